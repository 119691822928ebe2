"""Claims found by holder, the write ledger and ranged browsing: what the Spark data source stands on.

Every count is checked against the tables: each message in exactly one share, settled once, a
partition recorded once however many attempts race for it.
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from airflow_provider_sqlqueue.transport import Message, QueueAddress, QueueClient

pytestmark = pytest.mark.every_dialect


def test_a_holders_claims_split_into_shares_that_cover_each_message_once(client, queue):
    client.send(queue, [Message(f"m{n}") for n in range(200)])
    taken = client.claim(queue, 120, holder="batch:1")
    client.claim(queue, 30, holder="batch:2")
    shares = [client.held(queue, "batch:1", parts=4, part=p) for p in range(4)]
    ids = [m.id for share in shares for m in share]
    assert sorted(ids) == sorted(m.id for m in taken) and len(set(ids)) == 120
    assert all(share for share in shares)  # consecutive Seq values spread over every share
    again = client.held(queue, "batch:1")  # reading again returns the same messages, in send order
    assert [m.text for m in again] == [m.text for m in taken]
    assert {m.deliveries for m in again} == {1}


def test_hold_takes_up_to_the_count_once_keeps_the_bodies_in_the_store_and_sends_poison_away(
    backend, client, queue, schema, raw
):
    client.send(queue, [Message(f"m{n}".encode()) for n in range(30)])
    address = client.address(queue)
    table = backend.table(schema, address.table)
    raw.execute(
        f"INSERT INTO {table} (Id, Headers, Body) VALUES (%s, %s, %s)", (str(uuid.uuid4()), "not json", b"poison")
    )
    assert client.hold(queue, "batch:7", 20) == 20
    first = client.held_columns(queue, "batch:7")
    client.send(queue, Message(b"later"))
    assert client.hold(queue, "batch:7", 25) == 20  # a repeated read holds the same, takes no more
    held = client.held_columns(queue, "batch:7")
    assert sorted(held.bodies) == sorted(first.bodies) == sorted(f"m{n}".encode() for n in range(20))
    assert client.hold(queue, "batch:8", 100) == 11  # the rest; the unreadable one went to the error queue
    assert client.depth(queue) == 0 and client.depth(client.error_address(None, address)) == 1


def test_acknowledging_a_holder_settles_its_claims_and_no_one_elses(client, queue):
    client.send(queue, [Message(str(n)) for n in range(50)])
    client.claim(queue, 20, holder="a")
    client.claim(queue, 10, holder="b")
    assert client.ack_held(queue, "a") == 20
    assert client.ack_held(queue, "a") == 0
    assert client.in_flight(queue) == 10 and client.depth(queue) == 20


def test_renewing_by_holder_revives_a_lapsed_claim_but_not_one_taken_over(client, queue):
    client.send(queue, [Message(str(n)) for n in range(10)])
    client.claim(queue, 10, lease=0.2, holder="old")
    time.sleep(0.5)
    taken = client.claim(queue, 4, holder="other")  # four lapsed claims change hands
    assert len(taken) == 4 and {m.deliveries for m in taken} == {2}
    assert client.extend_held(queue, "old", 60) == 6  # the other six were still its own
    assert client.lapsed_claims(queue) == 0
    assert client.claim(queue, 10, holder="third") == []  # nothing lapsed, nothing waiting
    assert len(client.held(queue, "old")) == 6 and len(client.held(queue, "other")) == 4


def test_giving_back_by_holder_redelivers_with_the_failure(client, queue):
    client.send(queue, [Message(str(n)) for n in range(5)])
    client.claim(queue, 5, holder="job")
    assert client.nack_held(queue, "job", error=ValueError("bad batch")) == 5
    again = client.claim(queue, 5, holder="retry")
    assert len(again) == 5 and {m.deliveries for m in again} == {2}
    assert client.held(queue, "job") == []


def test_held_refuses_a_share_outside_the_split(client, queue):
    with pytest.raises(ValueError, match="part must be"):
        client.held(queue, "x", parts=2, part=2)
    with pytest.raises(ValueError, match="parts must be"):
        client.held(queue, "x", parts=0)


def test_a_partition_is_recorded_once_and_a_rolled_back_record_is_forgotten(client, queue, schema):
    ledger = client.create_writes(QueueAddress("sqlqueue_writes", schema))
    write = uuid.uuid4()

    def failed_attempt() -> None:
        with client.transaction():
            assert client.record_write(ledger, write, 3)
            raise RuntimeError("the partition's send failed")

    with pytest.raises(RuntimeError):
        failed_attempt()
    with client.transaction():
        assert client.record_write(ledger, write, 3)  # the failed attempt left no trace
    with client.transaction():
        assert not client.record_write(ledger, write, 3)
    assert client.record_write(ledger, write, 4)
    assert client.forget_write(ledger, write) == 2
    assert client.record_write(ledger, write, 3)


def test_two_attempts_of_one_partition_at_once_send_it_once(backend, client, queue, schema):
    """A speculative task beside the original: the second recorder waits for the first's transaction."""
    ledger = client.create_writes(QueueAddress("sqlqueue_writes", schema))
    write = uuid.uuid4()
    results: list[bool] = []

    def attempt(sender: QueueClient, hold: float) -> None:
        with sender.transaction():
            recorded = sender.record_write(ledger, write, 0)
            results.append(recorded)
            if recorded:
                sender.send(queue, [Message(f"row{n}") for n in range(100)])
                time.sleep(hold)  # the other attempt arrives while this transaction is open

    with backend.client(schema) as first, backend.client(schema) as second:
        one = threading.Thread(target=attempt, args=(first, 1.0))
        one.start()
        time.sleep(0.3)
        attempt(second, 0)
        one.join()
    assert sorted(results) == [False, True]
    assert client.depth(queue) == 100


def test_a_queue_is_browsed_in_ranges_that_together_hold_each_message_once(client, queue):
    client.send(queue, [Message(f"m{n}") for n in range(250)])
    low, high = client.seq_range(queue)
    assert high - low == 249
    middle = low + 100
    seen = []
    for after, last in ((low - 1, middle), (middle, high)):
        while after is not None:
            page = client.browse_page(queue, 40, after=after, last=last)
            seen += [m.text for m in page.messages]
            after = page.after
    assert seen == [f"m{n}" for n in range(250)]
    assert client.depth(queue) == 250  # browsing took nothing


def test_an_empty_queue_has_no_range(client, queue):
    assert client.seq_range(queue) is None


def test_a_message_that_expires_while_held_is_not_handed_out_again(client, queue):
    client.send(queue, [Message("lasting"), Message("brief", time_to_be_received=1)])
    client.claim(queue, 2, holder="batch")
    assert sorted(m.text for m in client.held(queue, "batch")) == ["brief", "lasting"]
    time.sleep(1.5)
    assert [m.text for m in client.held(queue, "batch")] == ["lasting"]
    assert client.held_columns(queue, "batch").bodies == [b"lasting"]
    assert client.ack_held(queue, "batch") == 2  # the expired one is settled with the rest
    assert client.in_flight(queue) == 0
