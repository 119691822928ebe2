"""SQL Server's T-SQL, verified without a server: every statement parsed by a real T-SQL parser.

No SQL Server can run where these tests run, so this is what is proven here: each statement the
dialect can emit parses as T-SQL (sqlglot's tsql dialect, with no part left unparsed), names every
table it touches exactly as the address says -- however odd the name -- and equals the reviewed
text in ``snapshots/sqlserver_statements.sql``. Whether SQL Server *executes* them as intended is
tested by the behaviour suite, which runs on SQL Server only when ``SQLQUEUE_MSSQL_URI`` is set.
Regenerate the snapshot after an intended change with ``SQLQUEUE_UPDATE_SNAPSHOTS=1``.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import sqlglot
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlglot import exp

from airflow_provider_sqlqueue.transport import (
    InvalidQueueNameError,
    QueueAddress,
    TransportMisconfiguredError,
    defaults,
)
from airflow_provider_sqlqueue.transport.dialects import Dialect, TableShape, get_dialect
from airflow_provider_sqlqueue.transport.dialects import sqlserver as tsql
from airflow_provider_sqlqueue.transport.drivers.sqlserver import (
    odbc_connection_string,
    placeholders,
    pymssql_text,
    pyodbc_statement,
)
from tests import tsql_types

SNAPSHOT = Path(__file__).parent / "snapshots" / "sqlserver_statements.sql"

#: Representative queues: plain, every character that needs escaping, a catalog, a secondary queue.
ADDRESSES = {
    "plain": QueueAddress("orders"),
    "escaping": QueueAddress("we]ird [name]; DROP TABLE x--'%s", "sa]les"),
    "catalog": QueueAddress("Sales.WORKER01", "ops", "Shop's DB"),
    "unicode": QueueAddress("東京 queue", "ünï"),
}

Statement = Callable[[Dialect, QueueAddress, QueueAddress], "str | list[str]"]

#: Every statement-producing method of the dialect interface, called as the operations call it.
#: The layout NServiceBus creates today, and the older one without Recoverable and with varchar Headers.
SHAPE = TableShape()
LEGACY_SHAPE = TableShape(recoverable=False, ascii_headers=True)

STATEMENTS: dict[str, Statement] = {
    "install_lock": lambda d, a, e: d.install_lock_sql(a),
    "current_catalog": lambda d, a, e: d.current_catalog_sql(),
    "create_queue": lambda d, a, e: list(d.create_queue_sql(a)),
    "add_body_string": lambda d, a, e: d.add_body_string_sql(a),
    "create_inflight": lambda d, a, e: list(d.create_inflight_sql(a)),
    "drop_queue": lambda d, a, e: d.drop_queue_sql(a),
    "queue_columns": lambda d, a, e: d.queue_columns_sql(a),
    "schema_exists": lambda d, a, e: d.schema_exists_sql(a),
    "has_expires_index": lambda d, a, e: d.has_expires_index_sql(a),
    "expires_index_ddl": lambda d, a, e: d.expires_index_ddl_sql(a),
    "send": lambda d, a, e: d.send_sql(a, SHAPE),
    "send_legacy": lambda d, a, e: d.send_sql(a, LEGACY_SHAPE),
    "send_batch": lambda d, a, e: d.send_batch_sql(a, 3, SHAPE),
    "receive": lambda d, a, e: d.receive_sql(a),
    "peek": lambda d, a, e: d.peek_sql(a),
    "depth": lambda d, a, e: d.depth_sql(a),
    "purge_expired": lambda d, a, e: d.purge_expired_sql(a),
    "purge_all": lambda d, a, e: d.purge_all_sql(a),
    "insert_error": lambda d, a, e: d.insert_error_sql(e, SHAPE),
    "insert_error_legacy": lambda d, a, e: d.insert_error_sql(e, LEGACY_SHAPE),
    "browse": lambda d, a, e: d.browse_sql(a),
    "newest_headers": lambda d, a, e: d.newest_headers_sql(e),
    "find": lambda d, a, e: d.find_sql(a),
    "scanned_all": lambda d, a, e: d.scanned_all_sql(a),
    "find_claims": lambda d, a, e: d.find_claims_sql(a),
    "claims_scanned_all": lambda d, a, e: d.claims_scanned_all_sql(a),
    "can_read": lambda d, a, e: d.can_read_sql(),
    "error_headers": lambda d, a, e: d.error_headers_sql(e),
    "error_rows": lambda d, a, e: d.error_rows_sql(e),
    "failed_messages": lambda d, a, e: d.failed_messages_sql(e),
    "list_queues": lambda d, a, e: d.list_queues_sql(),
    "queue_figures": lambda d, a, e: d.queue_figures_sql(a),
    "delayed_figures": lambda d, a, e: d.delayed_figures_sql(a.delayed()),
    "claim_figures": lambda d, a, e: d.claim_figures_sql(a),
    "claims": lambda d, a, e: d.claims_sql(a),
    "purge_expired_claims": lambda d, a, e: d.purge_expired_claims_sql(a),
    "release_lapsed": lambda d, a, e: d.release_lapsed_sql(a, SHAPE),
    "release_lapsed_legacy": lambda d, a, e: d.release_lapsed_sql(a, LEGACY_SHAPE),
    "delete_by_seq": lambda d, a, e: d.delete_by_seq_sql(e),
    "claim": lambda d, a, e: d.claim_sql(a),
    "reclaim": lambda d, a, e: d.reclaim_sql(a),
    "claim_without_bodies": lambda d, a, e: d.claim_sql(a, bodies=False),
    "reclaim_without_bodies": lambda d, a, e: d.reclaim_sql(a, bodies=False),
    "take": lambda d, a, e: d.take_sql(a),
    "adopt": lambda d, a, e: d.adopt_sql(a),
    "peek_with_claims": lambda d, a, e: d.peek_with_claims_sql(a),
    "count_inflight": lambda d, a, e: d.count_inflight_sql(a),
    "ack": lambda d, a, e: d.ack_sql(a),
    "ack_copy": lambda d, a, e: d.ack_copy_sql(a),
    "nack": lambda d, a, e: d.nack_sql(a),
    "extend": lambda d, a, e: d.extend_sql(a),
    "held": lambda d, a, e: d.held_sql(a),
    "ack_held": lambda d, a, e: d.ack_held_sql(a),
    "extend_held": lambda d, a, e: d.extend_held_sql(a),
    "nack_held": lambda d, a, e: d.nack_held_sql(a),
    "seq_range": lambda d, a, e: d.seq_range_sql(a),
    "create_writes": lambda d, a, e: list(d.create_writes_sql(a.sibling("sqlqueue_writes"))),
    "record_write": lambda d, a, e: d.record_write_sql(a.sibling("sqlqueue_writes")),
    "forget_write": lambda d, a, e: d.forget_write_sql(a.sibling("sqlqueue_writes")),
    "claim_to_error": lambda d, a, e: d.claim_to_error_sql(a, e, SHAPE),
    "claim_to_error_legacy": lambda d, a, e: d.claim_to_error_sql(a, e, LEGACY_SHAPE),
    "create_delayed": lambda d, a, e: list(d.create_delayed_sql(a.delayed())),
    "store_delayed": lambda d, a, e: d.store_delayed_sql(a.delayed()),
    "due_delayed": lambda d, a, e: d.due_delayed_sql(a.delayed()),
    "delete_delayed": lambda d, a, e: d.delete_delayed_sql(a.delayed()),
    "next_due": lambda d, a, e: d.next_due_sql(a.delayed()),
    "create_subscriptions": lambda d, a, e: list(d.create_subscriptions_sql(a.sibling("SubscriptionRouting"))),
    "subscribe": lambda d, a, e: d.subscribe_sql(a.sibling("SubscriptionRouting")),
    "unsubscribe": lambda d, a, e: d.unsubscribe_sql(a.sibling("SubscriptionRouting")),
    "subscribers": lambda d, a, e: d.subscribers_sql(a.sibling("SubscriptionRouting")),
    "grant_schema_usage": lambda d, a, e: list(d.grant_schema_usage_sql(a, "app]rt")),
    "grant_runtime": lambda d, a, e: list(d.grant_runtime_sql(a, "app]rt", sequence=True)),
    "can_insert": lambda d, a, e: d.can_insert_sql(),
}
#: Dialect methods that return no statement, and statement variants tested under another name.
NOT_STATEMENTS = {
    "validate_role",
    "validate_address",
    "parse_address",
    "format_address",
    "qualified_name",
    "translate_error",
    "send_batch_params",
    "token_list",
    "key_list",
    "topic_list",
    "seq_list",
    "table_reference",
    "check_locked_batches",
}
#: Statements SQL Server has none of: a batch locked by a transaction (operations/locked.py), each
#: called as the operations call it, and refused before anything is sent.
REFUSED: dict[str, Statement] = {
    "lock_batch": lambda d, a, e: d.lock_batch_sql(a),
    "locker": lambda d, a, e: d.locker_sql(a),
    "current_transaction": lambda d, a, e: d.current_transaction_sql(),
    "browse_locked": lambda d, a, e: d.browse_locked_sql(a),
    "transaction_open": lambda d, a, e: d.transaction_open_sql(),
    "locked_rows_table": lambda d, a, e: d.locked_rows_table_sql(a, 1),
    "seq_window": lambda d, a, e: d.seq_window_sql(0, 1),
    "locked_to_error": lambda d, a, e: d.locked_to_error_sql(a, e, SHAPE),
    "ack_locked": lambda d, a, e: d.ack_locked_sql(a),
    "ack_locked_copy": lambda d, a, e: d.ack_locked_copy_sql(a),
}
VARIANTS = {"send_legacy", "insert_error_legacy", "claim_to_error_legacy", "release_lapsed_legacy"}
VARIANTS |= {"claim_without_bodies", "reclaim_without_bodies"}
SESSION_STATEMENTS = {
    "setup": tsql.SESSION_SETUP,
    "open_transactions": tsql.OPEN_TRANSACTIONS,
    "begin": tsql.BEGIN_TRANSACTION,
    "commit": tsql.COMMIT_TRANSACTION,
    "rollback": tsql.ROLLBACK_TRANSACTION,
}

dialect = get_dialect("sqlserver")


def statements(address: QueueAddress) -> Iterator[tuple[str, str]]:
    """(name, statement) for everything the dialect emits for ``address`` and its error queue."""
    error = address.sibling("error")
    for name, make in STATEMENTS.items():
        produced = make(dialect, address, error)
        for n, sql in enumerate(produced if isinstance(produced, list) else [produced]):
            yield (f"{name}[{n}]" if isinstance(produced, list) else name), sql


def as_tsql(sql: str) -> str:
    """The statement as SQL Server sees it: ``%(name)s`` becomes a parameter ``@p_name``, ``%%`` a literal ``%``."""
    return placeholders(sql, lambda name: f"@p_{name}")


def placeholder_names(sql: str) -> set[str]:
    names: set[str] = set()
    placeholders(sql, lambda name: names.add(str(name)) or "?")
    return names


def parse(sql: str) -> list[exp.Expression]:
    parsed = sqlglot.parse(as_tsql(sql), read="tsql", error_level=sqlglot.ErrorLevel.RAISE)
    assert all(p is not None for p in parsed)
    unparsed = [node for p in parsed for node in p.walk() if isinstance(node, exp.Command)]
    assert not unparsed, f"sqlglot could not parse part of {sql!r} as T-SQL: {unparsed}"
    return parsed  # type: ignore[return-value]


def test_every_dialect_method_is_covered():
    abstract = set(Dialect.__abstractmethods__)
    assert abstract == {name + "_sql" for name in (set(STATEMENTS) - VARIANTS) | set(REFUSED)} | NOT_STATEMENTS
    # SQL Server keeps no xmin horizon (ghost records are cleaned in the background): no statement.
    assert get_dialect("sqlserver").horizon_sql() is None


@pytest.mark.parametrize("label", ADDRESSES)
def test_every_statement_parses_as_tsql_and_names_exactly_the_queue_tables(label):
    address = ADDRESSES[label]
    schema = address.schema or "dbo"
    expected_tables = {
        (address.catalog or "", schema, address.table),
        (address.catalog or "", schema, "error"),
        (address.catalog or "", schema, "sqlqueue_inflight"),
        (address.catalog or "", schema, address.table + ".Delayed"),
        (address.catalog or "", schema, "SubscriptionRouting"),
        (address.catalog or "", schema, "sqlqueue_writes"),
    }
    for name, sql in statements(address):
        parsed = parse(sql)
        tables = {(t.catalog, t.db, t.name) for p in parsed for t in p.find_all(exp.Table) if t.db and t.db != "sys"}
        if name.startswith("grant_"):  # GRANT names objects by schema only, after USE of the queue's database
            assert sql.startswith(f"USE {tsql.quote_ident(address.catalog)}; ") if address.catalog else "USE" not in sql
            tables = {(address.catalog or "", db, table) for _, db, table in tables}
        assert tables <= expected_tables, (name, tables)
        catalog_views = {t.catalog for p in parsed for t in p.find_all(exp.Table) if t.db == "sys"}
        # The queue's database's views; listing queues reads the connection's own database.
        assert catalog_views <= ({""} if name == "list_queues" else {address.catalog or ""}), (name, catalog_views)
        # Besides the application lock, DB_NAME() and the privilege check (which takes the table's name as
        # a parameter), every statement reads a queue table or a catalog view.
        assert tables or catalog_views or name in ("install_lock", "current_catalog", "can_insert", "can_read"), name
        # Names passed as strings (OBJECT_ID) must, read back as T-SQL, name the same table.
        for literal in (n for p in parsed for n in p.find_all(exp.National) if n.this.startswith("[")):
            table = sqlglot.parse_one(f"SELECT 1 FROM {literal.this}", read="tsql").find(exp.Table)
            assert (table.catalog, table.db, table.name) in expected_tables, (name, literal.this)


@pytest.mark.parametrize("name", SESSION_STATEMENTS)
def test_session_statements_parse(name):
    parse(SESSION_STATEMENTS[name])


def test_placeholder_names_match_the_parameters_the_operations_pass():
    address = ADDRESSES["escaping"]
    error = address.sibling("error")
    row = {"id", "ttbr_ms", "headers", "body"}
    claims = {"lease_ms", "holder", "queue"}
    expected = {  # the names each Dialect docstring promises, which the operations pass
        "send": row,
        "send_legacy": row,
        "send_batch": {f"{name}{n}" for name in row for n in (1, 2, 3)},
        "receive": {"limit"},
        "purge_expired": {"limit"},
        "insert_error": {"id", "headers", "body"},
        "insert_error_legacy": {"id", "headers", "body"},
        "browse": {"after", "last", "limit"},
        "seq_range": set(),
        "held": {"queue", "holder", "parts", "part"},
        "ack_held": {"queue", "holder"},
        "extend_held": {"lease_ms", "queue", "holder"},
        "nack_held": {"delay_ms", "error", "queue", "holder"},
        "create_writes": set(),
        "record_write": {"write", "part"},
        "forget_write": {"write"},
        "newest_headers": {"before", "limit"},
        "find": {"scan", "needle"},
        "scanned_all": {"scan"},
        "find_claims": {"scan", "needle"},
        "claims_scanned_all": {"scan"},
        "can_read": {"table"},
        "error_headers": {"after", "limit"},
        "error_rows": {"seqs"},
        "failed_messages": {"seqs", "preview"},
        "list_queues": {"search", "offset", "limit"},
        "queue_figures": {"limit"},
        "delayed_figures": {"limit"},
        "claim_figures": {"queue"},
        "claims": {"queue", "limit"},
        "purge_expired_claims": {"queue", "limit"},
        "release_lapsed": {"queue", "limit"},
        "release_lapsed_legacy": {"queue", "limit"},
        "delete_by_seq": {"seq"},
        "claim": claims | {"limit", "deliveries"},
        "reclaim": claims | {"limit", "deliveries"},
        "take": claims | {"tokens"},
        "adopt": claims | {"limit"},
        "peek_with_claims": {"queue"},
        "count_inflight": {"queue"},
        "ack": {"tokens", "queue"},
        "ack_copy": {"tokens", "queue"},
        "nack": {"delay_ms", "error", "tokens", "queue"},
        "extend": {"lease_ms", "tokens", "queue"},
        "claim_to_error": {"token", "queue", "headers"},
        "claim_to_error_legacy": {"token", "queue", "headers"},
        "queue_columns": {"schema", "table"},
        "has_expires_index": {"schema", "table"},
        "install_lock": set(),
        "current_catalog": set(),
        "can_insert": {"table"},
        "peek": set(),
        "depth": set(),
        "purge_all": set(),
        "drop_queue": set(),
        "add_body_string": set(),
        "expires_index_ddl": set(),
        "create_delayed": set(),
        "store_delayed": {"headers", "body", "delay_ms"},
        "due_delayed": {"limit"},
        "delete_delayed": {"keys"},
        "next_due": set(),
        "create_subscriptions": set(),
        "subscribe": {"address", "endpoint", "topic"},
        "unsubscribe": {"endpoint", "topic"},
        "subscribers": {"topics"},
        "grant_schema_usage": set(),
        "grant_runtime": set(),
    }
    for name, names in expected.items():
        produced = STATEMENTS[name](dialect, address, error)
        sql = produced if isinstance(produced, str) else " ".join(produced)
        assert placeholder_names(sql) == names, name


def snapshot_text() -> str:
    blocks = []
    for label, address in ADDRESSES.items():
        for name, sql in statements(address):
            blocks.append(f"-- {label}: {name}\n{as_tsql(sql)};\n")
    for name, sql in SESSION_STATEMENTS.items():
        blocks.append(f"-- session: {name}\n{sql};\n")
    return "\n".join(blocks)


def test_statements_equal_the_reviewed_snapshot():
    text = snapshot_text()
    if os.environ.get("SQLQUEUE_UPDATE_SNAPSHOTS"):
        SNAPSHOT.parent.mkdir(exist_ok=True)
        SNAPSHOT.write_text(text, encoding="utf-8")
    assert text == SNAPSHOT.read_text(encoding="utf-8")


@pytest.mark.parametrize("name", REFUSED)
def test_a_batch_locked_by_a_transaction_is_refused_saying_why_and_what_to_use(name):
    """SQL Server's readers cannot tell one transaction's locks from another's: each statement of a
    locked batch is refused with that reason and the claim store's way instead, as its text."""
    address = ADDRESSES["escaping"]
    with pytest.raises(TransportMisconfiguredError) as refused:
        REFUSED[name](dialect, address, address.sibling("error"))
    assert str(refused.value) == tsql.NO_LOCKED_BATCHES
    for words in ("needs PostgreSQL", "READ UNCOMMITTED", "claim mode", "mode='claim'", "claimed_from_queue"):
        assert words in str(refused.value)
    with pytest.raises(TransportMisconfiguredError, match="READ UNCOMMITTED"):
        dialect.check_locked_batches()  # what a Spark read asks before it connects
    get_dialect("postgres").check_locked_batches()


