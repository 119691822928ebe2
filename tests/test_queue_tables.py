"""Only queue tables are touched: every operation checks its table before any statement runs.

A name that reaches a business table, a catalog table or the claim store is refused with
:class:`NotAQueueError` (or :class:`QueueNotFoundError`) and nothing changes; a retry from the error
queue skips, with its reason, each message it cannot route and retries the rest.
"""

from __future__ import annotations

import json
import uuid

import pytest

from airflow_provider_sqlqueue.transport import Message, QueueAddress, QueueNotFoundError
from airflow_provider_sqlqueue.transport.errors import NotAQueueError
from airflow_provider_sqlqueue.transport.message import FAILED_QUEUE

pytestmark = pytest.mark.every_dialect


def _customers(backend, raw, schema: str) -> QueueAddress:
    """An ordinary business table with three rows (it has an Id and a Body, but it is no queue)."""
    table = backend.table(schema, "customers")
    raw.execute(f"CREATE TABLE {table} (Id int PRIMARY KEY, Body varchar(50))")
    raw.execute(f"INSERT INTO {table} (Id, Body) VALUES (1, 'ada'), (2, 'bob'), (3, 'cy')")
    return QueueAddress("customers", schema)


def _rows(backend, raw, schema: str, table: str) -> list[tuple]:
    return sorted(tuple(row) for row in raw.execute(f"SELECT * FROM {backend.table(schema, table)}").fetchall())


def test_no_operation_touches_a_table_that_is_not_a_queue(backend, raw, client, schema):
    customers = _customers(backend, raw, schema)
    before = _rows(backend, raw, schema, "customers")
    attempts = {
        "purge": lambda: client.purge(customers),
        "purge_expired": lambda: client.purge_expired(customers),
        "drop_queue": lambda: client.drop_queue(customers),
        "send": lambda: client.send(customers, Message("x")),
        "receive": lambda: client.receive(customers),
        "claim": lambda: client.claim(customers),
        "depth": lambda: client.depth(customers),
        "peek": lambda: client.peek(customers),
        "browse": lambda: client.browse(customers),
        "queue_stats": lambda: client.queue_stats([customers]),
        "release_lapsed": lambda: client.release_lapsed(customers),
        "check_queue": lambda: client.check_queue(customers),
    }
    for name, attempt in attempts.items():
        with pytest.raises(NotAQueueError, match="not a queue table"):
            attempt()
        assert _rows(backend, raw, schema, "customers") == before, name


def test_a_table_whose_seq_is_not_generated_is_not_a_queue(backend, raw, client, schema):
    """Every column of a queue, but Seq (RowVersion) without a default or identity: a send would
    store rows no receive ever reads (Seq NULL), so it is refused like any other table that is no queue."""
    table = backend.table(schema, "handmade")
    if backend.name == "postgres":
        columns = "Id uuid PRIMARY KEY, Expires timestamp, Headers text NOT NULL, Body bytea, Seq bigint UNIQUE"
    else:
        columns = (
            "Id uniqueidentifier PRIMARY KEY, CorrelationId varchar(255), ReplyToAddress varchar(255), "
            "Recoverable bit NOT NULL, Expires datetime, Headers nvarchar(max) NOT NULL, "
            "Body varbinary(max), RowVersion bigint UNIQUE"
        )
    raw.execute(f"CREATE TABLE {table} ({columns})")
    handmade = QueueAddress("handmade", schema)
    for attempt in (lambda: client.send(handmade, Message("x")), lambda: client.receive(handmade)):
        with pytest.raises(NotAQueueError, match=r"(seq|rowversion) is bigint without"):
            attempt()
    assert _rows(backend, raw, schema, "handmade") == []
    assert QueueAddress("handmade", schema) not in client.queues()


def test_the_claim_store_is_not_a_queue(client, queue, schema):
    client.send(queue, Message("held"))
    [claimed] = client.claim(queue)
    store = QueueAddress("sqlqueue_inflight", schema)
    for attempt in (client.purge, client.drop_queue, client.receive, client.depth):
        with pytest.raises(NotAQueueError, match="claim store"):
            attempt(store)
    assert client.ack(queue, claimed.claim_token) is True  # the claim was never disturbed


def test_drop_queue_of_a_missing_table_is_a_no_op(client, schema):
    client.drop_queue(QueueAddress("never_made", schema))
    with pytest.raises(QueueNotFoundError):
        client.depth(QueueAddress("never_made", schema))


def test_a_retry_skips_what_it_cannot_route_with_the_reason_and_retries_the_rest(backend, raw, client, queue, schema):
    _customers(backend, raw, schema)
    error = QueueAddress("error", schema)
    canonical = client.canonical_address
    waiting = Message("already back")
    client.send(queue, waiting)
    failures = {
        "business table": (canonical(QueueAddress("customers", schema)), uuid.uuid4()),
        "the error queue": (canonical(error), uuid.uuid4()),
        "id waiting": (canonical(queue), waiting.id),
        "good": (canonical(queue), uuid.uuid4()),
    }
    for failed_q, message_id in failures.values():
        backend.nservicebus_send(raw, schema, "error", message_id, json.dumps({FAILED_QUEUE: failed_q}), b"b")
    page = client.retry_errors_page(error, limit=10)
    assert page.retried == 1
    reasons = [reason for _, reason in page.skipped]
    assert len(reasons) == 3
    assert "not a queue table" in reasons[0]
    assert "this error queue" in reasons[1]
    if backend.name == "postgres":  # Id is the queue's key there; NServiceBus's SQL Server tables allow repeats
        assert "already waits" in reasons[2]
    assert client.depth(error) == 3  # the skipped stay, unchanged
    assert sorted(m.text for m in client.receive(queue, 10)) == ["already back", "b"]
    assert _rows(backend, raw, schema, "customers") == [(1, "ada"), (2, "bob"), (3, "cy")]


def test_retry_errors_by_queue_leaves_a_message_whose_id_already_waits(client, queue, schema):
    error = QueueAddress("error", schema)
    first, second = Message("first"), Message("second")
    client.send(queue, [first, second])
    for received in client.receive(queue, 2):
        client.move_to_error(queue, received, "boom")
    client.send(queue, Message("first again", id=first.id))  # the same id sent again meanwhile
    retried = client.retry_errors(error, queue=queue)
    if client.database == "postgres":
        assert (retried, client.depth(error)) == (1, 1)
        assert sorted(m.text for m in client.receive(queue, 10)) == ["first again", "second"]
    else:  # NServiceBus's SQL Server tables let two rows share an id
        assert (retried, client.depth(error)) == (2, 0)


def test_a_missing_claim_store_is_named_as_such_not_as_a_missing_queue(backend, raw, client, queue, schema):
    """A queue NServiceBus (or plain SQL) created has no claim store beside it: claim mode says so."""
    client.send(queue, Message("waiting"))
    raw.execute(f"DROP TABLE {backend.table(schema, 'sqlqueue_inflight')}")
    with backend.client(schema) as other:  # a session that has not met the store yet
        for attempt in (lambda: other.claim(queue), lambda: other.held(queue, "h")):
            with pytest.raises(
                QueueNotFoundError, match=r"claim store .*sqlqueue_inflight.* does not exist: run create_queue"
            ):
                attempt()
        assert other.depth(queue) == 1  # the queue itself is there and untouched
        other.create_queue(queue)  # adds the store, leaves the queue as it is
        assert [m.text for m in other.claim(queue)] == ["waiting"]
