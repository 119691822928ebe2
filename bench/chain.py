"""Both example Spark chains under Airflow's real services, at a steady rate and in a burst (issue 34).

api-server, scheduler (LocalExecutor), dag-processor and triggerer run as separate processes
(``demo.services.AirflowServices``) on a metadata database of their own, with ``example_dags/`` as
the DAGs folder and the queues in a schema of their own (``SQLQUEUE_SCHEMA``). Messages are
inserted from outside by plain SQL (``demo.data.insert_like_an_outside_sender``), each naming a
small raw orders CSV of its own (``--rows``, 200 by default: Spark's cost per message is its fixed
cost), into ``ingest`` (the sensor-driven chain ``sqlqueue_spark_clean`` ->
``sqlqueue_spark_summarise``) and ``ingest_events`` (the event-driven chain
``sqlqueue_spark_clean_events`` -> ``sqlqueue_spark_summarise_events``); both report into
``reports``. The other example DAGs stay paused (DAGs are paused at creation; only the chains'
four are unpaused), so no other Spark job shares the machine.

Two phases, one after the other, each fed to the chains of ``--chains`` (both by default; a chain
not named stays paused) at once:

* ``steady``: ``--rate`` messages a second *per chain* for ``--minutes``;
* ``burst``: ``--burst`` messages *per chain* inserted at once.

After feeding, a phase waits (up to ``--drain-timeout``) until every expected report is on
``reports`` and the chains' queues are empty, then ``--settle`` seconds more (a duplicate forwarded
late would show up). A phase that did not drain in time is marked ``"drained": false``: its "lost"
then counts reports still missing at the timeout, not messages known to be lost. Per phase and chain:

* reports/s: reports / (last report - first insert);
* latency insert -> report, p50 / p95 / max: the dataset name carries the insert time (ms since
  the epoch, its last ``-`` part), the report the time the summarise stage sent it
  (``NServiceBus.TimeSent``);
* DAG runs per message: new ``dag_run`` rows of the chain's two DAGs (metadata database) /
  messages;
* Spark sessions per message: sensor chain: ``run_job`` task instances that started (``@task.pyspark``
  starts a session before the task's code); event chain: the tasks' "<dag>-<task>: starting a Spark
  session" lines in the task logs under AIRFLOW_HOME/logs (runs whose task took nothing start none);
  both / messages (a message passes two stages, so 2.0 is one session per stage per message, 0.2 a
  batch of ten);
* lost (expected datasets with no report), twice (datasets reported more than once), and what is
  left in the chain's queues, in flight and in the error queue.

Spark (``spark_default``): ``--spark local`` (``local[*]``, the default), ``cluster`` (a standalone
master and worker, ``demo.spark_cluster.SparkCluster``: every task still starts a driver JVM) or
``connect`` (Spark Connect on that cluster: tasks are thin clients, no JVM per task). Prints a table
and writes ``--out`` (bench/chain.json). The 1-minute load average is sampled every 10 s.

    .venv/bin/python -m bench.chain --rate 0.1 --minutes 5 --burst 20
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

from airflow_provider_sqlqueue.transport import QueueAddress, QueueClient
from demo import example_dags_folder, install_examples, reaper
from demo.data import insert_like_an_outside_sender, write_orders
from demo.services import SERVICES, AirflowServices, metadata_database

LOCAL_PG_URI = "postgresql://postgres@127.0.0.1:5432/test"
CHAINS = {
    "sensor": {
        "ingest": "ingest",
        "queues": ("ingest", "cleaned"),
        "dags": {"sqlqueue_spark_clean": "clean", "sqlqueue_spark_summarise": "summarise"},
    },
    "events": {
        "ingest": "ingest_events",
        "queues": ("ingest_events", "cleaned_events"),
        "dags": {"sqlqueue_spark_clean_events": "clean", "sqlqueue_spark_summarise_events": "summarise"},
    },
}
CHAIN_DAGS = [dag for chain in CHAINS.values() for dag in chain["dags"]]

LOCAL_SPARK = {
    "conn_type": "spark",
    "host": "local[*]",
    "extra": {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "4"},
}


def percentile(values: list[float], share: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


class LoadSampler(threading.Thread):
    """The 1-minute load average (/proc/loadavg) every ``every`` seconds, tagged with the phase."""

    def __init__(self, every: float = 10.0) -> None:
        super().__init__(daemon=True)
        self.every = every
        self.phase = "startup"
        self.samples: list[tuple[str, float]] = []
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set():
            try:
                self.samples.append((self.phase, float(Path("/proc/loadavg").read_text().split()[0])))
            except OSError:
                pass
            self.stopped.wait(self.every)

    def figures(self, phase: str) -> dict[str, float | None]:
        values = [value for tag, value in self.samples if tag == phase]
        if not values:
            return {"mean": None, "max": None}
        return {"mean": round(statistics.mean(values), 2), "max": round(max(values), 2)}


class Bench:
    def __init__(
        self, services: AirflowServices, pg_uri: str, schema: str, data: Path, rows: int, chains: list[str]
    ) -> None:
        self.services = services
        self.chains = chains
        self.pg_uri = pg_uri
        self.schema = schema
        self.data = data
        self.rows = rows
        self.expected: dict[str, dict[str, Any]] = {}  # dataset -> phase, chain, sent, valid_orders
        self.seen: dict[str, float] = {}  # report message id -> when this process first saw it
        self.feeder = psycopg.connect(pg_uri, autocommit=True)

    def address(self, name: str) -> QueueAddress:
        return QueueAddress(name, self.schema)

    def insert(self, phase: str, chain: str, n: int) -> None:
        path = self.data / "in" / f"{chain}-{phase}-{n:05d}.csv"
        figures = write_orders(path, rows=self.rows, seed=n)
        sent = time.time()
        dataset = f"{chain}-{phase}-{n:05d}-{int(sent * 1000)}"
        body = {"dataset": dataset, "path": str(path), "output_root": str(self.data / "out")}
        insert_like_an_outside_sender(self.feeder, self.schema, CHAINS[chain]["ingest"], body)
        self.expected[dataset] = {"phase": phase, "chain": chain, "sent": sent, "orders": figures["valid_orders"]}

    def reports(self) -> list[dict[str, Any]]:
        """Every report on ``reports``: dataset, orders, when sent (its TimeSent, else when first seen)."""
        with QueueClient.connect(self.pg_uri) as client:
            messages = client.browse(self.address("reports"), 100_000)
        now = time.time()
        found = []
        for message in messages:
            key = str(message.id)
            self.seen.setdefault(key, now)
            body = message.json()
            stamp = message.headers.get("NServiceBus.TimeSent")
            try:
                at = (
                    datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S:%f Z").replace(tzinfo=UTC).timestamp()
                    if stamp
                    else self.seen[key]
                )
            except ValueError:
                at = self.seen[key]
            found.append({"dataset": body.get("dataset"), "orders": body.get("orders"), "at": at})
        return found

    def left(self) -> dict[str, int]:
        """Per chain queue: waiting + in flight; and the error queue's depth."""
        with QueueClient.connect(self.pg_uri) as client:
            counts = {
                name: client.depth(self.address(name)) + client.in_flight(self.address(name))
                for chain in CHAINS.values()
                for name in chain["queues"]
            }
            counts["error"] = client.depth(self.address("error"))
        return counts

    def dag_runs(self) -> dict[str, int]:
        rows = self.services.metadata(
            "SELECT dag_id, count(*) FROM dag_run WHERE dag_id = ANY(%s) GROUP BY dag_id", (CHAIN_DAGS,)
        )
        return dict.fromkeys(CHAIN_DAGS, 0) | {dag: int(n) for dag, n in rows}

    def sessions(self) -> dict[str, int]:
        """Spark sessions started so far per DAG (see the module docstring for how each chain counts)."""
        counts = dict.fromkeys(CHAIN_DAGS, 0)
        rows = self.services.metadata(
            "SELECT dag_id, count(*) FROM task_instance WHERE dag_id = ANY(%s) AND task_id IN ('clean', 'summarise')"
            " AND start_date IS NOT NULL GROUP BY dag_id",
            (list(CHAINS["sensor"]["dags"]),),
        )
        counts.update({dag: int(n) for dag, n in rows})
        needles = {f"{dag}-{task}: starting a Spark session": dag for dag, task in CHAINS["events"]["dags"].items()}
        for log in (self.services.home / "logs").rglob("*.log"):
            if "_events" not in str(log):
                continue
            text = log.read_text(errors="replace")
            for needle, dag in needles.items():
                counts[dag] += text.count(needle)
        return counts

    def feed_steady(self, rate: float, seconds: float) -> None:
        period = 1.0 / rate
        started = time.monotonic()
        n = 0
        last_poll = 0.0
        while True:
            due = started + n * period
            if due - started >= seconds:
                break
            for k, chain in enumerate(self.chains):  # the chains fed a share of a period apart
                at = due + k * period / len(self.chains)
                while time.monotonic() < at:
                    if time.monotonic() - last_poll > 5:
                        self.reports()  # note when reports appear (the TimeSent header is preferred)
                        last_poll = time.monotonic()
                    time.sleep(min(0.5, max(0.0, at - time.monotonic())))
                self.insert("steady", chain, n)
            n += 1

    def feed_burst(self, count: int) -> None:
        for n in range(count):
            for chain in self.chains:
                self.insert("burst", chain, n)

    def drain(self, phase: str, timeout: float, settle: float) -> tuple[float, bool]:
        """Wait for every report of the phase and empty chain queues; returns how long that took and
        whether it happened (False: the timeout came first, and "lost" counts reports still missing)."""
        started = time.monotonic()
        wanted = {d for d, e in self.expected.items() if e["phase"] == phase}
        drained = False
        while time.monotonic() - started < timeout:
            got = {r["dataset"] for r in self.reports()}
            if wanted <= got and not any(self.left().values()):
                drained = True
                break
            time.sleep(3)
        waited = time.monotonic() - started
        time.sleep(settle)
        return waited, drained

    def figures(self, phase: str, runs: dict[str, int], sessions: dict[str, int]) -> dict[str, Any]:
        reports = self.reports()
        left = self.left()
        result: dict[str, Any] = {}
        for chain in self.chains:
            spec = CHAINS[chain]
            expected = {d: e for d, e in self.expected.items() if e["phase"] == phase and e["chain"] == chain}
            mine = [r for r in reports if r["dataset"] in expected]
            counts = Counter(r["dataset"] for r in mine)
            first = {}
            for r in mine:
                first[r["dataset"]] = min(first.get(r["dataset"], r["at"]), r["at"])
            latencies = [first[d] - expected[d]["sent"] for d in first]
            wrong = sum(1 for r in mine if r["orders"] != expected[r["dataset"]]["orders"])
            n = len(expected)
            span = (max(first.values()) - min(e["sent"] for e in expected.values())) if first else None
            dag_runs = sum(runs[dag] for dag in spec["dags"])
            spark = sum(sessions[dag] for dag in spec["dags"])
            result[chain] = {
                "messages": n,
                "reported": len(first),
                "reports_per_second": round(len(first) / span, 3) if span else None,
                "last_report_after_first_insert_s": round(span, 1) if span else None,
                "latency_s": {
                    "p50": _round(percentile(latencies, 0.5)),
                    "p95": _round(percentile(latencies, 0.95)),
                    "max": _round(max(latencies) if latencies else None),
                },
                "dag_runs": {dag: runs[dag] for dag in spec["dags"]},
                "dag_runs_per_message": round(dag_runs / n, 2) if n else None,
                "spark_sessions": {dag: sessions[dag] for dag in spec["dags"]},
                "spark_sessions_per_message": round(spark / n, 2) if n else None,
                "lost": n - len(first),
                "twice": sum(1 for c in counts.values() if c > 1),
                "wrong_figures": wrong,
                "left_in_queues": {name: left[name] for name in spec["queues"]},
            }
        result["error_queue"] = left["error"]
        return result


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def diff(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {key: after[key] - before.get(key, 0) for key in after}


def spark_connection(args: argparse.Namespace, workdir: Path, stack: list[Any]) -> tuple[dict[str, Any], str]:
    if args.spark == "local":
        return LOCAL_SPARK, "local[*]"
    from demo.spark_cluster import SparkCluster

    cluster = SparkCluster(workdir / "spark", workers=1, cores=args.spark_cores, memory=args.spark_memory)
    stack.append(cluster)
    cluster.start()
    if args.spark == "cluster":
        connection = {
            "conn_type": "spark",
            "host": "spark://127.0.0.1",
            "port": cluster.port,
            "extra": {
                "spark.ui.enabled": "false",
                "spark.sql.shuffle.partitions": "4",
                "spark.cores.max": "1",
                "spark.executor.memory": "512m",
                "spark.pyspark.python": sys.executable,
            },
        }
        return connection, f"standalone cluster {cluster.master} (1 worker, {args.spark_cores} cores)"
    remote = cluster.start_connect()
    port = int(remote.rsplit(":", 1)[1])
    return {"conn_type": "spark_connect", "host": "127.0.0.1", "port": port}, f"Spark Connect {remote}"


def print_table(result: dict[str, Any]) -> None:
    header = (
        f"{'phase':7} {'chain':7} {'msgs':>5} {'rep':>5} {'rep/s':>6} {'p50 s':>6} {'p95 s':>6} {'max s':>6} "
        f"{'runs/m':>6} {'spark/m':>7} {'lost':>4} {'twice':>5} {'left':>4} {'error':>5}"
    )
    print(header)
    print("-" * len(header))
    for phase, chains in result["phases"].items():
        for chain in result["chains"]:
            f = chains[chain]
            lat = f["latency_s"]
            print(
                f"{phase:7} {chain:7} {f['messages']:5d} {f['reported']:5d} {_fmt(f['reports_per_second'], 3):>6} "
                f"{_fmt(lat['p50']):>6} {_fmt(lat['p95']):>6} {_fmt(lat['max']):>6} "
                f"{_fmt(f['dag_runs_per_message'], 2):>6} {_fmt(f['spark_sessions_per_message'], 2):>7} "
                f"{f['lost']:4d} {f['twice']:5d} {sum(f['left_in_queues'].values()):4d} {chains['error_queue']:5d}"
            )
    print("load average (1 min) per phase:", json.dumps(result["load_average"]))


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pg-uri", default=os.environ.get("SQLQUEUE_PG_URI", LOCAL_PG_URI))
    parser.add_argument("--rate", type=float, default=0.2, help="steady phase: messages a second per chain")
    parser.add_argument("--minutes", type=float, default=5.0, help="steady phase: how long it feeds")
    parser.add_argument("--burst", type=int, default=40, help="burst phase: messages per chain inserted at once")
    parser.add_argument("--phases", default="steady,burst", help="which phases, in order")
    parser.add_argument("--chains", default="sensor,events", help="which chains are fed (the others stay paused)")
    parser.add_argument("--rows", type=int, default=200, help="rows of each message's CSV")
    parser.add_argument("--spark", choices=("local", "cluster", "connect"), default="local")
    parser.add_argument("--spark-cores", type=int, default=2, help="cluster/connect: the worker's cores")
    parser.add_argument("--spark-memory", default="2g", help="cluster/connect: the worker's memory")
    parser.add_argument("--parallelism", type=int, default=4, help="Airflow's core.parallelism (task slots)")
    parser.add_argument("--drain-timeout", type=float, default=600.0, help="seconds a phase waits for its reports")
    parser.add_argument("--settle", type=float, default=10.0, help="seconds waited after a phase drained")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "sqlqueue-bench-chain")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("chain.json"))
    args = parser.parse_args()
    phases = [p for p in args.phases.split(",") if p]
    reaper.interruptible()  # SIGTERM and SIGHUP stop the services as Ctrl-C does

    workdir = args.workdir.resolve() / time.strftime("%Y%m%d-%H%M%S")
    workdir.mkdir(parents=True)
    schema = f"bench_chain_{uuid.uuid4().hex[:8]}"
    load = LoadSampler()
    load.start()
    stack: list[Any] = []
    with psycopg.connect(args.pg_uri, autocommit=True) as admin:
        admin.execute(f'CREATE SCHEMA "{schema}"')
    try:
        install_examples(args.pg_uri, schema)
        connection, spark_label = spark_connection(args, workdir, stack)
        with metadata_database(args.pg_uri) as metadata_uri:
            services = AirflowServices(
                workdir / "airflow",
                metadata_uri,
                args.pg_uri,
                example_dags_folder(),
                env={"SQLQUEUE_SCHEMA": schema, "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True"},
                parallelism=args.parallelism,
                spark_connection=connection,
            )
            try:
                run(services, args, schema, workdir, spark_label, phases, load)
            finally:
                services.stop()
    finally:
        load.stopped.set()
        for owner in reversed(stack):
            owner.stop()
        with psycopg.connect(args.pg_uri, autocommit=True) as admin:
            admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def start_chains(services: AirflowServices, dags: list[str], timeout: float = 300) -> float:
    """Migrate, start the services with DAGs paused at creation, and unpause only the benched
    chains' DAGs as the dag-processor stores them (the other examples -- the streaming relay's Spark
    job, the fan-out, a chain not benched -- never run); returns the seconds until all is healthy."""
    started = time.perf_counter()
    services.migrate()
    for name in SERVICES:
        services.start(name)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        services.metadata(
            "UPDATE dag SET is_paused = false WHERE dag_id = ANY(%s) AND is_paused RETURNING dag_id", (dags,)
        )
        if len(services.metadata("SELECT 1 FROM dag WHERE dag_id = ANY(%s) AND NOT is_paused", (dags,))) == len(dags):
            break
        time.sleep(1)
    services.wait_healthy()
    services.wait_for_dags(dags)
    return time.perf_counter() - started


