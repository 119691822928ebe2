"""Unit behaviour of :mod:`airflow_provider_sqlqueue.transport.meter`: every event a client or pump reports, counted.

A recording meter is given to real clients and a real pump on PostgreSQL; each event must be
reported once per message, against the queue it happened on.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from datetime import timedelta

import pytest

from airflow_provider_sqlqueue.transport import (
    ArgumentTypeError,
    AsyncPsycopgPool,
    Message,
    MessagePump,
    QueueAddress,
    QueueClient,
    ReceivedMessage,
)
from airflow_provider_sqlqueue.transport.meter import Event, Meter

pytestmark = pytest.mark.postgres_only


class Recording(Meter):
    def __init__(self) -> None:
        self.events: Counter[tuple[str, str]] = Counter()
        self.handler_times: list[float] = []

    def count(self, event: Event, queue: QueueAddress, n: int) -> None:
        assert n > 0
        self.events[(event, queue.table)] += n

    def handler_time(self, queue: QueueAddress, seconds: float) -> None:
        self.handler_times.append(seconds)


def test_the_default_meter_discards_and_a_wrong_one_is_refused(client: QueueClient, queue: QueueAddress) -> None:
    assert type(client.meter) is Meter
    client.send(queue, Message("x"))  # reported to nobody, no error
    with pytest.raises(ArgumentTypeError, match="meter must be"):
        client.meter = "statsd"  # type: ignore[assignment]


def test_a_clients_calls_are_counted_per_message(client: QueueClient, queue: QueueAddress, schema: str) -> None:
    meter = client.meter = Recording()
    client.send(queue, [Message(f"m{n}") for n in range(6)])
    client.send(queue, Message("later"), delay=0.001)
    client.receive(queue, 1)
    claimed = client.claim(queue, 3)
    client.ack(queue, [claimed[0].claim_token, claimed[1].claim_token])
    client.fail(queue, claimed[2], ValueError("no"))
    [other] = client.claim(queue, 1, lease=timedelta(milliseconds=1))
    time.sleep(0.05)  # its lease runs out
    [stolen] = client.claim(queue, 1)  # the lapsed claim, taken again: the first holder lost it
    assert stolen.id == other.id
    assert client.ack(queue, other.claim_token) is False
    client.nack(queue, stolen.claim_token)
    assert client.retry_errors(QueueAddress("error", schema)) == 1
    time.sleep(0.01)
    assert client.move_due(queue) == 1
    assert meter.events == {
        ("sent", "orders"): 7,
        ("received", "orders"): 6,  # 1 received, 3 + 1 + 1 claimed
        ("handled", "orders"): 2,
        ("moved_to_error", "orders"): 1,
        ("leases_lost", "orders"): 1,
        ("failed", "orders"): 1,
        ("retried", "error"): 1,
        ("moved_due", "orders"): 1,
    }


@pytest.mark.parametrize("mode", ["none", "claim", "native"])
def test_a_pumps_messages_are_counted_once_each(
    pg_uri: str, queue: QueueAddress, client: QueueClient, mode: str
) -> None:
    client.send(queue, [Message(f"m{n}", {"fail": "yes" if n % 4 == 0 else "no"}) for n in range(12)])
    meter = Recording()

    async def handler(message: ReceivedMessage, connection: object) -> None:
        if message.headers.get("fail") == "yes":
            raise ValueError("poison")

    async def run() -> None:
        pool = AsyncPsycopgPool(pg_uri, max_size=2)
        await pool.open()
        pump = MessagePump(
            pool, queue, handler, transaction_mode=mode, max_deliveries=2, peek_interval=0.05, meter=meter
        )
        task = asyncio.create_task(pump.run())
        try:
            for _ in range(400):
                await asyncio.sleep(0.05)
                if meter.events[("moved_to_error", "orders")] == 3 and meter.events[("handled", "orders")] == 9:
                    break
        finally:
            pump.stop()
            await task
            await pool.close()

    asyncio.run(run())
    # 9 good messages handled once; 3 poison ones tried max_deliveries times (once in none mode), then moved.
    tries = 1 if mode == "none" else 2
    assert meter.events[("handled", "orders")] == 9
    assert meter.events[("failed", "orders")] == 3 * tries
    assert meter.events[("moved_to_error", "orders")] == 3
    received = meter.events[("received", "orders")]
    assert received == 9 + 3 * tries + (3 if mode == "native" else 0)  # native receives a message to move it
    assert len(meter.handler_times) == 9 + 3 * tries and all(t >= 0 for t in meter.handler_times)


def test_a_pump_refuses_a_meter_that_is_not_one(pg_uri: str, queue: QueueAddress) -> None:
    async def handler(message: ReceivedMessage, connection: object) -> None:
        return None

    with pytest.raises(ArgumentTypeError, match="meter must be"):
        MessagePump(AsyncPsycopgPool(pg_uri, max_size=1), queue, handler, meter=print)  # type: ignore[arg-type]


class Broken(Meter):
    def count(self, event: Event, queue: QueueAddress, n: int) -> None:
        raise RuntimeError("statsd exploded")

    def handler_time(self, queue: QueueAddress, seconds: float) -> None:
        raise RuntimeError("statsd exploded")


def test_a_meter_that_raises_changes_nothing_the_client_or_pump_does(
    pg_uri: str, client: QueueClient, queue: QueueAddress, caplog: pytest.LogCaptureFixture
) -> None:
    client.meter = Broken()
    assert client.send(queue, [Message(f"m{n}") for n in range(6)]) == 6  # sent once, no error to retry on
    assert len(client.receive(queue, 2)) == 2  # received, not lost to an exception
    assert [r.getMessage() for r in caplog.records].count(
        "The meter Broken failed (RuntimeError: statsd exploded); its events are not counted"
    ) == 1  # said once
    handled: list[str] = []

    async def handler(message: ReceivedMessage, connection: object) -> None:
        handled.append(message.body.decode())

    async def run() -> None:
        pool = AsyncPsycopgPool(pg_uri, max_size=2)
        await pool.open()
        pump = MessagePump(pool, queue, handler, transaction_mode="none", peek_interval=0.05, meter=Broken())
        task = asyncio.create_task(pump.run())
        for _ in range(400):
            await asyncio.sleep(0.05)
            if len(handled) == 4:
                break
        pump.stop()
        await task
        await pool.close()
        with pytest.raises(ArgumentTypeError, match="meter must be"):
            pump.meter = None  # type: ignore[assignment]

    asyncio.run(run())
    assert sorted(handled) == ["m2", "m3", "m4", "m5"] and client.depth(queue) == 0


def test_duplicate_tokens_are_not_lost_leases(client: QueueClient, queue: QueueAddress) -> None:
    meter = client.meter = Recording()
    client.send(queue, [Message("a"), Message("b")])
    first, second = client.claim(queue, 2)
    client.extend(queue, [first.claim_token, first.claim_token])
    client.ack(queue, [second.claim_token, second.claim_token])
    assert ("leases_lost", "orders") not in meter.events and meter.events[("handled", "orders")] == 1


def test_a_native_batch_counts_each_move_to_the_error_queue_once(
    pg_uri: str, client: QueueClient, queue: QueueAddress, schema: str
) -> None:
    client.send(queue, [Message("p1"), Message("good1"), Message("p2"), Message("good2")])
    meter = Recording()

    async def batch_handler(messages: list[ReceivedMessage], connection: object) -> None:
        if any(m.body.startswith(b"p") for m in messages):
            raise ValueError("poison in the batch")

    async def run() -> None:
        pool = AsyncPsycopgPool(pg_uri, max_size=2)
        await pool.open()
        pump = MessagePump(
            pool,
            queue,
            None,
            batch_handler=batch_handler,
            transaction_mode="native",
            receive_batch_size=4,
            max_deliveries=2,
            peek_interval=0.05,
            meter=meter,
        )
        task = asyncio.create_task(pump.run())
        for _ in range(400):
            await asyncio.sleep(0.05)
            if client.depth(queue) == 0 and client.depth(QueueAddress("error", schema)) == 2:
                break
        pump.stop()
        await task
        await pool.close()

    asyncio.run(run())
    assert client.depth(QueueAddress("error", schema)) == 2
    assert meter.events[("moved_to_error", "orders")] == 2  # once each, though batches rolled back around them
    assert meter.events[("handled", "orders")] == 2
