"""The ``native`` mode's receives on each real database: the handler's writes commit with the receive or
roll back with it, failures are counted per message until ``max_deliveries`` moves it to the error
queue, and a batch handler's batch commits or rolls back whole."""

from __future__ import annotations

from collections import Counter

import pytest

from airflow_provider_sqlqueue.transport import Message, MessagePump, QueueAddress
from airflow_provider_sqlqueue.transport.drivers import open_pool
from airflow_provider_sqlqueue.transport.pump_native import FailureCounter
from tests.backends import aexecute
from tests.test_transport_pump import run_until

pytestmark = pytest.mark.every_dialect


@pytest.fixture
async def pool(backend):
    p = open_pool(backend.uri, max_size=6)
    await p.open()
    yield p
    await p.close()


def test_failures_are_counted_per_message_and_the_oldest_forgotten_first() -> None:
    failures = FailureCounter(capacity=2)
    assert failures.get("a") == (0, None)
    first, second = ValueError("first"), ValueError("second")
    assert failures.record("a", first) == 1
    assert failures.record("a", second) == 2
    assert failures.get("a") == (2, second)  # the last failure, for the error queue's headers
    failures.record("b", first)
    failures.record("a", first)  # counted again: now the newest
    failures.record("c", first)  # over capacity: b, the oldest, is forgotten
    assert failures.get("b") == (0, None) and failures.get("a")[0] == 3 and failures.get("c")[0] == 1
    failures.forget("a")
    assert failures.get("a") == (0, None)


async def test_native_pump_moves_repeatedly_failing_message_to_error_queue(pool, client, queue, raw, schema, backend):
    client.send(queue, [Message("ok-1"), Message("bad"), Message("ok-2")])
    raw.execute(f'CREATE TABLE "{schema}".side_effects (body {backend.text_type})')
    calls: Counter[str] = Counter()

    async def handler(message, connection):
        calls[message.text] += 1
        await aexecute(connection, f'INSERT INTO "{schema}".side_effects VALUES (%s)', (message.text,))
        if message.text == "bad":
            raise ValueError("cannot process")

    pump = MessagePump(
        pool,
        queue,
        handler,
        transaction_mode="native",
        error_queue=QueueAddress("error", schema),
        max_deliveries=3,
        peek_interval=0.05,
    )
    error_count = lambda: raw.execute(f'SELECT count(*) FROM "{schema}"."error"').fetchone()[0]  # noqa: E731
    await run_until(pump, lambda: error_count() == 1 and calls["ok-1"] and calls["ok-2"])
    assert calls == {"ok-1": 1, "ok-2": 1, "bad": 3}
    side_effects = sorted(r[0] for r in raw.execute(f'SELECT body FROM "{schema}".side_effects'))
    assert side_effects == ["ok-1", "ok-2"]  # the failed attempts rolled back with their receive
    headers = raw.execute(f'SELECT headers FROM "{schema}"."error"').fetchone()[0]
    assert '"NServiceBus.ExceptionInfo.Message":"cannot process"' in headers
    assert client.depth(queue) == 0


@pytest.mark.postgres_only
@pytest.mark.parametrize("batch", [False, True])
async def test_a_native_handler_that_ends_the_receive_and_begins_another_fails_its_delivery(
    pool, client, queue, raw, schema, batch
):
    """ROLLBACK then BEGIN in the handler: its work in the second transaction is not committed, each
    such delivery counts as failed, and the messages reach the error queue after max_deliveries
    instead of being handled again and again."""
    client.send(queue, [Message(f"m{n}") for n in range(3)])
    raw.execute(f'CREATE TABLE "{schema}".work (body text)')
    calls: Counter[str] = Counter()

    async def careless(messages, connection):
        for message in messages:
            calls[message.text] += 1
        await connection.execute("ROLLBACK; BEGIN")
        for message in messages:
            await connection.execute(f'INSERT INTO "{schema}".work VALUES (%s)', (message.text,))

    async def handler(message, connection):
        await careless([message], connection)

    pump = MessagePump(
        pool,
        queue,
        None if batch else handler,
        batch_handler=careless if batch else None,
        receive_batch_size=3 if batch else 1,
        transaction_mode="native",
        error_queue=QueueAddress("error", schema),
        max_deliveries=2,
        peek_interval=0.05,
    )
    error_count = lambda: raw.execute(f'SELECT count(*) FROM "{schema}"."error"').fetchone()[0]  # noqa: E731
    await run_until(pump, lambda: error_count() == 3)
    assert raw.execute(f'SELECT count(*) FROM "{schema}".work').fetchone()[0] == 0
    assert client.depth(queue) == 0
    assert all(n <= 3 for n in calls.values()), calls  # a batch's, then each alone: not again and again


async def test_a_native_batch_handler_commits_or_rolls_back_the_whole_batch(pool, client, queue, raw, schema, backend):
    """The handler's writes and the receive of every message of the batch commit together, or none do."""
    raw.execute(f'CREATE TABLE "{schema}".ledger (body {backend.text_type})')
    client.send(queue, [Message(f"m{i}") for i in range(12)] + [Message("poison-pill")])
    batches: list[list[str]] = []

    async def batch_handler(messages, connection):
        batches.append([m.text for m in messages])
        for message in messages:
            await aexecute(connection, f'INSERT INTO "{schema}".ledger VALUES (%s)', (message.text,))
        if "poison-pill" in batches[-1]:
            raise ValueError("this batch cannot be processed")

    pump = MessagePump(
        pool,
        queue,
        None,
        batch_handler=batch_handler,
        transaction_mode="native",
        error_queue=QueueAddress("error", schema),
        receive_batch_size=5,
        max_deliveries=2,
        peek_interval=0.05,
    )
    await run_until(pump, lambda: client.depth(QueueAddress("error", schema)) == 1)
    ledger = sorted(row[0] for row in raw.execute(f'SELECT body FROM "{schema}".ledger').fetchall())
    assert ledger == sorted(f"m{i}" for i in range(12))  # every failed batch's writes were rolled back
    assert client.depth(queue) == 0
    assert [m.text for m in client.browse(QueueAddress("error", schema))] == ["poison-pill"]
    # The last batch (m10, m11, the pill) failed whole; its messages then came one at a time: m10 and
    # m11 passed alone, and only the pill, failing alone twice, went to the error queue.
    assert batches[2] == ["m10", "m11", "poison-pill"] and batches[3:] == [
        ["m10"],
        ["m11"],
        ["poison-pill"],
        ["poison-pill"],
    ]
    assert pump.failed == 3 + 2
    assert pump.handled == 12
