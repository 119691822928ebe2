"""The JVM read: a locked batch read by Spark's own JDBC reader (``claimed_from_queue``,
``relay_batch``), against the data source's reader of the same rows: the same rows and headers,
NServiceBus's reading of every Headers text, no password in any plan, and the Python path (said
once, or refused with ``engine="jvm"``) where the JDBC driver or the url cannot serve."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import uuid

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from airflow_provider_sqlqueue.spark import InvalidOptionError, claimed_from_queue
from airflow_provider_sqlqueue.spark.jdbc import JDBC_DRIVER, JdbcTarget, jdbc_target
from airflow_provider_sqlqueue.transport import Message, QueueAddress, QueueClient, TransportMisconfiguredError
from tests.test_contract import SECRET
from tests.test_spark_functions import depth
from tests.test_spark_jvm import local_spark_fixture, shop_fixture  # noqa: F401 - the fixtures local_spark and shop

pytestmark = pytest.mark.postgres_only


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (
            "postgresql://app:pw@db.example:6432/shop?sslmode=verify-full&application_name=nightly",
            JdbcTarget(
                "jdbc:postgresql://db.example:6432/shop",
                {
                    "user": "app",
                    "driver": JDBC_DRIVER,
                    "password": "pw",
                    "sslmode": "verify-full",
                    "ApplicationName": "nightly",
                },
            ),
        ),
        (
            "host=a,b port=5433 dbname=my/db user=u target_session_attrs=read-write connect_timeout=3",
            JdbcTarget(
                "jdbc:postgresql://a:5433,b:5433/my%2Fdb",
                {"user": "u", "driver": JDBC_DRIVER, "targetServerType": "primary", "connectTimeout": "3"},
            ),
        ),
        ("postgresql://u@[::1]/x", JdbcTarget("jdbc:postgresql://[::1]:5432/x", {"user": "u", "driver": JDBC_DRIVER})),
        ("postgresql://u@h/", JdbcTarget("jdbc:postgresql://h:5432/u", {"user": "u", "driver": JDBC_DRIVER})),
        ("dbname=x user=u", "by a Unix socket"),
        ("host=/var/run/postgresql dbname=x", "by a Unix socket"),
        ("host=a,b,c port=1,2 dbname=x", "neither one nor one per host"),
        ("host=h dbname=x service=shop", "the url's 'service'"),
        ("service=shop", "the url's 'service'"),
        ("hostaddr=127.0.0.1 dbname=x user=u", "the url's 'hostaddr'"),
        ("host=h dbname=x sslkey=/k.pem", "the url's 'sslkey'"),
        ("host=h dbname=x target_session_attrs=read-only", "target_session_attrs='read-only'"),
        ("mssql://sa:pw@h/x", "PostgreSQL's"),
    ],
)
def test_a_libpq_url_becomes_a_jdbc_one_or_says_why_not(url: str, expected: JdbcTarget | str) -> None:
    target = jdbc_target(url)
    if isinstance(expected, str):
        assert isinstance(target, str) and expected in target and "pw" not in target
    else:
        assert target == expected and dict(target.properties) == dict(expected.properties)
        assert "pw" not in target.url and "pw" not in repr(target)


#: Headers texts each reading must read alike: Spark's JSON parser reads the first five otherwise
#: than NServiceBus's rules (a name twice, a number, text after the object, a lone surrogate, a raw
#: control character), and the rest are readable texts Spark would not write as they are.
EXOTIC_HEADERS = [
    '{"a":"1","b":"x","a":"2"}',
    '{"a":1}',
    '{"a":"x"} x',
    '{"a":"\\ud800"}',
    '{"a":"\x01"}',
    '{"a":"\\ud83d\\ude00","b":"\\u00e9\\/"}',
    ' {"a" : null }\n',
    "",
    "{}",
    '{"a":"\\u0000\\u001f"}',
    '{"\\u0061":"x","a":"y"}',
    "{'a':'b'}",
    '{"a":NaN}',
    "[]",
]


def test_a_locked_batch_reads_alike_through_sparks_jdbc_reader_and_the_data_sources(local_spark, shop, caplog) -> None:
    """The same rows, headers and bodies by both readers; texts NServiceBus cannot read are the poison of both."""
    schema, uri = shop
    with QueueClient.connect(uri) as client:
        client.send(QueueAddress("a", schema), [Message(f"m{n}", {"k": f'é\n"{n}\\'}) for n in range(30)])
    with psycopg.connect(uri, autocommit=True) as raw:
        for text in EXOTIC_HEADERS:
            raw.execute(
                f'INSERT INTO "{schema}".a (Id, Headers, Body) VALUES (gen_random_uuid(), %s, %s)', (text, None)
            )
    read = {}
    with caplog.at_level(logging.INFO, logger="airflow_provider_sqlqueue.spark"):
        for engine in ("jvm", "python", "jvm"):
            with (  # noqa: PT012 - read, then given back for the next reader
                pytest.raises(RuntimeError, match="again"),
                claimed_from_queue(local_spark, url=uri, queue=f'a@"{schema}"', engine=engine, numPartitions="3") as df,
            ):
                rows = df.collect()
                read[engine] = sorted((r["id"], sorted(r["headers"].items()), bytes(r["body"])) for r in rows)
                raise RuntimeError("read it again")
    assert "The locked batch of a@" in caplog.text and "is read by Spark's JDBC reader" in caplog.text
    assert read["jvm"] == read["python"]
    assert len(read["jvm"]) == 30 + 7  # the second to fifth texts and the last three are poison
    headers = sorted(str(h) for _, h, _ in read["jvm"])
    assert "[('a', '2'), ('b', 'x')]" in headers and "[('a', None)]" in headers and "[('a', 'y')]" in headers
    assert "[('a', '😀'), ('b', 'é/')]" in headers and "[('a', '\\x00\\x1f')]" in headers
    assert sorted(body for _, _, body in read["jvm"]) == sorted([b""] * 7 + [f"m{n}".encode() for n in range(30)])
    assert depth(uri, schema, "error") == 7 and depth(uri, schema, "a") == 37


def test_a_locked_batch_read_after_its_block_ended_is_refused_by_either_reader(local_spark, shop) -> None:
    """Its rows are back in the queue with the ended transaction's id still on them: no reader returns them."""
    schema, uri = shop
    with QueueClient.connect(uri) as client:
        client.send(QueueAddress("a", schema), [Message(f"m{n}") for n in range(10)])
    for engine in ("jvm", "python"):
        with (
            pytest.raises(RuntimeError, match="given back"),
            claimed_from_queue(local_spark, url=uri, queue=f'a@"{schema}"', engine=engine) as df,
        ):
            raise RuntimeError("given back")
        with pytest.raises(Exception, match=r'that locked this batch of "jvm_\w+"\."a" has ended'):
            df.collect()
    assert depth(uri, schema, "a") == 10


