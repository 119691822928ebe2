"""The ``sqlqueue`` data source's options under hostile input, and its write ledger per queue.

These run the data source's own Python -- the classes Spark instantiates on the driver and in its
Python workers -- against the real database, without a JVM (the Spark jobs themselves are in
``tests/test_spark.py``). Every option the data source reads is registered here, discovered
from the code, and given hostile values: each must be refused with the library's own error before
any row changes, and no error may carry the connection's password.
"""

from __future__ import annotations

import base64
import inspect
import re
import traceback
import uuid
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from psycopg import sql
from pyspark.sql import Row
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
    DateType,
    DayTimeIntervalType,
    DecimalType,
    DoubleType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
    YearMonthIntervalType,
)

from airflow_provider_sqlqueue import spark
from airflow_provider_sqlqueue.transport import (
    ArgumentTypeError,
    InvalidArgumentError,
    QueueAddress,
    QueueClient,
    SqlQueueError,
    TransportUnavailableError,
)
from tests.test_contract import SECRET, checksums, with_password

pytestmark = pytest.mark.postgres_only

#: Every option of the data source, with hostile values ({schema}: the test's schema).
OPTIONS: dict[str, list[str]] = {
    "url": [
        f"postgresql://app:{SECRET}@[::1/test",
        f"postgresql://app:{SECRET}%zz@127.0.0.1/test",
        f"postgresql://app:{SECRET}@127.0.0.1:99999/test",
        "mysql://app@127.0.0.1/test",
        "",
    ],
    "password": [],  # any text is a password; it must only never be shown (checked with every url above)
    "queue": ['customers@"{schema}"', 'pg_authid@"pg_catalog"', 'missing@"{schema}"', "\udcff", "q" * 200, ""],
    "errorQueue": ['customers@"{schema}"', "\x00", "q" * 200],
    "mode": ["sometimes", "CLAIM\x00"],
    "holder": [],  # free text naming the claims; checked by the core when it is used
    "numPartitions": ["0", "-1", "many", "1e999", "100000000"],
    "fetchSize": ["0", "-3", "nan", str(2**63)],
    "lease": ["0", "-1", "nan", "inf", "forever", "1e12"],
    "maxDeliveries": ["0", "x"],
    "maxMessagesPerBatch": ["0", "-1", "1e9", "lots"],
    "batchSize": ["0", "2.5", str(2**63)],
    "messageType": [],  # free text, sent as a header
    "contentType": [],  # free text, sent as a header
    "timeToBeReceived": ["0", "-1", "nan", "1e20", "soon"],
    "ledger": ['customers@"{schema}"', 'orders@"{schema}"', "\x00"],
    "writeId": ["\udcff", "w" * 1_000, "\x00"],  # text, hashed into the ledger's key
}


def options_read_by_the_code() -> set[str]:
    source = inspect.getsource(spark.Options.parse)
    return set(re.findall(r'options(?:\.get)?\(\s*"([A-Za-z]+)"', source)) | set(
        re.findall(r'_(?:count|number|span)\(\s*options,\s*"([A-Za-z]+)"', source)
    )


def test_every_option_is_registered() -> None:
    assert options_read_by_the_code() == set(OPTIONS) == set(spark.OPTION_NAMES)


@pytest.fixture
def shop(pg_uri: str, raw_pg: psycopg.Connection[Any]):
    schema = f"spk_{uuid.uuid4().hex[:10]}"
    raw_pg.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    raw_pg.execute(
        sql.SQL("CREATE TABLE {} (Id int PRIMARY KEY, Name text)").format(sql.Identifier(schema, "customers"))
    )
    raw_pg.execute(sql.SQL("INSERT INTO {} VALUES (1, 'ada')").format(sql.Identifier(schema, "customers")))
    uri = with_password(pg_uri)
    with QueueClient.connect(uri) as client:
        for name in ("orders", "billing"):
            client.create_queue(QueueAddress(name, schema))
    try:
        yield schema, uri
    finally:
        raw_pg.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


@pytest.fixture(scope="module")
def raw_pg(pg_uri: str):
    with psycopg.connect(pg_uri, autocommit=True) as connection:
        yield connection


def open_everything(options: dict[str, str]) -> None:
    """What Spark does with the options on the driver: the source, then each of its readers and writers."""
    source = spark.SqlQueueDataSource(options)
    source.reader(source.schema())
    source.writer(source.schema(), False)
    source.streamReader(source.schema())


