"""Consumers while the xmin horizon is pinned: do they fall behind as dead tuples pile up?

A producer sends ``--rate`` messages a second (200-byte bodies with NServiceBus's headers, in
batches every 20 ms) for the whole run; a consumer drains the queue in one mode (``none``,
``claim`` + ``ack``, ``native``). After ``--warm`` seconds a REPEATABLE READ session takes a
snapshot and holds it for ``--pin`` seconds (as a report, a ``pg_dump`` or an idle-in-transaction
session would), so vacuum can remove none of the rows consumed meanwhile; then it commits and the
run goes on for ``--after`` seconds. Per 10 s window: what arrived, what was handled, and the
handling latency (send to handled) at p50 and p99; and the dead tuples each consumed message
left in the queue's tables. Each mode runs on its own fresh queue, one after the other, on the
same server in the same run.

    .venv/bin/python bench/ageing.py --json bench/ageing.json

Each mode runs beside its baseline ``<mode>/start``: the same consumer with every scan starting from
the head of the index, as before sessions kept a head (``transport/heads.py``). A mode "falls behind" in the first window that handles less than 95 % of what arrived (with the
backlog carried); it is "current" again after the release once a window's p99 is at most 0.5 s
and its backlog is under 1 % of a window's arrivals (a batch straddling the window edge).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg

from airflow_provider_sqlqueue.transport import Message, QueueAddress, QueueClient, heads
from bench.throughput import database

WINDOW = 10.0
BATCH_EVERY = 0.02
BODY = 200


def body(sent: float) -> bytes:
    return f"{sent:.6f}".encode().ljust(BODY, b" ")


def produce(uri: str, queue: QueueAddress, rate: int, seconds: float, sent: Any) -> None:
    """Send ``rate`` messages a second in batches, on schedule (a late batch is sent at once)."""
    per_batch = max(1, round(rate * BATCH_EVERY))
    with QueueClient.connect(uri) as client:
        start = time.monotonic()
        batches = 0
        while (now := time.monotonic()) - start < seconds:
            due = start + batches * BATCH_EVERY
            if now < due:
                time.sleep(due - now)
            stamp = time.time()
            client.send(queue, [Message(body(stamp)) for _ in range(per_batch)])
            sent.append((stamp, per_batch))
            batches += 1


def handled_times(messages: list[Any], times: list[tuple[float, float]]) -> None:
    now = time.time()
    times.extend((now, float(m.body[:20].decode())) for m in messages)


def consume(uri: str, queue: QueueAddress, mode: str, seconds: float, out: Any) -> None:
    """Drain the queue in ``mode`` until ``seconds`` have passed; record (handled at, sent at) per message.

    ``<mode>/start``: the same consumer with every scan starting from the head of the Seq index and
    every look by time reaching back all the way, as before sessions kept heads: the baseline.
    """
    mode, _, variant = mode.partition("/")
    if variant == "start":
        heads.Head.start = lambda self: 0  # type: ignore[method-assign]
        heads.Head.look_back_ms = lambda self, look: heads.EVERYTHING_MS  # type: ignore[method-assign]
    times: list[tuple[float, float]] = []
    end = time.monotonic() + seconds
    with QueueClient.connect(uri) as client:
        while time.monotonic() < end:
            if mode == "none":
                got = client.receive(queue, 50)
                handled_times(got, times)
            elif mode == "claim":
                got = client.claim(queue, 50)
                if got:
                    client.ack(queue, [m.claim_token for m in got])
                handled_times(got, times)
            else:
                got = []
                for _ in range(50):
                    with client.receive_native(queue) as message:
                        if message is None:
                            break
                        got.append(message)
                handled_times(got, times)
            if not got:
                time.sleep(0.005)
    out.extend(times)


def dead_tuples(raw: psycopg.Connection[Any], schema: str) -> int:
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


def run_mode(uri: str, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    schema = f"ageing_{mode.replace('/', '_')}_{uuid.uuid4().hex[:6]}"
    queue = QueueAddress("bench", schema)
    total = args.warm + args.pin + args.after
    with psycopg.connect(uri, autocommit=True) as raw:
        raw.execute(f'CREATE SCHEMA "{schema}"')
        try:
            with QueueClient.connect(uri) as client:
                client.create_queue(queue)
            manager = multiprocessing.Manager()
            sent, handled = manager.list(), manager.list()
            consumers = [
                multiprocessing.Process(target=consume, args=(uri, queue, mode, total + 5, handled))
                for _ in range(args.consumers)
            ]
            producer = multiprocessing.Process(target=produce, args=(uri, queue, args.rate, total, sent))
            for process in (*consumers, producer):
                process.start()
            start = time.time()
            time.sleep(args.warm)
            before = dead_tuples(raw, schema)
            with pinned(uri):
                pinned_at = time.time()
                time.sleep(args.pin)
                during = dead_tuples(raw, schema)
            released_at = time.time()
            producer.join()
            for process in consumers:
                process.join()
            handled_during = sum(1 for at, _ in handled if pinned_at <= at < released_at)
            return summarise(
                mode,
                list(sent),
                list(handled),
                start,
                pinned_at,
                released_at,
                dead_per_message=(during - before) / max(1, handled_during),
            )
        finally:
            raw.execute(f'DROP SCHEMA "{schema}" CASCADE')


def summarise(
    mode: str,
    sent: list[tuple[float, int]],
    handled: list[tuple[float, float]],
    start: float,
    pinned_at: float,
    released_at: float,
    dead_per_message: float,
) -> dict[str, Any]:
    windows = []
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
    parser.add_argument(
        "--modes", nargs="+", default=["none", "none/start", "claim", "claim/start", "native", "native/start"]
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results: list[dict[str, Any]] = []
    with database(args.uri) as uri:
        for mode in args.modes:
            result = run_mode(uri, mode, args)
            results.append(result)
            shown = {key: value for key, value in result.items() if key != "windows"}
            print(json.dumps(shown), flush=True)
            for window in result["windows"]:
                print("   ", json.dumps(window), flush=True)
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}, "results": results}, indent=2))


if __name__ == "__main__":
    main()
