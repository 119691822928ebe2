"""Queue tables under churn with autovacuum on: do per-table storage parameters help?

A queue inserts every row and deletes it again. Autovacuum's default thresholds vacuum a table once
its dead rows exceed 50 + 20 % of its rows (``reltuples``); a queue table that is usually
near-empty has few rows, but one that just held a backlog has many, and dead index entries at the
head of the Seq index slow the receives that scan it. This measures, on a server with autovacuum
on and no pinned horizon, whether storage parameters on the tables ``create_queue`` makes change
anything.

For each run: a fresh schema and queue (``QueueClient.create_queue``), then the variant's storage
parameters set with ``ALTER TABLE ... SET (...)`` on the queue table and on the schema's claim store
``sqlqueue_inflight``. A producer sends ``--rate`` messages a second (200-byte bodies, a batch every
20 ms) for ``--seconds``; one consumer drains the queue in ``none`` mode (``receive`` of 50) or in
``claim`` mode (``claim`` of 50, then ``ack`` of their tokens). Variants:

* ``default``: the tables as created;
* ``tuned``: ``autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000,
  autovacuum_vacuum_insert_scale_factor = 0, autovacuum_vacuum_insert_threshold = 1000`` on the
  queue table and on ``sqlqueue_inflight``;
* ``tuned+fillfactor``: ``tuned`` plus ``fillfactor = 80`` on ``sqlqueue_inflight``;
* ``tuned+nodelay``: ``tuned`` plus ``autovacuum_vacuum_cost_delay = 0`` on both tables (not in
  the default runs; ``--runs claim/tuned+nodelay`` adds it).

Per 10 s window: what arrived, what was handled, the handling latency (send to handled) at p50
and p99, the duration of the consumer's calls (``receive``, or ``claim`` + ``ack``) at p50 and p99;
and, sampled once a second from ``pg_stat_user_tables``, the dead tuples (the window's largest
and last sample), the autovacuum runs and ``pg_total_relation_size`` of the queue table (with its
indexes) and of ``sqlqueue_inflight``. A run's "end" figures are the last sample while the
producer ran (once it stops, the queue empties and vacuum may truncate the table). A run "falls behind" in a window that handles less than
95 % of what arrived in it. Runs alternate: every round runs each ``mode/variant`` once, the order
rotated by one each round.

    .venv/bin/python bench/churn.py --uri postgresql://postgres@127.0.0.1:5435/postgres --json bench/churn.json

Use a server of its own with autovacuum on (the figures depend on when autovacuum runs); the
server's autovacuum settings are recorded in the JSON.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg
from psycopg import sql

from airflow_provider_sqlqueue.transport import Message, QueueAddress, QueueClient

WINDOW = 10.0
BATCH_EVERY = 0.02
BODY = 200
BATCH = 50
QUEUE = "bench"
INFLIGHT = "sqlqueue_inflight"

TUNED = (
    "autovacuum_vacuum_scale_factor = 0",
    "autovacuum_vacuum_threshold = 1000",
    "autovacuum_vacuum_insert_scale_factor = 0",
    "autovacuum_vacuum_insert_threshold = 1000",
)
NODELAY = ("autovacuum_vacuum_cost_delay = 0",)
# variant -> (storage parameters of the queue table, of sqlqueue_inflight)
VARIANTS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "default": ((), ()),
    "tuned": (TUNED, TUNED),
    "tuned+fillfactor": (TUNED, (*TUNED, "fillfactor = 80")),
    "tuned+nodelay": ((*TUNED, *NODELAY), (*TUNED, *NODELAY)),
}
RUNS = ["none/default", "none/tuned", "claim/default", "claim/tuned", "claim/tuned+fillfactor"]

SETTINGS_SQL = """
SELECT name, setting FROM pg_settings
WHERE name LIKE 'autovacuum%' OR name IN ('shared_buffers', 'server_version', 'vacuum_cost_limit')
ORDER BY name
"""

STATS_SQL = """
SELECT relname, n_dead_tup, n_live_tup, autovacuum_count, last_autovacuum, pg_total_relation_size(relid)
FROM pg_stat_user_tables WHERE schemaname = %s AND relname = ANY(%s)
"""


def body(sent: float) -> bytes:
    return f"{sent:.6f}".encode().ljust(BODY, b" ")


def produce(uri: str, schema: str, rate: int, seconds: float, sent: Any) -> None:
    """Send ``rate`` messages a second in batches, on schedule (a late batch is sent at once)."""
    per_batch = max(1, round(rate * BATCH_EVERY))
    queue = QueueAddress(QUEUE, schema)
    stamps: list[tuple[float, int]] = []
    with QueueClient.connect(uri) as client:
        start = time.monotonic()
        batches = 0
        while (now := time.monotonic()) - start < seconds:
            due = start + batches * BATCH_EVERY
            if now < due:
                time.sleep(due - now)
            stamp = time.time()
            client.send(queue, [Message(body(stamp)) for _ in range(per_batch)])
            stamps.append((stamp, per_batch))
            batches += 1
    sent.extend(stamps)


def consume(uri: str, schema: str, mode: str, seconds: float, handled: Any, calls: Any) -> None:
    """Drain the queue in ``mode`` for ``seconds``: (handled at, sent at) per message, (ended at, duration) per call."""
    queue = QueueAddress(QUEUE, schema)
    times: list[tuple[float, float]] = []
    durations: list[tuple[float, float]] = []
    end = time.monotonic() + seconds
    with QueueClient.connect(uri) as client:
        while time.monotonic() < end:
            began = time.perf_counter()
            if mode == "none":
                got = client.receive(queue, BATCH)
            else:
                got = client.claim(queue, BATCH)
                if got:
                    client.ack(queue, [m.claim_token for m in got if m.claim_token is not None])
            took = time.perf_counter() - began
            now = time.time()
            if got:
                durations.append((now, took))
                times.extend((now, float(m.body[:20].decode())) for m in got)
            else:
                time.sleep(0.005)
    handled.extend(times)
    calls.extend(durations)


def install(uri: str, schema: str, variant: str) -> None:
    """A fresh queue in ``schema``, then the variant's storage parameters on its table and on the claim store."""
    with QueueClient.connect(uri) as client:
        client.create_queue(QueueAddress(QUEUE, schema))
    with psycopg.connect(uri, autocommit=True) as raw:
        for table, options in zip((QUEUE, INFLIGHT), VARIANTS[variant], strict=True):
            if options:
                raw.execute(
                    sql.SQL("ALTER TABLE {} SET ({})").format(
                        sql.Identifier(schema, table), sql.SQL(", ".join(options))
                    )
                )


