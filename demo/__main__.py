"""``python -m demo [--keep-running]``: see the package docstring."""

from __future__ import annotations

import argparse
import socket
import sys
import time
from pathlib import Path
from typing import Any

from psycopg import sql

from airflow_provider_sqlqueue.transport import QueueAddress, QueueClient

from . import database, example_dags_folder, install_examples, reaper
from .data import insert_like_an_outside_sender, write_orders
from .services import AirflowServices, metadata_database

SCHEMA = "sqlqueue_demo"
#: The queues of the two chains the demo feeds (it creates all the examples' queues).
QUEUES = ("ingest", "cleaned", "reports", "ingest_events", "cleaned_events")
STAGES = [
    "sqlqueue_spark_clean",
    "sqlqueue_spark_summarise",
    "sqlqueue_spark_clean_events",
    "sqlqueue_spark_summarise_events",
]
UI_PORT = 8080
#: What a run takes, measured on an idle 2-core machine (migration, services, two Spark jobs per chain).
TYPICAL_MINUTES = 5
DEADLINE_SECONDS = 900


def port_free(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) != 0


class Progress:
    """Concise lines about what the pipeline does, instead of Airflow's logs."""

    def __init__(self, services: AirflowServices, client: QueueClient) -> None:
        self.services = services
        self.client = client
        self.started = time.monotonic()
        self.tasks: dict[tuple[str, str, str], str] = {}
        self.queues: dict[str, tuple[int, int]] = {}

    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self.started:6.1f}s] {text}", flush=True)

    def poll(self) -> None:
        rows = self.services.metadata(
            "SELECT dag_id, run_id, task_id, state FROM task_instance WHERE dag_id = ANY(%s) ORDER BY start_date NULLS LAST",
            (STAGES,),
        )
        for dag_id, run_id, task_id, state in rows:
            key = (dag_id, run_id, task_id)
            if state and self.tasks.get(key) != state and state in ("deferred", "running", "success", "failed"):
                self.tasks[key] = state
                self.say(f"{dag_id} run {run_id}: task {task_id} {state}")
        for name in QUEUES:
            address = QueueAddress(name, SCHEMA)
            figures = (self.client.depth(address), self.client.in_flight(address))
            if self.queues.get(name, (0, 0)) != figures:
                self.queues[name] = figures
                self.say(f"queue {name}: {figures[0]} waiting, {figures[1]} in flight")


def main() -> int:
    parser = argparse.ArgumentParser(description="The Spark chain under Airflow's real services")
    parser.add_argument("--keep-running", action="store_true", help="leave the services and the UI running")
    args = parser.parse_args()
    reaper.interruptible()  # SIGTERM and SIGHUP stop the services as Ctrl-C does
    print(
        f"The demo takes about {TYPICAL_MINUTES} minutes on an idle machine of 2 cores, longer when it is busy;"
        f" it gives up after {DEADLINE_SECONDS // 60} minutes of waiting for the reports."
    )
    workdir = Path.cwd() / ".sqlqueue-demo"
    with database() as pg_uri, metadata_database(pg_uri) as metadata_uri, QueueClient.connect(pg_uri) as client:
        schema = sql.Identifier(SCHEMA)
        client.connection.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(schema))
        client.connection.execute(sql.SQL("CREATE SCHEMA {}").format(schema))
        created = install_examples(pg_uri, SCHEMA)
        print(f"Queues {', '.join(created)} (and error) created in schema {SCHEMA}")

        port = UI_PORT if port_free(UI_PORT) else None
        services = AirflowServices(
            workdir / "airflow", metadata_uri, pg_uri, example_dags_folder(), port=port, env={"SQLQUEUE_SCHEMA": SCHEMA}
        )
        started = time.perf_counter()
        try:
            seconds = services.start_all(STAGES)
            print(f"Airflow api-server, scheduler, dag-processor and triggerer up in {seconds:.0f}s")
            print(f"  UI: {services.url}   logs: {services.logs}")

            expected: dict[str, dict[str, Any]] = {}
            for name, queue, seed in (
                ("orders-2026-11", "ingest", 2026),
                ("orders-2026-11-events", "ingest_events", 7),
            ):
                dataset = workdir / "data" / f"{name}.csv"
                expected[name] = write_orders(dataset, seed=seed)
                body = {"dataset": name, "path": str(dataset), "output_root": str(workdir / "output")}
                insert_like_an_outside_sender(client.connection, SCHEMA, queue, body)
                print(
                    f"Inserted into {queue} by plain SQL: {body['dataset']} ({expected[name]['rows']} raw order lines)"
                )

            progress = Progress(services, client)
            deadline = time.monotonic() + DEADLINE_SECONDS
            while time.monotonic() < deadline and client.depth(QueueAddress("reports", SCHEMA)) < len(expected):
                progress.poll()
                time.sleep(2)
            progress.poll()
            reports = {m.json()["dataset"]: m.json() for m in client.receive(QueueAddress("reports", SCHEMA), 10)}
            left = {
                name: client.depth(QueueAddress(name, SCHEMA)) + client.in_flight(QueueAddress(name, SCHEMA))
                for name in QUEUES
            }
            left["error"] = client.depth(QueueAddress("error", SCHEMA))

            problems = []
            for name, figures in expected.items():
                report = reports.get(name)
                if report is None:
                    problems.append(f"no report for {name}")
                    continue
                print(
                    f"\nReport {name}: {report['orders']} orders, revenue {report['revenue']:.2f}, {report['customers']} customers"
                )
                print(
                    "  by country: "
                    + ", ".join(f"{row['country']} {row['revenue']:.2f}" for row in report["by_country"])
                )
                if report["orders"] != figures["valid_orders"] or abs(report["revenue"] - figures["revenue"]) > 0.05:
                    problems.append(f"{name}: report {report['orders']}/{report['revenue']} != {figures}")
            if any(left.values()):
                problems.append(f"queues not empty: {left}")
            if problems:
                print("FAILED: " + "; ".join(problems) + f" (logs: {services.logs})", file=sys.stderr)
                return 1
            print(
                f"\nOK: both chains' reports match the data; every queue is empty. Total {time.perf_counter() - started:.0f}s"
            )
            if args.keep_running:
                print(f"Services still running: open {services.url} (Ctrl-C stops them)")
                try:
                    while True:
                        time.sleep(3600)
                except KeyboardInterrupt:
                    pass
            return 0
        finally:
            services.stop()


if __name__ == "__main__":
    sys.exit(main())
