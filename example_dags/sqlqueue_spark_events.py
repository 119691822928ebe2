"""The same Spark chain, event-driven: an AssetWatcher starts a DAG run per message.

``ingest_events`` --> clean (Spark) --> ``cleaned_events`` --> summarise (Spark) --> ``reports``

No sensor and no continuously running DAG: the triggerer watches each queue
(``MessageQueueTrigger(scheme="sqlqueue")``) and every message becomes an asset event that starts
a run; the run reads its messages from the triggering asset events and acknowledges them at the
end. A failed run gives them back, which starts a new run.
"""

from __future__ import annotations

import os
from datetime import datetime

from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger
from airflow.sdk import DAG, Asset, AssetWatcher, task

from airflow_provider_sqlqueue.demo.spark_jobs import clean_message, summarise_message
from airflow_provider_sqlqueue.operators.sqlqueue import (
    AckMessagesOperator,
    NackMessagesOperator,
    SendMessageOperator,
    claimed_messages,
)

SCHEMA = os.environ.get("SQLQUEUE_SCHEMA", "public")
CONN, SPARK_CONN = "sqlqueue_default", "spark_default"
INGEST, CLEANED, REPORTS = (f'{name}@"{SCHEMA}"' for name in ("ingest_events", "cleaned_events", "reports"))


def watched(queue_name: str, name: str) -> Asset:
    """An asset whose watcher turns each message of the queue into an asset event."""
    return Asset(
        name=f"sqlqueue_{name}",
        uri=f"sqlqueue://{CONN}/{SCHEMA}/{name}",
        watchers=[
            AssetWatcher(
                name=f"{name}_watcher",
                trigger=MessageQueueTrigger(
                    scheme="sqlqueue", sqlqueue_conn_id=CONN, queue_name=queue_name, lease_seconds=3600
                ),
            )
        ],
    )


def stage(dag_id: str, task_id: str, source: Asset, target: str, job) -> DAG:
    """One stage: each run handles the messages that triggered it in Spark, sends the results on, acks."""
    with DAG(
        dag_id,
        schedule=[source],
        start_date=datetime(2026, 1, 1),
        catchup=False,
        tags=["sqlqueue", "spark", "event-driven"],
        doc_md=__doc__,
    ) as dag:

        @task.pyspark(task_id=task_id, conn_id=SPARK_CONN)
        def run_job(spark=None, **context) -> list[dict]:
            return [job(spark, message) for message in claimed_messages(None, context)]

        results = run_job()
        send = SendMessageOperator(task_id="send", queue_name=target, messages=results, sqlqueue_conn_id=CONN)
        results >> send >> AckMessagesOperator(task_id="ack", sqlqueue_conn_id=CONN)
        [results, send] >> NackMessagesOperator(task_id="give_back", sqlqueue_conn_id=CONN, trigger_rule="one_failed")
    return dag


stage("sqlqueue_spark_clean_events", "clean", watched(INGEST, "ingest_events"), CLEANED, clean_message)
stage("sqlqueue_spark_summarise_events", "summarise", watched(CLEANED, "cleaned_events"), REPORTS, summarise_message)
