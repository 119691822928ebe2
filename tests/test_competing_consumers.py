"""Competing consumer processes over thousands of messages: every message delivered exactly once, counted."""

from __future__ import annotations

import multiprocessing
from collections import Counter

import pytest

from airflow_provider_sqlqueue.transport import Message, QueueAddress, QueueClient
from tests.backends import execute_on

pytestmark = pytest.mark.every_dialect

MESSAGES = 4000
CONSUMERS = 4


def consume(uri: str, schema: str, mode: str, batch: int, start: multiprocessing.synchronize.Barrier) -> list[str]:
    """Drain the queue in one process; in native mode record each message in a ledger in the same transaction."""
    queue = QueueAddress("orders", schema)
    seen: list[str] = []
    with QueueClient.connect(uri, error_queue=QueueAddress("error", schema)) as client:
        start.wait()
        empty_in_a_row = 0
        while empty_in_a_row < 3:
            if mode == "none":
                got = [m.text for m in client.receive(queue, batch)]
            elif mode == "claim":
                claims = client.claim(queue, batch)
                got = [m.text for m in claims]
                for claim in claims:
                    assert client.ack(queue, claim.claim_token)
            else:
                with client.receive_native(queue) as message:
                    got = []
                    if message is not None:
                        execute_on(client.session, f'INSERT INTO "{schema}".ledger VALUES (%s)', (message.text,))
                        got = [message.text]
            empty_in_a_row = 0 if got else empty_in_a_row + 1
            seen.extend(got)
    return seen


@pytest.mark.parametrize(("mode", "batch"), [("none", 1), ("none", 25), ("claim", 1), ("claim", 10), ("native", 1)])
def test_competing_consumers_deliver_each_message_exactly_once(backend, client, queue, raw, schema, mode, batch):
    raw.execute(f'CREATE TABLE "{schema}".ledger (body {backend.text_type})')
    expected = [f"m-{i:05d}" for i in range(MESSAGES)]
    client.send(queue, [Message(body) for body in expected])

    ctx = multiprocessing.get_context("spawn")
    start = ctx.Manager().Barrier(CONSUMERS)
    with ctx.Pool(CONSUMERS) as pool:
        results = pool.starmap(consume, [(backend.uri, schema, mode, batch, start)] * CONSUMERS)

    delivered = Counter(body for result in results for body in result)
    assert sum(delivered.values()) == MESSAGES, "a message was lost or delivered twice"
    assert sorted(delivered) == expected
    assert max(delivered.values()) == 1
    assert sum(1 for result in results if result) >= 2, "consumers did not actually compete"
    assert client.depth(queue) == 0 and client.in_flight(queue) == 0
    if mode == "native":
        ledger = Counter(r[0] for r in raw.execute(f'SELECT body FROM "{schema}".ledger').fetchall())
        assert sorted(ledger) == expected and max(ledger.values()) == 1
