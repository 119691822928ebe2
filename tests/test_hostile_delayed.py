"""Delayed delivery, publish/subscribe and audit copies under hostile input, on PostgreSQL.

Each test reproduces one defect and counts what happened: every message where it belongs, none
lost, none twice, nothing else changed.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from urllib.parse import quote
from zoneinfo import ZoneInfo

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from airflow_provider_sqlqueue.transport import (
    InvalidQueueNameError,
    Message,
    QueueAddress,
    QueueClient,
    SqlQueueError,
)
from airflow_provider_sqlqueue.transport import operations as ops
from airflow_provider_sqlqueue.transport.client import Addressing
from airflow_provider_sqlqueue.transport.dialects import get_dialect
from airflow_provider_sqlqueue.transport.drivers import finish
from airflow_provider_sqlqueue.transport.errors import InvalidArgumentError
from airflow_provider_sqlqueue.transport.message import (
    EXCEPTION_MESSAGE,
    FAILED_QUEUE,
    FORWARD_DESTINATION,
    MESSAGE_ID,
    PROCESSING_ENDPOINT,
)


def count(raw, schema: str, table: str) -> int:
    return int(raw.execute(f'SELECT count(*) FROM "{schema}"."{table}"').fetchone()[0])


def store_due(backend, raw, queue: QueueAddress, destination: str, body: bytes, message_id: str | None = None) -> str:
    """A due row as NServiceBus's own sender stores it, forwarded to ``destination``."""
    message_id = message_id or str(uuid.uuid4())
    headers = json.dumps({MESSAGE_ID: message_id, FORWARD_DESTINATION: destination})
    backend.nservicebus_store_delayed(raw, queue.schema, queue.delayed().table, headers, body, timedelta(0))
    return message_id


@pytest.fixture
def restricted_uri(pg_uri: str, schema: str) -> Iterator[tuple[str, str]]:
    """A login role with run-time rights on the schema's tables, and its name (to take rights away)."""
    role = f"sqlqueue_rt_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_uri, autocommit=True) as admin:
        admin.execute(f'CREATE ROLE "{role}" LOGIN')
        admin.execute(f'GRANT USAGE ON SCHEMA "{schema}" TO "{role}"')
    try:
        yield make_conninfo(**{**conninfo_to_dict(pg_uri), "user": role}), role
    finally:
        with psycopg.connect(pg_uri, autocommit=True) as admin:
            admin.execute(f'DROP OWNED BY "{role}"')
            admin.execute(f'DROP ROLE "{role}"')


def test_a_due_message_its_destination_cannot_take_goes_to_the_error_queue_and_the_rest_move(
    backend, raw, client, queue, schema, pg_uri, restricted_uri
):
    shipping, locked = QueueAddress("shipping", schema), QueueAddress("locked", schema)
    client.create_queue(shipping)
    client.create_queue(locked)
    raw.execute(f'CREATE TABLE "{schema}".ledger (entry text)')  # a table, but no queue
    uri, role = restricted_uri
    with psycopg.connect(pg_uri, autocommit=True) as admin:
        admin.execute(f'GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA "{schema}" TO "{role}"')
        admin.execute(f'GRANT USAGE ON ALL SEQUENCES IN SCHEMA "{schema}" TO "{role}"')
        admin.execute(f'REVOKE INSERT ON "{schema}"."locked" FROM "{role}"')

    client.send(queue, [Message(f"own{n}") for n in range(4)], delay=0.05)
    shipped = {
        store_due(backend, raw, queue, client.canonical_address(shipping), f"ship{n}".encode()) for n in range(3)
    }
    poison = {
        store_due(backend, raw, queue, f'ledger@"{schema}"', b"not a queue"),
        store_due(backend, raw, queue, client.canonical_address(locked), b"may not write"),
    }
    time.sleep(0.1)

    with QueueClient.connect(uri) as runtime:
        assert runtime.move_due(queue) == 9

    assert sorted(m.text for m in client.receive(queue, 10)) == [f"own{n}" for n in range(4)]
    assert {str(m.id) for m in client.receive(shipping, 10)} == shipped
    failed = client.receive(QueueAddress("error", schema), 10)
    assert {str(m.id) for m in failed} == poison
    for message in failed:
        assert message.headers[FAILED_QUEUE] == client.canonical_address(queue)
        assert FORWARD_DESTINATION not in message.headers
        assert ("ledger" if message.body == b"not a queue" else "locked") in message.headers[EXCEPTION_MESSAGE]
    assert count(raw, schema, "ledger") == 0 and count(raw, schema, "locked") == 0
    assert count(raw, schema, queue.delayed().table) == 0