def test_receive_is_nservicebus_receive_for_an_escaped_name():
    sql = dialect.receive_sql(ADDRESSES["escaping"])
    assert sql == (
        "WITH message AS (SELECT TOP (%(limit)s) * FROM [sa]]les].[we]]ird [name]]; DROP TABLE x--'%%s] "
        "WITH (UPDLOCK, READPAST, ROWLOCK) ORDER BY RowVersion) "
        "DELETE FROM message OUTPUT deleted.Id, "
        "CASE WHEN deleted.Expires IS NOT NULL AND deleted.Expires <= GETUTCDATE() THEN 1 ELSE 0 END, "
        "deleted.Headers, deleted.Body, deleted.RowVersion"
    )


def test_send_writes_recoverable_and_server_clock_expiry():
    sql = as_tsql(dialect.send_sql(ADDRESSES["plain"], SHAPE))
    assert sql == (
        "INSERT INTO [dbo].[orders] (Id, Recoverable, Expires, Headers, Body) "
        "SELECT v.Id, 1, DATEADD(millisecond, v.Ttbr % 86400000, DATEADD(day, v.Ttbr / 86400000, GETUTCDATE())), "
        "v.Headers, v.Body FROM (VALUES (1, @p_id, CAST(@p_ttbr_ms AS bigint), @p_headers, @p_body)) AS v(Ord, Id, Ttbr, Headers, Body) "
        "ORDER BY v.Ord"
    )


