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


from airflow_provider_sqlqueue.demo.spark_jobs import clean_orders, summarise_orders
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
defaults = {"retries": 0}

with DAG(
    "sqlqueue_spark_clean",
    schedule="@continuous",
    max_active_runs=1,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    default_args=defaults,
    tags=["sqlqueue", "spark"],
    doc_md=__doc__,
):
    wait = SqlQueueSensor(task_id="wait_for_dataset", queue_name=INGEST, max_messages=1, lease=LEASE)

    @task.pyspark(conn_id=SPARK_CONN)
    def clean(messages: list[dict], spark=None) -> list[dict]:
        results = []
        for message in messages:
            body = message["body"]
            target = f"{body['output_root']}/clean/{message['id']}"
            result = clean_orders(spark, body["path"], target)
            print(f"cleaned {body['dataset']}: {result['rows']} rows kept, {result['rejected']} rejected -> {target}")
            results.append({**result, "dataset": body["dataset"], "output_root": body["output_root"]})
        return results

    cleaned = clean(wait.output)
    send = SendMessageOperator(
        task_id="send_to_summarise", queue_name=CLEANED, messages=cleaned, message_type="SqlQueue.Demo.DatasetCleaned"
    )
    cleaned >> send >> AckMessagesOperator(task_id="ack", messages=wait.output)
    [cleaned, send] >> NackMessagesOperator(task_id="give_back", messages=wait.output, trigger_rule="one_failed")

with DAG(
    "sqlqueue_spark_summarise",
    schedule="@continuous",
    max_active_runs=1,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    default_args=defaults,
    tags=["sqlqueue", "spark"],
    doc_md=__doc__,
):
    wait = SqlQueueSensor(task_id="wait_for_clean_data", queue_name=CLEANED, max_messages=1, lease=LEASE)

    @task.pyspark(conn_id=SPARK_CONN)
    def summarise(messages: list[dict], spark=None) -> list[dict]:
        reports = []
        for message in messages:
            body = message["body"]
            target = f"{body['output_root']}/reports/{message['id']}"
            report = summarise_orders(spark, body["path"], target)
            print(f"summarised {body['dataset']}: {report['orders']} orders, revenue {report['revenue']}")
            reports.append({**report, "dataset": body["dataset"]})
        return reports

    summarised = summarise(wait.output)
    send = SendMessageOperator(
        task_id="send_report", queue_name=REPORTS, messages=summarised, message_type="SqlQueue.Demo.DatasetReport"
    )
    summarised >> send >> AckMessagesOperator(task_id="ack", messages=wait.output)
    [summarised, send] >> NackMessagesOperator(task_id="give_back", messages=wait.output, trigger_rule="one_failed")
