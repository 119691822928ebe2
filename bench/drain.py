"""The consumer loop and sends side by side with PgQueuer and PGMQ, raw psycopg, in one run on one server.

Same message for everyone: a 200-byte body and 10 headers of 20 characters (PGMQ's: a 200-byte
JSON document and the headers as a JSON object). Measured on the same PostgreSQL, each into a
fresh schema (PGMQ: a fresh queue in its ``pgmq`` schema, installed once for the run):

In ``--rounds`` rotating rounds (each round runs every contender of a group once, the order
rotated by one each round; a ratio is the median over rounds of the ratio within a round, a rate
the median of the rounds):

* drain ``--messages`` waiting messages with ``--concurrency`` consumers, ``--batch`` per statement,
  a handler that only counts: ``MessagePump`` in ``none`` mode and in ``claim`` mode (with acks);
  PgQueuer's ``QueueManager`` (``mode=drain``, ``batch_size=--batch``); PGMQ's ``pgmq.pop`` loop
  (``qty=--batch``, ``--concurrency`` connections) beside ``none``, and its ``pgmq.read`` (30 s
  visibility) + ``pgmq.delete`` of the batch's ids beside ``claim``;
* one message, send to handled, on an idle consumer: ``--latency-messages`` messages sent one at
  a time with a random 20-80 ms gap (the same gaps for every contender of a round), p50 and p99:
  ``MessagePump`` at its constructor's defaults with ``QueueClient.send(..., notify=True)``;
  PgQueuer's ``QueueManager`` at its defaults (it LISTENs); PGMQ with
  ``pgmq.enable_notify_insert`` (throttle 0 ms: the default 250 ms drops notifications for sends
  closer together) and a consumer that LISTENs on ``pgmq.q_<queue>.INSERT`` on a connection of its
  own and then reads + deletes (reading again at least once a second if no notification came);
  the same pump fed by plain SQL ``INSERT`` statements into a queue made with
  ``notify_on_insert=True`` (as an NServiceBus endpoint sends); and, as a reference, the same
  default pump with ``notify=False`` sends (bound by its peek interval). Each starts idle: one
  warm-up message is handled and 0.5 s pass before the first.

Once each, as before:

* the raw ``DELETE ... RETURNING`` of ``--batch`` rows per statement, typed by hand (the database's
  limit for this work, no handler at all), and ``MessagePump`` receiving one message per statement
  (as NServiceBus does) in both modes;
* receive ``--batch`` and 1 message per call with ``QueueClient.receive`` against the same
  ``DELETE ... RETURNING`` typed by hand, in alternating rounds (best of three each);
* send one message per call and ``--batch`` per call: ``QueueClient.send`` against PgQueuer's
  ``Queries.enqueue``; and plain SQL sends of one message per statement into a queue with and
  without ``notify_on_insert`` (what the trigger costs).

PgQueuer and PGMQ are not dependencies of this project (``bench/peers.py``): ``bash bench/run``
runs this script with ``uv run --with pgqueuer==... --with asyncpg --with pgmq==...``. Without them
their rows are skipped. Prints a table of rates, latencies, ratios against their targets, and the
load average beside them (the machine may be shared), and writes JSON (``--json``).

    python3 -m uv run --no-sync --with pgqueuer==1.6.0 --with asyncpg --with pgmq==1.1.4 \\
        python bench/drain.py --json bench/drain.json
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from enum import Enum
from importlib import import_module
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from airflow_provider_sqlqueue.transport import AsyncPsycopgPool, Message, MessagePump, QueueAddress, QueueClient
from bench.peers import install_pgqueuer, missing, pgmq_installed, pgqueuer_queries, versions

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


def fill(uri: str, schema: str, count: int, notify_on_insert: bool = False) -> QueueAddress:
    queue = QueueAddress("orders", schema)
    with QueueClient.connect(uri) as client:
        client.create_queue(queue, notify_on_insert=notify_on_insert)  # a no-op when it exists
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


@asynccontextmanager
async def pgqueuer_schema(uri: str) -> AsyncIterator[tuple[str, Any, Any]]:
    """PgQueuer installed in a fresh schema: ``(schema, connection, queries)``, dropped afterwards.

    PgQueuer runs on asyncpg, its own first-choice driver (what its documentation benchmarks).
    """
    schema = fresh_schema(uri)
    try:
        await install_pgqueuer(uri, schema)
        connection, queries = await pgqueuer_queries(uri, schema)
        try:
            yield schema, connection, queries
        finally:
            if not connection.is_closed():
                await connection.close()
    finally:
        drop_schema(uri, schema)


async def with_pgqueuer(uri: str, run: Callable[[Any, Any], Awaitable[float]]) -> float:
    """Run ``run(queries, connection)`` in a fresh schema with PgQueuer installed."""
    async with pgqueuer_schema(uri) as (_, connection, queries):
        return await run(queries, connection)


async def drain_pgqueuer(uri: str, count: int, batch: int) -> float:
    pgqueuer = import_module("pgqueuer")
    types = import_module("pgqueuer.types")

    async def run(queries: Any, connection: Any) -> float:
        for start in range(0, count, 1000):
            n = min(1000, count - start)
            await queries.enqueue(["orders"] * n, [BODY] * n, [0] * n, headers=[HEADERS] * n)
        manager = pgqueuer.QueueManager(queries)
        handled = 0

        @manager.entrypoint("orders")
        async def handle(job: Any) -> None:
            nonlocal handled
            handled += 1

        began = time.perf_counter()
        await manager.run(batch_size=batch, mode=types.QueueExecutionMode.drain)
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


# PGMQ: its SQL functions (peer SQL), on psycopg; PGMQ's messages are JSON documents.
PGMQ_HEADERS = json.dumps(HEADERS)
PGMQ_VISIBILITY_S = 30


def pgmq_body(index: int = 0) -> str:
    """A 200-byte JSON document carrying ``index``."""
    head = f'{{"i": {index}, "pad": "'
    return head + " " * (len(BODY) - len(head) - 2) + '"}'


@contextmanager
def pgmq_queue(uri: str, notify: bool = False) -> Iterator[str]:
    """A fresh PGMQ queue (``pgmq.create``), dropped afterwards; ``notify``: NOTIFY on every insert."""
    name = f"drain_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(uri, autocommit=True) as connection:
        connection.execute("SELECT pgmq.create(%s)", [name])
        if notify:
            connection.execute("SELECT pgmq.enable_notify_insert(%s, 0)", [name])
    try:
        yield name
    finally:
        with psycopg.connect(uri, autocommit=True) as connection:
            connection.execute("SELECT pgmq.drop_queue(%s)", [name])


def pgmq_channel(name: str) -> str:
    """The channel PGMQ's insert trigger notifies: ``'pgmq.' || TG_TABLE_NAME || '.' || TG_OP``."""
    return f"pgmq.q_{name.lower()}.INSERT"