@contextmanager
def sampling(uri: str, schema: str, samples: list[dict[str, Any]]) -> Iterator[None]:
    """Once a second: the two tables' rows of ``pg_stat_user_tables`` and their total sizes, and the load average."""
    stop = threading.Event()

    def run() -> None:
        with psycopg.connect(uri, autocommit=True) as connection:
            while True:
                rows = connection.execute(STATS_SQL, [schema, [QUEUE, INFLIGHT]]).fetchall()
                sample: dict[str, Any] = {"at": time.time(), "load1": os.getloadavg()[0]}
                for name, dead, live, autovacuums, last, size in rows:
                    key = "queue" if name == QUEUE else "inflight"
                    sample[key] = {
                        "dead": dead,
                        "live": live,
                        "autovacuums": autovacuums,
                        "last_autovacuum": last.isoformat() if last else None,
                        "bytes": size,
                    }
                samples.append(sample)
                if stop.wait(1.0):
                    return

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def run_once(uri: str, run: str, args: argparse.Namespace) -> dict[str, Any]:
    mode, _, variant = run.partition("/")
    schema = f"churn_{mode}_{variant.replace('+', '_')}_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(uri, autocommit=True) as raw:
        raw.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        try:
            install(uri, schema, variant)
            options = {
                table: raw.execute(
                    "SELECT c.reloptions FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                    "WHERE n.nspname = %s AND c.relname = %s",
                    [schema, table],
                ).fetchone()
                for table in (QUEUE, INFLIGHT)
            }
            samples: list[dict[str, Any]] = []
            with multiprocessing.Manager() as manager, sampling(uri, schema, samples):
                sent, handled, calls = manager.list(), manager.list(), manager.list()
                processes = [
                    multiprocessing.Process(target=consume, args=(uri, schema, mode, args.seconds + 5, handled, calls)),
                    multiprocessing.Process(target=produce, args=(uri, schema, args.rate, args.seconds, sent)),
                ]
                start = time.time()
                try:
                    for process in processes:
                        process.start()
                    for process in processes:
                        process.join()
                    if any(process.exitcode for process in processes):
                        raise RuntimeError(f"{run}: a producer or consumer died")
                    sent_list, handled_list, call_list = list(sent), list(handled), list(calls)
                finally:
                    for process in processes:
                        if process.is_alive():
                            process.terminate()
                            process.join()
        finally:
            raw.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
    result = summarise(run, sent_list, handled_list, call_list, samples, start, args.seconds)
    result["reloptions"] = {table: row[0] if row else None for table, row in options.items()}
    return result


def pct(values: list[float], q: float) -> float | None:
    return values[min(len(values) - 1, int(len(values) * q))] if values else None


def ms(value: float | None) -> float | None:
    return None if value is None else round(1000 * value, 1)


