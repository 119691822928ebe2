"""The ``sqlqueue`` data source on a real standalone Spark cluster, every guarantee counted.

A master and a worker are started from the installed PySpark distribution (``spark-class``), and
Spark Connect from the same distribution; executors are separate JVMs with their own Python
workers, so nothing here shares memory with the test. Counts come from the queue tables: each row
sent exactly once, each streamed or relayed message delivered downstream exactly once across a stop
and a SIGKILL of an executor or the driver. The example DAGs on a cluster, under Airflow's real
services, are in ``tests/test_spark_cluster_dags.py``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest

from airflow_provider_sqlqueue.transport import Message, QueueAddress, QueueClient
from demo.spark_cluster import SparkCluster
from tests.conftest import EXAMPLE_DAGS

pytestmark = pytest.mark.timeout(1800)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    # Cores are shared out by applications (this test's, a killed driver's, Airflow's, Spark
    # Connect's), not by the machine's two CPUs.
    with SparkCluster(tmp_path_factory.mktemp("spark-cluster"), cores=6, memory="6g") as running:
        yield running


@pytest.fixture(scope="module")
def spark(cluster: SparkCluster) -> Iterator[object]:
    from pyspark import SparkContext

    from airflow_provider_sqlqueue.spark import register

    session = cluster.session("sqlqueue-source-tests", {"spark.task.maxFailures": "4"})
    register(session)
    yield session
    session.stop()
    # The JVM outlives the session, keeping the conf it was launched with as system properties, which
    # every later SparkConf of this process reads. Airflow's @task.pyspark sets its connection's master
    # only when the conf has none, so the example DAGs run later by tests/test_spark_pipeline.py went
    # to this cluster's master, stopped with this module.
    SparkContext._jvm.java.lang.System.clearProperty("spark.master")


@pytest.fixture(name="space")  # a name of its own: tests/test_spark_write.py imports it
def space_fixture(pg_uri: str) -> Iterator[Callable[[str], str]]:
    """A schema of its own; returns a function giving a queue's address in it (created on first use)."""
    schema = f"spark_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_uri, autocommit=True) as admin:
        admin.execute(f'CREATE SCHEMA "{schema}"')

    def queue(name: str) -> str:
        address = f'{name}@"{schema}"'
        with QueueClient.connect(pg_uri) as client:
            client.create_queue(address)
        return address

    try:
        yield queue
    finally:
        with psycopg.connect(pg_uri, autocommit=True) as admin:
            admin.execute(f'DROP SCHEMA "{schema}" CASCADE')


@contextmanager
def executors_killed(spark: Any, pg_uri: str, statement: str, params: tuple[object, ...]) -> Iterator[None]:
    """For the block: the application's executor JVMs SIGKILLed as soon as a session runs a
    ``statement`` (a condition on pg_stat_activity); at least one must have been."""
    app = spark.sparkContext.applicationId
    killed: list[int] = []

    def kill() -> None:
        deadline = time.monotonic() + 300
        with psycopg.connect(pg_uri, autocommit=True) as watcher:
            while time.monotonic() < deadline and not killed:
                sql = f"SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND {statement}"
                if watcher.execute(sql, params).fetchone()[0]:
                    pattern = f"CoarseGrainedExecutorBackend.*{app}"
                    found = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.split()
                    for pid in map(int, found):
                        os.kill(pid, signal.SIGKILL)
                        killed.append(pid)
                time.sleep(0.02)

    killer = threading.Thread(target=kill, daemon=True)
    killer.start()
    yield
    killer.join(timeout=10)
    assert killed, f"no executor was killed (none ran {statement})"


def send_order_events(pg_uri: str, queue: str, count: int) -> None:
    """``count`` order events (JSON bodies, as the streaming example reads them), 5,000 a send."""
    with QueueClient.connect(pg_uri) as client:
        for start in range(0, count, 5_000):
            orders = (
                {"order_id": f"o{n}", "country": "NL", "quantity": n % 7 + 1, "unit_price": 2.5}
                for n in range(start, min(count, start + 5_000))
            )
            client.send(queue, [Message.of(order) for order in orders])