def fill_pgmq(uri: str, name: str, count: int) -> None:
    with psycopg.connect(uri, autocommit=True) as connection:
        for start in range(0, count, 1000):
            n = min(1000, count - start)
            connection.execute(
                "SELECT count(*) FROM pgmq.send_batch(%s, %s::jsonb[], %s::jsonb[])",
                [name, [pgmq_body()] * n, [PGMQ_HEADERS] * n],
            )


POP_SQL = "SELECT msg_id, message, headers FROM pgmq.pop(%s, %s::int)"
READ_SQL = "SELECT msg_id, message, headers FROM pgmq.read(%s, %s::int, %s::int)"
DELETE_SQL = "SELECT count(*) FROM pgmq.delete(%s, %s::bigint[])"


async def drain_pgmq(uri: str, count: int, concurrency: int, batch: int, how: str) -> float:
    """``concurrency`` connections looping ``pgmq.pop`` (``how="pop"``) or ``pgmq.read`` +
    ``pgmq.delete`` of the batch's ids (``how="read"``), each until its call returns nothing."""
    with pgmq_queue(uri) as name:
        fill_pgmq(uri, name, count)
        handled = 0

        async def handle(row: Any) -> None:  # a coroutine, as the pump's and PgQueuer's handlers are
            nonlocal handled
            handled += 1

        async def consume(connection: psycopg.AsyncConnection[Any]) -> None:
            while True:
                if how == "pop":
                    rows = await (await connection.execute(POP_SQL, [name, batch])).fetchall()
                    if not rows:
                        return
                    for row in rows:
                        await handle(row)
                else:
                    rows = await (await connection.execute(READ_SQL, [name, PGMQ_VISIBILITY_S, batch])).fetchall()
                    if not rows:
                        return
                    for row in rows:
                        await handle(row)
                    await connection.execute(DELETE_SQL, [name, [row[0] for row in rows]])

        connections = [await psycopg.AsyncConnection.connect(uri, autocommit=True) for _ in range(concurrency)]
        try:
            began = time.perf_counter()
            await asyncio.gather(*(consume(connection) for connection in connections))
            seconds = time.perf_counter() - began
        finally:
            for connection in connections:
                await connection.close()
        if handled != count:
            raise RuntimeError(f"PGMQ ({how}) handled {handled} of {count}")
        return count / seconds