def test_send_to_a_table_without_recoverable_leaves_the_column_out():
    """NServiceBus's SendTextWithoutRecoverable: older tables have no Recoverable column."""
    sql = as_tsql(dialect.send_sql(ADDRESSES["plain"], LEGACY_SHAPE))
    assert sql.startswith("INSERT INTO [dbo].[orders] (Id, Expires, Headers, Body) SELECT v.Id, DATEADD(")


def test_durations_up_to_the_longest_ttbr_fit_dateadds_int():
    """DATEADD takes an int: 1000 years in seconds would overflow it (8115); in days it does not."""
    longest = int(defaults.MAX_TIME_TO_BE_RECEIVED.total_seconds() * 1000)
    assert longest // 86_400_000 < 2**31 and 86_400_000 < 2**31
    assert longest // 1000 >= 2**31  # what the seconds form could not hold


def test_batches_stay_under_sql_servers_parameter_limit():
    row = (uuid.uuid4(), None, "{}", b"x")
    assert dialect.batch_size([row] * 10_000) == 500
    assert len(placeholder_names(dialect.send_batch_sql(ADDRESSES["plain"], 500, SHAPE))) == 2000 < 2100


def test_batches_are_capped_by_the_bytes_pymssql_inlines():
    """pymssql inlines bodies as hex (twice their size): a batch stops at BYTES_PER_INSERT, one large message goes alone."""
    body = b"\x01" * (1024 * 1024)
    rows = [(uuid.uuid4(), None, "{}", body)] * 10
    count = dialect.batch_size(rows)
    assert 1 <= count < 10
    assert sum(2 * len(r[3]) + 2 * len(r[2]) for r in rows[:count]) <= tsql.BYTES_PER_INSERT
    huge = [(uuid.uuid4(), None, "{}", b"\x01" * (tsql.BYTES_PER_INSERT * 2))] * 3
    assert dialect.batch_size(huge) == 1


