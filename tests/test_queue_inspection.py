"""What an operator sees of queues and does to them: listing, figures, claims, failures, retries, give-backs.

Every figure is compared with what the tables hold; every action is counted -- nothing lost,
nothing moved twice, also when two operators click at once.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from airflow_provider_sqlqueue.transport import ArgumentTypeError, Message, QueueAddress, QueueClient, defaults
from airflow_provider_sqlqueue.transport.message import wire_timestamp

pytestmark = pytest.mark.every_dialect


def fail_messages(client: QueueClient, queue: QueueAddress, count: int, error: Exception) -> list[uuid.UUID]:
    """Send ``count`` messages, claim them and fail each with ``error``; returns their ids in failing order."""
    client.send(queue, [Message(f"{queue.table} {n}", {"n": str(n)}) for n in range(count)])
    ids = []
    for claim in client.claim(queue, count):
        client.fail(queue, claim, error)
        ids.append(claim.id)
    return ids


def test_queues_lists_the_queue_tables_and_nothing_else(client, queue, raw, schema, backend):
    client.create_subscription_table(QueueAddress("SubscriptionRouting", schema))
    other = QueueAddress("billing", schema)
    client.create_queue(other)
    raw.execute(f"CREATE TABLE {backend.table(schema, 'notes')} (id int, body {backend.text_type})")
    made_by_nservicebus = QueueAddress("Shipping", schema)
    for sql in client.dialect.create_queue_sql(
        made_by_nservicebus
    ):  # the table only, as an endpoint's installer makes it
        raw.execute(sql)

    mine = [address for address in client.queues() if address.schema == schema]

    assert [address.table for address in mine] == ["Shipping", "billing", "error", "orders"]


def test_queue_page_filters_and_pages_in_the_database(client, schema) -> None:
    names = [f"page_{n:02d}" for n in range(7)]
    for name in names:
        client.create_queue(QueueAddress(name, schema), delayed=False)
    mine = f"{schema}.page_"  # this test's schema alone: other tests' queues may share the database
    first = client.queue_page(mine.upper(), offset=0, limit=3)  # case does not matter
    assert first.total == 7 and [a.table for a in first.queues] == names[:3]
    rest = client.queue_page(mine, offset=3, limit=10)
    assert rest.total == 7 and [a.table for a in rest.queues] == names[3:]
    past = client.queue_page(mine, offset=50, limit=10)
    assert past.total == 7 and past.queues == []  # past the end: the total still says how many there are
    assert client.queue_page(f"{schema}.no such queue").total == 0
    assert QueueAddress("error", schema) in client.queue_page(schema).queues


def test_queue_stats_match_the_tables(client, queue, raw, schema, backend):
    sent = datetime(2026, 5, 1, 12, 30, tzinfo=UTC)
    client.send(queue, Message("oldest", {"NServiceBus.TimeSent": wire_timestamp(sent)}))
    client.send(queue, [Message(f"m{n}") for n in range(4)])
    client.send(queue, [Message("gone", time_to_be_received=timedelta(milliseconds=1)) for _ in range(3)])
    # Held first: a claim takes lapsed claims before waiting messages.
    held = client.claim(queue, 1, lease=timedelta(minutes=5))  # "oldest"
    claimed = client.claim(queue, 2, lease=timedelta(milliseconds=200))  # m0, m1
    time.sleep(0.4)

    [stats] = client.queue_stats(queue)

    assert stats.queue == queue
    assert stats.waiting == client.depth(queue) == 5  # m2, m3 and the three expired ones
    assert stats.expired == 3
    assert (stats.in_flight, stats.lapsed) == (3, 2)
    assert stats.oldest_sent is not None  # m2's TimeSent: the send's own clock
    assert abs(stats.oldest_sent - datetime.now(UTC)) < timedelta(minutes=1)
    [capped] = client.queue_stats(queue, expired_limit=2)
    assert capped.expired == 2
    assert len(claimed) == 2 and len(held) == 1

    client.ack(queue, [c.claim_token for c in claimed + held])
    client.purge_expired(queue)
    client.receive(queue, 10)
    client.send(queue, Message("again", {"NServiceBus.TimeSent": wire_timestamp(sent)}))
    [after] = client.queue_stats(queue)
    assert (after.waiting, after.expired, after.in_flight, after.lapsed, after.oldest_sent) == (1, 0, 0, 0, sent)


def test_queue_stats_of_tables_an_nservicebus_endpoint_made(client, raw, schema, backend):
    """No claim store in the schema: claims are unknown (None), the rest is read as usual."""
    address = QueueAddress("Sales", schema)
    for sql in client.dialect.create_queue_sql(address):
        raw.execute(sql)
    backend.nservicebus_send(raw, schema, "Sales", uuid.uuid4(), json.dumps({"NServiceBus.TimeSent": "bad"}), b"x")
    backend.nservicebus_send(raw, schema, "Sales", uuid.uuid4(), "not json", b"y")

    [stats] = client.queue_stats(address)

    assert (stats.waiting, stats.expired, stats.in_flight, stats.lapsed, stats.oldest_sent) == (2, 0, None, None, None)


def test_claims_show_holders_and_leases_without_tokens(client, queue):
    client.send(queue, [Message("a"), Message("b")])
    [reserved] = client.reserve(queue, lease=timedelta(minutes=3))  # first: a claim takes lapsed claims first
    [lapsing] = client.claim(queue, lease=timedelta(milliseconds=100), holder="worker-1")
    client.nack(queue, reserved.claim_token, error="busy", delay=timedelta(minutes=1))
    time.sleep(0.2)

    first, second = client.claims(queue)

    assert (first.id, first.holder, first.deliveries) == (lapsing.id, "worker-1", 1)
    assert first.lease_left < timedelta(0)
    assert (second.id, second.holder, second.deliveries) == (reserved.id, None, 0)
    assert timedelta(seconds=50) < second.lease_left <= timedelta(minutes=1)
    assert "busy" in (second.last_error or "")
    assert [claim.id for claim in client.claims(queue, limit=1)] == [first.id]


def test_release_lapsed_gives_claims_back_to_every_receiver(client, queue, raw, schema, backend):
    client.send(queue, [Message(f"m{n}") for n in range(5)])
    live = client.claim(queue, 1, lease=timedelta(minutes=5))  # first: a claim takes lapsed claims first
    lapsed = client.claim(queue, 3, lease=timedelta(milliseconds=100))
    [waiting] = client.browse(queue)
    time.sleep(0.2)

    assert client.release_lapsed(queue, batch_size=2) == 3
    assert client.release_lapsed(queue) == 0  # a second click finds nothing

    # An NServiceBus endpoint's own receive sees them now, behind the message that waited.
    received = [backend.nservicebus_receive(raw, schema, "orders") for _ in range(4)]
    assert [uuid.UUID(str(row[0])) for row in received] == [waiting.id] + [m.id for m in lapsed]
    assert not client.ack(queue, lapsed[0].claim_token)  # its old holder no longer has it
    assert client.ack(queue, live[0].claim_token)


def test_release_lapsed_beside_reclaiming_receivers_moves_each_claim_once(backend, schema, queue):
    """Two operators giving claims back and two receivers reclaiming them, at once: each claim goes one way."""
    count = 400
    with backend.client(schema) as client:
        client.send(queue, [Message(f"m{n}") for n in range(count)])
        client.claim(queue, count, lease=timedelta(milliseconds=50))
    time.sleep(0.2)
    released: list[int] = []
    reclaimed: list[uuid.UUID] = []

    def operator() -> None:
        with backend.client(schema) as mine:
            released.append(mine.release_lapsed(queue, batch_size=25))

    def receiver() -> None:
        with backend.client(schema) as mine:
            while batch := mine.claim(queue, 10, lease=timedelta(minutes=5)):
                reclaimed.extend(message.id for message in batch)

    threads = [threading.Thread(target=work) for work in (operator, operator, receiver, receiver)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)

    with backend.client(schema) as client:
        waiting = [m.id for m in client.browse(queue, count)]
        # Given back or reclaimed, each message reached a receiver once: a claim taken both ways
        # would show up twice here (reclaimed, then claimed again from the queue).
        assert len(set(reclaimed)) == len(reclaimed)
        assert client.in_flight(queue) == len(reclaimed)
        assert len(waiting) + len(reclaimed) == count
        assert not set(waiting) & set(reclaimed)
        assert 0 <= sum(released) <= count


def test_failed_messages_page_newest_first_with_bounded_previews(client, queue, raw, schema, backend):
    error = QueueAddress("error", schema)
    other = QueueAddress("billing", schema)
    client.create_queue(other)
    orders_ids = fail_messages(client, queue, 5, ValueError("bad order"))
    billing_ids = fail_messages(client, other, 3, KeyError("no account"))
    big = bytes(range(256)) * 40
    backend.nservicebus_send(raw, schema, "error", uuid.uuid4(), "{broken", big)

    page, before = client.failed_messages(error, limit=4)
    assert [m.headers is None for m in page] == [True, False, False, False]
    assert page[0].body_size == len(big) and page[0].body_preview == big[: defaults.BODY_PREVIEW_BYTES]
    assert [m.id for m in page[1:]] == billing_ids[::-1]
    rest, end = client.failed_messages(error, before=before, limit=10)
    assert [m.id for m in rest] == orders_ids[::-1] and end is None
    assert rest[0].body_preview == b"orders 4" and rest[0].body_size == 8

    source = client.canonical_address(queue)
    mine, cursor = client.failed_messages(error, group=(source, "builtins.ValueError"), limit=2, preview=3)
    assert [m.id for m in mine] == orders_ids[:-3:-1] and cursor is not None
    assert [m.body_preview for m in mine] == [b"ord", b"ord"]
    more, done = client.failed_messages(error, group=(source, "builtins.ValueError"), before=cursor, limit=10)
    assert [m.id for m in more] == orders_ids[2::-1] and done is None
    groups = {(g.source, g.exception_type): g.count for g in client.error_summary(error)}
    assert (
        groups[(source, "builtins.ValueError")] == 5 and groups[("(unreadable headers)", "(unreadable headers)")] == 1
    )


def test_retry_selected_messages_once_however_often_clicked(client, queue, schema):
    error = QueueAddress("error", schema)
    ids = fail_messages(client, queue, 4, ValueError("bad"))
    page, _ = client.failed_messages(error)
    chosen = [m.seq for m in page if m.id in ids[:2]]

    assert client.retry_errors(error, seqs=chosen) == 2
    assert client.retry_errors(error, seqs=chosen) == 0
    assert sorted(m.id for m in client.receive(queue, 10)) == sorted(ids[:2])
    assert client.depth(error) == 2
    with pytest.raises(ValueError, match="seqs"):
        client.retry_errors(error, seqs=[])
    with pytest.raises(ArgumentTypeError, match="seqs"):
        client.retry_errors(error, seqs=["1; DROP TABLE x"])  # type: ignore[list-item]


def test_retry_of_a_source_queue_reaches_failures_behind_other_queues(client, queue, schema, monkeypatch):
    """The oldest rows of a long error queue belong to another queue: a retry of orders still finds orders'."""
    monkeypatch.setattr(defaults, "ERROR_SCAN_ROWS", 7)
    error = QueueAddress("error", schema)
    other = QueueAddress("billing", schema)
    client.create_queue(other)
    fail_messages(client, other, 30, KeyError("first"))
    mine = fail_messages(client, queue, 5, ValueError("later"))

    assert client.retry_errors(error, queue=queue, limit=3) == 3
    page = client.retry_errors_page(error, queue=queue, after=0, limit=100)
    assert (page.retried, page.done) == (0, False)  # one bounded pass of 7 rows: billing's only
    assert client.retry_errors(error, queue=queue) == 2
    assert sorted(m.id for m in client.receive(queue, 10)) == sorted(mine)
    assert client.depth(error) == 30


def test_two_retries_at_once_move_each_message_once(backend, schema, queue):
    count = 300
    with backend.client(schema) as client:
        ids = fail_messages(client, queue, count, ValueError("x"))
    retried: list[int] = []

    def operator() -> None:
        with backend.client(schema) as mine:
            retried.append(mine.retry_errors(QueueAddress("error", schema), queue=queue, limit=count))

    threads = [threading.Thread(target=operator) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)

    with backend.client(schema) as client:
        back = client.browse(queue, count * 2)
        assert sum(retried) == count == len(back)
        assert sorted(m.id for m in back) == sorted(ids)
        assert client.depth(QueueAddress("error", schema)) == 0
