"""Consumers while the xmin horizon is pinned: do they fall behind as dead tuples pile up?

A producer sends ``--rate`` messages a second (200-byte bodies, in batches every 20 ms) for the
whole run; a consumer drains the queue in one mode (``none``, ``claim`` + ``ack``, ``native``, or
a peer: ``pgqueuer``, ``pgmq``). After ``--warm`` seconds a REPEATABLE READ session takes a
snapshot and holds it for ``--pin`` seconds (as a report, a ``pg_dump`` or an idle-in-transaction
session would), so vacuum can remove none of the rows consumed meanwhile; then it commits and the
run goes on for ``--after`` seconds. Per 10 s window: what arrived, what was handled, and the
handling latency (send to handled) at p50 and p99; and the dead tuples each consumed message
left in the tables of the queue's schema. Each mode runs on its own fresh queue, one after the
other, on the same server in the same run.

    python3 -m uv run --no-sync --with pgqueuer==1.6.0 --with asyncpg --with pgmq==1.1.4 \\
        python bench/ageing.py --json bench/ageing.json

Each mode runs beside its baseline ``<mode>/start``: the same consumer with every scan starting from
the head of the index, as before sessions kept a head (``transport/heads.py``). A mode "falls behind" in the first window that handles less than 95 % of what arrived (with the
backlog carried); it is "current" again after the release once a window's p99 is at most 0.5 s
and its backlog is under 1 % of a window's arrivals (a batch straddling the window edge).

The peers, with the same producer rate, body size, pin and windows:

* ``pgqueuer``: PgQueuer's tables installed in a fresh schema (as ``bench/drain.py`` does), its
  ``Queries.enqueue`` sending each batch and its ``QueueManager`` dequeuing 50 at a time on
  asyncpg; a message counts as handled when its entrypoint runs (PgQueuer deletes the job and logs
  it in a buffered statement after that).
* ``pgmq``: PGMQ's SQL (the ``pgmq.sql`` that the ``pgmq`` Python package ships) installed into a
  schema ``pgmq`` for the run and dropped after it (a ``pgmq`` schema already there is left alone
  and the row skipped); ``pgmq.send_batch`` sends, and the consumer calls ``pgmq.read`` for 50 with a 30 s
  visibility timeout and ``pgmq.delete`` for their ids, over psycopg; handled once deleted.

Neither is a dependency of this project: ``bash bench/run`` runs this script with
``uv run --with pgqueuer==... --with asyncpg --with pgmq==...``; without them their rows are
skipped with the reason printed.

This server may be shared: a mode whose producer or consumer dies (the server refusing it, say
with its lock table full) is run again from the start, up to ``--attempts`` times; a row says how
many it took. Each window also says how old the oldest transaction of another session holding the
horizon back was (``others_oldest_xact_s``: one with a transaction id anywhere on the server, or a
snapshot in this database), so a pin that was not the bench's own shows in the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from importlib import import_module
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg

from airflow_provider_sqlqueue.transport import Message, QueueAddress, QueueClient, heads
from bench.peers import PEERS, PGMQ_SCHEMA, install_pgmq, install_pgqueuer, missing, pgqueuer_queries, versions
from bench.throughput import database

WINDOW = 10.0
BATCH_EVERY = 0.02
BODY = 200
BATCH = 50
QUEUE = "bench"
PGMQ_VISIBILITY_S = 30

Send = Callable[[float, int], None]


def body(sent: float) -> bytes:
    return f"{sent:.6f}".encode().ljust(BODY, b" ")


def json_body(sent: float) -> str:
    """PGMQ's messages are JSON: the send time and padding, 200 bytes of JSON text."""
    head = f'{{"sent": {sent:.6f}, "pad": "'
    return head + " " * (BODY - len(head) - 2) + '"}'


@contextmanager
def sender(uri: str, schema: str, mode: str) -> Iterator[Send]:
    """``send(stamp, n)``: one batch of ``n`` messages sent at ``stamp``, through the mode's own producer."""
    if mode == "pgqueuer":
        loop = asyncio.new_event_loop()
        connection, queries = loop.run_until_complete(pgqueuer_queries(uri, schema))

        def send_pgqueuer(stamp: float, n: int) -> None:
            loop.run_until_complete(queries.enqueue([QUEUE] * n, [body(stamp)] * n, [0] * n))

        try:
            yield send_pgqueuer
        finally:
            loop.run_until_complete(connection.close())
            loop.close()
    elif mode == "pgmq":
        with psycopg.connect(uri, autocommit=True) as connection:

            def send_pgmq(stamp: float, n: int) -> None:
                connection.execute("SELECT pgmq.send_batch(%s, %s::jsonb[])", [QUEUE, [json_body(stamp)] * n])

            yield send_pgmq
    else:
        queue = QueueAddress(QUEUE, schema)
        with QueueClient.connect(uri) as client:

            def send_sqlqueue(stamp: float, n: int) -> None:
                client.send(queue, [Message(body(stamp)) for _ in range(n)])

            yield send_sqlqueue