def test_create_table_matches_the_nservicebus_layout():
    [block] = dialect.create_queue_sql(ADDRESSES["plain"])
    create = parse(block)[0]
    table = create.find(exp.Create)
    columns = [(c.name, c.args["kind"].sql("tsql")) for c in table.find_all(exp.ColumnDef)]
    assert columns == [
        ("Id", "UNIQUEIDENTIFIER"),
        ("CorrelationId", "VARCHAR(255)"),
        ("ReplyToAddress", "VARCHAR(255)"),
        ("Recoverable", "BIT"),
        ("Expires", "DATETIME"),
        ("Headers", "NVARCHAR(MAX)"),
        ("Body", "VARBINARY(MAX)"),
        ("RowVersion", "BIGINT"),
    ]
    # NServiceBus's installer: table and both indexes together, only when the table is new.
    assert block.startswith("IF OBJECT_ID(N'[dbo].[orders]', N'U') IS NULL BEGIN CREATE TABLE")
    assert (
        "CREATE NONCLUSTERED INDEX [Index_RowVersion]" in block and "CREATE NONCLUSTERED INDEX [Index_Expires]" in block
    )


def resource_of(install_lock: str, database: str) -> str:
    """Evaluate the lock statement's resource expression as SQL Server would (QUOTENAME, +, DB_NAME())."""
    declare = sqlglot.parse(install_lock, read="tsql")[0]
    value = declare.find(exp.DeclareItem).args["default"]

    def evaluate(node: exp.Expression) -> str:
        if isinstance(node, exp.Add):
            return evaluate(node.this) + evaluate(node.expression)
        if isinstance(node, exp.National):
            return node.this
        if isinstance(node, exp.Anonymous) and node.name.upper() == "QUOTENAME":
            return "[" + evaluate(node.expressions[0]).replace("]", "]]") + "]"
        if isinstance(node, exp.Anonymous) and node.name.upper() == "DB_NAME":
            return database
        raise AssertionError(f"unexpected {node.sql('tsql')}")

    return evaluate(value)


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        (QueueAddress("orders"), "[MyDb].[dbo].[orders]_lock"),
        (QueueAddress("we]ird", "sa]les"), "[MyDb].[sa]]les].[we]]ird]_lock"),
        (QueueAddress("orders", "ops", "Shop's DB"), "[Shop's DB].[ops].[orders]_lock"),
    ],
)
def test_installers_take_nservicebus_lock(address, expected):
    """NServiceBus's QueueCreator locks '{CanonicalQueueAddress.QualifiedTableName}_lock': the same resource."""
    assert resource_of(as_tsql(dialect.install_lock_sql(address)), "MyDb") == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("orders", QueueAddress("orders")),
        ("orders@[dbo]", QueueAddress("orders", "dbo")),
        ("orders@[sa]]les]@[Shop]", QueueAddress("orders", "sa]les", "Shop")),
        ("Sales.WORKER01@[dbo]", QueueAddress("Sales.WORKER01", "dbo")),
        ("[we@ird]@[dbo]", QueueAddress("we@ird", "dbo")),
        ("[Shop].[dbo].[orders]", QueueAddress("orders", "dbo", "Shop")),
        ("sales.orders", QueueAddress("orders", "sales")),
        ("[Sales.WORKER01]", QueueAddress("Sales.WORKER01")),
    ],
)
def test_sqlserver_address_forms(text, expected):
    assert dialect.parse_address(text) == expected
    again = dialect.parse_address(dialect.format_address(expected))
    assert (again.table, again.schema or "dbo", again.catalog) == (
        expected.table,
        expected.schema or "dbo",
        expected.catalog,
    )


