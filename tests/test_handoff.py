"""Hand-off between a waiter and the task that works: reservations, taking, renewing, atomic forward.

The rules proven here are what the Airflow layer builds on: a reservation counts no delivery and
comes back after one short lease; taking it gives the message exactly one owner (a new token);
a holder that stays alive keeps its claims with :class:`LeaseKeeper`; an atomic forward sends a
stage's result only together with the acknowledgement of the claims it came from.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import Counter
from datetime import timedelta

import pytest

from airflow_provider_sqlqueue.transport import (
    Failure,
    LeaseKeeper,
    LeaseLostError,
    Message,
    QueueAddress,
    QueueClient,
)

pytestmark = pytest.mark.every_dialect


def error_headers(raw, backend, schema) -> list[dict]:
    rows = raw.execute(f"SELECT headers FROM {backend.table(schema, 'error')} ORDER BY {backend.seq}").fetchall()
    return [json.loads(headers) for (headers,) in rows]


def test_reservation_counts_no_delivery_and_comes_back_after_its_lease(client, queue):
    client.send(queue, Message("m"))
    [reserved] = client.reserve(queue, lease=0.2)
    assert reserved.deliveries == 0
    assert client.reserve(queue) == [] and client.peek(queue, include_claims=True) == 0
    time.sleep(0.35)  # the reserving waiter died: nobody took it
    for _ in range(7):  # lapsing again and again spends none of max_deliveries (5)
        [again] = client.reserve(queue, lease=0.01)
        assert again.id == reserved.id and again.deliveries == 0 and again.claim_token != reserved.claim_token
        time.sleep(0.03)
    [final] = client.reserve(queue)
    [taken] = client.take(queue, [final.claim_token], holder="task-1")
    assert (taken.id, taken.deliveries) == (reserved.id, 1)
    assert taken.claim_token != final.claim_token  # the reservation's token no longer settles anything
    assert client.ack(queue, final.claim_token) is False
    assert client.ack(queue, taken.claim_token) is True
    assert client.depth(queue) == 0 and client.in_flight(queue) == 0


def test_a_reservation_has_one_taker(client, queue):
    client.send(queue, [Message("a"), Message("b")])
    reserved = client.reserve(queue, 2)
    tokens = [m.claim_token for m in reserved]
    first = client.take(queue, tokens, holder="run-1")
    assert [m.text for m in first] == ["a", "b"]
    assert client.take(queue, tokens, holder="run-2") == []  # a stale event naming the same messages
    assert client.take(queue, holder="run-3") == []  # nothing left to adopt either
    assert client.ack(queue, [m.claim_token for m in first]) == {m.claim_token for m in first}


def test_take_checks_the_queue_of_the_token(client, queue, schema):
    other = QueueAddress("other", schema)
    client.create_queue(other)
    client.send(queue, Message("m"))
    [reserved] = client.reserve(queue)
    assert client.take(other, [reserved.claim_token]) == []
    assert client.ack(other, reserved.claim_token) is False
    assert client.in_flight(queue) == 1


def test_adopt_takes_every_reservation_of_the_queue_oldest_first(client, queue):
    client.send(queue, [Message(str(i)) for i in range(5)])
    client.reserve(queue, 2)
    client.reserve(queue, 2)
    [direct] = client.claim(queue)  # delivered to a handler already: not a reservation
    adopted = client.take(queue, holder="run-1")
    assert [m.text for m in adopted] == ["0", "1", "2", "3"] and all(m.deliveries == 1 for m in adopted)
    assert direct.text == "4"
    assert client.take(queue, holder="run-2") == []


def test_adopt_respects_limit(client, queue):
    client.send(queue, [Message(str(i)) for i in range(5)])
    client.reserve(queue, 5)
    assert [m.text for m in client.take(queue, limit=3)] == ["0", "1", "2"]
    assert [m.text for m in client.take(queue, limit=3)] == ["3", "4"]


def test_competing_adopters_split_the_reservations(backend, schema, client, queue):
    total = 400
    client.send(queue, [Message(str(i)) for i in range(total)])
    reserved = client.reserve(queue, total)
    assert len(reserved) == total
    got: list[str] = []
    lock = threading.Lock()

    def adopter() -> None:
        with QueueClient.connect(backend.uri) as mine:
            while taken := mine.take(queue, limit=7):
                with lock:
                    got.extend(m.text for m in taken)

    threads = [threading.Thread(target=adopter) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    counts = Counter(got)
    assert len(counts) == total and max(counts.values()) == 1  # nothing lost, nothing taken twice


def test_reservations_lapse_before_deliveries_count_and_takes_reach_max_deliveries(client, queue, raw, schema, backend):
    client.send(queue, Message("poison job"))
    for attempt in range(1, 4):
        [reserved] = client.reserve(queue, lease=0.01, max_deliveries=3)
        [taken] = client.take(queue, [reserved.claim_token], lease=0.01)
        assert taken.deliveries == attempt
        failure = Failure.of(FileNotFoundError(f"[PATH_NOT_FOUND] no such dataset (attempt {attempt})"), "dag.clean")
        assert client.nack(queue, taken.claim_token, error=failure) is True
    time.sleep(0.03)
    assert client.reserve(queue, max_deliveries=3) == []  # third failure was the last
    [headers] = error_headers(raw, backend, schema)
    assert headers["NServiceBus.ExceptionInfo.ExceptionType"] == "builtins.FileNotFoundError"
    assert headers["NServiceBus.ExceptionInfo.Message"] == "[PATH_NOT_FOUND] no such dataset (attempt 3)"
    assert headers["NServiceBus.ExceptionInfo.Source"] == "dag.clean"
    assert "FileNotFoundError" in headers["NServiceBus.ExceptionInfo.StackTrace"]
    assert headers["SqlQueue.DeliveryCount"] == "3"
    assert client.in_flight(queue) == 0


def test_forward_sends_and_acknowledges_in_one_transaction(client, queue, schema):
    target = QueueAddress("next", schema)
    client.create_queue(target)
    client.send(queue, [Message("a"), Message("b")])
    claimed = client.claim(queue, 2)
    sent = client.forward({queue: [m.claim_token for m in claimed]}, {target: [Message("A"), Message("B")]})
    assert sent == 2
    assert client.in_flight(queue) == 0 and [m.text for m in client.receive(target, 5)] == ["A", "B"]


def test_forward_with_a_lost_claim_sends_nothing_and_keeps_the_other_claims(client, queue, schema):
    target = QueueAddress("next", schema)
    client.create_queue(target)
    client.send(queue, [Message("a"), Message("b")])
    [a, b] = client.claim(queue, 2, lease=0.05)
    client.extend(queue, a.claim_token, timedelta(minutes=1))
    time.sleep(0.1)
    [b_again] = client.claim(queue)  # b's lease ran out: another consumer has it now
    assert b_again.id == b.id
    with pytest.raises(LeaseLostError, match="no longer held"):
        client.forward({queue: [a.claim_token, b.claim_token]}, {target: [Message("A+B")]})
    assert client.depth(target) == 0  # the result was not sent
    assert client.ack(queue, a.claim_token) is True  # and a's claim was not consumed by the failed forward
    assert client.ack(queue, b_again.claim_token) is True


def test_extend_and_settle_many_tokens_in_one_call(client, queue):
    client.send(queue, [Message(str(i)) for i in range(4)])
    claimed = client.claim(queue, 4)
    tokens = [m.claim_token for m in claimed]
    stranger = uuid.uuid4()
    assert client.extend(queue, [*tokens, stranger]) == set(tokens)
    assert client.nack(queue, tokens[:2], error="retry") == set(tokens[:2])
    assert client.ack(queue, tokens[2:]) == set(tokens[2:])
    assert [m.deliveries for m in client.claim(queue, 4)] == [2, 2]


def test_lease_keeper_keeps_claims_alive_and_reports_those_taken_by_others(backend, client, queue):
    client.send(queue, [Message("kept"), Message("dropped")])
    kept, dropped = client.claim(queue, 2, lease=1)
    key = client.session.dialect.format_address(queue)

    def open_client() -> QueueClient:
        return QueueClient.connect(backend.uri)

    # The shortest lease a keeper takes (defaults.MIN_RENEWED_LEASE), renewed every third of it.
    with LeaseKeeper(open_client, {key: [kept.claim_token, dropped.claim_token]}, timedelta(seconds=1)) as keeper:
        assert client.nack(queue, dropped.claim_token) is True  # given back: someone else takes it
        [retaken] = client.claim(queue)
        assert retaken.id == dropped.id
        time.sleep(2.5)  # past two leases: only the renewals keep "kept"
        assert client.claim(queue) == []
    assert keeper.renewals >= 3
    assert keeper.held == {key: {kept.claim_token}} and keeper.lost == {key: {dropped.claim_token}}
    assert client.ack(queue, kept.claim_token) is True
    assert client.ack(queue, retaken.claim_token) is True


def test_error_queue_defaults_to_the_queues_own_schema(backend, schema, raw):
    """Only defaults, in a non-default schema: poison rows, failures and retries all use <schema>.error."""
    with QueueClient.connect(backend.uri) as client:
        address = QueueAddress("orders", schema)
        client.create_queue(address)
        assert backend.tables(raw, schema) >= {"orders", "error"}
        backend.nservicebus_send(raw, schema, "orders", uuid.uuid4(), "not json", b"poison")
        client.send(address, Message("fails"))
        [message] = client.claim(address, max_deliveries=1)
        client.nack(address, message.claim_token, error=ValueError("bad row"))
        assert client.claim(address, max_deliveries=1) == []
        rows = raw.execute(f"SELECT headers FROM {backend.table(schema, 'error')} ORDER BY {backend.seq}").fetchall()
        assert rows[0][0] == "not json"  # moved unchanged
        assert json.loads(rows[1][0])["NServiceBus.ExceptionInfo.Message"] == "bad row"
        assert len(rows) == 2
        assert client.retry_errors(queue=address) == 1  # the poison row has no FailedQ: it stays
        assert [m.text for m in client.receive(address)] == ["fails"]
