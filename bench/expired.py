"""One receive behind a run of expired messages, against the same receive behind none.

A consumer that was down longer than its messages' time to be received comes back to a queue whose
head is a run of expired rows. Each figure is the median of five calls that each find one live
message behind ``--expired`` expired ones (100,000 by default; the run is rebuilt before each
call), divided by the median of the same call on a queue holding only the live message, measured
in the same run on the same server. The first call behind the run pays for deleting it (in
bulk, 10,000 rows a statement); what the ratio says is that this is a few statements' work, not
one receive per expired row.

    .venv/bin/python bench/expired.py --json bench/expired.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg

from airflow_provider_sqlqueue.transport import Message, QueueAddress, QueueClient
from bench.throughput import database

RUNS = 5


def receive(client: QueueClient, queue: QueueAddress) -> None:
    assert [m.text for m in client.receive(queue, 1)] == ["live"]


def claim(client: QueueClient, queue: QueueAddress) -> None:
    [message] = client.claim(queue, 1)
    client.ack(queue, message.claim_token)


def native(client: QueueClient, queue: QueueAddress) -> None:
    with client.receive_native(queue) as message:
        assert message is not None and message.text == "live"


MODES: dict[str, Callable[[QueueClient, QueueAddress], None]] = {"none": receive, "claim": claim, "native": native}


def timed(uri: str, queue: QueueAddress, expired: int, call: Callable[[QueueClient, QueueAddress], None]) -> float:
    """Median seconds of ``call`` finding one live message behind ``expired`` expired ones."""
    spans = []
    with QueueClient.connect(uri) as client, psycopg.connect(uri, autocommit=True) as raw:
        for _ in range(RUNS):
            client.purge(queue)
            if expired:
                raw.execute(
                    f'INSERT INTO "{queue.schema}"."{queue.table}" (Id, Expires, Headers, Body) '
                    "SELECT gen_random_uuid(), (now() AT TIME ZONE 'UTC') - interval '1 hour', '{}', ''::bytea "
                    "FROM generate_series(1, %s)",
                    (expired,),
                )
            client.send(queue, Message("live"))
            raw.execute(f'VACUUM ANALYZE "{queue.schema}"."{queue.table}"')
            started = time.perf_counter()
            call(client, queue)
            spans.append(time.perf_counter() - started)
    return statistics.median(spans)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--uri", help="PostgreSQL URI (default: the test server, else an embedded one)")
    parser.add_argument("--expired", type=int, default=100_000)
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    with database(args.uri) as uri:
        schema = f"bench_expired_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(uri, autocommit=True) as raw, QueueClient.connect(uri) as client:
            raw.execute(f'CREATE SCHEMA "{schema}"')
            queue = QueueAddress("orders", schema)
            client.create_queue(queue)
        try:
            figures = {}
            for mode, call in MODES.items():
                behind = timed(uri, queue, args.expired, call)
                alone = timed(uri, queue, 0, call)
                figures[mode] = {"behind_ms": behind * 1000, "alone_ms": alone * 1000, "ratio": behind / alone}
                print(f"{mode:7} behind {args.expired:,} expired {behind * 1000:8.1f} ms   alone {alone * 1000:6.2f} ms"
                      f"   ratio {behind / alone:7.1f}")  # fmt: skip
        finally:
            with psycopg.connect(uri, autocommit=True) as raw:
                raw.execute(f'DROP SCHEMA "{schema}" CASCADE')
    if args.json:
        args.json.write_text(json.dumps({"expired": args.expired, "figures": figures}, indent=2) + "\n")


if __name__ == "__main__":
    main()