@pytest.mark.parametrize("text", ["a@b@c@d", "[unterminated", "orders@[dbo", "a.b.c.d", "st]ray"])
def test_sqlserver_bad_addresses_are_refused(text):
    with pytest.raises(InvalidQueueNameError):
        dialect.parse_address(text)


def test_sqlserver_refuses_temporary_table_names():
    for name in ("#orders", "##orders"):
        with pytest.raises(InvalidQueueNameError, match="temporary table"):
            dialect.parse_address(f"{name}@[dbo]")


def test_sqlserver_refuses_names_over_128_characters():
    with pytest.raises(InvalidQueueNameError, match="129 characters; SQL Server names are limited to 128"):
        dialect.qualified_name(QueueAddress("q" * 129))
    assert dialect.qualified_name(QueueAddress("q" * 128)) == "[dbo].[" + "q" * 128 + "]"


def test_odbc_uri_becomes_a_braced_connection_string():
    assert odbc_connection_string(
        "mssql+pyodbc://sa:p%3Bw%7D@db.example:1444/queues?driver=ODBC Driver 18 for SQL Server"
        "&TrustServerCertificate=yes"
    ) == (
        "DRIVER={ODBC Driver 18 for SQL Server};SERVER=db.example,1444;DATABASE=queues;UID=sa;PWD={p;w}}};"
        "TrustServerCertificate=yes"
    )


def test_placeholder_rewriting_refuses_a_stray_percent():
    with pytest.raises(ValueError, match="stray %"):
        placeholders("SELECT 5 % 2", lambda name: "?")
    assert placeholders("SELECT [50%% off], %s, %(x)s", lambda name: f"<{name}>") == "SELECT [50% off], <None>, <x>"


names = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1, max_size=40
).filter(lambda s: s.strip())


tables = names.filter(lambda s: not s.startswith("#"))  # temporary tables are refused (tested above)