@pytest.mark.parametrize("option", sorted(name for name, values in OPTIONS.items() if values))
def test_a_hostile_option_is_refused_before_anything_changes(option: str, shop, raw_pg) -> None:
    schema, uri = shop
    good = {"url": uri, "queue": f'orders@"{schema}"', "mode": "claim", "holder": "contract"}
    open_everything(good)
    failures = []
    for value in OPTIONS[option]:
        hostile = value.replace("{schema}", schema)
        before = checksums(raw_pg, schema)
        try:
            open_everything({**good, option: hostile})
        except Exception as exc:
            text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            if not isinstance(exc, SqlQueueError) or isinstance(exc, TransportUnavailableError):
                failures.append(f"{option}={hostile[:40]!r}: {type(exc).__name__}: {exc!s:.200}")
            if SECRET in text:
                failures.append(f"{option}={hostile[:40]!r}: the password is in the error")
        else:
            failures.append(f"{option}={hostile[:40]!r}: accepted")
        if checksums(raw_pg, schema) != before:
            failures.append(f"{option}={hostile[:40]!r}: rows changed")
    assert not failures, "\n".join(failures)


def columns(**types: DataType) -> StructType:
    return StructType([StructField(name, kind) for name, kind in types.items()])


def write(options: dict[str, str], rows: list[Row], schema: StructType | None = None) -> Any:
    """One partition of a batch write, as a Spark task runs it (``schema``: the DataFrame's; by
    default a ``body`` string column)."""
    source = spark.SqlQueueDataSource(options)
    writer = source.writer(schema or columns(body=StringType()), False)
    part = writer.write(iter(rows))
    writer.commit([part])
    return part


def test_one_write_id_to_two_queues_sends_to_both(shop) -> None:
    """The ledger used to key a write by its id alone: the second queue got nothing, silently."""
    schema, uri = shop
    rows = [Row(body=f"m{n}") for n in range(3)]
    for queue in ("orders", "billing"):
        write({"url": uri, "queue": f'{queue}@"{schema}"', "writeId": "nightly-2026-11-25"}, rows)
    again = write({"url": uri, "queue": f'orders@"{schema}"', "writeId": "nightly-2026-11-25"}, rows)
    assert again.sent is None  # the same write to the same queue, retried: sent once
    spelled = write(
        {"url": uri, "queue": f'orders@"{schema}"'.replace('"', '"', 1), "writeId": "nightly-2026-11-25"}, rows
    )
    assert spelled.sent is None
    with QueueClient.connect(uri) as client:
        for queue in ("orders", "billing"):
            assert sorted(m.text for m in client.receive(QueueAddress(queue, schema), 10)) == ["m0", "m1", "m2"]


def test_a_row_json_cannot_carry_is_refused_not_sent_as_invalid_json(shop) -> None:
    schema, uri = shop
    for bad in (float("nan"), float("inf"), float("-inf")):
        with pytest.raises(InvalidArgumentError, match="score"):
            write(
                {"url": uri, "queue": f'orders@"{schema}"'},
                [Row(id=1, score=1.5), Row(id=2, score=bad)],
                columns(id=IntegerType(), score=DoubleType()),
            )
    with QueueClient.connect(uri) as client:
        assert client.depth(QueueAddress("orders", schema)) == 0  # the partition is all or nothing


# -- options Spark passes: only the user's (plus ``path`` from load(path)); any other is a typo ------


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"maxMessagePerBatch": "1"}, "unknown option 'maxMessagePerBatch': did you mean 'maxMessagesPerBatch'"),
        ({"maxmessageperbatch": "1"}, "did you mean 'maxMessagesPerBatch'"),  # as Spark passes it: lower case
        ({"errorqueu": "dead"}, "did you mean 'errorQueue'"),
        ({"timeToBeRecieved": "5"}, "did you mean 'timeToBeReceived'"),
        ({"zzz": "1"}, "unknown option 'zzz'; known options: url, password, queue"),
        ({"path": "/data/orders"}, "takes no path"),
        ({"lease": "30", "LEASE": "60"}, "option 'lease' is given twice"),
    ],
)
def test_an_unknown_or_misspelt_option_is_refused_naming_the_nearest(extra: dict[str, str], message: str) -> None:
    with pytest.raises(spark.InvalidOptionError, match=re.escape(message)):
        spark.Options.parse({"url": "postgresql://db/x", "queue": "orders", **extra})


def test_options_are_known_in_any_case() -> None:
    """Spark hands options over lower-cased (a CaseInsensitiveDict); plain dicts may use any case."""
    from pyspark.sql.datasource import CaseInsensitiveDict

    given = {"URL": "postgresql://db/x", "Queue": "orders", "MAXMESSAGESPERBATCH": "7", "timetobereceived": "9"}
    for options in (given, CaseInsensitiveDict(given)):
        parsed = spark.Options.parse(options)
        assert parsed.max_messages_per_batch == 7 and parsed.time_to_be_received == timedelta(seconds=9)
    assert spark.Options.parse({**given, "lease": "30", "LEASE": "30"}).lease == timedelta(seconds=30)


