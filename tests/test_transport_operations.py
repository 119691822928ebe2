"""The queue operations (``transport/operations.py``) driven with fixed rows, without a database.

Operations are sans-IO: they yield statements and receive what each returned. Driving them with
rows chosen here checks the decisions they make about those rows -- what is dropped, routed to
the error queue, retried, refused -- for both dialects' statements, including rows no real server
is easy to coax into returning on cue. That the statements do what the rows assume is what the
behaviour suites check on real servers.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from airflow_provider_sqlqueue.transport import LeaseLostError, Message, QueueAddress
from airflow_provider_sqlqueue.transport import operations as ops
from airflow_provider_sqlqueue.transport.dialects import Dialect, get_dialect
from airflow_provider_sqlqueue.transport.drivers import finish
from airflow_provider_sqlqueue.transport.message import DELIVERY_COUNT, FAILED_QUEUE, Failure

QUEUE = QueueAddress("orders", "sales")
ERROR = QueueAddress("error", "sales")
#: The queue as NServiceBus writes it in FailedQ, catalog and all.
CATALOGED = QueueAddress("orders", "sales", "SHOPDB")


class Script:
    """Answers each statement by the dialect method that produced it, and records what ran."""

    def __init__(self, dialect: Dialect, answers: dict[str, Callable[[ops.Step], Any]]) -> None:
        self.dialect = dialect
        self.answers = answers
        self.ran: list[tuple[str, ops.Step]] = []

    def name_of(self, step: ops.Step) -> str:
        for name, produce in _PRODUCERS.items():
            if step.sql in produce(self.dialect):
                return name
        return "?"

    def __call__(self, step: ops.Step) -> Any:
        name = self.name_of(step)
        self.ran.append((name, step))
        answer = self.answers.get(name)
        return answer(step) if answer is not None else None

    def names(self) -> list[str]:
        return [name for name, _ in self.ran]


def _all(*texts: str) -> set[str]:
    return set(texts)


_PRODUCERS: dict[str, Callable[[Dialect], set[str]]] = {
    "receive": lambda d: _all(d.receive_sql(QUEUE), d.receive_sql(ERROR)),
    "insert_error": lambda d: _all(
        *(d.insert_error_sql(a, d.table_shape(a) or _shape()) for a in _addresses(d, QUEUE, ERROR, CATALOGED))
    ),
    "claim": lambda d: _all(d.claim_sql(QUEUE)),
    "reclaim": lambda d: _all(d.reclaim_sql(QUEUE)),
    "claim_to_error": lambda d: _all(d.claim_to_error_sql(QUEUE, ERROR, d.table_shape(ERROR) or _shape())),
    "ack": lambda d: _all(d.ack_sql(QUEUE)),
    "ack_copy": lambda d: _all(d.ack_copy_sql(QUEUE)),
    "send": lambda d: _all(d.send_sql(QUEUE, d.table_shape(QUEUE) or _shape())),
    "send_batch": lambda d: {d.send_batch_sql(QUEUE, n, d.table_shape(QUEUE) or _shape()) for n in range(1, 6)},
    "queue_columns": lambda d: _all(*(d.queue_columns_sql(a) for a in _addresses(d, QUEUE, CATALOGED))),
    "has_expires_index": lambda d: _all(d.has_expires_index_sql(QUEUE)),
    "install_lock": lambda d: _all(d.install_lock_sql(QUEUE)),
    "create_queue": lambda d: set(d.create_queue_sql(QUEUE)),
    "error_headers": lambda d: _all(d.error_headers_sql(ERROR)),
    "error_rows": lambda d: _all(d.error_rows_sql(ERROR)),
    "current_catalog": lambda d: _all(d.current_catalog_sql()),
    "delete_by_seq": lambda d: _all(d.delete_by_seq_sql(ERROR)),
    "purge_expired": lambda d: _all(d.purge_expired_sql(QUEUE)),
}


def _addresses(d: Dialect, *addresses: QueueAddress) -> list[QueueAddress]:
    """The addresses this dialect can name (PostgreSQL has no catalogs)."""
    return [a for a in addresses if a.catalog is None or d.name == "sqlserver"]


def _shape() -> Any:
    from airflow_provider_sqlqueue.transport.dialects import TableShape

    return TableShape()


def drive(op: ops.Operation[Any], script: Script) -> Any:
    async def execute(step: ops.Step) -> Any:
        return script(step)

    return finish(ops.drive(op, execute))


DIALECTS = ["postgres", "sqlserver"]
QUEUE_COLUMNS = {
    "postgres": [
        ("id", "uuid"),
        ("expires", "timestamp without time zone"),
        ("headers", "text"),
        ("body", "bytea"),
        ("seq", "integer"),
    ],
    "sqlserver": [
        ("id", "uniqueidentifier"),
        ("recoverable", "bit"),
        ("expires", "datetime"),
        ("headers", "nvarchar"),
        ("body", "varbinary"),
        ("rowversion", "bigint"),
    ],
}


def dialect_with_known_tables(name: str) -> Dialect:
    """A dialect that has checked the queue and error tables (each session reads a table's catalog once)."""
    d = get_dialect(name)
    for address in (QUEUE, ERROR):
        d.learn_table_shape(address, QUEUE_COLUMNS[name])
    return d


@pytest.mark.parametrize("name", DIALECTS)
def test_receive_drops_expired_rows_moves_poison_unchanged_and_asks_again_for_the_shortfall(name):
    d = dialect_with_known_tables(name)
    good, expired, poison, later = (uuid.uuid4() for _ in range(4))
    batches = iter(
        [
            [(good, 0, '{"a":"1"}', b"g", 3), (expired, 1, "{}", b"x", 1), (poison, 0, "not json", b"\x00p", 2)],
            [(later, 0, "{}", b"l", 4)],
        ]
    )
    script = Script(d, {"receive": lambda step: next(batches), "purge_expired": lambda step: 7})
    received = drive(ops.receive(d, QUEUE, ERROR, 3), script)
    assert [(m.id, m.body) for m in received] == [(good, b"g"), (later, b"l")]
    # the expired row met says more may follow it: they are deleted in bulk, not one receive each
    assert script.names() == ["receive", "purge_expired", "insert_error", "receive"]
    moved = script.ran[2][1].params
    assert (moved["id"], moved["headers"], moved["body"]) == (poison, "not json", b"\x00p")
    assert script.ran[3][1].params["limit"] == 2  # the two that were dropped, asked for again


@pytest.mark.parametrize("name", DIALECTS)
def test_receive_from_its_own_error_queue_never_meets_its_poison_row_again(name):
    d = dialect_with_known_tables(name)
    script = Script(d, {"receive": lambda step: [(uuid.uuid4(), 0, "[]", b"", 1)]})
    assert drive(ops.receive(d, ERROR, ERROR, 5), script) == []
    assert script.names() == ["receive", "insert_error"]  # no second receive within the call


@pytest.mark.parametrize("name", DIALECTS)
def test_a_claim_delivered_max_deliveries_times_goes_to_the_error_queue_with_its_last_failure(name):
    d = dialect_with_known_tables(name)
    token, message_id = uuid.uuid4(), uuid.uuid4()
    failure = Failure.of(ValueError("bad row 7"), "etl.clean").to_text()
    script = Script(
        d,
        {
            "reclaim": lambda step: [(token, message_id, 0, '{"k":"v"}', b"b", 6, failure, 9)],
            "claim": lambda step: [],
        },
    )
    assert drive(ops.claim(d, QUEUE, ERROR, 1, 60_000, 5, "me"), script) == []
    assert script.names() == ["reclaim", "claim_to_error", "claim"]
    headers = json.loads(script.ran[1][1].params["headers"])
    assert headers["NServiceBus.ExceptionInfo.ExceptionType"] == "builtins.ValueError"
    assert headers["NServiceBus.ExceptionInfo.Message"] == "bad row 7"
    assert headers[FAILED_QUEUE] == d.format_address(QUEUE)
    assert headers[DELIVERY_COUNT] == "5"  # delivered five times before this lapse
    assert script.ran[1][1].params["token"] == token
    assert headers["k"] == "v"


@pytest.mark.parametrize("name", DIALECTS)
def test_forward_sends_nothing_when_a_claim_was_lost(name):
    d = dialect_with_known_tables(name)
    held, lost = uuid.uuid4(), uuid.uuid4()
    script = Script(d, {"ack": lambda step: [(held,)]})
    with pytest.raises(LeaseLostError, match=str(lost)):
        drive(ops.forward(d, [(QUEUE, [held, lost])], [(QUEUE, [Message(b"result")])]), script)
    assert script.names() == ["ack"]  # the send never ran; the caller's transaction rolls the ack back


def test_sqlserver_reads_a_tables_layout_once_and_writes_to_it_as_it_is():
    d = get_dialect("sqlserver")
    columns = [
        ("id", "uniqueidentifier"),
        ("expires", "datetime"),
        ("headers", "varchar"),
        ("body", "varbinary"),
        ("rowversion", "bigint"),
    ]
    script = Script(d, {"queue_columns": lambda step: columns})
    drive(ops.send(d, QUEUE, [Message(b"1", {"city": "Zürich"})]), script)
    drive(ops.send(d, QUEUE, [Message(b"2")]), script)
    assert script.names() == ["queue_columns", "send", "send"]
    sent = script.ran[1][1]
    assert "Recoverable" not in sent.sql
    assert sent.params["headers"].isascii() and "Z\\u00fcrich" in sent.params["headers"]


@pytest.mark.parametrize("name", DIALECTS)
def test_one_message_is_one_statement_and_a_batch_follows_the_dialects_batch_size(name):
    d = dialect_with_known_tables(name)
    assert ops.needs_no_transaction(ops.send(d, QUEUE, [Message(b"x")]))
    # The notification rides on the INSERT: a notified send of one message is still one statement.
    assert ops.needs_no_transaction(ops.send(d, QUEUE, [Message(b"x")], notify=True))
    big = [Message(b"\x01" * (600 * 1024)) for _ in range(5)]
    script = Script(d, {})
    assert drive(ops.send(d, QUEUE, big), script) == 5
    statements = script.names()
    assert set(statements) == {"send_batch"}
    # PostgreSQL sends any batch as arrays in one statement; SQL Server caps one by the bytes pymssql
    # inlines (hex: twice the body), so 3 of these fit under its 4 MiB and the other 2 follow.
    assert len(statements) == (1 if name == "postgres" else 2)


@pytest.mark.parametrize("name", DIALECTS)
def test_the_installer_leaves_an_existing_table_alone_and_warns_of_a_missing_expires_index(name, caplog):
    d = get_dialect(name)
    columns = [*QUEUE_COLUMNS[name], ("extra", "integer")]  # the dialect's queue columns, and more
    script = Script(d, {"queue_columns": lambda step: columns, "has_expires_index": lambda step: (0,)})
    with caplog.at_level(logging.WARNING, logger="airflow_provider_sqlqueue"):
        drive(ops.create_queue(d, QUEUE), script)
    assert script.names() == ["install_lock", "queue_columns", "queue_columns", "has_expires_index"]
    assert d.expires_index_ddl_sql(QUEUE) in caplog.text


def test_retry_matches_failedq_written_with_the_catalog_and_leaves_what_it_cannot_route():
    d = dialect_with_known_tables("sqlserver")
    ids = [uuid.uuid4() for _ in range(3)]
    rows = [
        (1, ids[0], json.dumps({FAILED_QUEUE: "orders@[sales]@[SHOPDB]", "x": "1"}), b"a"),
        (2, ids[1], json.dumps({"x": "no FailedQ"}), b"b"),
        (3, ids[2], json.dumps({FAILED_QUEUE: "orders@[sales]@[OtherDb]"}), b"c"),
    ]
    script = Script(
        d,
        {
            "error_headers": lambda step: [(seq, headers) for seq, _, headers, _ in rows],
            "error_rows": lambda step: [row for row in rows if row[0] in json.loads(step.params["seqs"])],
            "current_catalog": lambda step: ("ShopDb",),
            "queue_columns": lambda step: QUEUE_COLUMNS["sqlserver"],
            "insert_error": lambda step: 1,  # the retry's insert reports the row it wrote
        },
    )
    page = drive(ops.retry_from_error(d, ERROR, limit=10, scan=10, only_queue=QueueAddress("orders", "sales")), script)
    assert page == ops.RetryPage(1, 3, True)
    [locked] = [step.params["seqs"] for name, step in script.ran if name == "error_rows"]
    assert json.loads(locked) == [1]  # only the row whose FailedQ names the queue is locked and read whole
    inserted = [step.params for name, step in script.ran if name == "insert_error"]
    assert [p["id"] for p in inserted] == [ids[0]]
    assert json.loads(inserted[0]["headers"]) == {"x": "1"}  # failure headers removed
    assert [step.params["seq"] for name, step in script.ran if name == "delete_by_seq"] == [1]


@pytest.mark.parametrize("name", DIALECTS)
def test_which_operations_run_without_a_transaction(name):
    """None-mode receives and claims commit statement by statement (one round trip each); a native
    receive and a forward must commit as one."""
    d = dialect_with_known_tables(name)
    assert ops.needs_no_transaction(ops.receive(d, QUEUE, ERROR, 10, atomic=False))
    assert not ops.needs_no_transaction(ops.receive(d, QUEUE, ERROR, 10))
    assert ops.needs_no_transaction(ops.claim(d, QUEUE, ERROR, 10, 60_000, 5, "me"))
    assert ops.needs_no_transaction(ops.ack(d, QUEUE, [uuid.uuid4()]))
    assert not ops.needs_no_transaction(ops.forward(d, [(QUEUE, [uuid.uuid4()])], [(QUEUE, [Message(b"r")])]))


def test_a_postgres_batch_is_one_insert_and_needs_no_transaction_unlike_sql_servers():
    batch = [Message(b"x") for _ in range(50)]
    assert ops.needs_no_transaction(ops.send(dialect_with_known_tables("postgres"), QUEUE, batch))
    assert not ops.needs_no_transaction(ops.send(dialect_with_known_tables("sqlserver"), QUEUE, batch))


@pytest.mark.parametrize("name", DIALECTS)
def test_a_claim_told_there_are_no_lapsed_claims_skips_looking_for_them(name):
    d = dialect_with_known_tables(name)
    script = Script(d, {"claim": lambda step: []})
    assert drive(ops.claim(d, QUEUE, ERROR, 5, 60_000, 5, "me", reclaim=False), script) == []
    assert script.names() == ["claim"]
    script = Script(d, {"reclaim": lambda step: [], "claim": lambda step: []})
    drive(ops.claim(d, QUEUE, ERROR, 5, 60_000, 5, "me"), script)
    assert script.names() == ["reclaim", "claim"]
