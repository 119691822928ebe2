"""``save_to_queue`` and ``load_from_queue``: the data source's writes and reads through the JVM
where they can, else through ``format("sqlqueue")``, saying which; ``engine`` chooses."""

from __future__ import annotations

import logging
import uuid
from typing import Any

import pytest

from airflow_provider_sqlqueue.spark import InvalidOptionError, load_from_queue, register, save_to_queue
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
    with pytest.raises(InvalidOptionError, match="option 'engine' 'jdbc': the url's parameter"):
        load_from_queue(local_spark, url=no_jdbc(uri), queue=f'a@"{schema}"', engine="jdbc")
    assert depth(uri, schema, "a") == 0


def test_the_data_source_refuses_engine_jdbc_naming_the_functions_that_take_it(local_spark, shop) -> None:
    schema, uri = shop
    register(local_spark)
    df = local_spark.range(0, 10)
    with pytest.raises(Exception, match="save_to_queue"):
        df.write.format("sqlqueue").options(url=uri, queue=f'a@"{schema}"', engine="jdbc").mode("append").save()
    with pytest.raises(Exception, match="load_from_queue"):
        local_spark.read.format("sqlqueue").options(url=uri, queue=f'a@"{schema}"', engine="jdbc").load().count()
    assert depth(uri, schema, "a") == 0


def test_both_engines_read_the_same_messages(local_spark, shop) -> None:
    schema, uri = shop
    save_to_queue(local_spark.range(0, 1_000, numPartitions=2), url=uri, queue=f'a@"{schema}"')

    def read(engine: str) -> list[Any]:
        rows = load_from_queue(local_spark, url=uri, queue=f'a@"{schema}"', engine=engine, numPartitions="4")
        return sorted((r.id, r.body, tuple(sorted(r.headers.items())), r.deliveries) for r in rows.collect())

    assert read("jdbc") == read("python") and len(read("auto")) == 1_000
    assert depth(uri, schema, "a") == 1_000


def test_bad_options_are_refused_before_anything_is_sent(local_spark, shop) -> None:
    schema, uri = shop
    df = local_spark.range(0, 10)
    with pytest.raises(InvalidOptionError, match="did you mean 'writeId'"):
        save_to_queue(df, url=uri, queue=f'a@"{schema}"', writeID_="x")
    with pytest.raises(InvalidOptionError, match="applies only to reads"):
        save_to_queue(df, url=uri, queue=f'a@"{schema}"', lease="30")
    with pytest.raises(InvalidOptionError, match="applies only to writes"):
        load_from_queue(local_spark, url=uri, queue=f'a@"{schema}"', writeId="x")
    with pytest.raises(InvalidOptionError, match="option 'engine' must be one of auto, jdbc, python"):
        save_to_queue(df, url=uri, queue=f'a@"{schema}"', engine="jvm")
    with pytest.raises(Exception, match=r"not a queue|does not exist"):
        save_to_queue(df, url=uri, queue=f'missing_{uuid.uuid4().hex[:6]}@"{schema}"')
    assert depth(uri, schema, "a") == 0