def test_spark_jdbc_reader_keeps_the_password_out_of_plans_and_a_url_it_cannot_take_is_said(
    local_spark, shop, caplog
) -> None:
    schema, uri = shop
    with QueueClient.connect(uri) as client:
        client.send(QueueAddress("a", schema), [Message(f"m{n}") for n in range(10)])
    with claimed_from_queue(local_spark, url=uri, queue=f'a@"{schema}"', engine="jvm") as df:
        plans = df._jdf.queryExecution().toString()  # the parsed, analysed, optimised and physical plans
        assert df.count() == 10
    assert "JDBCRelation" in plans and SECRET not in plans and SECRET not in caplog.text
    assert depth(uri, schema, "a") == 0
    with QueueClient.connect(uri) as client:
        client.send(QueueAddress("a", schema), [Message(f"m{n}") for n in range(10)])
    socket = make_conninfo(uri, host="/var/run/postgresql")
    with (
        pytest.raises(InvalidOptionError, match="option 'engine' 'jvm': the url reaches PostgreSQL by a Unix socket"),
        claimed_from_queue(local_spark, url=socket, queue=f'a@"{schema}"', engine="jvm"),
    ):
        pytest.fail("the block ran")
    assert depth(uri, schema, "a") == 10  # refused before anything was locked
    with (
        caplog.at_level(logging.INFO, logger="airflow_provider_sqlqueue.spark"),
        claimed_from_queue(local_spark, url=socket, queue=f'a@"{schema}"', engine="auto") as df,
    ):
        assert df.count() == 10
    assert "takes the Python path: the url reaches PostgreSQL by a Unix socket" in caplog.text
    assert depth(uri, schema, "a") == 0