@pytest.mark.parametrize("sender_zone", ["Asia/Tokyo", "America/Los_Angeles"])
def test_due_times_are_absolute_whatever_the_session_time_zone(raw, pg_uri, queue, schema, sender_zone):
    mover_zone = "America/Los_Angeles" if sender_zone == "Asia/Tokyo" else "Asia/Tokyo"
    sender_uri = f"{pg_uri}?options={quote(f'-c TimeZone={sender_zone}')}"
    with QueueClient.connect(sender_uri) as sender, QueueClient.connect(pg_uri) as mover:
        mover.connection.execute(f"SET TIME ZONE '{mover_zone}'")
        # A delay that ends just past the next daylight-saving change in Los Angeles.
        now = datetime.now(UTC)
        later = now.astimezone(ZoneInfo("America/Los_Angeles"))
        while later.utcoffset() == now.astimezone(ZoneInfo("America/Los_Angeles")).utcoffset():
            later += timedelta(days=1)
        across_dst = later.astimezone(UTC) - now
        sender.send(queue, Message("across DST"), delay=across_dst)
        sender.send(queue, Message("in an hour"), delay=timedelta(hours=1))
        sender.send(queue, Message("in a second"), delay=1)

        for client in (sender, mover):
            wait = client.next_due(queue)
            assert wait is not None and timedelta(0) < wait <= timedelta(seconds=1)
        dues = [row[0] for row in raw.execute(f'SELECT Due FROM "{schema}"."orders.Delayed" ORDER BY Due')]
        expected = [timedelta(seconds=1), timedelta(hours=1), across_dst]
        for due, delay in zip(dues, expected, strict=True):
            assert abs(due - (now + delay)) < timedelta(seconds=30)

        assert mover.move_due(queue) == 0  # nothing is due yet, in any zone
        time.sleep(1.1)
        assert mover.move_due(queue) == 1
        assert sender.move_due(queue) == 0
        assert [m.text for m in mover.receive(queue, 5)] == ["in a second"]
        assert count(raw, schema, "orders.Delayed") == 2


def test_a_delayed_message_is_received_with_the_id_it_was_sent_with(raw, client, queue, schema):
    sent = [Message(f"m{n}") for n in range(3)]
    client.send(queue, sent, delay=0.05)
    time.sleep(0.1)
    assert client.move_due(queue) == 3
    assert [(m.text, m.id) for m in client.receive(queue, 10)] == [(m.body.decode(), m.id) for m in sent]
    assert count(raw, schema, queue.delayed().table) == 0


def test_a_message_delayed_twice_moves_both_copies_without_holding_up_the_rest(raw, client, queue, schema):
    first, again = Message("once"), Message("twice")
    client.send(queue, [first, again], delay=0.05)
    client.send(queue, again, delay=0.05)  # the same message delayed a second time (a sender's retry)
    client.send(queue, Message("waiting"), delay=0.05)
    time.sleep(0.1)
    assert client.move_due(queue) == 4
    client.send(queue, first, delay=0.05)  # and once more after the first copy already waits in the queue
    time.sleep(0.1)
    assert client.move_due(queue) == 1

    received = client.receive(queue, 10)
    assert len(received) == 5 and len({m.id for m in received}) == 5
    ids = Counter(m.headers[MESSAGE_ID] for m in received)
    assert ids[str(first.id)] == 2 and ids[str(again.id)] == 2
    by_text = Counter((m.text, m.id) for m in received)
    assert by_text[("once", first.id)] == 1 and by_text[("twice", again.id)] == 1
    assert count(raw, schema, queue.delayed().table) == 0


def test_a_delayed_batch_is_stored_in_one_statement(raw, client, queue, schema):
    batch = [Message(str(n)) for n in range(5000)]
    session = client.session
    steps: list[ops.Step] = []

    async def execute(step: ops.Step) -> object:
        steps.append(step)
        return await session.execute(step)

    with client.transaction():
        op = ops.send_delayed(session.dialect, queue, queue.delayed(), batch, 50)
        assert finish(ops.drive(op, execute)) == 5000
    assert len([step for step in steps if "INSERT" in step.sql]) == 1
    assert count(raw, schema, queue.delayed().table) == 5000
    time.sleep(0.1)
    assert client.move_due(queue, batch_size=5000) == 5000
    assert [m.text for m in client.receive(queue, 6000)] == [str(n) for n in range(5000)]  # in order


def test_every_queue_name_create_queue_accepts_has_its_delayed_table(backend, raw, client, schema):
    longest = ("é" * 8 + "q" * 64).encode()[:47].decode(errors="ignore")  # multi-byte characters count in bytes
    queue = QueueAddress(longest, schema)
    client.create_queue(queue)
    assert f"{longest}.Delayed" in backend.tables(raw, schema)
    client.send(queue, Message("later"), delay=0.05)
    time.sleep(0.1)
    assert client.move_due(queue) == 1 and [m.text for m in client.receive(queue)] == ["later"]
    before = backend.tables(raw, schema)
    for size in (48, 55):
        with pytest.raises(InvalidQueueNameError, match="at most 47 bytes"):
            client.create_queue(QueueAddress("q" * size, schema))
    assert backend.tables(raw, schema) == before  # refused up front: nothing half-made


