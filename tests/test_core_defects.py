"""Regression tests for defects found by adversarial testing of the transport core, one per defect."""

from __future__ import annotations

import time
import uuid

import pytest

from airflow_provider_sqlqueue.transport import Message, QueueAddress, QueueClient

pytestmark = pytest.mark.every_dialect


def test_poison_row_in_a_queue_that_is_its_own_error_queue_does_not_loop(backend, raw, schema):
    """D1: receiving from the error queue met its own poison row again and again inside one transaction."""
    with QueueClient.connect(backend.uri) as client:
        error = QueueAddress("error", schema)
        client.create_queue(QueueAddress("orders", schema))
        backend.nservicebus_send(raw, schema, "error", uuid.uuid4(), "not json", b"poison")
        client.send(error, Message("after the poison"))
        started = time.monotonic()
        assert [m.text for m in client.receive(error, 5)] == ["after the poison"]  # never blocked by it
        assert client.depth(error) == 1  # the poison row went to the back once, unchanged
        client.send(error, Message("claimed after the poison"))
        assert [m.text for m in client.claim(error, 5)] == ["claimed after the poison"]
        for take in (client.receive, client.claim):
            assert take(error, 5) == []  # only the poison row is left: the call returns
            assert client.depth(error) == 1
        assert time.monotonic() - started < 5


def test_claim_drops_a_run_of_expired_rows_and_returns_the_live_message_in_one_call(client, queue):
    """D3: claim mode stalled one expired row per call."""
    client.send(queue, [Message(f"stale {n}", time_to_be_received=0.001) for n in range(10)])
    time.sleep(0.05)
    client.send(queue, Message("live"))
    [message] = client.claim(queue, 1)
    assert message.text == "live"
    assert client.depth(queue) == 0


def test_a_token_settles_only_in_its_own_queue(client, queue, schema):
    """D10: ack("other_queue", token) used to remove a claim of another queue."""
    other = QueueAddress("other", schema)
    client.create_queue(other)
    client.send(queue, Message("m"))
    [claimed] = client.claim(queue)
    assert client.ack(other, claimed.claim_token) is False
    assert client.nack(other, claimed.claim_token) is False
    assert client.extend(other, claimed.claim_token) is False
    assert client.ack(queue, claimed.claim_token) is True