#: A driver whose Spark has no JDBC driver: it reads a locked batch with engine auto, then engine jvm.
NO_JDBC_DRIVER = """
import logging, sys
from pyspark.sql import SparkSession
from airflow_provider_sqlqueue.spark import InvalidOptionError, claimed_from_queue

logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(message)s")
url, queue = sys.argv[1:]
spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
with claimed_from_queue(spark, url=url, queue=queue, maxMessagesPerBatch="4") as df:
    print("read", df.count())
try:
    with claimed_from_queue(spark, url=url, queue=queue, engine="jvm") as df:
        print("read", df.count())
except InvalidOptionError as exc:
    print("refused:", exc)
"""


def test_without_a_jdbc_driver_the_batch_is_read_by_the_data_source_and_engine_jvm_is_refused(shop) -> None:
    schema, uri = shop
    with QueueClient.connect(uri) as client:
        client.send(QueueAddress("a", schema), [Message(f"m{n}") for n in range(10)])
    env = {k: v for k, v in os.environ.items() if k != "PYSPARK_SUBMIT_ARGS"}
    done = subprocess.run(
        [sys.executable, "-c", NO_JDBC_DRIVER, uri, f'a@"{schema}"'],
        env={**env, "PYSPARK_PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    said = done.stdout
    assert "read 4" in said and "takes the Python path: no PostgreSQL JDBC driver on Spark's class path" in said
    assert "refused: option 'engine' 'jvm': no PostgreSQL JDBC driver" in said
    assert SECRET not in said + done.stderr
    assert depth(uri, schema, "a") == 6  # the refused read's batch given back


def test_a_url_that_leaves_a_parameter_to_libpqs_environment_keeps_the_python_path(monkeypatch) -> None:
    """libpq would take the database from PGDATABASE, the JDBC driver not: its reader would read
    another database, find no batch there, and the block would acknowledge what it never returned."""
    monkeypatch.setenv("PGDATABASE", "elsewhere")
    assert "leaves dbname to libpq's environment (PGDATABASE)" in str(jdbc_target("postgresql://u@h:5432"))
    assert isinstance(jdbc_target("postgresql://u@h:5432/shop"), JdbcTarget)  # the url's own dbname wins
    monkeypatch.setenv("PGUSER", "other")
    assert "leaves user to libpq's environment (PGUSER)" in str(jdbc_target("postgresql://h:5432/shop"))


def test_a_queue_whose_names_hold_percent_signs_is_read_by_sparks_jdbc_reader(local_spark, pg_uri) -> None:
    schema = f"jdbc_50%off_{uuid.uuid4().hex[:6]}"
    queue = QueueAddress("or%ders", schema)
    with psycopg.connect(pg_uri, autocommit=True) as raw:
        raw.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        try:
            with QueueClient.connect(pg_uri) as client:
                client.create_queue(queue)
                client.create_queue(QueueAddress("error", schema))
                client.send(queue, [Message(f"m{n}") for n in range(3)])
            with claimed_from_queue(local_spark, url=pg_uri, queue=f'"{schema}"."or%ders"', engine="jvm") as df:
                assert sorted(bytes(r["body"]) for r in df.collect()) == [b"m0", b"m1", b"m2"]
            with QueueClient.connect(pg_uri) as client:
                assert client.depth(queue) == 0
        finally:
            raw.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql://app:{SECRET}%zz@127.0.0.1/test",
        f"postgresql://app:{SECRET}@[::1:5432/test",
        f"postgresql://app@127.0.0.1/test?password={SECRET}%zz",
    ],
)
def test_a_url_libpq_cannot_read_is_refused_in_the_librarys_words_without_its_password(url: str) -> None:
    with pytest.raises(TransportMisconfiguredError, match="the connection string cannot be used") as refused:
        jdbc_target(url)
    assert SECRET not in str(refused.value)
