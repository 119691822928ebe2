"""``python -m airflow_provider_sqlqueue.demo``: see the package docstring."""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

from . import database, prepare_airflow, run_dag, task_output
from .data import write_orders


def main() -> int:
    workdir = Path.cwd() / ".sqlqueue-demo"
    with database() as pg_uri:
        started = time.perf_counter()
        prepare_airflow(workdir / "airflow", pg_uri)
        print(f"Airflow initialised in {time.perf_counter() - started:.1f}s (home: {workdir / 'airflow'})")
        logging.getLogger("airflow").setLevel(logging.WARNING)

        from ..transport import Message, QueueClient

        dataset = workdir / "data" / "orders-2026-11.csv"
        expected = write_orders(dataset)
        print(f"Generated {dataset} ({expected['rows']} raw order lines)")

        setup, seconds = run_dag("sqlqueue_setup")
        if setup.state != "success":
            print(f"setup DAG {setup.state}", file=sys.stderr)
            return 1
        print(f"Queues created in {seconds:.1f}s")

        with QueueClient.connect(pg_uri) as client:
            body = {"dataset": "orders-2026-11", "path": str(dataset), "output_root": str(workdir / "output")}
            client.send("ingest", Message.of(body))
            print(f"Sent to ingest: {body}")

            clean, seconds = run_dag("sqlqueue_spark_clean")
            print(f"\nStage 1 clean ({clean.state}, {seconds:.1f}s):")
            for result in (task_output(clean, "clean") or {}).get("results", []):
                print(f"  kept {result['rows']} rows, rejected {result['rejected']} -> {result['path']}")

            summarise, seconds = run_dag("sqlqueue_spark_summarise")
            print(f"\nStage 2 summarise ({summarise.state}, {seconds:.1f}s):")
            for report in (task_output(summarise, "summarise") or {}).get("results", []):
                print(f"  {report['orders']} orders, revenue {report['revenue']:.2f}, {report['customers']} customers")
                countries = ", ".join(f"{row['country']} {row['revenue']:.2f}" for row in report["by_country"])
                products = ", ".join(row["product"] for row in report["top_products"])
                print(f"  by country: {countries}")
                print(f"  top products: {products}")

            [final] = client.receive("reports") or [None]
            queues = {name: client.depth(name) + client.inflight(name) for name in ("ingest", "cleaned", "reports", "error")}
        print(f"\nReport message on the reports queue: {final.json() if final else None}")
        print(f"Messages left (waiting + in flight): {queues}")

        problems = []
        if clean.state != "success" or summarise.state != "success":
            problems.append("a stage failed")
        report = final.json() if final else {}
        if report.get("orders") != expected["valid_orders"]:
            problems.append(f"report counts {report.get('orders')} orders, the data has {expected['valid_orders']}")
        if abs((report.get("revenue") or 0) - expected["revenue"]) > 0.05:
            problems.append(f"report revenue {report.get('revenue')} differs from {expected['revenue']}")
        if any(queues.values()):
            problems.append(f"queues not empty: {queues}")
        if problems:
            print("FAILED: " + "; ".join(problems), file=sys.stderr)
            return 1
        print(f"\nOK: the report matches the data ({expected['valid_orders']} orders, revenue {expected['revenue']:.2f}); "
              f"every queue is empty. Total {time.perf_counter() - started:.1f}s")
        return 0


if __name__ == "__main__":
    sys.exit(main())
