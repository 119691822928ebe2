"""The JVM path in one local Spark (``local[2,4]``: two cores, a failed task tried up to four times).

What it must keep from the data source's Python path: the same messages (headers and JSON bodies,
compared value by value with the Python path's for the same rows), one transaction per partition
recorded in the write ledger (a retried task's rows sent once), and no password in any plan.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from collections.abc import Iterator
from datetime import date
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from psycopg import sql

from airflow_provider_sqlqueue.spark import Options, RowLayout, register
from airflow_provider_sqlqueue.spark.jvm import _loader, jvm_reason, layout_reason, message_rows, write_in_jvm
from airflow_provider_sqlqueue.transport import InvalidArgumentError, QueueAddress, QueueClient
from tests.test_contract import SECRET, with_password

pytestmark = pytest.mark.postgres_only

DYNAMIC = ("NServiceBus.MessageId", "NServiceBus.TimeSent")


@pytest.fixture(name="local_spark", scope="module")  # a name of its own: tests/test_spark_functions.py imports it
def local_spark_fixture() -> Iterator[Any]:
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    session = (
        SparkSession.builder.master("local[2,4]")
        .appName("sqlqueue-jvm-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    yield session
    session.stop()


@pytest.fixture(name="shop")  # tests/test_spark_functions.py imports it
def shop_fixture(pg_uri: str) -> Iterator[tuple[str, str]]:
    """A schema with queues ``a``, ``b`` and ``error``: (schema, a URI with a password trust ignores)."""
    schema = f"jvm_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_uri, autocommit=True) as raw:
        raw.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        try:
            uri = with_password(pg_uri)
            with QueueClient.connect(uri) as client:
                for name in ("a", "b", "error"):
                    client.create_queue(QueueAddress(name, schema))
            yield schema, uri
        finally:
            raw.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


def options(uri: str, schema: str, queue: str, **more: str) -> Options:
    return Options.parse({"url": uri, "queue": f'{queue}@"{schema}"', **more})


# -- writes ----------------------------------------------------------------------------------------

ROWS = [
    (Decimal("0.0000001"), date(1, 1, 1), 1e20, 0.1, [1, 2], {"k": [None]}, 'é\x00"', True, 2**62),
    (Decimal("-12345678901234567.1234567"), date(9999, 12, 31), -0.0, 1.5e-300, [], {}, None, None, None),
    (Decimal("0E-7"), None, None, 3.0, None, None, "\U0001f600", False, -1),
]
SCHEMA = "d decimal(38,7), dt date, f double, g float, a array<int>, m map<string,array<string>>, s string, b boolean, l long"


def test_a_json_row_becomes_the_same_message_on_both_paths(local_spark, shop) -> None:
    """The JVM's to_json and the data source's encoder write the same JSON values and headers."""
    schema, uri = shop
    df = local_spark.createDataFrame(ROWS, SCHEMA)
    layout = RowLayout.of(df.schema)
    assert layout_reason(layout) is None
    jvm = options(uri, schema, "a", messageType="Shop.Row")
    assert write_in_jvm(df, jvm, layout) == 3
    register(local_spark)
    python = {"url": uri, "queue": f'b@"{schema}"', "messageType": "Shop.Row"}
    df.write.format("sqlqueue").options(**python).mode("append").save()
    with QueueClient.connect(uri) as client:
        through_jvm = client.browse(QueueAddress("a", schema))
        through_python = client.browse(QueueAddress("b", schema))
    assert len(through_jvm) == len(through_python) == 3

    def in_order(messages: list[Any]) -> list[Any]:  # the Python path's partitions commit in any order
        return sorted(messages, key=lambda m: json.dumps(json.loads(m.body), sort_keys=True))

    for one, other in zip(in_order(through_jvm), in_order(through_python), strict=True):
        assert json.loads(one.body) == json.loads(other.body)
        assert {k: v for k, v in one.headers.items() if k not in DYNAMIC} == {
            k: v for k, v in other.headers.items() if k not in DYNAMIC
        }
        assert one.headers["NServiceBus.MessageId"] == str(one.id)
        assert one.id.version == 7  # time-ordered, as NServiceBus's own ids
    assert len({m.id for m in through_jvm}) == 3


def test_a_body_column_and_a_headers_column_are_sent_as_given(local_spark, shop) -> None:
    schema, uri = shop
    rows = [
        (b"\x00\xff", {"Shop.Tenant": "é", "NServiceBus.MessageId": None}),
        (None, None),
    ]
    df = local_spark.createDataFrame(rows, "body binary, headers map<string,string>")
    assert write_in_jvm(df, options(uri, schema, "a"), RowLayout.of(df.schema)) == 2
    with QueueClient.connect(uri) as client:
        # one partition per row: they commit in either order
        first, second = sorted(client.browse(QueueAddress("a", schema)), key=lambda m: "Shop.Tenant" not in m.headers)
    assert first.body == b"\x00\xff" and first.headers["Shop.Tenant"] == "é"
    assert first.headers["NServiceBus.MessageId"] == str(first.id)  # null asks for the default
    assert second.body == b"" and set(second.headers) == set(DYNAMIC)


def test_a_task_that_fails_mid_write_is_retried_and_its_rows_are_sent_once(local_spark, shop) -> None:
    """The first attempt of partition 1 dies after loading part of its rows (its transaction rolls
    back); Spark runs it again; every row is a message exactly once."""
    from pyspark.sql import functions as sf
    from pyspark.sql.types import LongType

    schema, uri = shop

    def fail_first_attempt(n: int) -> int:
        from pyspark import TaskContext

        context = TaskContext.get()
        if context is not None and context.partitionId() == 1 and context.attemptNumber() == 0 and n % 1000 == 999:
            raise RuntimeError("killed mid-write")
        return n

    failing = sf.udf(fail_first_attempt, LongType())
    df = local_spark.range(0, 20_000, numPartitions=2).select(failing("id").alias("n"))
    assert write_in_jvm(df, options(uri, schema, "a"), RowLayout.of(df.schema)) == 20_000
    with QueueClient.connect(uri) as client:
        numbers = sorted(json.loads(m.body)["n"] for m in client.browse(QueueAddress("a", schema), 30_000))
    assert numbers == list(range(20_000))


def test_a_partition_holding_nan_sends_nothing_and_is_refused_in_the_librarys_words(local_spark, shop) -> None:
    schema, uri = shop
    df = local_spark.createDataFrame([(1.0,), (float("nan"),)], "x double").coalesce(1)
    with pytest.raises(InvalidArgumentError, match="a row holds NaN or an infinite number in x, which JSON cannot"):
        write_in_jvm(df, options(uri, schema, "a"), RowLayout.of(df.schema))
    with QueueClient.connect(uri) as client:
        assert client.depth(QueueAddress("a", schema)) == 0


def test_layouts_the_jvm_cannot_write_as_the_python_path_does_are_named(local_spark) -> None:
    for ddl, reason in (
        ("n long, ttbr double", "a 'ttbr' column"),
        ("at timestamp", "column 'at' is timestamp"),
        ("raw binary", "column 'raw' is binary"),
        ("xs array<double>", "column 'xs' is array<double>"),
    ):
        found = layout_reason(RowLayout.of(local_spark.createDataFrame([], ddl).schema))
        assert found is not None and reason in found, (ddl, found)


def test_a_time_to_be_received_or_sql_server_is_the_python_paths() -> None:
    from pyspark.sql.types import LongType, StructField, StructType

    layout = RowLayout.of(StructType([StructField("n", LongType())]))
    found = jvm_reason(Options.parse({"url": "postgresql://h/db", "queue": "q", "timeToBeReceived": "60"}), layout)
    assert found is not None and "timeToBeReceived" in found
    found = jvm_reason(Options.parse({"url": "mssql://h/db", "queue": "q"}), layout)
    assert found is not None and "SQL Server" in found
    assert jvm_reason(Options.parse({"url": "postgresql://h/db", "queue": "q"}), layout) is None


def test_no_plan_holds_the_password(local_spark, shop) -> None:
    schema, uri = shop
    df = local_spark.range(0, 10)
    parsed = options(uri, schema, "a")
    rows = message_rows(df, RowLayout.of(df.schema), parsed)
    loading = rows.mapInArrow(_loader(parsed, uuid.uuid4()), "part int, sent long")
    for plan in (rows._jdf.queryExecution().toString(), loading._jdf.queryExecution().toString()):
        assert SECRET not in plan
    assert write_in_jvm(df, parsed, RowLayout.of(df.schema)) == 10


def test_columns_named_with_any_character_are_written(local_spark, shop) -> None:
    schema, uri = shop
    names = ["a`b", "dotted.name", 'quo"te', "sp ace", "ünï", ""]
    df = local_spark.createDataFrame(
        [tuple(range(len(names)))], ", ".join(f"`{n.replace('`', '``')}` int" for n in names)
    )
    assert write_in_jvm(df, options(uri, schema, "a"), RowLayout.of(df.schema)) == 1
    with QueueClient.connect(uri) as client:
        [message] = client.browse(QueueAddress("a", schema))
    assert json.loads(message.body) == {name: n for n, name in enumerate(names)}


def test_a_schema_and_queue_with_percent_signs_take_the_jvm_path(local_spark, pg_uri) -> None:
    schema = f"per%cent_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(pg_uri, autocommit=True) as raw:
        raw.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        try:
            with QueueClient.connect(pg_uri) as client:
                client.create_queue(QueueAddress("a%b", schema))
            df = local_spark.range(0, 100)
            parsed = Options.parse({"url": pg_uri, "queue": f'a%b@"{schema}"'})
            assert write_in_jvm(df, parsed, RowLayout.of(df.schema)) == 100
            with QueueClient.connect(pg_uri) as client:
                assert client.depth(QueueAddress("a%b", schema)) == 100
        finally:
            raw.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