# -- a queue as its own error queue ---------------------------------------------------------------


@pytest.mark.parametrize("error_queue", ["orders", 'orders@"public"', '"orders"'])
def test_a_queue_is_not_its_own_error_queue(error_queue: str) -> None:
    with pytest.raises(InvalidArgumentError, match="cannot be its own error queue"):
        spark.Options.parse({"url": "postgresql://db/x", "queue": 'orders@"public"', "errorQueue": error_queue})


def test_a_claim_on_the_error_queue_needs_another_error_queue(shop) -> None:
    schema, uri = shop
    with QueueClient.connect(uri) as client:
        client.create_queue(QueueAddress("error", schema))
    options = {"url": uri, "queue": f'error@"{schema}"', "mode": "claim", "holder": "h"}
    source = spark.SqlQueueDataSource(options)
    with pytest.raises(InvalidArgumentError, match="its own error queue"):
        source.reader(source.schema())
    with pytest.raises(InvalidArgumentError, match="its own error queue"):
        source.streamReader(source.schema())
    browse = spark.SqlQueueDataSource({"url": uri, "queue": f'error@"{schema}"'})  # browsing it is fine
    browse.reader(browse.schema())
    other = spark.SqlQueueDataSource({**options, "errorQueue": "billing"})
    other.reader(other.schema())


# -- the written DataFrame's schema, checked before anything is sent ------------------------------


@pytest.mark.parametrize(
    ("schema", "error", "message"),
    [
        (columns(body=StringType(), ttbr=BooleanType()), ArgumentTypeError, "column 'ttbr'.*got boolean"),
        (columns(body=StringType(), ttbr=StringType()), ArgumentTypeError, "column 'ttbr'.*got string"),
        (columns(body=StringType(), ttbr=YearMonthIntervalType()), ArgumentTypeError, "column 'ttbr'.*interval"),
        (columns(body=StringType(), headers=StringType()), ArgumentTypeError, "column 'headers' must be a map"),
        (
            columns(body=StringType(), headers=ArrayType(StringType())),
            ArgumentTypeError,
            "column 'headers' must be a map",
        ),
        (
            columns(body=StringType(), headers=MapType(StringType(), IntegerType())),
            ArgumentTypeError,
            "column 'headers'",
        ),
        (columns(body=IntegerType()), ArgumentTypeError, "column 'body' must be binary or string"),
        (StructType([]), InvalidArgumentError, "has no columns"),
        (
            StructType([StructField("n", IntegerType()), StructField("n", StringType())]),
            InvalidArgumentError,
            "more than one column named 'n'",
        ),
        (columns(n=YearMonthIntervalType()), ArgumentTypeError, "column 'n' is interval"),
        (columns(n=ArrayType(YearMonthIntervalType())), ArgumentTypeError, r"column 'n' \(its elements\)"),
        (columns(n=MapType(ArrayType(StringType()), StringType())), ArgumentTypeError, "a map's keys must be scalars"),
    ],
)
def test_a_written_column_that_cannot_be_sent_is_refused_before_anything_changes(
    schema: StructType, error: type[Exception], message: str, shop, raw_pg
) -> None:
    dataset, uri = shop
    before = checksums(raw_pg, dataset)
    source = spark.SqlQueueDataSource({"url": uri, "queue": f'orders@"{dataset}"'})
    with pytest.raises(error, match=message):
        source.writer(schema, False)
    assert checksums(raw_pg, dataset) == before  # nothing sent, and no ledger created


def test_a_ttbr_column_of_seconds_or_an_interval_sets_each_message(shop) -> None:
    schema, uri = shop
    rows = [Row(body="a", ttbr=Decimal("90.5")), Row(body="b", ttbr=None), Row(body="c", ttbr=7)]
    write(
        {"url": uri, "queue": f'orders@"{schema}"', "timeToBeReceived": "60"},
        rows,
        columns(body=StringType(), ttbr=DecimalType(10, 1)),
    )
    write(
        {"url": uri, "queue": f'orders@"{schema}"'},
        [Row(body="d", ttbr=timedelta(hours=1))],
        columns(body=StringType(), ttbr=DayTimeIntervalType()),
    )
    with QueueClient.connect(uri) as client:
        got = {
            m.text: m.headers["NServiceBus.TimeToBeReceived"] for m in client.browse(QueueAddress("orders", schema), 10)
        }
    assert got == {"a": "00:01:30.5000000", "b": "00:01:00", "c": "00:00:07", "d": "01:00:00"}
    with pytest.raises(ArgumentTypeError, match="column 'ttbr'"):  # a row built by hand still meets the core's rule
        write(
            {"url": uri, "queue": f'orders@"{schema}"'},
            [Row(body="e", ttbr=True)],
            columns(body=StringType(), ttbr=IntegerType()),
        )