# Latency: one message at a time on an idle consumer, send to handled.

WARM = -1  # the index of the warm-up message, handled before the measured ones and not counted
Send = Callable[[int], None]


#: A plain SQL send, as a program that is not this library writes a message.
PLAIN_INSERT = 'INSERT INTO "{schema}"."orders" (Id, Headers, Body) VALUES (gen_random_uuid(), %s, %s)'


def send_plain_sql(uri: str, count: int, notify_on_insert: bool) -> float:
    """Plain SQL sends of one message per statement (autocommit) per second, into a queue made with or
    without ``notify_on_insert``: what the trigger costs a sender that does not notify by itself."""
    schema = fresh_schema(uri)
    try:
        fill(uri, schema, 0, notify_on_insert)
        headers = json.dumps(HEADERS)
        with psycopg.connect(uri, autocommit=True) as connection:
            began = time.perf_counter()
            for _ in range(count):
                connection.execute(PLAIN_INSERT.format(schema=schema), (headers, BODY))
            return count / (time.perf_counter() - began)
    finally:
        drop_schema(uri, schema)


def latency_body(index: int) -> bytes:
    return f"{index:<12d}".encode().ljust(len(BODY), b" ")


def index_of(body: bytes) -> int:
    return int(body[:12])


class Clock:
    """When each message was sent and handled (``time.perf_counter``, one process), and the waits."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.sent: dict[int, float] = {}
        self.handled: dict[int, float] = {}
        self.warm = threading.Event()
        self.done = asyncio.Event()

    def handle(self, index: int) -> None:
        """Called on the consumer's event loop when message ``index`` is handled."""
        self.handled.setdefault(index, time.perf_counter())
        if index == WARM:
            self.warm.set()
        elif sum(1 for i in self.handled if i != WARM) >= self.count:
            self.done.set()

    def drive(self, open_sender: Callable[[], Any], gaps: list[float]) -> None:
        """In a thread: open the sender, send the warm-up message, wait for it, then one message per gap."""
        with open_sender() as send:
            send(WARM)
            if not self.warm.wait(10):
                raise RuntimeError("the warm-up message was not handled within 10 s")
            time.sleep(0.5)
            for index, gap in enumerate(gaps):
                self.sent[index] = time.perf_counter()
                send(index)
                time.sleep(gap)

    async def run(self, open_sender: Callable[[], Any], gaps: list[float], timeout: float = 30.0) -> dict[str, Any]:
        """Send (in a thread) and wait until every message is handled or ``timeout`` after the last send."""
        await asyncio.to_thread(self.drive, open_sender, gaps)
        try:
            await asyncio.wait_for(self.done.wait(), timeout)
        except TimeoutError:
            pass
        latencies = sorted(1000 * (self.handled[i] - self.sent[i]) for i in self.sent if i in self.handled)
        return {
            "sent": len(self.sent),
            "handled": len(latencies),
            "p50_ms": percentile(latencies, 0.50),
            "p99_ms": percentile(latencies, 0.99),
            "max_ms": latencies[-1] if latencies else None,
        }


