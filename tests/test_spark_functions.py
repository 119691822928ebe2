"""``save_to_queue``: the data source's write with messages built in the JVM where it can, else
through ``format("sqlqueue")``, saying which; ``engine`` chooses; one ledger for both."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
import uuid

import psycopg
import pytest

from airflow_provider_sqlqueue.spark import InvalidOptionError, claimed_from_queue, register, save_to_queue
from airflow_provider_sqlqueue.transport import Message, QueueAddress, QueueClient, SqlQueueError
from tests.test_spark_jvm import local_spark_fixture, shop_fixture  # noqa: F401 - the fixtures local_spark and shop

pytestmark = pytest.mark.postgres_only


def depth(uri: str, schema: str, queue: str) -> int:
    with QueueClient.connect(uri) as client:
        return client.depth(QueueAddress(queue, schema))


def test_a_write_goes_through_the_jvm_and_a_repeated_write_id_sends_nothing(local_spark, shop, caplog) -> None:
    schema, uri = shop
    df = local_spark.range(0, 5_000, numPartitions=3).selectExpr("id", "id % 7 AS bucket")
    with caplog.at_level(logging.INFO, logger="airflow_provider_sqlqueue.spark"):
        for _ in range(2):
            save_to_queue(df, url=uri, queue=f'a@"{schema}"', writeId="nightly-1")
    assert depth(uri, schema, "a") == 5_000
    said = caplog.text
    assert "5000 messages from 3 partitions built by Spark (0 committed before)" in said
    assert "0 messages from 3 partitions built by Spark (3 committed before)" in said


def test_where_the_jvm_cannot_go_the_python_path_writes_and_says_why(local_spark, shop, caplog) -> None:
    schema, uri = shop
    df = local_spark.range(0, 100, numPartitions=2).selectExpr("id", "CAST(id + 60 AS double) AS ttbr")
    with caplog.at_level(logging.INFO, logger="airflow_provider_sqlqueue.spark"):
        save_to_queue(df, url=uri, queue=f'a@"{schema}"')  # a ttbr column: the Python path
        save_to_queue(df.drop("ttbr"), url=uri, queue=f'a@"{schema}"', timeToBeReceived="60")
    assert depth(uri, schema, "a") == 200
    assert "takes the Python path: a 'ttbr' column" in caplog.text
    assert "takes the Python path: option 'timeToBeReceived'" in caplog.text


def test_engine_jvm_refuses_what_the_jvm_cannot_do_and_sends_nothing(local_spark, shop) -> None:
    schema, uri = shop
    df = local_spark.range(0, 10).selectExpr("id", "CAST(id + 60 AS double) AS ttbr")
    with pytest.raises(InvalidOptionError, match="option 'engine' 'jvm': a 'ttbr' column"):
        save_to_queue(df, url=uri, queue=f'a@"{schema}"', engine="jvm")
    with pytest.raises(InvalidOptionError, match="option 'engine' 'jvm': option 'timeToBeReceived'"):
        save_to_queue(df.drop("ttbr"), url=uri, queue=f'a@"{schema}"', engine="JVM", timeToBeReceived="5")
    assert depth(uri, schema, "a") == 0


def test_the_data_source_refuses_engine_jvm_naming_the_function_that_takes_it(local_spark, shop) -> None:
    schema, uri = shop
    register(local_spark)
    df = local_spark.range(0, 10)
    with pytest.raises(Exception, match="save_to_queue"):
        df.write.format("sqlqueue").options(url=uri, queue=f'a@"{schema}"', engine="jvm").mode("append").save()
    with pytest.raises(Exception, match="applies only to writes"):
        local_spark.read.format("sqlqueue").options(url=uri, queue=f'a@"{schema}"', engine="python").load().count()
    assert depth(uri, schema, "a") == 0


def test_a_write_id_is_one_write_whichever_engine_sends_or_repeats_it(local_spark, shop, caplog) -> None:
    """One ledger, partition by partition: the Python path fails after partition 0 committed, the JVM
    repeats the write and sends partition 1 only; the JVM first, the Python path repeats nothing."""
    from pyspark.sql import functions as sf
    from pyspark.sql.types import LongType

    schema, uri = shop

    def fail_partition_1(n: int) -> int:
        from pyspark import TaskContext

        context = TaskContext.get()
        if context is not None and context.partitionId() == 1:
            raise RuntimeError("partition 1 fails")
        return n

    rows = local_spark.range(0, 100, numPartitions=2)
    failing = rows.select(sf.udf(fail_partition_1, LongType())("id").alias("id"))
    with pytest.raises(Exception, match="partition 1 fails"):
        save_to_queue(failing, url=uri, queue=f'a@"{schema}"', writeId="w1", engine="python")
    assert depth(uri, schema, "a") == 50
    with caplog.at_level(logging.INFO, logger="airflow_provider_sqlqueue.spark"):
        save_to_queue(rows, url=uri, queue=f'a@"{schema}"', writeId="w1", engine="jvm")
    assert (
        depth(uri, schema, "a") == 100
        and "50 messages from 2 partitions built by Spark (1 committed before)" in caplog.text
    )
    with QueueClient.connect(uri) as client:
        numbers = sorted(int(m.body.split(b":")[1].rstrip(b"}")) for m in client.browse(QueueAddress("a", schema), 200))
    assert numbers == list(range(100))

    save_to_queue(rows, url=uri, queue=f'b@"{schema}"', writeId="w2", engine="jvm")
    save_to_queue(rows, url=uri, queue=f'b@"{schema}"', writeId="w2", engine="python")
    assert depth(uri, schema, "b") == 100


def test_a_role_with_only_the_grants_the_docs_list_writes_through_the_jvm(local_spark, shop, pg_uri) -> None:
    """The ledger made ahead and granted, as the docs say: no CREATE needed."""
    import psycopg
    from psycopg import sql
    from psycopg.conninfo import make_conninfo

    schema, uri = shop
    role = f"writer_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_uri, autocommit=True) as raw, QueueClient.connect(pg_uri) as admin:
        admin.create_writes(QueueAddress("sqlqueue_writes", schema))
        raw.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
        try:
            raw.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(sql.Identifier(schema), sql.Identifier(role)))
            raw.execute(
                sql.SQL("GRANT SELECT, INSERT, DELETE ON ALL TABLES IN SCHEMA {} TO {}").format(
                    sql.Identifier(schema), sql.Identifier(role)
                )
            )
            raw.execute(
                sql.SQL("GRANT USAGE ON ALL SEQUENCES IN SCHEMA {} TO {}").format(
                    sql.Identifier(schema), sql.Identifier(role)
                )
            )
            writer = make_conninfo(uri, user=role)
            save_to_queue(local_spark.range(0, 10), url=writer, queue=f'a@"{schema}"', engine="jvm")
            assert depth(uri, schema, "a") == 10
        finally:
            raw.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            raw.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_bad_options_are_refused_before_anything_is_sent(local_spark, shop) -> None:
    schema, uri = shop
    df = local_spark.range(0, 10)
    with pytest.raises(InvalidOptionError, match="did you mean 'writeId'"):
        save_to_queue(df, url=uri, queue=f'a@"{schema}"', writeID_="x")
    with pytest.raises(InvalidOptionError, match="applies only to reads"):
        save_to_queue(df, url=uri, queue=f'a@"{schema}"', lease="30")
    with pytest.raises(InvalidOptionError, match="option 'engine' must be one of auto, jvm, python"):
        save_to_queue(df, url=uri, queue=f'a@"{schema}"', engine="jdbc")
    with pytest.raises(Exception, match=r"not a queue|does not exist"):
        save_to_queue(df, url=uri, queue=f'missing_{uuid.uuid4().hex[:6]}@"{schema}"')
    assert depth(uri, schema, "a") == 0


def test_every_engine_refuses_a_table_that_is_not_a_queue_in_the_librarys_words(local_spark, shop, pg_uri) -> None:
    import psycopg

    from airflow_provider_sqlqueue.transport import NotAQueueError, QueueNotFoundError

    schema, uri = shop
    with psycopg.connect(pg_uri, autocommit=True) as raw:
        raw.execute(f'CREATE TABLE "{schema}".customers (id int, name text)')
    for engine in ("auto", "jvm", "python"):
        with pytest.raises(NotAQueueError):
            save_to_queue(local_spark.range(0, 1), url=uri, queue=f'customers@"{schema}"', engine=engine)
        with pytest.raises(QueueNotFoundError):
            save_to_queue(local_spark.range(0, 1), url=uri, queue=f'missing@"{schema}"', engine=engine)


def test_a_database_that_does_not_exist_is_named_without_the_password(local_spark, shop) -> None:
    from tests.test_contract import SECRET

    schema, uri = shop
    elsewhere = uri.rsplit("/", 1)[0] + "/no_such_database"
    with pytest.raises(Exception, match="no_such_database") as refused:
        save_to_queue(local_spark.range(0, 1), url=elsewhere, queue=f'a@"{schema}"', engine="jvm")
    assert "no_such_database" in str(refused.value) and SECRET not in str(refused.value)


# -- claimed_from_queue: a batch held by the driver's transaction -----------------------------------


def insert_poison(uri: str, schema: str, queue: str) -> str:
    """A row another program wrote with headers nobody can read."""
    message_id = str(uuid.uuid4())
    with psycopg.connect(uri, autocommit=True) as raw:
        raw.execute(
            f'INSERT INTO "{schema}"."{queue}" (Id, Headers, Body) VALUES (%s, %s, %s)',
            (message_id, '{"not": 1}', b"poison"),
        )
    return message_id


def test_claimed_from_queue_reads_its_batch_exactly_and_acknowledges_it_at_the_end(local_spark, shop) -> None:
    schema, uri = shop
    queue = QueueAddress("a", schema)
    with QueueClient.connect(uri) as client:
        client.send(queue, Message("expires", time_to_be_received=0.05))
        poison = insert_poison(uri, schema, "a")
        client.send(queue, [Message(f"m{n}") for n in range(300)])
    time.sleep(0.1)
    options = {"url": uri, "queue": f'a@"{schema}"', "numPartitions": "3", "maxMessagesPerBatch": "250"}
    with claimed_from_queue(local_spark, **options) as df:
        rows = df.collect()
        assert df.count() == len(rows) == 249  # read again inside the block: the same batch
        with QueueClient.connect(uri) as other:  # the batch is held: others get the messages after it
            assert [m.text for m in other.receive(queue, 100)] == [f"m{n}" for n in range(249, 300)]
    assert sorted(int(r["body"][1:]) for r in rows) == list(range(249))
    assert len({r["id"] for r in rows}) == 249 and {r["deliveries"] for r in rows} == {None}
    with psycopg.connect(uri, autocommit=True) as raw:  # moved unchanged (a browse would skip it)
        assert raw.execute(f'SELECT Id::text, Headers FROM "{schema}".error').fetchall() == [(poison, '{"not": 1}')]
    assert depth(uri, schema, "a") == 0  # the expired message, which no batch took, deleted by the receive


def test_a_claimed_job_that_raises_gives_every_message_back_and_the_poison_away(local_spark, shop) -> None:
    schema, uri = shop
    with QueueClient.connect(uri) as client:
        client.send(QueueAddress("a", schema), [Message(f"m{n}") for n in range(20)])
    insert_poison(uri, schema, "a")
    options = {"url": uri, "queue": f'a@"{schema}"'}
    with pytest.raises(RuntimeError, match="failed"), claimed_from_queue(local_spark, **options) as df:  # noqa: PT012
        assert df.count() == 20
        raise RuntimeError("the job failed")
    assert depth(uri, schema, "a") == 20 and depth(uri, schema, "error") == 1
    with QueueClient.connect(uri) as client:  # back as they were, in order, and receivable at once
        assert [m.text for m in client.receive(QueueAddress("a", schema), 30)] == [f"m{n}" for n in range(20)]


def test_a_job_that_outlived_its_drivers_connection_raises_its_own_error_and_its_batch_is_back(
    local_spark, shop, pg_uri
) -> None:
    schema, uri = shop
    with QueueClient.connect(uri) as client:
        client.send(QueueAddress("a", schema), [Message(f"m{n}") for n in range(5)])
    with (  # noqa: PT012 - the connection is cut, then the job fails
        pytest.raises(RuntimeError, match="the job failed"),
        claimed_from_queue(local_spark, url=uri, queue=f'a@"{schema}"'),
        psycopg.connect(pg_uri, autocommit=True) as raw,
    ):
        raw.execute(  # the driver's session, holding the batch (its last statement named the queue)
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE state LIKE 'idle in transaction%%' "
            "AND strpos(query, %s) > 0",
            (schema,),
        )
        raise RuntimeError("the job failed")
    with QueueClient.connect(uri) as client:  # the transaction never committed: every message is back
        assert [m.text for m in client.receive(QueueAddress("a", schema), 10)] == [f"m{n}" for n in range(5)]


@pytest.mark.parametrize(
    ("extra", "refusal"),
    [
        ({"mode": "claim"}, "option 'mode' does not apply to claimed_from_queue"),
        ({"holder": "h"}, "option 'holder' does not apply to claimed_from_queue"),
        ({"lease": "30"}, "option 'lease' does not apply"),
        ({"maxDeliveries": "3"}, "option 'maxDeliveries' does not apply"),
        ({"LOCK": "1:0:5"}, "option 'lock' does not apply"),
        ({"ledger": "sqlqueue_writes"}, "applies only to writes"),
        ({"maxMessagesPerBatch": "0"}, "must be positive"),
        ({"errorQueue": "a"}, "its own error queue"),
        ({"engine": "jdbc"}, "option 'engine' must be one of auto, jvm, python"),
        ({"ENGINE": "JVM\x00"}, "option 'engine' must be one of auto, jvm, python"),
    ],
)
def test_claimed_from_queue_refuses_what_its_read_cannot_use_before_anything_changes(
    local_spark, shop, extra, refusal
) -> None:
    schema, uri = shop
    with QueueClient.connect(uri) as client:
        client.send(QueueAddress("a", schema), Message("waiting"))
    with (
        pytest.raises(SqlQueueError, match=refusal),
        claimed_from_queue(local_spark, url=uri, queue=f'a@"{schema}"', **extra),
    ):
        pytest.fail("the block ran")
    assert depth(uri, schema, "a") == 1
    with (
        pytest.raises(SqlQueueError, match="reads through a SparkSession"),
        claimed_from_queue(
            uri,
            url=uri,
            queue=f'a@"{schema}"',  # type: ignore[arg-type]
        ),
    ):
        pytest.fail("the block ran")


def test_claimed_from_queue_refuses_sql_server_saying_why_before_connecting_and_tables_that_are_no_queues(
    local_spark, shop, pg_uri
) -> None:
    from airflow_provider_sqlqueue.transport import NotAQueueError, QueueNotFoundError, TransportMisconfiguredError

    schema, uri = shop
    with (
        pytest.raises(TransportMisconfiguredError, match="READ UNCOMMITTED"),
        claimed_from_queue(local_spark, url="mssql://sa:pw@192.0.2.1:1433/shop", queue="orders"),
    ):
        pytest.fail("the block ran")
    with psycopg.connect(pg_uri, autocommit=True) as raw:
        raw.execute(f'CREATE TABLE "{schema}".customers (id int, name text)')
    for name, error in (("customers", NotAQueueError), ("missing", QueueNotFoundError)):
        with pytest.raises(error), claimed_from_queue(local_spark, url=uri, queue=f'{name}@"{schema}"'):
            pytest.fail("the block ran")


def spark_driver(script: str, *args: str) -> subprocess.Popen[bytes]:
    """A Spark driver running ``script`` in a process group of its own: the JVM and Python workers die with it."""
    return subprocess.Popen(
        [sys.executable, "-c", script, *args],
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


#: The driver of a Spark job that holds a batch and is killed mid-job: it signals from inside the job.
KILLED_DRIVER = """
import os, sys, time
from pyspark.sql import SparkSession
from airflow_provider_sqlqueue.spark import claimed_from_queue