def test_json_rows_carry_binary_times_and_intervals_faithfully(shop) -> None:
    schema, uri = shop
    instant = datetime(2020, 1, 1, 12, 30, tzinfo=UTC)
    row_schema = columns(
        raw=BinaryType(),
        at=TimestampType(),
        wall=TimestampNTZType(),
        day=DateType(),
        price=DecimalType(10, 2),
        took=DayTimeIntervalType(),
        nested=StructType(
            [StructField("blobs", ArrayType(BinaryType())), StructField("by_day", MapType(DateType(), LongType()))]
        ),
    )
    row = Row(
        raw=b"\x00\xff",
        at=instant.astimezone().replace(tzinfo=None),  # as PySpark hands a TIMESTAMP over: naive local time
        wall=datetime(2020, 1, 1, 12, 30),
        day=date(2020, 2, 29),
        price=Decimal("12.50"),
        took=-timedelta(days=1, seconds=3661, microseconds=500_000),
        nested=Row(blobs=[b"ab", None], by_day={date(2020, 1, 2): 3}),
    )
    write({"url": uri, "queue": f'orders@"{schema}"'}, [row], row_schema)
    with QueueClient.connect(uri) as client:
        (message,) = client.browse(QueueAddress("orders", schema), 10)
    assert message.headers["NServiceBus.ContentType"] == "application/json"
    assert message.json() == {
        "raw": base64.b64encode(b"\x00\xff").decode(),
        "at": "2020-01-01T12:30:00+00:00",
        "wall": "2020-01-01T12:30:00",
        "day": "2020-02-29",
        "price": "12.50",
        "took": "-P1DT1H1M1.5S",
        "nested": {"blobs": ["YWI=", None], "by_day": {"2020-01-02": 3}},
    }


@pytest.mark.parametrize(
    ("span", "text"),
    [
        (timedelta(0), "PT0S"),
        (timedelta(days=2), "P2D"),
        (timedelta(seconds=90), "PT1M30S"),
        (timedelta(microseconds=250_000), "PT0.25S"),
        (-timedelta(seconds=5), "-PT5S"),
        (timedelta(days=1, hours=2, microseconds=1), "P1DT2H0.000001S"),
    ],
)
def test_intervals_are_iso_8601_durations(span: timedelta, text: str) -> None:
    assert spark._iso_duration(span) == text


# -- batch_writer checks its arguments and its sink before a query claims anything ------------------


@pytest.mark.parametrize(
    ("options", "checkpoint", "error", "message"),
    [
        ({"url": "postgresql://db/x", "queue": "q"}, None, spark.InvalidOptionError, "checkpoint must be text"),
        ({"url": "postgresql://db/x", "queue": "q"}, "  ", spark.InvalidOptionError, "checkpoint must not be empty"),
        ([("url", "x")], "/ck", ArgumentTypeError, "must be a mapping"),
        ({"url": "postgresql://db/x", "queue": "q", "batchSize": 5}, "/ck", ArgumentTypeError, "'batchSize' is int"),
        (
            {"url": "postgresql://db/x", "queue": "q", "writeId": "w"},
            "/ck",
            spark.InvalidOptionError,
            "drop option 'writeId'",
        ),
        (
            {"url": "postgresql://db/x", "queue": "q", "batchsise": "5"},
            "/ck",
            spark.InvalidOptionError,
            "did you mean 'batchSize'",
        ),
    ],
)
def test_batch_writer_refuses_bad_arguments(
    options: Any, checkpoint: Any, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        spark.batch_writer(options, checkpoint)


def test_batch_writer_refuses_a_sink_that_is_not_a_queue_when_it_is_built(shop, raw_pg) -> None:
    schema, uri = shop
    before = checksums(raw_pg, schema)
    for options in (
        {"url": uri, "queue": f'customers@"{schema}"'},
        {"url": uri, "queue": f'orders@"{schema}"', "ledger": f'customers@"{schema}"'},
        {"url": uri, "queue": f'orders@"{schema}"', "ledger": f'billing@"{schema}"'},
    ):
        with pytest.raises(SqlQueueError):
            spark.batch_writer(options, "/tmp/checkpoint")
    assert checksums(raw_pg, schema) == before
    assert callable(spark.batch_writer({"url": uri, "queue": f'orders@"{schema}"'}, "/tmp/checkpoint"))


@pytest.mark.parametrize("write_id", ["w\x00", 5, "w" * 2_000, ""])
def test_forget_write_checks_the_write_id(write_id: Any, shop) -> None:
    schema, uri = shop
    with pytest.raises(SqlQueueError):
        spark.forget_write(uri, f'orders@"{schema}"', write_id)
