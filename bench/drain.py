"""The consumer loop and sends side by side with PgQueuer, raw psycopg, in one run on one server.

Same message for everyone: a 200-byte body and 10 headers of 20 characters. Measured, one after
the other on the same PostgreSQL, each into a fresh schema:

* drain ``--messages`` waiting messages with a consumer loop at ``--concurrency`` handlers:
  ``MessagePump`` in ``none`` mode and in ``claim`` mode (with acks), receiving one message per
  statement (as NServiceBus does) and ``--batch`` per statement; PgQueuer's ``QueueManager``
  (``mode=drain``, ``batch_size=--batch``); and the raw ``DELETE ... RETURNING`` of ``--batch`` rows
  per statement, typed by hand (the database's limit for this work, no handler at all);
* receive ``--batch`` and 1 message per call with ``QueueClient.receive`` against the same
  ``DELETE ... RETURNING`` typed by hand, in alternating rounds (best of three each);
* send one message per call and ``--batch`` per call: ``QueueClient.send`` against PgQueuer's
  ``Queries.enqueue``.

PgQueuer is not a dependency of this project: ``bash bench/run`` runs this script with
``uv run --with pgqueuer==...``. Without it installed the PgQueuer rows are skipped. Prints a table
of rates and ratios and writes JSON (``--json``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from airflow_provider_sqlqueue.transport import AsyncPsycopgPool, Message, MessagePump, QueueAddress, QueueClient

BODY = (b'{"order": 12345, "lines": [' + b'{"sku": "ABC-123", "qty": 1},' * 5 + b'{"sku": "END"}]}').ljust(200, b" ")
HEADERS = {f"Bench.Header{n:02d}": "v" * 20 for n in range(10)}
LOCAL_PG_URI = "postgresql://postgres@127.0.0.1:5432/test"


def database_uri(given: str | None) -> str:
    if given:
        return given
    try:
        psycopg.connect(LOCAL_PG_URI, connect_timeout=3).close()
        return LOCAL_PG_URI
    except psycopg.Error:
        raise SystemExit("no PostgreSQL: set SQLQUEUE_BENCH_PG_URI or pass --uri") from None


def fresh_schema(uri: str) -> str:
    schema = f"drain_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(uri, autocommit=True) as connection:
        connection.execute(f'CREATE SCHEMA "{schema}"')
    return schema


def drop_schema(uri: str, schema: str) -> None:
    with psycopg.connect(uri, autocommit=True) as connection:
        connection.execute(f'DROP SCHEMA "{schema}" CASCADE')


def fill(uri: str, schema: str, count: int) -> QueueAddress:
    queue = QueueAddress("orders", schema)
    with QueueClient.connect(uri) as client:
        client.create_queue(queue)  # a no-op when it exists
        for start in range(0, count, 1000):
            client.send(queue, [Message(BODY, HEADERS) for _ in range(min(1000, count - start))])
    return queue


async def drain_pump(uri: str, count: int, mode: str, concurrency: int, batch: int) -> float:
    schema = fresh_schema(uri)
    try:
        queue = fill(uri, schema, count)
        pool = AsyncPsycopgPool(uri, max_size=concurrency + 2)
        await pool.open()
        done = asyncio.Event()
        handled = 0

        async def handler(message: Any, connection: Any) -> None:
            nonlocal handled
            handled += 1
            if handled == count:
                done.set()

        pump = MessagePump(
            pool,
            queue,
            handler,
            transaction_mode=mode,
            max_concurrency=concurrency,
            receive_batch_size=batch,
            peek_batch_size=10 * batch,  # keep receiving while the peek says thousands wait
            peek_interval=0.1,
        )
        began = time.perf_counter()
        task = asyncio.create_task(pump.run())
        await done.wait()
        seconds = time.perf_counter() - began
        pump.stop()
        await task
        await pool.close()
        return count / seconds
    finally:
        drop_schema(uri, schema)


def drain_raw(uri: str, count: int, batch: int) -> float:
    schema = fresh_schema(uri)
    try:
        fill(uri, schema, count)
        table = f'"{schema}"."orders"'
        sql = (
            f"DELETE FROM {table} AS rs WHERE rs.Seq = ANY(ARRAY(SELECT Seq FROM {table} ORDER BY Seq "
            "LIMIT %s FOR UPDATE SKIP LOCKED)) RETURNING rs.Id, rs.Headers, rs.Body"
        )
        received = 0
        with psycopg.connect(uri, autocommit=True) as connection:
            began = time.perf_counter()
            while received < count:
                received += len(connection.execute(sql, (batch,)).fetchall())
            return count / (time.perf_counter() - began)
    finally:
        drop_schema(uri, schema)


RECEIVE_SQL = (
    "DELETE FROM {table} AS rs WHERE rs.Seq = ANY(ARRAY(SELECT Seq FROM {table} ORDER BY Seq LIMIT %s "
    "FOR UPDATE SKIP LOCKED)) RETURNING rs.Id, rs.Expires IS NOT NULL AND rs.Expires <= (now() AT TIME ZONE 'UTC'), "
    "rs.Headers, rs.Body, rs.Seq"
)


def receive_pair(uri: str, count: int, per_call: int, rounds: int = 3) -> tuple[float, float]:
    """``QueueClient.receive`` and the same DELETE ... RETURNING typed by hand, in alternating rounds.

    Each round refills the queue with ``count`` messages for each side; the best round of each is
    kept, so a burst of noise on this shared machine does not decide the ratio.
    """
    schema = fresh_schema(uri)
    try:
        queue = fill(uri, schema, 0)
        sql = RECEIVE_SQL.format(table=f'"{schema}"."orders"')
        ours: list[float] = []
        raw: list[float] = []
        with QueueClient.connect(uri) as client, psycopg.connect(uri, autocommit=True) as connection:
            for _ in range(rounds):
                fill(uri, schema, count)
                began = time.perf_counter()
                for _ in range(count // per_call):
                    client.receive(queue, per_call)
                ours.append(count / (time.perf_counter() - began))
                fill(uri, schema, count)
                began = time.perf_counter()
                for _ in range(count // per_call):
                    connection.execute(sql, (per_call,)).fetchall()
                raw.append(count / (time.perf_counter() - began))
        return max(ours), max(raw)
    finally:
        drop_schema(uri, schema)


def send_sqlqueue(uri: str, calls: int, per_call: int) -> float:
    schema = fresh_schema(uri)
    try:
        queue = fill(uri, schema, 0)
        with QueueClient.connect(uri) as client:
            batches = [[Message(BODY, HEADERS) for _ in range(per_call)] for _ in range(calls)]
            began = time.perf_counter()
            for batch in batches:
                client.send(queue, batch if per_call > 1 else batch[0])
            return calls * per_call / (time.perf_counter() - began)
    finally:
        drop_schema(uri, schema)


async def with_pgqueuer(uri: str, run: Callable[[Any, Any], Awaitable[float]]) -> float:
    """Install PgQueuer's tables in a fresh schema and run ``run(queries, connection)`` there.

    PgQueuer runs on asyncpg, its own first-choice driver (what its documentation benchmarks).
    """
    import asyncpg
    from pgqueuer import AsyncpgDriver, Queries

    schema = fresh_schema(uri)
    try:
        connection = await asyncpg.connect(uri, server_settings={"search_path": schema})
        queries = Queries(AsyncpgDriver(connection))
        await queries.install()
        try:
            return await run(queries, connection)
        finally:
            await connection.close()
    finally:
        drop_schema(uri, schema)


async def drain_pgqueuer(uri: str, count: int, batch: int) -> float:
    from pgqueuer import QueueManager
    from pgqueuer.types import QueueExecutionMode

    async def run(queries: Any, connection: Any) -> float:
        for start in range(0, count, 1000):
            n = min(1000, count - start)
            await queries.enqueue(["orders"] * n, [BODY] * n, [0] * n, headers=[HEADERS] * n)
        manager = QueueManager(queries)
        handled = 0

        @manager.entrypoint("orders")
        async def handle(job: Any) -> None:
            nonlocal handled
            handled += 1

        began = time.perf_counter()
        await manager.run(batch_size=batch, mode=QueueExecutionMode.drain)
        seconds = time.perf_counter() - began
        if handled != count:
            raise RuntimeError(f"PgQueuer handled {handled} of {count}")
        return count / seconds

    return await with_pgqueuer(uri, run)


async def send_pgqueuer(uri: str, calls: int, per_call: int) -> float:
    async def run(queries: Any, connection: Any) -> float:
        began = time.perf_counter()
        for _ in range(calls):
            if per_call == 1:
                await queries.enqueue("orders", BODY, headers=HEADERS)
            else:
                await queries.enqueue(
                    ["orders"] * per_call, [BODY] * per_call, [0] * per_call, headers=[HEADERS] * per_call
                )
        return calls * per_call / (time.perf_counter() - began)

    return await with_pgqueuer(uri, run)


def pgqueuer_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("pgqueuer")
    except Exception:  # not installed: its rows are skipped
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--uri", default=os.environ.get("SQLQUEUE_BENCH_PG_URI"))
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--json", type=Path, default=Path("bench/drain.json"))
    args = parser.parse_args()
    uri = database_uri(args.uri)
    n, c, b = args.messages, args.concurrency, args.batch
    pgq = pgqueuer_version()
    rows: dict[str, float] = {}
    rows["drain: raw DELETE ... RETURNING, batch"] = drain_raw(uri, n, b)
    rows["drain: MessagePump none, 1 per statement"] = asyncio.run(drain_pump(uri, n, "none", c, 1))
    rows["drain: MessagePump none, batch"] = asyncio.run(drain_pump(uri, n, "none", c, b))
    rows["drain: MessagePump claim + ack, 1 per statement"] = asyncio.run(drain_pump(uri, n, "claim", c, 1))
    rows["drain: MessagePump claim + ack, batch"] = asyncio.run(drain_pump(uri, n, "claim", c, b))
    if pgq:
        rows["drain: PgQueuer QueueManager, batch"] = asyncio.run(drain_pgqueuer(uri, n, b))
    rows[f"receive {b}: QueueClient"], rows[f"receive {b}: raw DELETE ... RETURNING"] = receive_pair(uri, n, b)
    rows["receive 1: QueueClient"], rows["receive 1: raw DELETE ... RETURNING"] = receive_pair(uri, 2000, 1)
    rows["send 1: QueueClient"] = send_sqlqueue(uri, 2000, 1)
    rows[f"send {b}: QueueClient"] = send_sqlqueue(uri, 200, b)
    if pgq:
        rows["send 1: PgQueuer enqueue"] = asyncio.run(send_pgqueuer(uri, 2000, 1))
        rows[f"send {b}: PgQueuer enqueue"] = asyncio.run(send_pgqueuer(uri, 200, b))

    print(f"\n{n} messages, concurrency {c}, batch {b}; PgQueuer {pgq or 'not installed'}\n")
    print("| workload | msg/s |")
    print("|---|---:|")
    for name, rate in rows.items():
        print(f"| {name} | {rate:,.0f} |")
    ratios: dict[str, float] = {}
    raw = rows["drain: raw DELETE ... RETURNING, batch"]
    ratios["pump none batch / raw batched DELETE"] = rows["drain: MessagePump none, batch"] / raw
    for per_call in (b, 1):
        ratios[f"receive {per_call} / raw DELETE ... RETURNING {per_call}"] = (
            rows[f"receive {per_call}: QueueClient"] / rows[f"receive {per_call}: raw DELETE ... RETURNING"]
        )
    if pgq:
        pq = rows["drain: PgQueuer QueueManager, batch"]
        ratios["pump none batch / PgQueuer drain"] = rows["drain: MessagePump none, batch"] / pq
        ratios["pump claim batch / PgQueuer drain"] = rows["drain: MessagePump claim + ack, batch"] / pq
        ratios[f"send {b} / PgQueuer enqueue {b}"] = (
            rows[f"send {b}: QueueClient"] / rows[f"send {b}: PgQueuer enqueue"]
        )
        ratios["send 1 / PgQueuer enqueue 1"] = rows["send 1: QueueClient"] / rows["send 1: PgQueuer enqueue"]
    print("\n| ratio | value |\n|---|---:|")
    for name, value in ratios.items():
        print(f"| {name} | {value:.2f} |")
    args.json.write_text(
        json.dumps(
            {
                "python": platform.python_version(),
                "pgqueuer": pgq,
                "messages": n,
                "concurrency": c,
                "batch": b,
                "rates": rows,
                "ratios": ratios,
            },
            indent=2,
        )
    )
    print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