@given(table=tables, schema=names, catalog=st.one_of(st.none(), names))
@settings(max_examples=300)
def test_nservicebus_address_round_trips(table, schema, catalog):
    address = QueueAddress(table, schema, catalog)
    assert dialect.parse_address(dialect.format_address(address)) == address


@given(table=tables, schema=names)
@settings(max_examples=200)
def test_any_name_is_one_bracketed_identifier_to_a_tsql_parser(table, schema):
    """Whatever the name, T-SQL reads the quoted form back as exactly that schema and table."""
    sql = as_tsql(f"SELECT 1 FROM {dialect.qualified_name(QueueAddress(table, schema))}")
    parsed = sqlglot.parse_one(sql, read="tsql").find(exp.Table)
    assert (parsed.db, parsed.name) == (schema, table)


#: Parameters as the operations pass them, with values that need quoting.
SAMPLE_PARAMS: dict[str, dict[str, object]] = {
    "send": {"id": uuid.uuid4(), "ttbr_ms": 60_000, "headers": '{"k":"it\'s"}', "body": b"\x00\xff"},
    "send_batch": dialect.send_batch_params([(uuid.uuid4(), None, "{}", b"")] * 3),
    "receive": {"limit": 10},
    "purge_expired": {"limit": 10_000},
    "insert_error": {"id": uuid.uuid4(), "headers": '{"a":"b"}', "body": b"body"},
    "browse": {"after": 0, "last": 2**63 - 1, "limit": 100},
    "held": {"queue": "orders@[dbo]", "holder": "spark:q'1:7", "parts": 4, "part": 3},
    "ack_held": {"queue": "orders@[dbo]", "holder": "spark:q'1:7"},
    "extend_held": {"lease_ms": 300_000, "queue": "orders@[dbo]", "holder": "spark:q'1:7"},
    "nack_held": {"delay_ms": 0, "error": '{"type": "Boom"}', "queue": "orders@[dbo]", "holder": "spark:q'1:7"},
    "record_write": {"write": uuid.uuid4(), "part": 12},
    "forget_write": {"write": uuid.uuid4()},
    "newest_headers": {"before": 2**63 - 1, "limit": 10_000},
    "error_headers": {"after": 0, "limit": 5_000},
    "error_rows": {"seqs": dialect.seq_list([3, 2**40])},
    "failed_messages": {"seqs": dialect.seq_list([7]), "preview": 512},
    "queue_figures": {"limit": 10_000},
    "delayed_figures": {"limit": 10_000},
    "claim_figures": {"queue": "orders@[dbo]"},
    "claims": {"queue": "it's@[dbo]", "limit": 100},
    "release_lapsed": {"queue": "orders@[dbo]", "limit": 1000},
    "release_lapsed_legacy": {"queue": "orders@[dbo]", "limit": 1000},
    "delete_by_seq": {"seq": 42},
    "insert_error_legacy": {"id": uuid.uuid4(), "headers": "{}", "body": b"x"},
    "claim": {"limit": 5, "queue": "orders@[dbo]", "deliveries": 1, "lease_ms": 120_000, "holder": "host's worker:42"},
    "reclaim": {"deliveries": 0, "lease_ms": 120_000, "holder": None, "queue": "orders@[dbo]", "limit": 5},
    "take": {
        "lease_ms": 120_000,
        "holder": "dag/run/task#1",
        "tokens": dialect.token_list([uuid.uuid4(), uuid.uuid4()]),
        "queue": "orders@[dbo]",
    },
    "adopt": {"lease_ms": 120_000, "holder": "dag/run/task#1", "queue": "orders@[dbo]", "limit": 100},
    "peek_with_claims": {"queue": "orders@[dbo]"},
    "count_inflight": {"queue": "orders@[dbo]"},
    "due_delayed": {"limit": 100},
    "delete_delayed": {"keys": dialect.key_list([1, 2, 2**40])},
    "subscribe": {"address": "Billing@[dbo]@[Shop's]", "endpoint": "Billing", "topic": "Shop.OrderPlaced"},
    "unsubscribe": {"endpoint": "Billing", "topic": "Shop.OrderPlaced"},
    "subscribers": {"topics": dialect.topic_list(["Shop.OrderPlaced", "Shop.IEvent's"])},
    "ack": {"tokens": dialect.token_list([uuid.uuid4()]), "queue": "orders@[dbo]"},
    "ack_copy": {"tokens": dialect.token_list([uuid.uuid4(), uuid.uuid4()]), "queue": "orders@[dbo]"},
    "nack": {
        "delay_ms": 0,
        "error": '{"type": "ValueError", "message": "it\'s bad"}',
        "tokens": dialect.token_list([uuid.uuid4()]),
        "queue": "orders@[dbo]",
    },
    "extend": {"lease_ms": 60_000, "tokens": dialect.token_list([uuid.uuid4()]), "queue": "orders@[dbo]"},
    "claim_to_error": {
        "token": uuid.uuid4(),
        "queue": "orders@[dbo]",
        "headers": '{"NServiceBus.FailedQ":"orders@[dbo]"}',
    },
    "purge_expired_claims": {"queue": "orders@[dbo]", "limit": 10_000},
    "queue_columns": {"schema": "dbo", "table": "orders"},
    "has_expires_index": {"schema": "dbo", "table": "orders"},
}


