"""The example Spark chain end to end (real Airflow, PostgreSQL and PySpark), and the Spark helpers."""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import pytest

from airflow_provider_sqlqueue.transport import Message, QueueAddress
from demo.data import write_orders
from demo.services import LOCAL_SPARK, airflow_connection

from .conftest import EXAMPLE_DAGS


def run_dag(dag_id: str) -> tuple[Any, float]:
    """Run one example DAG with ``dag.test()``; returns the run and its duration in seconds."""
    from airflow.dag_processing.dagbag import DagBag

    sys.modules.pop("sqlqueue_stages", None)  # the DAG files' shared module reads SQLQUEUE_SCHEMA when imported
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


QUEUES = ("ingest", "cleaned", "reports", "error")


@pytest.fixture
def pipeline(airflow_db, pg_uri, schema, client, monkeypatch, tmp_path):
    """The example DAGs' connections pointed at the test server and schema; the setup DAG has run."""
    monkeypatch.setenv("AIRFLOW_CONN_SQLQUEUE_DEFAULT", airflow_connection(pg_uri))
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps(LOCAL_SPARK))
    monkeypatch.setenv("SQLQUEUE_SCHEMA", schema)
    monkeypatch.setenv("AIRFLOW__CORE__DAGS_FOLDER", EXAMPLE_DAGS)
    setup, _ = run_dag("sqlqueue_setup")
    assert setup.state == "success"
    return tmp_path


def left(client, schema) -> dict[str, int]:
    return {
        name: client.depth(QueueAddress(name, schema)) + client.in_flight(QueueAddress(name, schema)) for name in QUEUES
    }


def check_report(report: dict, expected: dict) -> None:
    assert report["orders"] == expected["valid_orders"]
    assert report["revenue"] == pytest.approx(expected["revenue"], abs=0.05)
    assert report["by_country"][0]["country"] == expected["top_country"]
    assert report["first_day"] == "2026-11-01" and report["last_day"] == "2026-11-30"


def test_chain_end_to_end(pipeline, client, schema):
    dataset = pipeline / "orders.csv"
    expected = write_orders(dataset, rows=3000)
    client.send(
        QueueAddress("ingest", schema),
        Message.of({"dataset": "t", "path": str(dataset), "output_root": str(pipeline / "out")}),
    )

    clean, _ = run_dag("sqlqueue_spark_clean")
    assert clean.state == "success"
    [cleaned] = task_output(clean, "clean")["results"]
    assert (
        cleaned["rows"] == expected["valid_orders"]
        and cleaned["rejected"] == expected["rows"] - expected["valid_orders"]
    )

    summarise, _ = run_dag("sqlqueue_spark_summarise")
    assert summarise.state == "success"
    [report_message] = client.receive(QueueAddress("reports", schema))
    assert report_message.headers["NServiceBus.EnclosedMessageTypes"] == "SqlQueue.Demo.DatasetReport"
    check_report(report_message.json(), expected)
    assert left(client, schema) == dict.fromkeys(QUEUES, 0)


def test_a_batch_of_datasets_is_one_spark_job_and_a_missing_one_is_given_back_alone(pipeline, client, schema):
    """Three datasets in one run, the second not there: the batch's job fails, is split until the
    missing one is found, and the two others are cleaned, forwarded and summarised together."""
    expected = {
        name: write_orders(pipeline / f"{name}.csv", rows=800, seed=seed) for name, seed in (("a", 1), ("c", 3))
    }
    for name in ("a", "b", "c"):
        body = {"dataset": name, "path": str(pipeline / f"{name}.csv"), "output_root": str(pipeline / "out")}
        client.send(QueueAddress("ingest", schema), Message.of(body))

    clean, _ = run_dag("sqlqueue_spark_clean")
    assert clean.state == "success"
    results = task_output(clean, "clean")["results"]
    assert [r["dataset"] for r in results] == ["a", "c"]  # in the messages' order, without the missing one
    for result in results:
        assert result["rows"] == expected[result["dataset"]]["valid_orders"]
        assert result["path"].startswith(str(pipeline / "out" / "clean" / "message="))
    assert client.peek(QueueAddress("ingest", schema), include_claims=True) == 1  # "b" given back, not lost

    summarise, _ = run_dag("sqlqueue_spark_summarise")
    assert summarise.state == "success"
    reports = {m.json()["dataset"]: m.json() for m in client.receive(QueueAddress("reports", schema), 5)}
    assert sorted(reports) == ["a", "c"]
    for name, report in reports.items():
        check_report(report, expected[name])


