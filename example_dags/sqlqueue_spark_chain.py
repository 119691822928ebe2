"""Two Spark jobs chained through queue tables, one sensor-driven DAG per stage.

``ingest`` --(dataset path)--> clean (Spark) --(clean data path)--> ``cleaned``
``cleaned`` --> summarise (Spark) --(report)--> ``reports``

Each stage waits for messages (a deferrable sensor: the wait runs in the triggerer), runs its
Spark job on them while their claims are renewed, then sends the results to the next queue and
acknowledges the messages in one transaction (``ForwardMessagesOperator``): a result is sent once
per message even if a worker dies mid-job and the message is handled again. If the job fails the
messages are given back with its exception at once; after 5 deliveries they move to the error
queue, whose headers name the exception and the task. Spark runs wherever the ``spark_default``
connection points (``local[*]`` when it has no host); change that connection, not these DAGs, to
use a cluster. The queues are in the database
of the ``sqlqueue_default`` connection (schema: ``SQLQUEUE_SCHEMA``, default ``public``); the
``sqlqueue_setup`` DAG creates them.

Messages: ``ingest`` takes ``{"dataset": name, "path": csv, "output_root": dir}``; paths must be
readable by the Spark cluster (a shared filesystem or object store once Spark is not local).
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.sdk import DAG, task
from spark_jobs import clean_message, summarise_message  # example_dags/spark_jobs.py: the DAGs folder is on sys.path

from airflow_provider_sqlqueue.operators.sqlqueue import ForwardMessagesOperator, hold_messages
from airflow_provider_sqlqueue.sensors.sqlqueue import SqlQueueSensor
from airflow_provider_sqlqueue.transport import defaults

SCHEMA = os.environ.get("SQLQUEUE_SCHEMA", "public")
#: The hand-off lease: how soon messages held by a process that died (a triggerer, a worker) come back.
LEASE = (
    timedelta(seconds=float(os.environ["SQLQUEUE_LEASE_SECONDS"]))
    if "SQLQUEUE_LEASE_SECONDS" in os.environ
    else defaults.LEASE
)
INGEST, CLEANED, REPORTS = (f'{name}@"{SCHEMA}"' for name in ("ingest", "cleaned", "reports"))
SPARK_CONN = "spark_default"
BATCH = 10  # messages one run takes at most


def stage(dag_id: str, task_id: str, source: str, target: str, job, message_type: str) -> DAG:
    """One stage: wait for messages on ``source``, run ``job`` on each in Spark, forward the results to ``target``."""
    with DAG(
        dag_id,
        schedule="@continuous",
        max_active_runs=1,
        start_date=datetime(2026, 1, 1),
        catchup=False,
        default_args={"retries": 0},
        tags=["sqlqueue", "spark"],
        doc_md=__doc__,
    ) as dag:
        wait = SqlQueueSensor(task_id="wait", queue_name=source, max_messages=BATCH, lease=LEASE, deferrable=True)

        @task.pyspark(task_id=task_id, conn_id=SPARK_CONN, multiple_outputs=True)
        def run_job(messages: list[dict], spark=None) -> dict:
            with hold_messages(messages, lease=LEASE) as held:  # claims renewed while Spark works
                results = held.map(lambda message: job(spark, message))  # a failing one is given back alone
                return {"claims": held.messages, "results": results}

        done = run_job(wait.output)
        ForwardMessagesOperator(
            task_id="forward",
            queue_name=target,
            messages=done["results"],
            claims=done["claims"],
            message_type=message_type,
        )
    return dag


stage("sqlqueue_spark_clean", "clean", INGEST, CLEANED, clean_message, "SqlQueue.Demo.DatasetCleaned")
stage("sqlqueue_spark_summarise", "summarise", CLEANED, REPORTS, summarise_message, "SqlQueue.Demo.DatasetReport")