def test_sql_server_refuses_a_queue_name_too_long_for_its_delayed_table_saying_the_longest():
    addressing = Addressing(get_dialect("sqlserver"))
    assert addressing.installation("q" * 120).tables[-1][1].table == "q" * 120 + ".Delayed"
    with pytest.raises(InvalidQueueNameError, match="at most 120 characters"):
        addressing.installation("q" * 121)
    assert addressing.installation("q" * 121, delayed=False)  # without delayed delivery it may be longer


def test_drop_queue_drops_its_delayed_table_too(backend, raw, client, queue, schema):
    client.send(queue, Message("later"), delay=60)
    client.drop_queue(queue)
    assert {"orders", "orders.Delayed"} & backend.tables(raw, schema) == set()
    assert "error" in backend.tables(raw, schema)  # shared by other queues: left alone
    client.create_queue(queue)  # the name is free again, with nothing left over
    assert client.next_due(queue) is None


def test_publish_reaches_each_table_once_however_subscriptions_spell_it(backend, raw, client, queue, schema):
    billing = QueueAddress("billing", schema)
    client.create_queue(billing)
    table = client.create_subscription_table(QueueAddress("SubscriptionRouting", schema))
    for endpoint, address in (
        ("Sales", f'orders@"{schema}"'),
        ("Sales.Audit", f'"{schema}"."orders"'),
        ("Sales.Legacy", f"{schema}.orders"),
        ("Billing", f'billing@"{schema}"'),
    ):
        backend.nservicebus_subscribe(raw, schema, address, endpoint, "Shop.OrderPlaced")

    event = Message("placed")
    reached = client.publish("Shop.OrderPlaced", event, table=table)
    assert len(reached) == 2
    assert [m.id for m in client.receive(queue, 5)] == [event.id]
    assert [m.id for m in client.receive(billing, 5)] == [event.id]


@pytest.mark.parametrize("bad", ["Shop.\x00Order", "Shop.\ud800Order"])
def test_topics_and_endpoints_no_column_can_hold_are_refused_before_anything_is_sent(raw, client, queue, schema, bad):
    table = client.create_subscription_table(QueueAddress("SubscriptionRouting", schema))
    client.subscribe(queue, "Shop.Good", table=table)
    calls = [
        lambda: client.subscribe(queue, ["Shop.Fine", bad], table=table),
        lambda: client.subscribe(queue, "Shop.Fine", endpoint=bad, table=table),
        lambda: client.unsubscribe(queue, bad, table=table),
        lambda: client.subscribers(bad, table=table),
        lambda: client.publish(["Shop.Good", bad], Message("event"), table=table),
    ]
    for call in calls:
        with pytest.raises(InvalidArgumentError) as refused:
            call()
        assert isinstance(refused.value, SqlQueueError) and isinstance(refused.value, ValueError)
    assert count(raw, schema, "SubscriptionRouting") == 1
    assert client.peek(queue) == 0


def test_an_audit_queue_that_is_the_queue_or_its_error_queue_is_refused(pg_uri, client, queue, schema):
    client.send(queue, Message("work"))
    [claimed] = client.claim(queue)
    for audit in (f'orders@"{schema}"', f'error@"{schema}"'):
        with (
            pytest.raises(InvalidArgumentError, match="is the queue or its error queue"),
            QueueClient.connect(pg_uri, audit_queue=audit) as auditing,
        ):
            auditing.ack(queue, claimed.claim_token)
    assert client.in_flight(queue) == 1 and client.peek(queue) == 0  # the claim is untouched, nothing copied
    assert client.ack(queue, claimed.claim_token)


def test_ack_held_audits_each_message_in_the_same_transaction(pg_uri, raw, queue, schema):
    with QueueClient.connect(pg_uri, audit_queue=True) as auditing:
        auditing.create_queue(queue)
        sent = [Message(f"m{n}") for n in range(3)]
        auditing.send(queue, sent)
        assert len(auditing.claim(queue, 3, holder="batch-7")) == 3
        assert auditing.ack_held(queue, "batch-7") == 3
        copies = auditing.receive(QueueAddress("audit", schema), 10)
    assert sorted(m.headers[MESSAGE_ID] for m in copies) == sorted(str(m.id) for m in sent)
    assert {m.headers[PROCESSING_ENDPOINT] for m in copies} == {"orders"}
    assert count(raw, schema, "orders") == 0 and count(raw, schema, "sqlqueue_inflight") == 0
