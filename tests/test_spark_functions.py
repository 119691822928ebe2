"""``save_to_queue``: the data source's write with messages built in the JVM where it can, else
through ``format("sqlqueue")``, saying which; ``engine`` chooses; one ledger for both."""

from __future__ import annotations

import logging
import uuid

import pytest

from airflow_provider_sqlqueue.spark import InvalidOptionError, register, save_to_queue
from airflow_provider_sqlqueue.transport import QueueAddress, QueueClient
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
