"""What the example pipelines share: where their queues are, the hand-off lease, and one stage of a chain.

A stage waits for messages on a queue (a deferrable sensor: the wait runs in the triggerer), runs
one Spark job over all the messages it took while their claims are renewed, then hands the
results on and acknowledges the messages in one transaction: sent to the next queue
(``ForwardMessagesOperator``) or published to whoever subscribed to a topic
(``PublishMessageOperator``). A result is handed on once per message even if a worker dies
mid-job and the message is handled again. If the job fails, the batch is split until the failing
message is found; it alone is given back with the exception, and after 5 deliveries it moves to
the error queue, whose headers name the exception and the task. Spark runs wherever the ``spark_default``
connection points (``local[*]`` when it has no host); change that connection, not the DAGs, to use
a cluster. The queues are in the database of the ``sqlqueue_default`` connection (schema:
``SQLQUEUE_SCHEMA``, default ``public``); the ``sqlqueue_setup`` DAG creates them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

from airflow.sdk import DAG, BaseHook, task

from airflow_provider_sqlqueue.operators.sqlqueue import ForwardMessagesOperator, PublishMessageOperator
from airflow_provider_sqlqueue.sensors.sqlqueue import SqlQueueSensor
from airflow_provider_sqlqueue.tasks import hold_messages
from airflow_provider_sqlqueue.transport import defaults

SCHEMA = os.environ.get("SQLQUEUE_SCHEMA", "public")
#: The hand-off lease: how soon messages held by a process that died (a triggerer, a worker) come back.
LEASE = (
    timedelta(seconds=float(os.environ["SQLQUEUE_LEASE_SECONDS"]))
    if "SQLQUEUE_LEASE_SECONDS" in os.environ
    else defaults.LEASE
)
CONN, SPARK_CONN = "sqlqueue_default", "spark_default"
#: NServiceBus's subscription table of the examples' publish/subscribe, beside their queues.
SUBSCRIPTIONS = f'SubscriptionRouting@"{SCHEMA}"'
#: Messages one run takes at most. A stage runs one run at a time (``@continuous``) and each run
#: costs Spark's fixed time whatever its size (a session, a job: 20-30 s per run measured on the
#: chain benchmark), so a stage keeps up with a stream only if a run takes everything that arrived
#: during the last one: 10 capped the sensor chain at 0.38 messages/s (BENCHMARKS.md); by the same
#: arithmetic 100 allows about three a second. A larger batch makes a failing message's bisection longer.
BATCH = 100
#: The event the fan-out example publishes, and the queues subscribed to it (sqlqueue_setup subscribes them).
ORDERS_CLEANED = "SqlQueue.Demo.OrdersCleaned"
SUBSCRIBERS = {"fanout_summary": [ORDERS_CLEANED], "fanout_quality": [ORDERS_CLEANED]}
#: Every queue of the examples, as sqlqueue_setup creates them (each with error@SCHEMA beside it).
QUEUES = [
    "ingest",
    "cleaned",
    "reports",
    "ingest_events",
    "cleaned_events",
    "fanout_ingest",
    "fanout_summary",
    "fanout_quality",
    "fanout_reports",
    "order_events",
    "order_revenue",
]

#: A Spark job over a batch of messages: the session and the message dicts, one result per message in order.
Job = Callable[[Any, list[dict[str, Any]]], list[dict[str, Any]]]


@contextmanager
def spark_session(app_name: str, why: str, conn_id: str = SPARK_CONN) -> Iterator[Any]:
    """A Spark session where the Spark connection points, built as ``@task.pyspark`` builds it.

    For a task that takes its messages before Spark starts, and starts it only if it took any:
    ``@task.pyspark`` starts the session before the task's code runs. Stopped when the block ends;
    ``why`` goes into the line the task prints when a session starts.
    """
    print(f"{app_name}: starting a Spark session {why}")
    from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook
    from pyspark import SparkConf
    from pyspark.sql import SparkSession

    conf = SparkConf().set("spark.app.name", app_name)
    connection = BaseHook.get_connection(conn_id)
    if connection.conn_type == SparkConnectHook.conn_type:
        url = SparkConnectHook(conn_id).get_connection_url()
    else:
        url = f"{connection.host}:{connection.port}" if connection.port else connection.host or "local[*]"
    for key, value in connection.extra_dejson.items():
        conf.set(key, value)
    if url.startswith("sc://"):
        conf.set("spark.remote", url)
    elif not conf.get("spark.master", None):
        conf.set("spark.master", url)
    session = SparkSession.builder.config(conf=conf).getOrCreate()
    try:
        yield session
    finally:
        session.stop()


def report_files(messages: list[dict], results: list[Any]) -> None:
    """Name the files a stage's Spark job read (each message's ``path``) and wrote (each result's
    ``path``) to Airflow's hook lineage, which the openlineage provider reports with the task, as
    ``file://`` datasets: with the queues ``hold_messages`` names and the forward reports, the
    stage's lineage runs from the input files through the queues to the reports."""
    from airflow.sdk import ObjectStoragePath
    from airflow.sdk.lineage import get_hook_lineage_collector

    collector = get_hook_lineage_collector()
    read = [m["body"].get("path") for m in messages if isinstance(m.get("body"), dict)]
    written = [r.get("path") for r in results if isinstance(r, dict)]
    for add, paths in ((collector.add_input_asset, read), (collector.add_output_asset, written)):
        for path in dict.fromkeys(p for p in paths if isinstance(p, str) and p):
            # Spark's partition folders (message=<id>) keep their "=": a URI may hold it as it is.
            uri = path if "://" in path else "file://" + quote(str(Path(path).resolve()), safe="/=:@+,")
            add(context=ObjectStoragePath(uri), uri=uri)