def percentile(ordered: list[float], q: float) -> float | None:
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))] if ordered else None


def pump_defaults() -> dict[str, Any]:
    """MessagePump's constructor defaults where they are plain values (what the latency row runs with)."""
    found: dict[str, Any] = {}
    for name, parameter in inspect.signature(MessagePump).parameters.items():
        value = parameter.default
        if value is inspect.Parameter.empty:
            continue
        if isinstance(value, Enum):
            value = value.value
        if value is None or isinstance(value, (bool, int, float, str)):
            found[name] = value
    return found


async def latency_pump(uri: str, gaps: list[float], notify: bool, plain_sql: bool = False) -> dict[str, Any]:
    """``MessagePump(pool, queue, handler)`` at its defaults; sends with ``QueueClient.send(notify=...)``,
    or (``plain_sql``) with a plain SQL INSERT into a queue made with ``notify_on_insert=True``."""
    schema = fresh_schema(uri)
    try:
        queue = fill(uri, schema, 0, notify_on_insert=plain_sql)
        clock = Clock(len(gaps))
        concurrency = pump_defaults().get("max_concurrency") or 1
        pool = AsyncPsycopgPool(uri, max_size=int(concurrency) + 2)
        await pool.open()

        async def handler(message: Any, connection: Any) -> None:
            clock.handle(index_of(message.body))

        pump = MessagePump(pool, queue, handler)
        task = asyncio.create_task(pump.run())

        @contextmanager
        def open_sender() -> Iterator[Send]:
            if plain_sql:  # as an NServiceBus endpoint or any other program inserts
                with psycopg.connect(uri, autocommit=True) as raw:
                    headers = json.dumps(HEADERS)
                    yield lambda index: raw.execute(PLAIN_INSERT.format(schema=schema), (headers, latency_body(index)))
                return
            with QueueClient.connect(uri) as client:
                yield lambda index: client.send(queue, Message(latency_body(index), HEADERS), notify=notify)

        try:
            return await clock.run(open_sender, gaps)
        finally:
            pump.stop()
            await task
            await pool.close()
    finally:
        drop_schema(uri, schema)


async def latency_pgqueuer(uri: str, gaps: list[float]) -> dict[str, Any]:
    """PgQueuer's ``QueueManager.run()`` at its defaults (LISTEN on its channel); ``Queries.enqueue`` sends."""
    pgqueuer = import_module("pgqueuer")
    async with pgqueuer_schema(uri) as (schema, _, queries):
        clock = Clock(len(gaps))
        manager = pgqueuer.QueueManager(queries)

        async def handle(job: Any) -> None:
            clock.handle(index_of(job.payload))

        manager.entrypoint("orders")(handle)
        task = asyncio.create_task(manager.run())

        @contextmanager
        def open_sender() -> Iterator[Send]:
            loop = asyncio.new_event_loop()
            connection, sender = loop.run_until_complete(pgqueuer_queries(uri, schema))
            try:
                yield lambda index: loop.run_until_complete(
                    sender.enqueue("orders", latency_body(index), headers=HEADERS)
                )
            finally:
                loop.run_until_complete(connection.close())
                loop.close()

        try:
            return await clock.run(open_sender, gaps)
        finally:
            manager.shutdown.set()
            await task