def depth(pg_uri: str, queue: str) -> int:
    with QueueClient.connect(pg_uri) as client:
        return client.depth(queue)


def bodies(pg_uri: str, queue: str) -> list[dict]:
    with QueueClient.connect(pg_uri) as client:
        return [m.json() for m in client.browse(queue, 100_000)]  # type: ignore[misc]


def test_a_batch_write_of_100000_rows_is_exactly_100000_messages(spark, space, pg_uri):
    orders = space("orders")
    df = spark.range(100_000).selectExpr("id AS n", "concat('order-', id) AS name").repartition(8)
    started = time.perf_counter()
    df.write.format("sqlqueue").option("url", pg_uri).option("queue", orders).mode("append").save()
    print(f"\n100,000 rows written by 8 partitions in {time.perf_counter() - started:.1f}s")
    sent = bodies(pg_uri, orders)
    assert len(sent) == 100_000 and len({b["n"] for b in sent}) == 100_000
    with QueueClient.connect(pg_uri) as client:  # the write is over: its ledger rows are gone
        ledger = client.address(orders).sibling("sqlqueue_writes")
        assert client.forget_write(ledger, uuid.uuid4()) == 0
        with client.connection.cursor() as cursor:
            cursor.execute(f'SELECT count(*) FROM "{ledger.schema}".sqlqueue_writes')
            assert cursor.fetchone()[0] == 0


def test_a_task_that_fails_mid_write_leaves_no_partial_partition_and_loses_nothing(spark, space, pg_uri):
    """Partition 2's first attempt dies after 700 of its rows went to the database; Spark retries it."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType

    orders = space("orders")

    @F.udf(LongType())
    def fail_first_attempt(n):  # no hints: PySpark would read them as a pandas UDF's and warn
        from pyspark import TaskContext

        context = TaskContext.get()
        if context.partitionId() == 2 and context.attemptNumber() == 0 and n % 10_000 >= 700:
            raise RuntimeError("executor lost mid-partition (first attempt)")
        return n

    df = spark.range(0, 40_000, numPartitions=4).select(fail_first_attempt("id").alias("n"))
    df.write.format("sqlqueue").option("url", pg_uri).option("queue", orders).option("batchSize", "100").mode(
        "append"
    ).save()
    sent = [b["n"] for b in bodies(pg_uri, orders)]
    assert len(sent) == 40_000 and len(set(sent)) == 40_000


def test_an_executor_sigkilled_mid_jvm_write_loses_nothing_and_sends_nothing_twice(spark, space, pg_uri):
    """The JVM path (messages built by Spark, each partition loaded by COPY with its ledger row): the
    executor JVM is SIGKILLed while its tasks load; the worker starts another, Spark runs the lost
    tasks again, and every row is one message."""
    from airflow_provider_sqlqueue.spark import save_to_queue

    orders = space("orders")
    df = spark.range(0, 300_000, numPartitions=4).selectExpr("id AS n", "repeat('x', 300) AS pad")
    with executors_killed(spark, pg_uri, "query LIKE 'COPY %%orders%%'", ()):  # while its tasks load
        save_to_queue(df, url=pg_uri, queue=orders, engine="jvm")
    with QueueClient.connect(pg_uri) as client:
        schema = client.address(orders).schema
    with psycopg.connect(pg_uri) as raw:
        counted = raw.execute(
            f"SELECT count(*), count(DISTINCT (convert_from(Body, 'UTF8')::json ->> 'n')) FROM \"{schema}\".orders"
        ).fetchone()
    assert counted == (300_000, 300_000)  # every row once


def test_the_example_jobs_give_each_message_the_rows_of_its_own_input(spark, tmp_path):
    """A batch is read as one relation and its rows handed back per message: names with spaces, ``%``
    and non-ASCII letters, two messages naming one file, an input without rows and a ``file:`` path
    each get exactly their own rows, through both stages."""
    from spark_jobs import clean_batch, summarise_batch

    from demo.data import write_orders

    inputs = tmp_path / "in put"
    paths = [inputs / name for name in ["plain.csv", "with space.csv", "per%20cent.csv", "ünï cödé.csv"]]
    valid = [write_orders(path, rows=50 + n, seed=n)["valid_orders"] for n, path in enumerate(paths)]
    empty = inputs / "empty.csv"
    empty.write_text(paths[0].read_text().splitlines(keepends=True)[0])
    named = [*map(str, paths), str(paths[0]), str(empty), f"file:{paths[1]}"]
    expected = [*valid, valid[0], 0, valid[1]]
    out = str(tmp_path / "out")
    batch = [
        {"id": uuid.uuid4(), "body": {"dataset": f"d{n}", "path": p, "output_root": out}} for n, p in enumerate(named)
    ]

    cleaned = clean_batch(spark, batch)
    assert [result["rows"] for result in cleaned] == expected
    assert [result["dataset"] for result in cleaned] == [f"d{n}" for n in range(len(named))]
    reports = summarise_batch(spark, [{"id": uuid.uuid4(), "body": r} for r in cleaned if r["rows"]])
    assert [report["orders"] for report in reports] == [n for n in expected if n]


STREAM_DRIVER = """
import sys
sys.path.insert(0, {dags!r})
from pyspark.sql import SparkSession
from spark_jobs import relay_orders
spark = (SparkSession.builder.master({master!r}).appName("sqlqueue-stream-driver")
         .config("spark.ui.enabled", "false").config("spark.cores.max", "2")
         .config("spark.executor.memory", "1g").getOrCreate())