def queue(name: str) -> str:
    """The address of an example queue, in the examples' schema."""
    return f'{name}@"{SCHEMA}"'


def stage(
    dag_id: str,
    task_id: str,
    source: str,
    job: Job,
    message_type: str,
    *,
    target: str | None = None,
    publish: bool = False,
    doc_md: str | None = None,
) -> DAG:
    """Wait for messages on ``source``, run ``job`` on them in Spark (one job for the batch), then
    send the results to ``target`` or (``publish``) publish them as events of type ``message_type``."""
    if (target is None) == (not publish):
        raise ValueError("a stage either sends to a target queue or publishes")
    with DAG(
        dag_id,
        schedule="@continuous",
        max_active_runs=1,
        start_date=datetime(2026, 1, 1, tzinfo=UTC),
        catchup=False,
        default_args={"retries": 0},
        tags=["sqlqueue", "spark"],
        doc_md=doc_md,
    ) as dag:
        wait = SqlQueueSensor(
            task_id="wait",
            queue_name=source,
            max_messages=BATCH,
            lease=LEASE,
            deferrable=True,
            wake_on_notify=True,  # every insert notifies: the queues are made with notify_on_insert
        )

        @task.pyspark(task_id=task_id, conn_id=SPARK_CONN, multiple_outputs=True)
        def run_job(messages: list[dict], spark=None) -> dict:
            with hold_messages(messages, lease=LEASE) as held:  # claims renewed while Spark works
                # One Spark job for the batch; a message it fails on is found and given back alone.
                results = held.batch(lambda batch: job(spark, batch))
                report_files(held.messages, results)
                return {"claims": held.messages, "results": results}

        done = run_job(wait.output)
        if publish:
            PublishMessageOperator(
                task_id="publish",
                topics=[message_type],
                messages=done["results"],
                claims=done["claims"],
                subscription_table=SUBSCRIPTIONS,
            )
        else:
            ForwardMessagesOperator(
                task_id="forward",
                queue_name=target,
                messages=done["results"],
                claims=done["claims"],
                message_type=message_type,
            )
    return dag