async def latency_pgmq(uri: str, gaps: list[float]) -> dict[str, Any]:
    """PGMQ with ``enable_notify_insert`` (throttle 0): LISTEN on one connection, read + delete on another."""
    with pgmq_queue(uri, notify=True) as name:
        clock = Clock(len(gaps))
        wake = asyncio.Event()
        stop = asyncio.Event()
        listener = await psycopg.AsyncConnection.connect(uri, autocommit=True)
        reader = await psycopg.AsyncConnection.connect(uri, autocommit=True)
        await listener.execute(f'LISTEN "{pgmq_channel(name)}"')

        async def listen() -> None:
            async for _ in listener.notifies():
                wake.set()

        async def consume() -> None:
            while not stop.is_set():
                wake.clear()
                rows = await (await reader.execute(READ_SQL, [name, PGMQ_VISIBILITY_S, 100])).fetchall()
                if rows:
                    for _, message, _ in rows:
                        clock.handle(int(message["i"]))
                    await reader.execute(DELETE_SQL, [name, [row[0] for row in rows]])
                    continue
                try:
                    await asyncio.wait_for(wake.wait(), 1.0)
                except TimeoutError:
                    pass

        @contextmanager
        def open_sender() -> Iterator[Send]:
            with psycopg.connect(uri, autocommit=True) as connection:
                yield lambda index: connection.execute(
                    "SELECT pgmq.send(%s, %s::jsonb, %s::jsonb)", [name, pgmq_body(index), PGMQ_HEADERS]
                )

        tasks = [asyncio.create_task(listen()), asyncio.create_task(consume())]
        try:
            return await clock.run(open_sender, gaps)
        finally:
            stop.set()
            wake.set()
            tasks[0].cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await listener.close()
            await reader.close()


# Rounds

Contender = Callable[[int], Any]  # called with the round's number


def rotated(items: list[str], by: int) -> list[str]:
    by %= len(items)
    return items[by:] + items[:by]


def run_rounds(contenders: dict[str, Contender], rounds: int, what: str) -> list[dict[str, Any]]:
    """Every contender once per round, the order rotated by one each round; per round its results.

    A contender that fails is recorded as None in its round (with the error printed) and the rounds go on.
    """
    results: list[dict[str, Any]] = []
    for number in range(rounds):
        order = rotated(list(contenders), number)
        row: dict[str, Any] = {"round": number + 1, "order": order, "load_1m_before": round(os.getloadavg()[0], 2)}
        for name in order:
            try:
                row[name] = contenders[name](number)
            except Exception as exc:  # one failed measurement, not the run
                row[name] = None
                row.setdefault("errors", {})[name] = f"{type(exc).__name__}: {exc}"
            print(f"  {what} round {number + 1}: {name}: {row[name]}", flush=True)
        row["load_1m_after"] = round(os.getloadavg()[0], 2)
        results.append(row)
    return results


def median_of(rounds: list[dict[str, Any]], value: Callable[[dict[str, Any]], float | None]) -> float | None:
    """The median over rounds of ``value(round)`` (rounds where it is None left out)."""
    values = [v for v in (value(row) for row in rounds) if v is not None]
    return statistics.median(values) if values else None


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def quantile(row: dict[str, Any], name: str, q: str) -> float | None:
    result = row.get(name)
    return None if result is None else result.get(q)