def produce(uri: str, schema: str, mode: str, rate: int, seconds: float, sent: Any) -> None:
    """Send ``rate`` messages a second in batches, on schedule (a late batch is sent at once)."""
    per_batch = max(1, round(rate * BATCH_EVERY))
    with sender(uri, schema, mode) as send:
        start = time.monotonic()
        batches = 0
        while (now := time.monotonic()) - start < seconds:
            due = start + batches * BATCH_EVERY
            if now < due:
                time.sleep(due - now)
            stamp = time.time()
            send(stamp, per_batch)
            sent.append((stamp, per_batch))
            batches += 1


def handled_times(messages: list[Any], times: list[tuple[float, float]]) -> None:
    now = time.time()
    times.extend((now, float(m.body[:20].decode())) for m in messages)


def consume(uri: str, schema: str, mode: str, seconds: float, out: Any) -> None:
    """Drain the queue in ``mode`` until ``seconds`` have passed; record (handled at, sent at) per message.

    ``<mode>/start``: the same consumer with every scan starting from the head of the Seq index and
    every look by time reaching back all the way, as before sessions kept heads: the baseline.
    """
    if mode == "pgqueuer":
        out.extend(asyncio.run(consume_pgqueuer(uri, schema, seconds)))
        return
    if mode == "pgmq":
        out.extend(consume_pgmq(uri, seconds))
        return
    mode, _, variant = mode.partition("/")
    if variant == "start":
        heads.Head.start = lambda self: 0  # type: ignore[method-assign]
        heads.Head.look_back_ms = lambda self, look: heads.EVERYTHING_MS  # type: ignore[method-assign]
    queue = QueueAddress(QUEUE, schema)
    times: list[tuple[float, float]] = []
    end = time.monotonic() + seconds
    with QueueClient.connect(uri) as client:
        while time.monotonic() < end:
            if mode == "none":
                got = client.receive(queue, BATCH)
                handled_times(got, times)
            elif mode == "claim":
                got = client.claim(queue, BATCH)
                if got:
                    client.ack(queue, [m.claim_token for m in got if m.claim_token is not None])
                handled_times(got, times)
            else:
                got = []
                for _ in range(BATCH):
                    with client.receive_native(queue) as message:
                        if message is None:
                            break
                        got.append(message)
                handled_times(got, times)
            if not got:
                time.sleep(0.005)
    out.extend(times)


async def consume_pgqueuer(uri: str, schema: str, seconds: float) -> list[tuple[float, float]]:
    """PgQueuer's ``QueueManager`` dequeuing ``BATCH`` at a time; the entrypoint records the send time."""
    pgqueuer = import_module("pgqueuer")
    connection, queries = await pgqueuer_queries(uri, schema)
    manager = pgqueuer.QueueManager(queries)
    times: list[tuple[float, float]] = []

    async def handle(job: Any) -> None:
        times.append((time.time(), float(job.payload[:20].decode())))

    manager.entrypoint(QUEUE)(handle)
    asyncio.get_running_loop().call_later(seconds, manager.shutdown.set)
    try:
        await manager.run(batch_size=BATCH)
    finally:
        if not connection.is_closed():
            await connection.close()
    return times


def consume_pgmq(uri: str, seconds: float) -> list[tuple[float, float]]:
    """``pgmq.read`` of ``BATCH`` messages, then ``pgmq.delete`` of their ids; handled once deleted."""
    times: list[tuple[float, float]] = []
    end = time.monotonic() + seconds
    with psycopg.connect(uri, autocommit=True) as connection:
        while time.monotonic() < end:
            rows = connection.execute(
                "SELECT msg_id, (message->>'sent')::float8 FROM pgmq.read(%s, %s::int, %s::int)",
                [QUEUE, PGMQ_VISIBILITY_S, BATCH],
            ).fetchall()
            if not rows:
                time.sleep(0.005)
                continue
            connection.execute("SELECT pgmq.delete(%s, %s::bigint[])", [QUEUE, [msg_id for msg_id, _ in rows]])
            now = time.time()
            times.extend((now, sent) for _, sent in rows)
    return times


def dead_tuples(raw: psycopg.Connection[Any], schema: str) -> int:
    """Dead tuples in every table of ``schema``: the queue's own (and a peer's log and archive tables)."""
    row = raw.execute(
        "SELECT COALESCE(sum(n_dead_tup), 0) FROM pg_stat_user_tables WHERE schemaname = %s", [schema]
    ).fetchone()
    return int(row[0]) if row else 0