def summarise(
    run: str,
    sent: list[tuple[float, int]],
    handled: list[tuple[float, float]],
    calls: list[tuple[float, float]],
    samples: list[dict[str, Any]],
    start: float,
    seconds: float,
) -> dict[str, Any]:
    windows: list[dict[str, Any]] = []
    backlog = 0
    previous: dict[str, int] = {"queue": 0, "inflight": 0}
    for i in range(int(seconds // WINDOW)):
        low, high = start + i * WINDOW, start + (i + 1) * WINDOW
        arrived = sum(n for at, n in sent if low <= at < high)
        latencies = sorted(at - sent_at for at, sent_at in handled if low <= at < high)
        durations = sorted(took for at, took in calls if low <= at < high)
        backlog = max(0, backlog + arrived - len(latencies))
        inside = [s for s in samples if low <= s["at"] < high]
        window: dict[str, Any] = {
            "from_s": i * int(WINDOW),
            "arrived": arrived,
            "handled": len(latencies),
            "backlog": backlog,
            "p50_ms": ms(pct(latencies, 0.5)),
            "p99_ms": ms(pct(latencies, 0.99)),
            "call_p50_ms": ms(pct(durations, 0.5)),
            "call_p99_ms": ms(pct(durations, 0.99)),
            "load1": round(max((s["load1"] for s in inside), default=0.0), 2),
        }
        for key in ("queue", "inflight"):
            rows = [s[key] for s in inside if key in s]
            if not rows:
                continue
            window[f"{key}_dead_max"] = max(r["dead"] for r in rows)
            window[f"{key}_dead_end"] = rows[-1]["dead"]
            window[f"{key}_autovacuums"] = rows[-1]["autovacuums"] - previous[key]
            window[f"{key}_bytes_end"] = rows[-1]["bytes"]
            previous[key] = rows[-1]["autovacuums"]
        windows.append(window)
    p99s = [w["p99_ms"] for w in windows if w["p99_ms"] is not None]
    calls99 = [w["call_p99_ms"] for w in windows if w["call_p99_ms"] is not None]
    behind = [w["from_s"] for w in windows if w["arrived"] and w["handled"] < 0.95 * w["arrived"]]
    # the tables while the producer ran: once it stops the queue empties and vacuum truncates it
    loaded = [s for s in samples if s["at"] < start + seconds]
    last = loaded[-1] if loaded else {}
    result: dict[str, Any] = {
        "run": run,
        "median_p99_ms": statistics.median(p99s) if p99s else None,
        "max_p99_ms": max(p99s, default=None),
        "median_p50_ms": round(statistics.median(w["p50_ms"] for w in windows if w["p50_ms"] is not None), 1),
        "median_call_p99_ms": statistics.median(calls99) if calls99 else None,
        "max_call_p99_ms": max(calls99, default=None),
        "fell_behind_windows_s": behind,
        "backlog_at_end": windows[-1]["backlog"] if windows else None,
        "max_load1": max((w["load1"] for w in windows), default=None),
    }
    for key in ("queue", "inflight"):
        rows = [s[key] for s in loaded if key in s]
        result[f"{key}_dead_max"] = max((r["dead"] for r in rows), default=None)
        result[f"{key}_dead_end"] = rows[-1]["dead"] if rows else None
        result[f"{key}_autovacuums"] = rows[-1]["autovacuums"] if rows else None
        result[f"{key}_last_autovacuum"] = last.get(key, {}).get("last_autovacuum")
        result[f"{key}_bytes_end"] = rows[-1]["bytes"] if rows else None
        result[f"{key}_bytes_max"] = max((r["bytes"] for r in rows), default=None)
    result["windows"] = windows
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--uri", required=True)
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=300)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--runs", nargs="+", default=RUNS, help="mode/variant, mode none or claim")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    for run in args.runs:
        mode, _, variant = run.partition("/")
        if mode not in ("none", "claim") or variant not in VARIANTS:
            parser.error(f"unknown run {run!r}: modes none, claim; variants {', '.join(VARIANTS)}")
    with psycopg.connect(args.uri, autocommit=True) as raw:
        settings: dict[str, str] = dict(raw.execute(SETTINGS_SQL).fetchall())
    print(json.dumps({"settings": settings}), flush=True)
    results: list[dict[str, Any]] = []
    for round_ in range(args.rounds):
        shift = round_ % len(args.runs)
        for run in args.runs[shift:] + args.runs[:shift]:
            result = run_once(args.uri, run, args) | {"round": round_ + 1}
            results.append(result)
            print(json.dumps({key: value for key, value in result.items() if key != "windows"}), flush=True)
            if args.json:  # written after every run, so a cut-short session keeps what it measured
                args.json.write_text(
                    json.dumps(
                        {"args": vars(args) | {"json": str(args.json)}, "settings": settings, "results": results},
                        indent=2,
                    )
                )


if __name__ == "__main__":
    main()