@contextmanager
def pgmq_for_run(uri: str, wanted: bool) -> Iterator[str | None]:
    """PGMQ installed once for the whole run (dropped at its end if this run installed it)."""
    if not wanted:
        yield None
        return
    with pgmq_installed(uri) as how:
        yield how


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def measure(uri: str, args: argparse.Namespace, pgq: bool, pgmq: bool) -> dict[str, Any]:
    """Every measurement: the rotating rounds first (with PGMQ installed for them), then the rows run once."""
    n, c, b = args.messages, args.concurrency, args.batch

    def gaps(number: int) -> list[float]:
        """The round's gaps between latency sends: the same for every contender of the round."""
        rng = random.Random(args.seed * 1000 + number)
        return [rng.uniform(0.02, 0.08) for _ in range(args.latency_messages)]

    drains: dict[str, Contender] = {
        "pump none": lambda r: asyncio.run(drain_pump(uri, n, "none", c, b)),
        "pump claim": lambda r: asyncio.run(drain_pump(uri, n, "claim", c, b)),
    }
    waits: dict[str, Contender] = {
        "pump notify": lambda r: asyncio.run(latency_pump(uri, gaps(r), notify=True)),
        "pump no notify": lambda r: asyncio.run(latency_pump(uri, gaps(r), notify=False)),
        "pump plain SQL, notify_on_insert": lambda r: asyncio.run(
            latency_pump(uri, gaps(r), notify=False, plain_sql=True)
        ),
    }
    if pgq:
        drains["PgQueuer"] = lambda r: asyncio.run(drain_pgqueuer(uri, n, b))
        waits["PgQueuer"] = lambda r: asyncio.run(latency_pgqueuer(uri, gaps(r)))
    if pgmq:
        drains["PGMQ pop"] = lambda r: asyncio.run(drain_pgmq(uri, n, c, b, "pop"))
        drains["PGMQ read+delete"] = lambda r: asyncio.run(drain_pgmq(uri, n, c, b, "read"))
        waits["PGMQ notify"] = lambda r: asyncio.run(latency_pgmq(uri, gaps(r)))
    load: dict[str, Any] = {"start": loadavg()}
    with pgmq_for_run(uri, pgmq) as pgmq_install:
        drain_rounds = run_rounds(drains, args.rounds, "drain")
        load["after_drain_rounds"] = loadavg()
        latency_rounds = run_rounds(waits, args.rounds, "latency")
        load["after_latency_rounds"] = loadavg()

    rows: dict[str, float | None] = {}
    rows["drain: raw DELETE ... RETURNING, batch"] = drain_raw(uri, n, b)
    rows["drain: MessagePump none, 1 per statement"] = asyncio.run(drain_pump(uri, n, "none", c, 1))
    rows["drain: MessagePump claim + ack, 1 per statement"] = asyncio.run(drain_pump(uri, n, "claim", c, 1))
    labels = {
        "pump none": "drain: MessagePump none, batch",
        "pump claim": "drain: MessagePump claim + ack, batch",
        "PgQueuer": "drain: PgQueuer QueueManager, batch",
        "PGMQ pop": "drain: PGMQ pop, batch",
        "PGMQ read+delete": "drain: PGMQ read + delete, batch",
    }
    for name in drains:
        rows[labels[name]] = median_of(drain_rounds, lambda row, name=name: row[name])
    rows[f"receive {b}: QueueClient"], rows[f"receive {b}: raw DELETE ... RETURNING"] = receive_pair(uri, n, b)
    rows["receive 1: QueueClient"], rows["receive 1: raw DELETE ... RETURNING"] = receive_pair(uri, 2000, 1)
    rows["send 1: QueueClient"] = send_sqlqueue(uri, 2000, 1)
    rows[f"send {b}: QueueClient"] = send_sqlqueue(uri, 200, b)
    rows["send 1: plain SQL INSERT"] = send_plain_sql(uri, 2000, notify_on_insert=False)
    rows["send 1: plain SQL INSERT, notify_on_insert"] = send_plain_sql(uri, 2000, notify_on_insert=True)
    if pgq:
        rows["send 1: PgQueuer enqueue"] = asyncio.run(send_pgqueuer(uri, 2000, 1))
        rows[f"send {b}: PgQueuer enqueue"] = asyncio.run(send_pgqueuer(uri, 200, b))
    load["end"] = loadavg()
    latencies = {
        name: {q: median_of(latency_rounds, lambda row, name=name, q=q: quantile(row, name, q)) for q in QUANTILES}
        for name in waits
    }
    return {
        "pgmq_install": pgmq_install,
        "load_average_1_5_15": load,
        "rates": rows,
        "latency_ms": latencies,
        "drain_rounds": drain_rounds,
        "latency_rounds": latency_rounds,
    }


