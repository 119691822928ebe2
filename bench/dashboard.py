"""What the Queues page costs as a database grows: 10 queues and 10,000 failed messages (as many as
the error groups read), then 1,000 queues and 1,000,000 failed messages.

Each figure is the best of five runs of exactly what one request of the page's API runs (the API is
a thin layer over these core calls), in milliseconds, and the ratio of the large database to the
small one measured in the same run. A ratio near 1 means the request's cost does not grow with the
number of queues or the length of the error queue; the list of names grows with the queues (one
catalog query), and nothing grows with the error queue.

    .venv/bin/python bench/dashboard.py --json bench/dashboard.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg

from airflow_provider_sqlqueue.transport import QueueAddress, QueueClient
from bench.throughput import database

ERROR_TYPES = 7


def build(uri: str, schema: str, queues: int, failures: int) -> None:
    """``queues`` queue tables (as an NServiceBus installer makes them) with a few messages each, a claim
    store, and an error queue of ``failures`` rows spread over the queues and ``ERROR_TYPES`` exceptions."""
    with QueueClient.connect(uri) as client, psycopg.connect(uri, autocommit=True) as raw:
        raw.execute(f'CREATE SCHEMA "{schema}"')
        client.create_queue(QueueAddress("q0", schema))  # with the error queue and the claim store
        for n in range(1, queues):
            for sql in client.dialect.create_queue_sql(QueueAddress(f"q{n}", schema)):
                raw.execute(sql)
        for n in range(queues):
            raw.execute(
                f'INSERT INTO "{schema}"."q{n}" (Id, Headers, Body) SELECT gen_random_uuid(), '
                "json_build_object('NServiceBus.TimeSent', '2026-11-24 07:00:00:000000 Z')::text, 'x'::bytea "
                "FROM generate_series(1, 3)"
            )
        raw.execute(
            f'INSERT INTO "{schema}"."error" (Id, Expires, Headers, Body) SELECT gen_random_uuid(), NULL, '
            "json_build_object('NServiceBus.FailedQ', 'q' || (g %% %s) || '@\"' || %s || '\"', "
            "'NServiceBus.ExceptionInfo.ExceptionType', 'Shop.Error' || (g %% %s), "
            "'NServiceBus.ExceptionInfo.Message', 'failed ' || g, "
            "'NServiceBus.TimeOfFailure', '2026-11-24 07:00:00:000000 Z')::text, "
            "convert_to(repeat('body ' || g, 50), 'UTF8') FROM generate_series(1, %s) AS g",
            (queues, schema, ERROR_TYPES, failures),
        )
        raw.execute(f'ANALYZE "{schema}"."error"')


def best(run: Callable[[], object], rounds: int = 5) -> float:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return min(times) * 1000


def requests(client: QueueClient, schema: str, queues: int) -> dict[str, Callable[[], object]]:
    """Each API route's work, as the route runs it."""
    error = QueueAddress("error", schema)
    rare = (f'q{queues - 1}@"{schema}"', f"Shop.Error{(queues - 1) % ERROR_TYPES}")
    page = [QueueAddress(f"q{n}", schema) for n in range(10)]
    return {
        "list queues (catalog)": lambda: [q for q in client.queues() if q.schema == schema],
        "figures of 10 queues": lambda: client.queue_stats(page),
        "error groups (newest 10,000)": lambda: client.error_summary(error),
        "newest 25 failures": lambda: client.failed_messages(error, limit=25),
        "25 failures of one group": lambda: client.failed_messages(error, limit=25, group=rare),
        "one retry pass, nothing to retry": lambda: client.retry_errors_page(
            error, queue=QueueAddress("nowhere", schema), limit=1000
        ),
        "error queue estimate (peek)": lambda: client.peek(error),
    }


def measure(uri: str, queues: int, failures: int) -> dict[str, float]:
    schema = f"bench_dash_{uuid.uuid4().hex[:8]}"
    started = time.perf_counter()
    build(uri, schema, queues, failures)
    print(f"built {queues} queues and {failures:,} failed messages in {time.perf_counter() - started:.0f}s")
    try:
        with QueueClient.connect(uri) as client:
            client.create_queue(QueueAddress("nowhere", schema))
            return {name: best(run) for name, run in requests(client, schema, queues).items()}
    finally:
        with psycopg.connect(uri, autocommit=True) as raw:
            raw.execute(f'DROP SCHEMA "{schema}" CASCADE')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pg-uri", help="PostgreSQL to measure on (default: as the tests choose)")
    parser.add_argument("--json", type=Path, default=Path(__file__).with_name("dashboard.json"))
    args = parser.parse_args()
    with database(args.pg_uri) as uri:
        small = measure(uri, 10, 10_000)
        large = measure(uri, 1_000, 1_000_000)
    print(f"\n{'request':<36} {'10 q / 10k err':>14} {'1000 q / 1M err':>16} {'ratio':>7}")
    results = {}
    for name in small:
        ratio = large[name] / small[name]
        results[name] = {"small_ms": round(small[name], 2), "large_ms": round(large[name], 2), "ratio": round(ratio, 2)}
        print(f"{name:<36} {small[name]:>12.1f}ms {large[name]:>14.1f}ms {ratio:>6.1f}x")
    args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
