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


from airflow_provider_sqlqueue.demo.spark_jobs import clean_orders, summarise_orders
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


with DAG(
    "sqlqueue_spark_clean_events",
    schedule=[watched(INGEST, "ingest_events")],
    start_date=datetime(2026, 1, 1),
    catchup=False,
    tags=["sqlqueue", "spark", "event-driven"],
    doc_md=__doc__,
):

    @task.pyspark(conn_id=SPARK_CONN)
    def clean(spark=None, **context) -> list[dict]:
        results = []
        for message in claimed_messages(None, context):
            body = message["body"]
            target = f"{body['output_root']}/clean/{message['id']}"
            results.append({**clean_orders(spark, body["path"], target), "dataset": body["dataset"], "output_root": body["output_root"]})
        return results

    cleaned = clean()
    send = SendMessageOperator(task_id="send_to_summarise", queue_name=CLEANED, messages=cleaned)
    cleaned >> send >> AckMessagesOperator(task_id="ack", sqlqueue_conn_id=CONN)
    [cleaned, send] >> NackMessagesOperator(task_id="give_back", sqlqueue_conn_id=CONN, trigger_rule="one_failed")

with DAG(
    "sqlqueue_spark_summarise_events",
    schedule=[watched(CLEANED, "cleaned_events")],
    start_date=datetime(2026, 1, 1),
    catchup=False,
    tags=["sqlqueue", "spark", "event-driven"],
    doc_md=__doc__,
):

    @task.pyspark(conn_id=SPARK_CONN)
    def summarise(spark=None, **context) -> list[dict]:
        reports = []
        for message in claimed_messages(None, context):
            body = message["body"]
            target = f"{body['output_root']}/reports/{message['id']}"
            reports.append({**summarise_orders(spark, body["path"], target), "dataset": body["dataset"]})
        return reports

    summarised = summarise()
    send = SendMessageOperator(task_id="send_report", queue_name=REPORTS, messages=summarised)
    summarised >> send >> AckMessagesOperator(task_id="ack", sqlqueue_conn_id=CONN)
    [summarised, send] >> NackMessagesOperator(task_id="give_back", sqlqueue_conn_id=CONN, trigger_rule="one_failed")