relay_orders(spark, {url!r}, {source!r}, {target!r}, {checkpoint!r})
"""


def test_a_stream_stopped_and_then_killed_delivers_each_of_20000_messages_once(spark, cluster, space, pg_uri, tmp_path):
    sys.path.insert(0, EXAMPLE_DAGS)
    from spark_jobs import order_stream, relay_orders

    events, revenue = space("order_events"), space("order_revenue")
    checkpoint = str(tmp_path / "checkpoint")
    send_order_events(pg_uri, events, 20_000)

    def delivered() -> int:
        return depth(pg_uri, revenue)

    def wait_for(count: int, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        while delivered() < count:
            assert time.monotonic() < deadline, f"only {delivered()} of {count} delivered"
            time.sleep(0.5)

    # 1. A query stopped while it works.
    query = order_stream(spark, pg_uri, events, revenue, checkpoint)
    wait_for(5_000)
    query.stop()
    first = delivered()

    # 2. A driver SIGKILLed mid-stream: its claims stay held, its last batch half written.
    script = STREAM_DRIVER.format(
        dags=EXAMPLE_DAGS, master=cluster.master, url=pg_uri, source=events, target=revenue, checkpoint=checkpoint
    )
    driver = subprocess.Popen(
        [sys.executable, "-c", script], env={**os.environ, "PYSPARK_PYTHON": sys.executable}, start_new_session=True
    )
    try:
        wait_for(first + 5_000)
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait(timeout=60)
    second = delivered()

    # 3. Restarted from the checkpoint: the killed batch is replayed from its claims, then the rest.
    result = relay_orders(spark, pg_uri, events, revenue, checkpoint)
    out = bodies(pg_uri, revenue)
    ids = [b["order_id"] for b in out]
    print(f"\ndelivered {first} before the stop, {second} before the kill, {len(out)} in all; last run {result}")
    assert len(ids) == 20_000 and len(set(ids)) == 20_000  # every one, none twice
    assert {b["revenue"] for b in out if b["order_id"] == "o3"} == {10.0}
    with QueueClient.connect(pg_uri) as client:
        assert client.depth(events) == 0 and client.in_flight(events) == 0  # every claim acknowledged
        assert client.depth(QueueAddress("error", client.address(events).schema)) == 0


HELD_RELAY_DRIVER = """
import sys
sys.path.insert(0, {dags!r})
from pyspark.sql import SparkSession
from spark_jobs import relay_orders_in_held_batches
spark = (SparkSession.builder.master({master!r}).appName("sqlqueue-held-relay-driver")
         .config("spark.ui.enabled", "false").config("spark.cores.max", "2")
         .config("spark.executor.memory", "1g").getOrCreate())
