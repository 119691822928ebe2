"""The same Spark chain, event-driven: an AssetWatcher starts a DAG run per message.

``ingest_events`` --> clean (Spark) --> ``cleaned_events`` --> summarise (Spark) --> ``reports``

No sensor and no continuously running DAG: the triggerer watches each queue
(``MessageQueueTrigger(scheme="sqlqueue")``), reserves every message that arrives and turns it
into an asset event. Airflow folds events that arrive together into one run (and attaches some to
later runs), so a run does not rely on its own events: its task takes every reservation waiting
on the queue (``hold_messages()``) before any Spark session exists, and starts Spark only if that
took something (a run whose messages an earlier run already took has nothing to do). At most
``MAX_ACTIVE_RUNS`` runs of a stage are queued or running: while they are, the scheduler creates
no run for new events and folds them into the next one, so a steady stream of messages becomes a
stream of batches -- not a run, a worker slot and a task process per message, most of them taking
nothing, which on a busy machine is what made the chain fall behind. The claims
are renewed from then on, while the session starts and the job runs; results are forwarded and
the messages acknowledged in one transaction; a failed job gives its messages back with the
exception, and the reservation that follows starts a new run.
"""

from __future__ import annotations

from datetime import UTC, datetime

from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger
from airflow.sdk import DAG, Asset, AssetWatcher, task
from spark_jobs import clean_batch, summarise_batch  # example_dags/spark_jobs.py: the DAGs folder is on sys.path
from sqlqueue_stages import CONN, LEASE, SCHEMA, queue, report_files, spark_session

from airflow_provider_sqlqueue.operators.sqlqueue import ForwardMessagesOperator
from airflow_provider_sqlqueue.tasks import hold_messages

INGEST, CLEANED, REPORTS = queue("ingest_events"), queue("cleaned_events"), queue("reports")
#: Runs of a stage at once: two, so that one starts (a worker slot, the task's process) while the
#: other's Spark job runs; each takes every reservation waiting when its task starts.
MAX_ACTIVE_RUNS = 2


def watched(queue_name: str, name: str) -> Asset:
    """An asset whose watcher turns each message of the queue into an asset event."""
    return Asset(
        name=f"sqlqueue_{name}",
        uri=f"sqlqueue://{CONN}/{SCHEMA}/{name}",
        watchers=[
            AssetWatcher(
                name=f"{name}_watcher",
                trigger=MessageQueueTrigger(
                    scheme="sqlqueue",
                    sqlqueue_conn_id=CONN,
                    queue_name=queue_name,
                    lease=LEASE.total_seconds(),
                    wake_on_notify=True,  # sqlqueue_setup makes the queues with notify_on_insert
                ),
            )
        ],
    )


def stage(dag_id: str, task_id: str, source: Asset, target: str, job) -> DAG:
    """One stage: each run takes the messages reserved on the queue, runs ``job`` on them in one Spark job, forwards the results."""
    with DAG(
        dag_id,
        schedule=[source],
        start_date=datetime(2026, 1, 1, tzinfo=UTC),
        catchup=False,
        max_active_runs=MAX_ACTIVE_RUNS,
        tags=["sqlqueue", "spark", "event-driven"],
        doc_md=__doc__,
    ) as dag:

        @task(task_id=task_id, multiple_outputs=True)
        def run_job() -> dict:
            # Takes every reservation waiting on the run's queue before Spark starts, and starts it
            # only if that took something. Until taken the messages are only reserved: if this task
            # waits long for a worker slot, they go to another run for free. Once taken, their claims
            # are renewed while the Spark session starts (a JVM on a loaded worker can outlast a
            # short lease) and while the job runs.
            with hold_messages(sqlqueue_conn_id=CONN, lease=LEASE) as held:
                if not held.messages:
                    return {"claims": [], "results": []}  # an earlier run took them: no Spark session
                with spark_session(f"{dag_id}-{task_id}", f"for {len(held.messages)} message(s)") as spark:
                    # One Spark job for the batch; a message it fails on is found and given back alone.
                    results = held.batch(lambda batch: job(spark, batch))
                report_files(held.messages, results)
                return {"claims": held.messages, "results": results}

        done = run_job()
        ForwardMessagesOperator(
            task_id="forward", queue_name=target, messages=done["results"], claims=done["claims"], sqlqueue_conn_id=CONN
        )
    return dag


stage("sqlqueue_spark_clean_events", "clean", watched(INGEST, "ingest_events"), CLEANED, clean_batch)
stage("sqlqueue_spark_summarise_events", "summarise", watched(CLEANED, "cleaned_events"), REPORTS, summarise_batch)