QUANTILES = ("p50_ms", "p99_ms", "max_ms")


def meets(value: float | None, target: str) -> bool | None:
    """Whether ``value`` meets a target written ``≥ x`` or ``≤ x`` (None: no value, or no target)."""
    if value is None or target[:1] not in ("≥", "≤"):
        return None
    bound = float(target.split()[1])
    return value >= bound if target.startswith("≥") else value <= bound


def ratios(result: dict[str, Any], b: int) -> list[dict[str, Any]]:
    """The ratios and their targets; a peer's ratio is the median over rounds of the same round's ratio."""
    rows, drains, waits = result["rates"], result["drain_rounds"], result["latency_rounds"]
    found: list[tuple[str, float | None, str]] = []

    def same_round(a: str, peer: str, q: str | None = None) -> float | None:
        if q is None:
            return median_of(drains, lambda row: ratio(row.get(a), row.get(peer)))
        return median_of(waits, lambda row: ratio(quantile(row, a, q), quantile(row, peer, q)))

    def has(peer: str) -> bool:
        return any(peer in row for row in drains)

    raw = rows["drain: raw DELETE ... RETURNING, batch"]
    found.append(("pump none batch / raw batched DELETE", ratio(rows["drain: MessagePump none, batch"], raw), "≥ 0.5"))
    for per_call in (b, 1):
        ours, theirs = rows[f"receive {per_call}: QueueClient"], rows[f"receive {per_call}: raw DELETE ... RETURNING"]
        found.append((f"receive {per_call} / raw DELETE ... RETURNING {per_call}", ratio(ours, theirs), "≥ 0.8"))
    for mode, peer, target in (
        ("none", "PgQueuer", "≥ 8"),
        ("none", "PGMQ pop", "≥ 3"),
        ("claim", "PgQueuer", "≥ 2"),
        ("claim", "PGMQ read+delete", "≥ 1.5"),
    ):
        if has(peer):
            found.append((f"pump {mode} batch / {peer} drain", same_round(f"pump {mode}", peer), target))
    latency = result["latency_ms"]["pump notify"]
    found.append(("idle pump, notify: p50 ms", latency["p50_ms"], "≤ 20 ms"))
    found.append(("idle pump, notify: p99 ms", latency["p99_ms"], "≤ 100 ms"))
    plain = result["latency_ms"]["pump plain SQL, notify_on_insert"]
    found.append(("idle pump, plain SQL into a notify_on_insert queue: p50 ms", plain["p50_ms"], "≤ 20 ms"))
    found.append(("idle pump, plain SQL into a notify_on_insert queue: p99 ms", plain["p99_ms"], "≤ 100 ms"))
    with_trigger, without = rows["send 1: plain SQL INSERT, notify_on_insert"], rows["send 1: plain SQL INSERT"]
    found.append(("plain SQL sends with notify_on_insert / without", with_trigger / without, ""))
    for peer in ("PgQueuer", "PGMQ notify"):
        if peer in result["latency_ms"]:
            for q in ("p50_ms", "p99_ms"):
                found.append((f"idle pump {q[:3]} / {peer} {q[:3]}", same_round("pump notify", peer, q), "≤ 1"))
    if f"send {b}: PgQueuer enqueue" in rows:
        found.append(
            (
                f"send {b} / PgQueuer enqueue {b}",
                ratio(rows[f"send {b}: QueueClient"], rows[f"send {b}: PgQueuer enqueue"]),
                "≥ 1.5",
            )
        )
        found.append(
            ("send 1 / PgQueuer enqueue 1", ratio(rows["send 1: QueueClient"], rows["send 1: PgQueuer enqueue"]), "—")
        )
    return [
        {"ratio": name, "value": value, "target": target, "met": meets(value, target)} for name, value, target in found
    ]