relay_orders_in_held_batches(spark, {url!r}, {source!r}, {target!r}, max_per_batch=2_000)
"""


@pytest.mark.skip(
    reason="its executor kill finds the data source's read by its query; Spark's JDBC reader now reads the batch: to be rewritten for it (issue 44)"
)
def test_a_held_relay_whose_executor_and_then_driver_are_sigkilled_sends_each_of_16000_once(
    spark, cluster, space, pg_uri
):
    """relay_batch on the cluster: an executor SIGKILLed while it reads a held batch (Spark runs its
    tasks again over the same locked rows), then a driver SIGKILLed mid-relay (its batch's load and
    acknowledgement never commit); a relay run afterwards sends the rest. Each event once."""
    sys.path.insert(0, EXAMPLE_DAGS)
    from spark_jobs import relay_orders_in_held_batches

    events, revenue = space("order_events"), space("order_revenue")
    send_order_events(pg_uri, events, 10_000)
    with QueueClient.connect(pg_uri) as client:
        schema = client.address(events).schema

    def delivered() -> int:
        return depth(pg_uri, revenue)

    # 1. An executor SIGKILLed while it reads a held batch of this process's relay.
    reading = "query LIKE '%%pg_xact_status%%' AND strpos(query, %s) > 0"  # a read of the locked rows
    with executors_killed(spark, pg_uri, reading, (schema,)):
        first = relay_orders_in_held_batches(spark, pg_uri, events, revenue, max_per_batch=2_500)
    assert first["events"] == first["taken"] == delivered() == 10_000

    # 2. The same relay's driver SIGKILLed mid-relay, on fresh events.
    with QueueClient.connect(pg_uri) as client:
        client.send(
            events,
            [
                Message.of({"order_id": f"p{n}", "country": "NL", "quantity": 1, "unit_price": 1.0})
                for n in range(6_000)
            ],
        )
    before = delivered()
    script = HELD_RELAY_DRIVER.format(
        dags=EXAMPLE_DAGS, master=cluster.master, url=pg_uri, source=events, target=revenue
    )
    driver = subprocess.Popen(
        [sys.executable, "-c", script], env={**os.environ, "PYSPARK_PYTHON": sys.executable}, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 300
        while delivered() < before + 2_000:  # at least one batch committed: the kill falls mid-relay
            assert driver.poll() is None and time.monotonic() < deadline, "the driver relayed nothing"
            time.sleep(0.2)
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait(timeout=60)

    # 3. A relay afterwards: the killed batch is back in the queue, and goes with the rest.
    relay_orders_in_held_batches(spark, pg_uri, events, revenue, max_per_batch=5_000)
    ids = [b["order_id"] for b in bodies(pg_uri, revenue)]
    assert len(ids) == 16_000 and len(set(ids)) == 16_000  # every one, none twice
    with QueueClient.connect(pg_uri) as client:
        assert client.depth(events) == 0 and client.in_flight(events) == 0
        assert client.depth(QueueAddress("error", schema)) == 0


def test_a_stream_started_afresh_on_a_deleted_checkpoint_sends_every_batch(spark, space, pg_uri, tmp_path):
    """Deleting a checkpoint to start a stream over is common; the new query's batches 0, 1, ...
    must not be taken for the old query's batches of the same numbers in the write ledger."""
    import shutil

    sys.path.insert(0, EXAMPLE_DAGS)
    from spark_jobs import relay_orders

    events, revenue = space("order_events"), space("order_revenue")
    checkpoint = str(tmp_path / "checkpoint")
    for round_ in range(2):
        with QueueClient.connect(pg_uri) as client:
            orders = [
                {"order_id": f"r{round_}-{n}", "country": "NL", "quantity": 1, "unit_price": 1.0} for n in range(300)
            ]
            client.send(events, [Message.of(order) for order in orders])
        assert relay_orders(spark, pg_uri, events, revenue, checkpoint)["events"] == 300
        shutil.rmtree(checkpoint)
    assert len({b["order_id"] for b in bodies(pg_uri, revenue)}) == 600