@contextmanager
def pinned(uri: str) -> Iterator[None]:
    """A REPEATABLE READ snapshot held open: the xmin horizon stays where it is while the block runs."""
    with psycopg.connect(uri) as pin:
        pin.execute("SET application_name = 'sqlqueue-bench-pin'")
        pin.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        pin.execute("SELECT count(*) FROM pg_class")  # takes the snapshot
        yield
        pin.execute("COMMIT")


def install(raw: psycopg.Connection[Any], uri: str, schema: str, mode: str) -> None:
    """The mode's queue, in ``schema`` (made empty by the caller)."""
    if mode == "pgqueuer":
        asyncio.run(install_pgqueuer(uri, schema))
    elif mode == "pgmq":
        install_pgmq(raw)
        raw.execute("SELECT pgmq.create(%s)", [QUEUE])
    else:
        with QueueClient.connect(uri) as client:
            client.create_queue(QueueAddress(QUEUE, schema))


class AttemptFailedError(Exception):
    """A producer or consumer process died (the server refused it something): the mode is run again."""


def wait(seconds: float, processes: list[multiprocessing.Process]) -> None:
    """Sleep ``seconds``; stop early with :class:`AttemptFailedError` once one of ``processes`` has failed."""
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        time.sleep(min(0.5, left))
        if any(process.exitcode for process in processes):
            raise AttemptFailedError


OTHERS_SQL = """
SELECT COALESCE(EXTRACT(epoch FROM max(now() - xact_start)), 0)::float8 FROM pg_stat_activity
WHERE pid <> pg_backend_pid() AND application_name <> 'sqlqueue-bench-pin' AND xact_start IS NOT NULL
  AND (backend_xid IS NOT NULL OR (backend_xmin IS NOT NULL AND datname = current_database()))
"""


@contextmanager
def watch_others(uri: str, samples: list[tuple[float, float]]) -> Iterator[None]:
    """Once a second, the age of the oldest transaction that holds the horizon back besides the bench's pin.

    The consumers' own transactions last milliseconds; anything older is another session on this
    shared server (a test suite's) that pins the horizon too, inside or outside the pin.
    """
    stop = threading.Event()

    def run() -> None:
        with psycopg.connect(uri, autocommit=True) as connection:
            while not stop.wait(1.0):
                row = connection.execute(OTHERS_SQL).fetchone()
                samples.append((time.time(), float(row[0]) if row else 0.0))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def run_mode(uri: str, mode: str, args: argparse.Namespace) -> dict[str, Any] | None:
    """The mode's row, run again (up to ``--attempts``) when a process of its run failed."""
    reason = missing(mode)
    if reason:
        print(f"{mode}: skipped, {reason}", flush=True)
        return None
    for attempt in range(1, args.attempts + 1):
        try:
            result = run_attempt(uri, mode, args)
        except AttemptFailedError:
            print(f"{mode}: attempt {attempt} failed (a producer or consumer died, see above)", flush=True)
            continue
        except Exception as exc:  # the server refused the set-up or a look (e.g. its lock table full): again
            print(f"{mode}: attempt {attempt} failed: {type(exc).__name__}: {exc}", flush=True)
            continue
        if result is not None:
            result["attempts"] = attempt
        return result
    print(f"{mode}: skipped, all {args.attempts} attempts failed", flush=True)
    return None


def run_attempt(uri: str, mode: str, args: argparse.Namespace) -> dict[str, Any] | None:
    schema = PGMQ_SCHEMA if mode == "pgmq" else f"ageing_{mode.replace('/', '_')}_{uuid.uuid4().hex[:6]}"
    total = args.warm + args.pin + args.after
    with psycopg.connect(uri, autocommit=True) as raw:
        if raw.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", [schema]).fetchone():
            print(
                f"{mode}: skipped, a schema {schema} is already in this database (not the bench's to drop)", flush=True
            )
            return None
        raw.execute(f'CREATE SCHEMA "{schema}"')
        try:
            install(raw, uri, schema, mode)
            others: list[tuple[float, float]] = []
            with multiprocessing.Manager() as manager, watch_others(uri, others):
                sent, handled = manager.list(), manager.list()
                processes = [
                    multiprocessing.Process(target=consume, args=(uri, schema, mode, total + 5, handled))
                    for _ in range(args.consumers)
                ]
                processes.append(
                    multiprocessing.Process(target=produce, args=(uri, schema, mode, args.rate, total, sent))
                )
                try:
                    for process in processes:
                        process.start()
                    start = time.time()
                    wait(args.warm, processes)
                    before = dead_tuples(raw, schema)
                    with pinned(uri):
                        pinned_at = time.time()
                        wait(args.pin, processes)
                        during = dead_tuples(raw, schema)
                    released_at = time.time()
                    for process in processes:
                        process.join()
                    if any(process.exitcode for process in processes):
                        raise AttemptFailedError
                    sent_list, handled_list = list(sent), list(handled)
                finally:
                    for process in processes:
                        if process.is_alive():
                            process.terminate()
                            process.join()
            handled_during = sum(1 for at, _ in handled_list if pinned_at <= at < released_at)
            return summarise(
                mode,
                sent_list,
                handled_list,
                start,
                pinned_at,
                released_at,
                dead_per_message=(during - before) / max(1, handled_during),
                others=others,
            )
        finally:
            drop_schema(raw, schema)