def report(
    args: argparse.Namespace, found: dict[str, str | None], result: dict[str, Any], table: list[dict[str, Any]]
) -> None:
    load = result["load_average_1_5_15"]
    print(
        f"\n{args.messages} messages, concurrency {args.concurrency}, batch {args.batch}, {args.rounds} rotating rounds; "
        f"PgQueuer {found['pgqueuer']}, PGMQ SQL {found['pgmq_sql']} (pgmq package {found['pgmq']}, "
        f"{result['pgmq_install']}); load average (1, 5, 15 min): {load}\n"
    )
    print("| workload | msg/s |\n|---|---:|")
    for name, rate in result["rates"].items():
        print(f"| {name} | {'—' if rate is None else f'{rate:,.0f}'} |")
    print(
        f"\n| one message, send → handled ({args.latency_messages} sent 20-80 ms apart), median of rounds "
        "| p50 ms | p99 ms | max ms |\n|---|---:|---:|---:|"
    )
    for name, values in result["latency_ms"].items():
        print(f"| {name} | " + " | ".join("—" if v is None else f"{v:.1f}" for v in values.values()) + " |")
    print("\n| ratio (peers: median of the same round's) | value | target | met |\n|---|---:|---|---|")
    for row in table:
        value = "—" if row["value"] is None else f"{row['value']:.2f}"
        print(f"| {row['ratio']} | {value} | {row['target']} | {({True: 'yes', False: 'NO'}).get(row['met'], '—')} |")


def source() -> dict[str, Any]:
    """The commit measured, and the product's files that differed from it (uncommitted work measured too)."""
    root = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout
        except (OSError, subprocess.CalledProcessError):
            return ""

    changed = git("status", "--porcelain", "--", "airflow_provider_sqlqueue")
    return {
        "commit": git("rev-parse", "HEAD").strip() or None,
        "uncommitted": [line[3:] for line in changed.splitlines()],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--uri", default=os.environ.get("SQLQUEUE_BENCH_PG_URI"))
    parser.add_argument("--messages", type=int, default=20_000, help="waiting messages each drain starts with")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3, help="rotating rounds of the drain and latency contenders")
    parser.add_argument("--latency-messages", type=int, default=200, help="messages sent one at a time per latency row")
    parser.add_argument("--seed", type=int, default=1, help="of the random gaps between latency sends")
    parser.add_argument("--json", type=Path, default=Path("bench/drain.json"))
    args = parser.parse_args()
    uri = database_uri(args.uri)
    found = versions()
    for peer in ("pgqueuer", "pgmq"):
        if missing(peer):
            print(f"{peer}: skipped, {missing(peer)}", flush=True)
    defaults, measured = pump_defaults(), source()
    print(json.dumps({"versions": found, "pump_defaults": defaults, "source": measured}), flush=True)
    result = measure(uri, args, pgq=missing("pgqueuer") is None, pgmq=missing("pgmq") is None)
    table = ratios(result, args.batch)
    report(args, found, result, table)
    settings = {key: value for key, value in vars(args).items() if key not in ("uri", "json")}
    args.json.write_text(
        json.dumps(
            {
                "python": platform.python_version(),
                "versions": found,
                "pump_defaults": defaults,
                "source": measured,
                "args": settings,
                **{key: value for key, value in result.items() if key not in ("drain_rounds", "latency_rounds")},
                "ratios": table,
                "drain_rounds": result["drain_rounds"],
                "latency_rounds": result["latency_rounds"],
            },
            indent=2,
        )
    )
    print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
