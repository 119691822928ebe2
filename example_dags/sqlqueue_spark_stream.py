"""A Structured Streaming job between two queues, run by Airflow as an incremental drain.

``order_events`` --(order event)--> Spark Structured Streaming --(revenue event)--> ``order_revenue``

Each run starts the streaming query from its checkpoint, lets it take every waiting event
(micro-batches of claims on ``order_events``), and stops it: events are handled exactly once
across runs, crashes and restarts (README, "The sqlqueue data source"). The same job run with
``awaitTermination()`` instead of a drain (spark-submit) is a long-running stream. Spark runs where
``spark_default`` points; the checkpoint directory (``SQLQUEUE_CHECKPOINTS``) must then be on
storage the driver reaches after a restart, and the executors need this package installed.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

from airflow.sdk import DAG, task
from spark_jobs import relay_orders  # example_dags/: the DAGs folder is on sys.path
from sqlqueue_stages import CONN, SCHEMA, SPARK_CONN, queue

from airflow_provider_sqlqueue.hooks.sqlqueue import SqlQueueHook

ORDER_EVENTS, ORDER_REVENUE = queue("order_events"), queue("order_revenue")
CHECKPOINTS = os.environ.get("SQLQUEUE_CHECKPOINTS", "/tmp/sqlqueue-checkpoints")  # noqa: S108  # a demo default; set it in production

with DAG(
    "sqlqueue_spark_stream",
    schedule=timedelta(minutes=5),
    max_active_runs=1,
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    default_args={"retries": 1, "retry_delay": timedelta(seconds=30)},
    tags=["sqlqueue", "spark", "streaming"],
    doc_md=__doc__,
):

    @task.pyspark(task_id="relay", conn_id=SPARK_CONN)
    def relay(spark=None) -> dict:
        url = SqlQueueHook(CONN).conninfo()
        return relay_orders(spark, url, ORDER_EVENTS, ORDER_REVENUE, f"{CHECKPOINTS}/{SCHEMA}/order_revenue")

    relay()
