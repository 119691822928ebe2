"""Two Spark jobs chained through queue tables, one sensor-driven DAG per stage.

``ingest`` --(dataset path)--> clean (Spark) --(clean data path)--> ``cleaned``
``cleaned`` --> summarise (Spark) --(report)--> ``reports``

Each stage waits for one message (deferrable sensor, in the triggerer), runs its Spark job, sends
its result as a message to the next queue and only then acknowledges the message it was given.
If the job fails the message is given back at once; after 5 deliveries it moves to the error
queue. Spark runs wherever the ``spark_default`` connection points (``local[*]`` when it has no
host); change that connection, not these DAGs, to use a cluster. The queues are in the database
of the ``sqlqueue_default`` connection (schema: ``SQLQUEUE_SCHEMA``, default ``public``); the
``sqlqueue_setup`` DAG creates them.

Messages: ``ingest`` takes ``{"dataset": name, "path": csv, "output_root": dir}``; paths must be
readable by the Spark cluster (a shared filesystem or object store once Spark is not local).
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.sdk import DAG, task

from airflow_provider_sqlqueue.demo.spark_jobs import clean_message, summarise_message
from airflow_provider_sqlqueue.operators.sqlqueue import (
    AckMessagesOperator,
    NackMessagesOperator,
    SendMessageOperator,
)
from airflow_provider_sqlqueue.sensors.sqlqueue import SqlQueueSensor

SCHEMA = os.environ.get("SQLQUEUE_SCHEMA", "public")
INGEST, CLEANED, REPORTS = (f'{name}@"{SCHEMA}"' for name in ("ingest", "cleaned", "reports"))
SPARK_CONN = "spark_default"
LEASE = timedelta(hours=1)  # longer than a stage's Spark job takes


def stage(dag_id: str, task_id: str, source: str, target: str, job, message_type: str) -> DAG:
    """One stage: wait for a message on ``source``, run ``job`` on it in Spark, send the result to ``target``, ack."""
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
        wait = SqlQueueSensor(task_id="wait", queue_name=source, max_messages=1, lease=LEASE)

        @task.pyspark(task_id=task_id, conn_id=SPARK_CONN)
        def run_job(messages: list[dict], spark=None) -> list[dict]:
            return [job(spark, message) for message in messages]

        results = run_job(wait.output)
        send = SendMessageOperator(task_id="send", queue_name=target, messages=results, message_type=message_type)
        results >> send >> AckMessagesOperator(task_id="ack", messages=wait.output)
        [results, send] >> NackMessagesOperator(task_id="give_back", messages=wait.output, trigger_rule="one_failed")
    return dag


stage("sqlqueue_spark_clean", "clean", INGEST, CLEANED, clean_message, "SqlQueue.Demo.DatasetCleaned")
stage("sqlqueue_spark_summarise", "summarise", CLEANED, REPORTS, summarise_message, "SqlQueue.Demo.DatasetReport")
