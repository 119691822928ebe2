"""Unit behaviour of :mod:`airflow_provider_sqlqueue.transport.meter`: every event a client or pump reports, counted.

A recording meter is given to real clients and a real pump on PostgreSQL; each event must be
reported once per message, against the queue it happened on.
"""

from __future__ import annotations

import asyncio
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
    [stolen] = client.claim(queue, 1)  # the lapsed claim, taken again: the first holder lost it
    assert stolen.id == other.id
    assert client.ack(queue, other.claim_token) is False
    client.nack(queue, stolen.claim_token)
    assert client.retry_errors(QueueAddress("error", schema)) == 1
    import time

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