@pytest.mark.parametrize("name", SAMPLE_PARAMS)
def test_text_pymssql_sends_parses_as_tsql(name):
    """With real values quoted by pymssql itself (pymssql binds on the client), each statement is still T-SQL."""
    address = ADDRESSES["escaping"]
    sql = STATEMENTS[name](dialect, address, address.sibling("error"))
    text = pymssql_text(sql, SAMPLE_PARAMS[name])
    parsed = sqlglot.parse(text, read="tsql", error_level=sqlglot.ErrorLevel.RAISE)
    assert not [node for p in parsed for node in p.walk() if isinstance(node, exp.Command)]
    strings = [n.this for p in parsed for n in p.find_all(exp.National)]
    for value in SAMPLE_PARAMS[name].values():
        if isinstance(value, str):
            assert value in strings  # the value arrives as one string literal, quotes and all


def test_pymssql_text_refuses_a_parameter_mismatch():
    with pytest.raises(ValueError, match="more parameters"):
        pymssql_text("SELECT %s", (1, 2))
    with pytest.raises(ValueError, match="fewer parameters"):
        pymssql_text("SELECT %s, %s", (1,))
    with pytest.raises(ValueError, match="no value for placeholder 'b'"):
        pymssql_text("SELECT %(a)s, %(b)s", {"a": 1})
    with pytest.raises(ValueError, match=r"parameters \['c'\] have no placeholder"):
        pymssql_text("SELECT %(a)s", {"a": 1, "c": 2})


def test_pyodbc_binds_a_name_used_twice_twice():
    assert pyodbc_statement("SELECT %(a)s, %(b)s, %(a)s", {"a": 1, "b": "x"}) == ("SELECT ?, ?, ?", (1, "x", 1))


# -- what each driver sends, type-checked against the tables' column types -------------------------

#: Bodies of every shape: pymssql used to send the ASCII ones as varchar literals (error 257).
BODIES = {
    "empty": b"",
    "ascii": b'{"a":1}',
    "binary": b"\x00\xff\x10",
    "utf8": "héllo 東京".encode(),
    "large": bytes(range(256)) * 400,
}
HEADERS = {"empty": "{}", "ascii": '{"k":"v"}', "unicode": '{"k":"välue 東京"}', "quote": '{"k":"it\'s 100%"}'}


def sample_params(name: str, body: bytes | None, headers: str) -> dict[str, object]:
    """Parameters as the operations pass them, with the body and headers under test."""
    if name in ("send", "send_legacy"):
        return {"id": uuid.uuid4(), "ttbr_ms": 60_000, "headers": headers, "body": body}
    if name == "send_batch":  # one batch mixing shapes: one ASCII body used to fail the whole batch
        rows = [
            (uuid.uuid4(), None, headers, body),
            (uuid.uuid4(), 5, "{}", b"\x00"),
            (uuid.uuid4(), 2**40, HEADERS["unicode"], b""),
        ]
        return dialect.send_batch_params(rows)
    if name in ("insert_error", "insert_error_legacy"):
        return {"id": uuid.uuid4(), "headers": headers, "body": body}
    if name == "store_delayed":
        return {"headers": headers, "body": body, "delay_ms": 2**40}
    if name in ("claim_to_error", "claim_to_error_legacy"):
        return {"token": uuid.uuid4(), "queue": "orders@[dbo]", "headers": headers}
    return SAMPLE_PARAMS.get(name, {})


def checker_tables(address: QueueAddress, legacy: bool) -> dict[str, dict[str, str]]:
    """The tables a statement may touch, with the column types of the dialect's own DDL."""
    queue = tsql_types.table_columns(dialect.create_queue_sql(address)[0])
    if legacy:  # an older NServiceBus table: no Recoverable, varchar Headers
        queue = {
            name: ("varchar" if name == "headers" else kind) for name, kind in queue.items() if name != "recoverable"
        }
    inflight = tsql_types.table_columns(dialect.create_inflight_sql(address)[0])
    delayed = tsql_types.table_columns(dialect.create_delayed_sql(address.delayed())[0])
    routing = tsql_types.table_columns(dialect.create_subscriptions_sql(address.sibling("SubscriptionRouting"))[0])
    writes = tsql_types.table_columns(dialect.create_writes_sql(address.sibling("sqlqueue_writes"))[0])
    return {
        "subscriptionrouting": routing,
        "sqlqueue_writes": writes,
        address.table.lower(): queue,
        "error": queue,
        "sqlqueue_inflight": inflight,
        address.delayed().table.lower(): delayed,
    }


def pyodbc_types(values: tuple[object, ...]) -> dict[str, tsql_types.Typed]:
    """How pyodbc binds each value: str as nvarchar, bytes as varbinary, ints by size, None untyped (varchar)."""
    typed = {}
    for n, value in enumerate(values, start=1):
        if value is None:
            kind = tsql_types.Typed("varchar", null=True)
        elif isinstance(value, bool):
            kind = tsql_types.Typed("bit")
        elif isinstance(value, int):
            kind = tsql_types.Typed("int" if -(2**31) <= value < 2**31 else "bigint")
        elif isinstance(value, (bytes, bytearray)):
            kind = tsql_types.Typed("varbinary")
        elif isinstance(value, str):
            kind = tsql_types.Typed("nvarchar")
        else:
            raise AssertionError(f"pyodbc would bind {type(value).__name__}")
        typed[f"@__p{n}"] = kind
    return typed


def as_pyodbc_checkable(text: str) -> str:
    numbers = iter(range(1, 10_000))
    return re.sub(r"\?", lambda _: f"@__p{next(numbers)}", text)


def type_problems(
    text: str, tables: dict[str, dict[str, str]], parameters: dict[str, tsql_types.Typed] | None = None
) -> list[str]:
    parsed = sqlglot.parse(text, read="tsql", error_level=sqlglot.ErrorLevel.RAISE)
    assert not [node for p in parsed for node in p.walk() if isinstance(node, exp.Command)], text[:200]
    return tsql_types.Checker(tables, parameters or {}).check([p for p in parsed if p is not None])