def drop_schema(raw: psycopg.Connection[Any], schema: str) -> None:
    """Drop the run's schema, trying again for a while if the server refuses (a full lock table passes)."""
    for tries_left in reversed(range(10)):
        try:
            raw.execute(f'DROP SCHEMA "{schema}" CASCADE')
            return
        except psycopg.OperationalError:
            if not tries_left:
                raise
            time.sleep(3)


def summarise(
    mode: str,
    sent: list[tuple[float, int]],
    handled: list[tuple[float, float]],
    start: float,
    pinned_at: float,
    released_at: float,
    dead_per_message: float,
    others: Sequence[tuple[float, float]] = (),
) -> dict[str, Any]:
    windows: list[dict[str, Any]] = []
    backlog = 0
    edges = [start + i * WINDOW for i in range(int((max(at for at, _ in handled) - start) // WINDOW) + 1)]
    for low in edges:
        high = low + WINDOW
        arrived = sum(n for at, n in sent if low <= at < high)
        latencies = sorted(at - sent_at for at, sent_at in handled if low <= at < high)
        done = len(latencies)
        due = arrived + backlog
        backlog = max(0, due - done)
        windows.append(
            {
                "from_s": round(low - start),
                "pinned": pinned_at <= low < released_at or low < pinned_at < high,
                "arrived": arrived,
                "handled": done,
                "backlog": backlog,
                "p50_ms": round(1000 * latencies[len(latencies) // 2]) if latencies else None,
                "p99_ms": round(1000 * latencies[int(len(latencies) * 0.99)]) if latencies else None,
                "others_oldest_xact_s": round(max((age for at, age in others if low <= at < high), default=0.0), 1),
            }
        )
    behind = next((w for w in windows if w["arrived"] and w["handled"] < 0.95 * w["arrived"]), None)
    after = [w for w in windows if w["from_s"] >= released_at - start]
    current = next((w for w in after if w["backlog"] <= 0.01 * w["arrived"] and (w["p99_ms"] or 0) <= 500), None)
    during = [w for w in windows if w["pinned"] and w["p99_ms"] is not None]
    return {
        "mode": mode,
        "fell_behind_at_s": None if behind is None else behind["from_s"],
        "pin_from_s": round(pinned_at - start),
        "release_at_s": round(released_at - start),
        "worst_p99_ms_pinned": max((w["p99_ms"] for w in during), default=None),
        "median_p50_ms_pinned": statistics.median(w["p50_ms"] for w in during) if during else None,
        "current_again_at_s": None if current is None else current["from_s"],
        "dead_tuples_per_message": round(dead_per_message, 2),
        "others_oldest_xact_s_unpinned": max(
            (w["others_oldest_xact_s"] for w in windows if not w["pinned"]), default=0.0
        ),
        "windows": windows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--uri")
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--warm", type=float, default=20)
    parser.add_argument("--pin", type=float, default=180)
    parser.add_argument("--after", type=float, default=40)
    parser.add_argument("--consumers", type=int, default=1)
    parser.add_argument("--attempts", type=int, default=3, help="runs of a mode whose producer or consumer died")
    parser.add_argument(
        "--modes",
        nargs="+",
        default=["none", "none/start", "claim", "claim/start", "native", "native/start", *PEERS],
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    found = versions()
    print(json.dumps({"versions": found}), flush=True)
    results: list[dict[str, Any]] = []
    with database(args.uri) as uri:
        for mode in args.modes:
            result = run_mode(uri, mode, args)
            if result is None:
                continue
            results.append(result)
            shown = {key: value for key, value in result.items() if key != "windows"}
            print(json.dumps(shown), flush=True)
            for window in result["windows"]:
                print("   ", json.dumps(window), flush=True)
    if args.json:
        args.json.write_text(
            json.dumps({"args": vars(args) | {"json": str(args.json)}, "versions": found, "results": results}, indent=2)
        )


if __name__ == "__main__":
    main()