def test_a_stream_keeps_the_cores_expiry_and_poison_rules(spark, space, pg_uri, tmp_path):
    """Rows no consumer may be handed, met by a streaming query: expired ones (a ``timeToBeReceived``
    the data source's own write set) are dropped, unreadable headers and a message delivered
    ``maxDeliveries`` times go to the named error queue; every good message reaches the sink once."""
    events, failures = space("events"), space("failures")
    with QueueClient.connect(pg_uri) as client:
        schema = client.address(events).schema
        client.send(events, Message.of({"n": "tired"}))  # delivered twice already, before the stream
        for _ in range(2):
            (tired,) = client.claim(events, 1, holder="before")
            client.nack_held(events, "before", error="handler threw twice")
        assert tired.json() == {"n": "tired"} and tired.deliveries == 2
        client.send(events, [Message.of({"n": n}) for n in range(500)])
    (
        spark.createDataFrame([(json.dumps({"n": f"late-{n}"}),) for n in range(50)], "body string")
        .write.format("sqlqueue")
        .option("url", pg_uri)
        .option("queue", events)
        .option("timeToBeReceived", "1")
        .mode("append")
        .save()
    )
    with psycopg.connect(pg_uri, autocommit=True) as outsider:
        outsider.execute(
            f'INSERT INTO "{schema}".events (Id, Expires, Headers, Body) VALUES (%s, NULL, %s, %s)',
            (uuid.uuid4(), "{not json", b"{}"),
        )
    time.sleep(1.5)  # the fifty are past their time to be received
    seen: list[object] = []

    def sink(batch, batch_id: int) -> None:
        seen.extend(json.loads(r.body)["n"] for r in batch.select("body").collect())

    query = (
        spark.readStream.format("sqlqueue")
        .option("url", pg_uri)
        .option("queue", events)
        .option("maxDeliveries", "2")
        .option("errorQueue", failures)
        .option("maxMessagesPerBatch", "200")
        .load()
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .start()
    )
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    # Each good one once; none of the fifty, the tired one or the unreadable row.
    assert len(seen) == 500 and set(seen) == set(range(500))
    with QueueClient.connect(pg_uri) as client:
        assert client.depth(events) == 0 and client.in_flight(events) == 0
        assert client.depth(QueueAddress("error", schema)) == 0
    with psycopg.connect(pg_uri) as raw:
        failed = [headers for (headers,) in raw.execute(f'SELECT Headers FROM "{schema}".failures')]
    assert len(failed) == 2 and "{not json" in failed  # the unreadable row kept as it came
    (readable,) = [json.loads(headers) for headers in failed if headers != "{not json"]
    assert readable["NServiceBus.ExceptionInfo.Message"] == "handler threw twice"


