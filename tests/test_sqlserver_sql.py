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

from airflow_provider_sqlqueue.transport import InvalidQueueNameError, QueueAddress
from airflow_provider_sqlqueue.transport.dialects import Dialect, get_dialect
from airflow_provider_sqlqueue.transport.dialects import sqlserver as tsql
from airflow_provider_sqlqueue.transport.drivers import _odbc_string, _placeholders, pymssql_text

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
STATEMENTS: dict[str, Statement] = {
    "create_queue": lambda d, a, e: list(d.create_queue(a)),
    "add_body_string": lambda d, a, e: d.add_body_string(a),
    "create_inflight": lambda d, a, e: list(d.create_inflight(a)),
    "drop_queue": lambda d, a, e: d.drop_queue(a),
    "queue_columns": lambda d, a, e: d.queue_columns(a),
    "has_expires_index": lambda d, a, e: d.has_expires_index(a),
    "expires_index_ddl": lambda d, a, e: d.expires_index_ddl(a),
    "send": lambda d, a, e: d.send(a),
    "send_batch": lambda d, a, e: d.send_batch(a, 3)[0],
    "receive": lambda d, a, e: d.receive(a),
    "peek": lambda d, a, e: d.peek(a),
    "depth": lambda d, a, e: d.depth(a),
    "purge_expired": lambda d, a, e: d.purge_expired(a),
    "purge_all": lambda d, a, e: d.purge_all(a),
    "insert_error": lambda d, a, e: d.insert_error(e),
    "browse": lambda d, a, e: d.browse(a),
    "peek_error_rows": lambda d, a, e: d.peek_error_rows(e),
    "delete_by_seq": lambda d, a, e: d.delete_by_seq(e),
    "send_raw": lambda d, a, e: d.send_raw(a),
    "claim": lambda d, a, e: d.claim(a),
    "reclaim": lambda d, a, e: d.reclaim(a),
    "take": lambda d, a, e: d.take(a),
    "adopt": lambda d, a, e: d.adopt(a),
    "peek_with_claims": lambda d, a, e: d.peek_with_claims(a),
    "count_inflight": lambda d, a, e: d.count_inflight(a),
    "ack": lambda d, a, e: d.ack(a),
    "nack": lambda d, a, e: d.nack(a),
    "extend": lambda d, a, e: d.extend(a),
    "claim_to_error": lambda d, a, e: d.claim_to_error(a, e),
}
NOT_STATEMENTS = {"validate_address", "parse_address", "format_address", "qualified_name", "translate_error", "send_batch_params", "token_list"}
SESSION_STATEMENTS = {
    "begin": tsql.BEGIN_TRANSACTION,
    "commit": tsql.COMMIT_TRANSACTION,
    "rollback": tsql.ROLLBACK_TRANSACTION,
    **{f"setup_{n}": sql for n, sql in enumerate(tsql.SESSION_SETUP)},
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
    """The statement as SQL Server sees it: ``%s`` becomes a parameter, ``%%`` a literal ``%``."""
    numbers = iter(range(1, 10_000))
    return _placeholders(sql, lambda: f"@p{next(numbers)}")


def parse(sql: str) -> list[exp.Expression]:
    parsed = sqlglot.parse(as_tsql(sql), read="tsql", error_level=sqlglot.ErrorLevel.RAISE)
    assert all(p is not None for p in parsed)
    unparsed = [node for p in parsed for node in p.walk() if isinstance(node, exp.Command)]
    assert not unparsed, f"sqlglot could not parse part of {sql!r} as T-SQL: {unparsed}"
    return parsed  # type: ignore[return-value]


def test_every_dialect_method_is_covered():
    abstract = set(Dialect.__abstractmethods__)
    assert abstract == set(STATEMENTS) | NOT_STATEMENTS


@pytest.mark.parametrize("label", ADDRESSES)
def test_every_statement_parses_as_tsql_and_names_exactly_the_queue_tables(label):
    address = ADDRESSES[label]
    schema = address.schema or "dbo"
    expected_tables = {
        (address.catalog or "", schema, address.table),
        (address.catalog or "", schema, "error"),
        (address.catalog or "", schema, "sqlqueue_inflight"),
    }
    for name, sql in statements(address):
        parsed = parse(sql)
        tables = {(t.catalog, t.db, t.name) for p in parsed for t in p.find_all(exp.Table) if t.db and t.db != "sys"}
        assert tables <= expected_tables, (name, tables)
        catalog_views = {t.catalog for p in parsed for t in p.find_all(exp.Table) if t.db == "sys"}
        assert catalog_views <= {address.catalog or ""}, (name, catalog_views)  # the queue's database's views
        # Besides the application lock, every statement reads a queue table or a catalog view.
        assert tables or catalog_views or isinstance(parsed[0], exp.Execute), name
        # Names passed as strings (OBJECT_ID) must, read back as T-SQL, name the same table.
        for literal in (n for p in parsed for n in p.find_all(exp.National) if n.this.startswith("[")):
            table = sqlglot.parse_one(f"SELECT 1 FROM {literal.this}", read="tsql").find(exp.Table)
            assert (table.catalog, table.db, table.name) in expected_tables, (name, literal.this)


@pytest.mark.parametrize("name", SESSION_STATEMENTS)
def test_session_statements_parse(name):
    parse(SESSION_STATEMENTS[name])


def test_placeholders_count_matches_the_parameters_the_operations_pass():
    address = ADDRESSES["escaping"]
    error = address.sibling("error")
    expected = {  # parameters per statement, from the Dialect docstrings the operations follow
        "send": 4, "send_batch": 12, "receive": 1, "purge_expired": 1, "insert_error": 3, "browse": 1,
        "peek_error_rows": 1, "delete_by_seq": 1, "send_raw": 3, "claim": 5, "reclaim": 5, "take": 4, "adopt": 4,
        "peek_with_claims": 1, "count_inflight": 1, "ack": 2, "nack": 4, "extend": 3,
        "claim_to_error": 2, "queue_columns": 2, "has_expires_index": 2, "peek": 0, "depth": 0, "purge_all": 0,
        "drop_queue": 0, "add_body_string": 0, "expires_index_ddl": 0,
    }
    for name, count in expected.items():
        sql = STATEMENTS[name](dialect, address, error)
        assert len(re.findall(r"%s", sql.replace("%%", ""))) == count, name


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


def test_receive_is_nservicebus_receive_for_an_escaped_name():
    sql = dialect.receive(ADDRESSES["escaping"])
    assert sql == (
        "WITH message AS (SELECT TOP (%s) * FROM [sa]]les].[we]]ird [name]]; DROP TABLE x--'%%s] "
        "WITH (UPDLOCK, READPAST, ROWLOCK) ORDER BY RowVersion) "
        "DELETE FROM message OUTPUT deleted.Id, "
        "CASE WHEN deleted.Expires IS NOT NULL AND deleted.Expires <= GETUTCDATE() THEN 1 ELSE 0 END, "
        "deleted.Headers, deleted.Body, deleted.RowVersion"
    )


def test_send_writes_recoverable_and_server_clock_expiry():
    sql = as_tsql(dialect.send(ADDRESSES["plain"]))
    assert sql == (
        "INSERT INTO [dbo].[orders] (Id, Recoverable, Expires, Headers, Body) "
        "SELECT v.Id, 1, DATEADD(millisecond, v.Ttbr % 1000, DATEADD(second, v.Ttbr / 1000, GETUTCDATE())), "
        "v.Headers, v.Body FROM (VALUES (1, @p1, CAST(@p2 AS bigint), @p3, @p4)) AS v(Ord, Id, Ttbr, Headers, Body) "
        "ORDER BY v.Ord"
    )


def test_batches_stay_under_sql_servers_parameter_limit():
    sql, rows = dialect.send_batch(ADDRESSES["plain"], 10_000)
    assert rows == 500 and sql.count("%s") == 2000 < 2100


def test_create_table_matches_the_nservicebus_layout():
    create = parse(dialect.create_queue(ADDRESSES["plain"])[1])[0]
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
    assert (again.table, again.schema or "dbo", again.catalog) == (expected.table, expected.schema or "dbo", expected.catalog)


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
    assert _odbc_string("mssql+pyodbc://sa:p%3Bw%7D@db.example:1444/queues?driver=ODBC Driver 18 for SQL Server"
                        "&TrustServerCertificate=yes") == (
        "DRIVER={ODBC Driver 18 for SQL Server};SERVER=db.example,1444;DATABASE=queues;UID=sa;PWD={p;w}}};"
        "TrustServerCertificate=yes"
    )


def test_placeholder_rewriting_refuses_a_stray_percent():
    with pytest.raises(ValueError, match="stray %"):
        _placeholders("SELECT 5 % 2", lambda: "?")
    assert _placeholders("SELECT [50%% off], %s", lambda: "?") == "SELECT [50% off], ?"


names = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1, max_size=40).filter(
    lambda s: s.strip()
)


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
SAMPLE_PARAMS = {
    "send": (uuid.uuid4(), 60_000, '{"k":"it\'s"}', b"\x00\xff"),
    "send_batch": (uuid.uuid4(), None, "{}", b"") * 3,
    "receive": (10,),
    "purge_expired": (10_000,),
    "insert_error": (uuid.uuid4(), '{"a":"b"}', b"body"),
    "browse": (100,),
    "peek_error_rows": (100,),
    "delete_by_seq": (42,),
    "send_raw": (uuid.uuid4(), "{}", b"x"),
    "claim": (5, "orders@[dbo]", 1, 120_000, "host's worker:42"),
    "reclaim": (0, 120_000, None, "orders@[dbo]", 5),
    "take": (120_000, "dag/run/task#1", dialect.token_list([uuid.uuid4(), uuid.uuid4()]), "orders@[dbo]"),
    "adopt": (120_000, "dag/run/task#1", "orders@[dbo]", 100),
    "peek_with_claims": ("orders@[dbo]",),
    "count_inflight": ("orders@[dbo]",),
    "ack": (dialect.token_list([uuid.uuid4()]), "orders@[dbo]"),
    "nack": (0, '{"type": "ValueError", "message": "it\'s bad"}', dialect.token_list([uuid.uuid4()]), "orders@[dbo]"),
    "extend": (60_000, dialect.token_list([uuid.uuid4()]), "orders@[dbo]"),
    "claim_to_error": (uuid.uuid4(), '{"NServiceBus.FailedQ":"orders@[dbo]"}'),
    "queue_columns": ("dbo", "orders"),
    "has_expires_index": ("dbo", "orders"),
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
    for value in SAMPLE_PARAMS[name]:
        if isinstance(value, str):
            assert value in strings  # the value arrives as one string literal, quotes and all


def test_pymssql_text_refuses_a_parameter_count_mismatch():
    with pytest.raises(ValueError, match="more parameters"):
        pymssql_text("SELECT %s", (1, 2))
    with pytest.raises(ValueError, match="fewer parameters"):
        pymssql_text("SELECT %s, %s", (1,))