def test_fan_out_one_stage_publishes_to_two_subscribed_stages(pipeline, client, schema):
    """sqlqueue_setup subscribed fanout_summary and fanout_quality; the clean stage publishes to both."""
    dataset = pipeline / "orders.csv"
    expected = write_orders(dataset, rows=1000)
    sent = Message.of({"dataset": "f", "path": str(dataset), "output_root": str(pipeline / "out")})
    client.send(QueueAddress("fanout_ingest", schema), sent)

    clean, _ = run_dag("sqlqueue_fanout_clean")
    assert clean.state == "success"
    assert sorted(task_output(clean, "publish")) == [f'fanout_quality@"{schema}"', f'fanout_summary@"{schema}"']
    events = {name: client.browse(QueueAddress(name, schema)) for name in ("fanout_summary", "fanout_quality")}
    assert [len(found) for found in events.values()] == [1, 1]
    assert events["fanout_summary"][0].id == events["fanout_quality"][0].id  # one event, two subscribers
    assert events["fanout_summary"][0].headers["NServiceBus.MessageIntent"] == "Publish"

    for dag_id in ("sqlqueue_fanout_summarise", "sqlqueue_fanout_quality"):
        assert run_dag(dag_id)[0].state == "success"
    reports = {
        m.headers["NServiceBus.EnclosedMessageTypes"]: m.json()
        for m in client.receive(QueueAddress("fanout_reports", schema), 10)
    }
    assert set(reports) == {"SqlQueue.Demo.DatasetReport", "SqlQueue.Demo.QualityReport"}
    check_report(reports["SqlQueue.Demo.DatasetReport"], expected)
    quality = reports["SqlQueue.Demo.QualityReport"]
    assert quality["rows"] == expected["valid_orders"] == sum(quality["rows_per_country"].values())
    for name in ("fanout_ingest", "fanout_summary", "fanout_quality", "fanout_reports"):
        address = QueueAddress(name, schema)
        assert client.depth(address) + client.in_flight(address) == 0, name


def test_first_spark_job_fails_once_then_the_chain_completes(pipeline, client, schema):
    """The dataset's file is not there yet: the Spark job fails, the message comes back, and the retry succeeds."""
    dataset = pipeline / "late.csv"
    client.send(
        QueueAddress("ingest", schema),
        Message.of({"dataset": "late", "path": str(dataset), "output_root": str(pipeline / "out")}),
    )

    first, _ = run_dag("sqlqueue_spark_clean")
    assert first.state == "success"  # the batch went on: its one failing message was given back alone
    assert task_output(first, "clean") == {"claims": [], "results": []}
    assert client.depth(QueueAddress("cleaned", schema)) == 0
    assert client.peek(QueueAddress("ingest", schema), include_claims=True) == 1  # given back, not lost
    [stored] = client.session.connection.execute(f'SELECT LastError FROM "{schema}".sqlqueue_inflight').fetchone()
    failure = json.loads(stored)  # what the error queue will say if the message ends there
    assert failure["source"] == "sqlqueue_spark_clean.clean"
    assert "PATH_NOT_FOUND" in failure["message"] and failure["type"].endswith("AnalysisException")

    expected = write_orders(dataset, rows=1500, seed=5)
    clean, _ = run_dag("sqlqueue_spark_clean")
    assert clean.state == "success"
    assert task_output(clean, "wait")[0]["deliveries"] == 2
    summarise, _ = run_dag("sqlqueue_spark_summarise")
    assert summarise.state == "success"
    [report_message] = client.receive(QueueAddress("reports", schema))
    check_report(report_message.json(), expected)
    assert left(client, schema) == dict.fromkeys(QUEUES, 0)


def test_maintenance_reports_depths_and_errors(pipeline, client, schema):
    ingest = QueueAddress("ingest", schema)
    client.send(ingest, [Message("a"), Message("gone", time_to_be_received=0.001)])
    [message] = client.receive(ingest)
    client.move_to_error(ingest, message, ValueError("bad dataset"))
    run, _ = run_dag("sqlqueue_maintenance")
    assert run.state == "success"
    summary = task_output(run, "report")
    assert summary["queues"][f'ingest@"{schema}"'] == {"waiting": 0, "in_flight": 0}  # the expired one was purged
    assert summary["error_queue"]["messages"] == 1
    assert summary["error_queue"]["by_source"] == {f'ingest@"{schema}"': 1}
    assert summary["error_queue"]["by_exception"] == {"builtins.ValueError": 1}


def test_event_driven_dags_parse_with_their_watchers(pipeline):
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=EXAMPLE_DAGS)
    assert not bag.import_errors
    for dag_id in ("sqlqueue_spark_clean_events", "sqlqueue_spark_summarise_events"):
        [asset] = bag.dags[dag_id].timetable.asset_condition.objects  # one watched queue each
        [watcher] = asset.watchers
        assert watcher.trigger.serialize()[0] == "airflow_provider_sqlqueue.triggers.sqlqueue.SqlQueueEventTrigger"
        # A plain task, not @task.pyspark: it takes its messages, then starts Spark only if it took any.
        [first] = [t for t in bag.dags[dag_id].tasks if not t.upstream_task_ids]
        assert first.task_id in ("clean", "summarise") and type(first).__name__ == "_PythonDecoratedOperator"


def test_send_rows_and_read_queue(client, queue, schema, pg_uri, monkeypatch):
    from pyspark.sql import SparkSession

    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)  # executors need this package and psycopg
    from airflow_provider_sqlqueue.spark import read_queue, send_rows

    spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
    try:
        df = spark.range(0, 1000, numPartitions=4).selectExpr("id", "concat('order-', id) AS name")
        assert send_rows(df, pg_uri, f'orders@"{schema}"', batch_size=64) == 1000
        assert client.depth(queue) == 1000
        pending = read_queue(spark, pg_uri, f'orders@"{schema}"', limit=2000)
        assert pending.count() == 1000
        bodies = sorted(json.loads(row.text)["id"] for row in pending.select("text").collect())
        assert bodies == list(range(1000))
        assert pending.where("headers['NServiceBus.ContentType'] = 'application/json'").count() == 1000
        assert client.depth(queue) == 1000  # reading leaves them queued
    finally:
        spark.stop()