def test_trigger_available_now_relays_what_waited_in_limited_batches_and_ends(spark, space, pg_uri, tmp_path):
    """Trigger.AvailableNow with maxMessagesPerBatch: the query claims what waited when it started,
    in batches no larger than the limit, and ends by itself; run again on its checkpoint it relays
    what came meanwhile. Every message reaches the sink once, no claim is left."""
    from airflow_provider_sqlqueue.spark import batch_writer

    events, relayed = space("events"), space("relayed")
    checkpoint = str(tmp_path / "checkpoint")

    def run() -> list[int]:
        query = (
            spark.readStream.format("sqlqueue")
            .option("url", pg_uri)
            .option("queue", events)
            .option("maxMessagesPerBatch", "1000")
            .load()
            .select("body")
            .writeStream.foreachBatch(batch_writer({"url": pg_uri, "queue": relayed}, checkpoint))
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        try:
            assert query.awaitTermination(300), "an AvailableNow query ends by itself"
            counts = [
                int(p.numInputRows if hasattr(p, "numInputRows") else p["numInputRows"]) for p in query.recentProgress
            ]
            return [count for count in counts if count]
        finally:
            query.stop()

    with QueueClient.connect(pg_uri) as client:
        client.send(events, [Message.of({"n": n}) for n in range(2_500)])
    assert run() == [1_000, 1_000, 500]
    with QueueClient.connect(pg_uri) as client:
        client.send(events, [Message.of({"n": n}) for n in range(2_500, 3_200)])
    assert run() == [700]
    assert sorted(b["n"] for b in bodies(pg_uri, relayed)) == list(range(3_200))
    with QueueClient.connect(pg_uri) as client:
        assert client.depth(events) == 0 and client.in_flight(events) == 0


def test_a_claim_read_returns_the_same_messages_until_acknowledged(spark, space, pg_uri):
    from airflow_provider_sqlqueue.spark import ack_held

    orders = space("orders")
    with QueueClient.connect(pg_uri) as client:
        client.send(orders, [Message.of({"n": n}) for n in range(3_000)])
    reader = (
        spark.read.format("sqlqueue")
        .option("url", pg_uri)
        .option("queue", orders)
        .option("mode", "claim")
        .option("holder", "nightly-2026-11-24")
        .option("maxMessagesPerBatch", "2000")
        .option("numPartitions", "3")
    )
    first = {json.loads(r.body)["n"] for r in reader.load().collect()}
    again = {json.loads(r.body)["n"] for r in reader.load().collect()}  # a retried job: the same messages
    assert first == again and len(first) == 2_000
    browsed = spark.read.format("sqlqueue").option("url", pg_uri).option("queue", orders).load()
    assert browsed.count() == 1_000  # the other thousand still wait
    assert ack_held(pg_uri, orders, "nightly-2026-11-24") == 2_000
    with QueueClient.connect(pg_uri) as client:
        assert client.in_flight(orders) == 0 and client.depth(orders) == 1_000


def test_a_micro_batch_longer_than_the_lease_keeps_its_claims(spark, space, pg_uri, tmp_path):
    """A 3-second lease and a batch whose sink takes 10 s while a rival consumer keeps claiming: the
    driver-side source renews the batch's claims, so the rival never gets one of them."""
    events = space("events")
    with QueueClient.connect(pg_uri) as client:
        client.send(events, [Message.of({"n": n}) for n in range(200)])
    seen: list[int] = []
    rival: list[int] = []

    def slow_sink(batch, batch_id: int) -> None:
        rows = batch.select("deliveries").collect()
        with QueueClient.connect(pg_uri) as competitor:
            for _ in range(5):
                time.sleep(2)
                rival.extend(m.deliveries for m in competitor.claim(events, 200, holder="rival"))
        seen.extend(r.deliveries for r in rows)

    query = (
        spark.readStream.format("sqlqueue")
        .option("url", pg_uri)
        .option("queue", events)
        .option("lease", "3")
        .load()
        .writeStream.foreachBatch(slow_sink)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .start()
    )
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    assert rival == [] and len(seen) == 200 and set(seen) == {1}
    with QueueClient.connect(pg_uri) as client:
        assert client.depth(events) == 0 and client.in_flight(events) == 0


def test_plans_carry_no_connection_secret(spark, space, pg_uri):
    orders = space("orders")
    secret_url = pg_uri + ("&" if "?" in pg_uri else "?") + "application_name=s3cr3t-app"
    df = spark.read.format("sqlqueue").option("url", secret_url).option("queue", orders).load()
    plan = df._jdf.queryExecution().toString()
    assert "s3cr3t" not in plan and "sqlqueue" in plan


# -- the example DAGs on the cluster, under Airflow's services ------------------------------------


# -- options through Spark: each documented one works, bad input is refused before any task runs ------


def test_every_documented_option_works_through_spark_and_a_typo_or_a_bad_column_is_refused(
    spark, space, pg_uri, tmp_path
):
    """Spark passes the options as given (lower-cased) and nothing of its own, so refusing unknown
    options leaves every documented one working: a write, a browse, a claim read and a stream."""
    from psycopg.conninfo import conninfo_to_dict
    from pyspark.errors import AnalysisException

    from airflow_provider_sqlqueue.spark import ack_held, batch_writer

    password = str(conninfo_to_dict(pg_uri).get("password") or "ignored-by-trust")
    orders, relayed, failures = space("orders"), space("relayed"), space("failures")
    write = {
        "url": pg_uri,
        "password": password,
        "queue": orders,
        "batchSize": "2",
        "messageType": "Shop.Order",
        "contentType": "application/json",
        "timeToBeReceived": "3600",
        "writeId": "all-options",
        "ledger": "sqlqueue_writes",
    }
    df = spark.createDataFrame([(n, f"o{n}") for n in range(5)], "n int, name string")
    df.write.format("sqlqueue").options(**write).mode("append").save()
    read = {"url": pg_uri, "queue": orders, "numPartitions": "3", "fetchSize": "2"}
    assert spark.read.format("sqlqueue").options(**read).load().count() == 5
    claim = {
        **read,
        "mode": "claim",
        "holder": "all-options",
        "maxMessagesPerBatch": "2",
        "lease": "60",
        "maxDeliveries": "3",
        "errorQueue": failures,
    }
    taken = {json.loads(r.body)["name"] for r in spark.read.format("sqlqueue").options(**claim).load().collect()}
    assert len(taken) == 2 and ack_held(pg_uri, orders, "all-options") == 2
    checkpoint = str(tmp_path / "checkpoint")
    stream = {k: v for k, v in claim.items() if k not in ("mode", "holder", "fetchSize")}
    query = (
        spark.readStream.format("sqlqueue").options(**stream).load().select("body")
        .writeStream.foreachBatch(batch_writer({"url": pg_uri, "queue": relayed, "batchSize": "2"}, checkpoint))
        .option("checkpointLocation", checkpoint).start()
    )  # fmt: skip
    try:
        query.processAllAvailable()  # two batches of maxMessagesPerBatch
    finally:
        query.stop()
    relayed_names = [b["name"] for b in bodies(pg_uri, relayed)]
    assert len(relayed_names) == 3 and taken | set(relayed_names) == {f"o{n}" for n in range(5)}
    with pytest.raises(AnalysisException, match="did you mean 'maxMessagesPerBatch'"):
        spark.read.format("sqlqueue").options(**claim).option("maxMessagePerBatch", "1").load().collect()
    with pytest.raises(AnalysisException, match="option 'batchSize' applies only to writes"):
        spark.read.format("sqlqueue").options(**read).option("batchSize", "2").load().collect()
    # The message columns are found whatever their case, as Spark finds the DataFrame's own.
    cased = spark.createDataFrame([("cased", {"Shop.K": "v"}, 60)], "Body string, Headers map<string,string>, TTBR int")
    cased.write.format("sqlqueue").option("url", pg_uri).option("queue", relayed).mode("append").save()
    with QueueClient.connect(pg_uri) as client:
        (message,) = [m for m in client.browse(relayed, 10) if m.body == b"cased"]
    assert message.headers["Shop.K"] == "v" and message.headers["NServiceBus.TimeToBeReceived"] == "00:01:00"
    with pytest.raises(AnalysisException, match="column 'ttbr'"):
        spark.createDataFrame([("b", True)], "body string, ttbr boolean").write.format("sqlqueue").option(
            "url", pg_uri
        ).option("queue", orders).mode("append").save()
    with QueueClient.connect(pg_uri) as client:
        assert client.depth(orders) == 0 and client.in_flight(orders) == 0