RENDERED = [
    name
    for name in STATEMENTS
    if name in SAMPLE_PARAMS or name.startswith(("send", "insert_error", "claim_to_error", "store_delayed"))
]


def rendering_cases() -> Iterator[tuple[str, str, str, bool]]:
    """(statement, body, headers, legacy table): every shape for statements that carry them, once for the rest."""
    for name in RENDERED:
        if name.startswith(("send", "insert_error", "claim_to_error", "store_delayed")):
            legacy = name.endswith("_legacy")
            for body in BODIES:
                for headers in HEADERS:
                    yield name, body, headers, legacy
        elif name.startswith("release_lapsed"):  # written for one table layout, like the sends
            yield name, "empty", "empty", name.endswith("_legacy")
        else:
            yield name, "empty", "empty", False
            yield name, "empty", "empty", True


@pytest.mark.parametrize(("name", "body", "headers", "legacy"), list(rendering_cases()))
def test_what_each_driver_sends_type_checks_against_the_table(name, body, headers, legacy):
    """Every statement, rendered exactly as pymssql (values inlined) and pyodbc (``?`` + bound values)
    send it, with bodies and headers of every shape, puts only values SQL Server converts into each column."""
    address = ADDRESSES["plain"]
    sql = STATEMENTS[name](dialect, address, address.sibling("error"))
    params = sample_params(name, BODIES[body], HEADERS[headers])
    tables = checker_tables(address, legacy)
    assert type_problems(pymssql_text(sql, params), tables) == []
    text, values = pyodbc_statement(sql, params)
    assert type_problems(as_pyodbc_checkable(text), tables, pyodbc_types(values)) == []


@pytest.mark.parametrize("body", [None, b"", b"x"])
def test_a_null_body_is_typed_for_both_drivers(body):
    """NServiceBus allows a NULL Body; moved to the error queue it must still be a varbinary."""
    address = ADDRESSES["plain"]
    sql = dialect.insert_error_sql(address.sibling("error"), SHAPE)
    tables = checker_tables(address, False)
    params = {"id": uuid.uuid4(), "headers": "{}", "body": body}
    assert type_problems(pymssql_text(sql, params), tables) == []
    text, values = pyodbc_statement(sql, params)
    assert type_problems(as_pyodbc_checkable(text), tables, pyodbc_types(values)) == []


def test_the_checker_catches_pymssqls_own_rendering_of_an_ascii_body():
    """What the checker is for: pymssql's quoting sends b'{"a":1}' as '{"a":1}', which SQL Server refuses."""
    from pymssql._mssql import quote_simple_value

    address = ADDRESSES["plain"]
    sql = dialect.send_sql(address, SHAPE)
    params = {"id": uuid.uuid4(), "ttbr_ms": None, "headers": "{}", "body": b'{"a":1}'}
    own = placeholders(sql, lambda name: quote_simple_value(params[name]).decode())
    problems = type_problems(own, checker_tables(address, False))
    assert any("varchar -> varbinary is refused (error 257)" in p for p in problems), problems
    assert "0x7b2261223a317d" in pymssql_text(sql, params)  # the transport's rendering: a binary literal


def test_the_checker_catches_an_untyped_null_body_from_pyodbc():
    """Without the CAST, pyodbc's NULL (bound as varchar where the driver cannot describe parameters) fails."""
    address = ADDRESSES["plain"]
    tables = checker_tables(address, False)
    bare = "INSERT INTO [dbo].[error] (Id, Recoverable, Expires, Headers, Body) VALUES (?, 1, NULL, ?, ?)"
    values = (str(uuid.uuid4()), "{}", None)
    problems = type_problems(as_pyodbc_checkable(bare), tables, pyodbc_types(values))
    assert any("error 257" in p for p in problems), problems


def test_the_checker_catches_a_text_count_and_a_column_that_does_not_exist():
    tables = checker_tables(ADDRESSES["plain"], True)
    assert any(
        "TOP" in p
        for p in type_problems(
            pymssql_text(dialect.browse_sql(ADDRESSES["plain"]), {"limit": "10", "after": 0, "last": 99}), tables
        )
    )
    wrong = pymssql_text(
        dialect.send_sql(ADDRESSES["plain"], SHAPE), {"id": uuid.uuid4(), "ttbr_ms": None, "headers": "{}", "body": b""}
    )
    assert any("no column recoverable" in p for p in type_problems(wrong, tables))  # the legacy table has none


def test_claim_key_is_the_same_for_every_form_of_one_address():
    forms = ["orders", "orders@[dbo]", "orders@[dbo]@[Shop]", "[Shop].[dbo].[orders]", "dbo.orders"]
    assert {dialect.claim_key(dialect.parse_address(form)) for form in forms} == {"orders@[dbo]"}


def test_a_varchar_headers_table_is_written_ascii_and_warned_about(caplog):
    import logging

    dialect = get_dialect("sqlserver")  # a fresh one: it has read no table yet
    address = QueueAddress("legacy")
    assert dialect.table_shape(address) is None  # unknown until the catalog was read
    with caplog.at_level(logging.WARNING, logger="airflow_provider_sqlqueue"):
        shape = dialect.learn_table_shape(
            address,
            [
                ("id", "uniqueidentifier"),
                ("expires", "datetime"),
                ("headers", "varchar"),
                ("body", "varbinary"),
                ("rowversion", "bigint"),
            ],
        )
    assert (shape.recoverable, shape.ascii_headers) == (False, True)
    assert dialect.table_shape(address) == shape
    assert "varchar Headers column" in caplog.text