url, queue, marker = sys.argv[1:]
spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()

def stall(row):
    open(marker, "w").close()
    time.sleep(600)
    return row

with claimed_from_queue(spark, url=url, queue=queue) as df:
    df.rdd.map(stall).count()
"""


def test_a_driver_killed_mid_job_gives_every_message_back(shop, tmp_path) -> None:
    schema, uri = shop
    queue = QueueAddress("a", schema)
    with QueueClient.connect(uri) as client:
        client.send(queue, [Message(f"m{n}") for n in range(40)])
    marker = tmp_path / "in-the-job"
    driver = spark_driver(KILLED_DRIVER, uri, f'a@"{schema}"', str(marker))
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert driver.poll() is None and time.monotonic() < deadline, "the job never started"
            time.sleep(0.2)
        with QueueClient.connect(uri) as client:
            assert client.receive(queue, 40) == []  # the batch is held by the driver
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait(30)
    deadline = time.monotonic() + 30
    with QueueClient.connect(uri) as client:
        while not (back := client.receive(queue, 40)):  # once the server has seen the driver's connection end
            assert time.monotonic() < deadline, "the killed driver's batch never came back"
            time.sleep(0.2)
        back += client.receive(queue, 40)
    assert [m.text for m in back] == [f"m{n}" for n in range(40)]


# -- relay_batch: a held batch sent on to another queue in the same transaction ---------------------


def shouted(df):
    """The relay's job in these tests: each order's text, upper-cased, as the body sent on."""
    from pyspark.sql import functions as F

    return df.select(F.upper(F.col("body").cast("string")).alias("body"))


def test_relay_batch_sends_each_message_on_once_and_takes_it_from_the_source(local_spark, shop) -> None:
    from airflow_provider_sqlqueue.spark import Relayed, relay_batch

    schema, uri = shop
    a, b = QueueAddress("a", schema), QueueAddress("b", schema)
    with QueueClient.connect(uri) as client:
        client.send(a, [Message(f"order {n} ß zürich 東京") for n in range(300)])
        poison = insert_poison(uri, schema, "a")
    source = {"url": uri, "queue": f'a@"{schema}"', "maxMessagesPerBatch": "200", "numPartitions": "3"}
    target = {"queue": f'b@"{schema}"', "messageType": "Shop.OrderShouted"}
    relayed = []
    while (done := relay_batch(local_spark, shouted, source, target)).taken:
        relayed.append(done)
    assert relayed == [Relayed(200, 200), Relayed(101, 100)]  # the poison: taken, moved, not sent
    assert depth(uri, schema, "a") == 0 and relay_batch(local_spark, shouted, source, target) == Relayed(0, 0)
    with QueueClient.connect(uri) as client:
        sent = client.receive(b, 400)
        assert sorted(m.text for m in sent) == sorted(f"ORDER {n} SS ZÜRICH 東京" for n in range(300))
        assert len({m.id for m in sent}) == 300
        assert {m.headers["NServiceBus.EnclosedMessageTypes"] for m in sent} == {"Shop.OrderShouted"}
    with psycopg.connect(uri, autocommit=True) as raw:
        assert raw.execute(f'SELECT Id::text FROM "{schema}".error').fetchall() == [(poison,)]


def test_a_relay_whose_job_raises_sends_nothing_and_gives_the_batch_back(local_spark, shop) -> None:
    from airflow_provider_sqlqueue.spark import relay_batch

    schema, uri = shop
    with QueueClient.connect(uri) as client:
        client.send(QueueAddress("a", schema), [Message(f"m{n}") for n in range(20)])

    def failing(df):
        from pyspark.sql import functions as F

        def boom(text: str) -> str:
            raise RuntimeError("the job failed")

        return df.select(F.udf(boom)(F.col("body").cast("string")).alias("body"))

    insert_poison(uri, schema, "a")
    with pytest.raises(Exception, match="the job failed"):
        relay_batch(local_spark, failing, {"url": uri, "queue": f'a@"{schema}"'}, {"queue": f'b@"{schema}"'})
    assert depth(uri, schema, "a") == 20 and depth(uri, schema, "b") == 0
    assert depth(uri, schema, "error") == 1  # the poison, which no job can read, moved as claimed_from_queue moves it


def test_relay_batch_refuses_bad_target_headers_before_reading_and_nan_rows_in_its_own_words(local_spark, shop):
    from pyspark.sql import functions as F

    from airflow_provider_sqlqueue.spark import relay_batch
    from airflow_provider_sqlqueue.transport import InvalidArgumentError, InvalidHeadersError

    schema, uri = shop
    source = {"url": uri, "queue": f'a@"{schema}"'}
    with pytest.raises(InvalidHeadersError, match="lone surrogate"):  # refused though the source is empty
        relay_batch(local_spark, shouted, source, {"queue": f'b@"{schema}"', "messageType": "x\udcff"})
    with QueueClient.connect(uri) as client:
        client.send(QueueAddress("a", schema), Message("waiting"))
    with pytest.raises(InvalidArgumentError, match="NaN or an infinite number in x"):
        relay_batch(
            local_spark, lambda df: df.select(F.lit(float("nan")).alias("x")), source, {"queue": f'b@"{schema}"'}
        )
    assert depth(uri, schema, "a") == 1 and depth(uri, schema, "b") == 0


B = 'b@"{schema}"'


@pytest.mark.parametrize(
    ("source", "target", "refusal"),
    [
        ({}, {"queue": B, "writeId": "w"}, "option 'writeId' does not apply to relay_batch's target"),
        ({}, {"queue": B, "ledger": "sqlqueue_writes"}, "option 'ledger' does not apply"),
        ({}, {"queue": B, "url": "postgresql://elsewhere/db"}, "option 'url' does not apply"),
        ({}, {"queue": B, "timeToBeReceived": "60"}, "option 'timeToBeReceived' does not apply"),
        ({}, {"queue": 'a@"{schema}"'}, "cannot send to the queue it takes from"),
        ({}, {"queue": 'missing@"{schema}"'}, "missing"),
        ({}, {}, "option 'queue' is required"),
        ({"mode": "claim"}, {"queue": B}, "option 'mode' does not apply to relay_batch"),
        ({"messageType": "x"}, {"queue": B}, "applies only to writes"),
        ({"maxMessagesPerBatch": "-1"}, {"queue": B}, "must be positive"),
    ],
)
def test_relay_batch_refuses_what_it_cannot_use_before_anything_changes(local_spark, shop, source, target, refusal):
    from airflow_provider_sqlqueue.spark import relay_batch

    schema, uri = shop
    with QueueClient.connect(uri) as client:
        client.send(QueueAddress("a", schema), Message("waiting"))
    target = {key: value.replace("{schema}", schema) for key, value in target.items()}
    with pytest.raises(SqlQueueError, match=refusal):
        relay_batch(local_spark, shouted, {"url": uri, "queue": f'a@"{schema}"', **source}, target)
    assert depth(uri, schema, "a") == 1 and depth(uri, schema, "b") == 0


def test_relay_batch_refuses_wrong_types_and_sql_server_before_connecting(local_spark, shop) -> None:
    from airflow_provider_sqlqueue.spark import relay_batch
    from airflow_provider_sqlqueue.transport import ArgumentTypeError, TransportMisconfiguredError

    schema, uri = shop
    source, target = {"url": uri, "queue": f'a@"{schema}"'}, {"queue": f'b@"{schema}"'}
    with QueueClient.connect(uri) as client:
        client.send(QueueAddress("a", schema), Message("waiting"))
    for args, refusal in (
        ((local_spark, "not a function", source, target), "transform is a function"),
        ((local_spark, shouted, [("url", uri)], target), "source options must be a mapping"),
        ((local_spark, shouted, source, {"queue": 1}), "target options are text"),
        ((uri, shouted, source, target), "reads through a SparkSession"),
        ((local_spark, lambda df: df.collect(), source, target), "must return a DataFrame"),
    ):
        with pytest.raises(ArgumentTypeError, match=refusal):
            relay_batch(*args)
    mssql = {"url": "mssql://sa:pw@192.0.2.1:1433/shop", "queue": "orders"}
    with pytest.raises(TransportMisconfiguredError, match="READ UNCOMMITTED"):
        relay_batch(local_spark, shouted, mssql, {"queue": "billing"})
    assert depth(uri, schema, "a") == 1 and depth(uri, schema, "b") == 0


#: The driver of a relay killed after it loaded the batch into the target, before its transaction
#: commits: the load is wrapped to signal and stall (the database is the real one).
KILLED_RELAY = """
import sys, time
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from airflow_provider_sqlqueue.spark import relay_batch
from airflow_provider_sqlqueue.transport import QueueClient

