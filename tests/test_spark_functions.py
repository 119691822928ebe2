"""``save_to_queue``: the data source's write through the JVM where it can, else through
``format("sqlqueue")``, saying which; ``engine`` chooses; one ledger for both."""

from __future__ import annotations

import logging
import uuid

import pytest

from airflow_provider_sqlqueue.spark import InvalidOptionError, register, save_to_queue
from airflow_provider_sqlqueue.transport import QueueAddress, QueueClient
from tests.test_spark_jdbc import local_spark_fixture, shop_fixture  # noqa: F401 - the fixtures local_spark and shop

pytestmark = pytest.mark.postgres_only


def depth(uri: str, schema: str, queue: str) -> int:
    with QueueClient.connect(uri) as client:
        return client.depth(QueueAddress(queue, schema))


def no_jdbc(uri: str) -> str:
    """``uri`` with a libpq parameter PgJDBC has no property for: the Python path's url."""
    return f"{uri}{'&' if '?' in uri else '?'}keepalives=1"


def test_a_write_goes_through_the_jvm_and_a_repeated_write_id_sends_nothing(local_spark, shop, caplog) -> None:
    schema, uri = shop
    df = local_spark.range(0, 5_000, numPartitions=3).selectExpr("id", "id % 7 AS bucket")
    with caplog.at_level(logging.INFO, logger="airflow_provider_sqlqueue.spark"):
        for _ in range(2):
            save_to_queue(df, url=uri, queue=f'a@"{schema}"', writeId="nightly-1")
    assert depth(uri, schema, "a") == 5_000
    said = caplog.text
    assert "5000 messages through Spark's JDBC writer" in said and "was sent before; sent nothing" in said


def test_where_the_jvm_cannot_go_the_python_path_writes_and_says_why(local_spark, shop, caplog) -> None:
    schema, uri = shop
    df = local_spark.range(0, 100, numPartitions=2).selectExpr("id", "CAST(id + 60 AS double) AS ttbr")
    with caplog.at_level(logging.INFO, logger="airflow_provider_sqlqueue.spark"):
        save_to_queue(df, url=uri, queue=f'a@"{schema}"')  # a ttbr column: the Python path
        save_to_queue(df.drop("ttbr"), url=no_jdbc(uri), queue=f'a@"{schema}"')  # a url JDBC cannot follow
    assert depth(uri, schema, "a") == 200
    assert "takes the Python path: a 'ttbr' column" in caplog.text
    assert "through Spark's Python workers: the url's parameter(s) keepalives" in caplog.text


def test_engine_jdbc_refuses_what_the_jvm_cannot_do_and_sends_nothing(local_spark, shop) -> None:
    schema, uri = shop
    df = local_spark.range(0, 10).selectExpr("id", "CAST(id + 60 AS double) AS ttbr")
    with pytest.raises(InvalidOptionError, match="option 'engine' 'jdbc': a 'ttbr' column"):
        save_to_queue(df, url=uri, queue=f'a@"{schema}"', engine="jdbc")
    with pytest.raises(InvalidOptionError, match="option 'engine' 'jdbc': the url's parameter"):
        save_to_queue(df.drop("ttbr"), url=no_jdbc(uri), queue=f'a@"{schema}"', engine="JDBC")
    assert depth(uri, schema, "a") == 0


def test_the_data_source_refuses_engine_jdbc_naming_the_functions_that_take_it(local_spark, shop) -> None:
    schema, uri = shop
    register(local_spark)
    df = local_spark.range(0, 10)
    with pytest.raises(Exception, match="save_to_queue"):
        df.write.format("sqlqueue").options(url=uri, queue=f'a@"{schema}"', engine="jdbc").mode("append").save()
    with pytest.raises(Exception, match="applies only to writes"):
        local_spark.read.format("sqlqueue").options(url=uri, queue=f'a@"{schema}"', engine="python").load().count()
    assert depth(uri, schema, "a") == 0


def test_a_write_id_is_one_write_whichever_engine_sends_or_repeats_it(local_spark, shop, caplog) -> None:
    """Python first, failing after one partition: the JVM may not repeat it (only the Python path knows
    what is missing), so auto repeats it there and jdbc refuses. JVM first: the Python path sends nothing."""
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
    with pytest.raises(InvalidOptionError, match="option 'engine' 'jdbc': write 'w1' was sent in part"):
        save_to_queue(rows, url=uri, queue=f'a@"{schema}"', writeId="w1", engine="jdbc")
    with caplog.at_level(logging.INFO, logger="airflow_provider_sqlqueue.spark"):
        save_to_queue(rows, url=uri, queue=f'a@"{schema}"', writeId="w1")
    assert depth(uri, schema, "a") == 100 and "takes the Python path: write 'w1' was sent in part" in caplog.text

    save_to_queue(rows, url=uri, queue=f'b@"{schema}"', writeId="w2", engine="jdbc")
    save_to_queue(rows, url=uri, queue=f'b@"{schema}"', writeId="w2", engine="python")
    assert depth(uri, schema, "b") == 100


def test_a_role_that_may_not_create_the_stage_writes_through_the_python_path(local_spark, shop, pg_uri) -> None:
    """The ledger made ahead and granted, as the docs say: no CREATE needed, auto takes the Python path."""
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
            with pytest.raises(InvalidOptionError, match="may not create the write's staging table"):
                save_to_queue(local_spark.range(0, 10), url=writer, queue=f'a@"{schema}"', engine="jdbc")
            save_to_queue(local_spark.range(0, 10), url=writer, queue=f'a@"{schema}"')
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
    with pytest.raises(InvalidOptionError, match="option 'engine' must be one of auto, jdbc, python"):
        save_to_queue(df, url=uri, queue=f'a@"{schema}"', engine="jvm")
    with pytest.raises(Exception, match=r"not a queue|does not exist"):
        save_to_queue(df, url=uri, queue=f'missing_{uuid.uuid4().hex[:6]}@"{schema}"')
    assert depth(uri, schema, "a") == 0


def test_engine_jdbc_says_why_the_database_cannot_be_reached_without_its_password(local_spark, shop) -> None:
    from tests.test_contract import SECRET

    schema, uri = shop
    elsewhere = uri.rsplit("/", 1)[0] + "/no_such_database"
    with pytest.raises(InvalidOptionError) as refused:
        save_to_queue(local_spark.range(0, 1), url=elsewhere, queue=f'a@"{schema}"', engine="jdbc")
    assert 'database "no_such_database" does not exist' in str(refused.value) and SECRET not in str(refused.value)