def run(
    services: AirflowServices,
    args: argparse.Namespace,
    schema: str,
    workdir: Path,
    spark_label: str,
    phases: list[str],
    load: LoadSampler,
) -> None:
    chains = [c for c in args.chains.split(",") if c]
    unknown = sorted(set(chains) - set(CHAINS))
    if unknown or not chains:
        raise SystemExit(f"--chains: choose from {', '.join(CHAINS)} (got {args.chains!r})")
    startup = start_chains(services, [dag for chain in chains for dag in CHAINS[chain]["dags"]])
    print(f"Airflow services up in {startup:.0f}s (logs: {services.logs}); Spark: {spark_label}", flush=True)
    bench = Bench(services, args.pg_uri, schema, workdir / "data", args.rows, chains)
    result: dict[str, Any] = {
        "command": "python -m bench.chain " + " ".join(sys.argv[1:]),
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
        ).stdout.strip(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cpus": os.cpu_count(),
        "spark": spark_label,
        "chains": chains,
        "settings": {
            "rate_per_chain": args.rate,
            "minutes": args.minutes,
            "burst_per_chain": args.burst,
            "rows": args.rows,
            "parallelism": args.parallelism,
        },
        "services_startup_s": round(startup, 1),
        "phases": {},
        "drain_s": {},
        "drained": {},
    }
    for phase in phases:
        load.phase = phase
        runs, sessions = bench.dag_runs(), bench.sessions()
        print(f"[{time.strftime('%H:%M:%S')}] {phase}: feeding", flush=True)
        if phase == "steady":
            bench.feed_steady(args.rate, args.minutes * 60)
        elif phase == "burst":
            bench.feed_burst(args.burst)
        else:
            raise SystemExit(f"unknown phase {phase}")
        print(f"[{time.strftime('%H:%M:%S')}] {phase}: fed, draining", flush=True)
        waited, drained = bench.drain(phase, args.drain_timeout, args.settle)
        result["drain_s"][phase] = round(waited, 1)
        result["drained"][phase] = drained
        result["phases"][phase] = bench.figures(phase, diff(bench.dag_runs(), runs), diff(bench.sessions(), sessions))
        print(f"[{time.strftime('%H:%M:%S')}] {phase}: done", flush=True)
    load.phase = "end"
    result["load_average"] = {phase: load.figures(phase) for phase in ["startup", *phases]}
    result["logs"] = str(services.logs)
    print_table(result)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