url, source, target, marker = sys.argv[1:]
spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
load = QueueClient.send_csv

def loaded_then_stall(self, queue, chunks):
    sent = load(self, queue, chunks)
    open(marker, "w").write(str(sent))
    time.sleep(600)

QueueClient.send_csv = loaded_then_stall
relay_batch(spark, lambda df: df.select(F.col("body")), {"url": url, "queue": source}, {"queue": target})
"""


def test_a_relay_driver_killed_after_loading_the_target_sends_nothing_and_the_next_relay_sends_all_once(
    local_spark, shop, tmp_path
) -> None:
    from airflow_provider_sqlqueue.spark import Relayed, relay_batch

    schema, uri = shop
    a, b = QueueAddress("a", schema), QueueAddress("b", schema)
    with QueueClient.connect(uri) as client:
        client.send(a, [Message(f"m{n}") for n in range(40)])
    marker = tmp_path / "loaded"
    driver = spark_driver(KILLED_RELAY, uri, f'a@"{schema}"', f'b@"{schema}"', str(marker))
    try:
        deadline = time.monotonic() + 180
        while not marker.exists() or not marker.read_text():
            assert driver.poll() is None and time.monotonic() < deadline, "the relay never loaded its batch"
            time.sleep(0.2)
        assert marker.read_text() == "40"  # loaded, in the transaction that also holds the batch
        assert depth(uri, schema, "b") == 0
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait(30)
    deadline = time.monotonic() + 30
    while depth(uri, schema, "a") != 40:  # once the server has seen the driver's connection end
        assert time.monotonic() < deadline, "the killed relay's batch never came back"
        time.sleep(0.2)
    assert depth(uri, schema, "b") == 0
    source, target = {"url": uri, "queue": f'a@"{schema}"'}, {"queue": f'b@"{schema}"'}
    assert relay_batch(local_spark, shouted, source, target) == Relayed(40, 40)
    with QueueClient.connect(uri) as client:
        assert sorted(m.text for m in client.receive(b, 100)) == sorted(f"M{n}" for n in range(40))
    assert depth(uri, schema, "a") == 0
