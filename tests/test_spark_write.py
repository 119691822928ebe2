"""The ``sqlqueue`` data source's batch write: rows to messages, the write ledger, COPY and Arrow.

These run the writer Spark instantiates (on the driver, then ``write`` per partition as an
executor's Python worker does) against the real database, without a JVM: the written DataFrame's
schema is refused before anything is sent when a column cannot be, JSON rows carry their values
faithfully, a write id is sent once per queue, and the Arrow and COPY paths send what the row and
INSERT paths send. The writes on a cluster are in ``tests/test_spark_cluster.py``.
"""

from __future__ import annotations

import asyncio
import base64
import re
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import psycopg
import pyarrow as pa
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
from airflow_provider_sqlqueue.spark.write import _iso_duration
from airflow_provider_sqlqueue.transport import (
    ArgumentTypeError,
    AsyncQueueClient,
    InvalidArgumentError,
    Message,
    QueueAddress,
    QueueClient,
    SqlQueueError,
)
from tests.test_contract import checksums
from tests.test_spark_cluster import bodies, space_fixture  # noqa: F401 - the fixture space, shared
from tests.test_spark_options import raw_pg_fixture, shop_fixture  # noqa: F401 - the fixtures raw_pg and shop
from tests.test_spark_read import queue_fixture  # noqa: F401 - the fixture queue, shared

pytestmark = pytest.mark.postgres_only


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
        # The message columns are found whatever their case, so a differently cased one meets their types...
        (
            columns(BODY=IntegerType()),
            ArgumentTypeError,
            "column 'BODY' must be binary or string.*taken as column 'body'",
        ),
        (columns(body=StringType(), Headers=StringType()), ArgumentTypeError, "column 'Headers' must be a map"),
        (columns(body=StringType(), TTBR=BooleanType()), ArgumentTypeError, "column 'TTBR'.*got boolean"),
        # ... and two names Spark would take for one column are refused, special or not.
        (columns(body=StringType(), Body=StringType()), InvalidArgumentError, "'body' and 'Body'.*differ only in case"),
        (columns(name=StringType(), NAME=LongType()), InvalidArgumentError, "'name' and 'NAME'.*differ only in case"),
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


def test_message_columns_are_found_whatever_their_case_by_rows_and_by_arrow(shop) -> None:
    """A ``Headers`` or ``TTBR`` column was sent as content (headers and expiry lost), and a lone
    ``BODY`` column as the JSON object ``{"BODY": ...}``; JSON content keeps its columns' names."""
    from pyspark.sql.pandas.types import to_arrow_schema

    schema, uri = shop
    text_map = MapType(StringType(), StringType())
    cases = [
        (columns(Body=StringType(), Headers=text_map, TTBR=IntegerType()), ("b", {"a": "1"}, 60)),
        (columns(BODY=BinaryType(), headers=text_map), (b"\x00b", {"a": "2"})),
        (columns(Name=StringType(), HEADERS=text_map, tTbR=DoubleType()), ("ada", {"a": "3"}, 1.5)),
    ]
    sent = []
    for row_schema, values in cases:
        layout = spark.RowLayout.of(row_schema)
        assert layout.takes_arrow()  # both paths apply: each must find the same columns
        assert set(layout.special()) == {name.lower() for name in row_schema.names} - {"name"}
        for arrow in (False, True):
            source = spark.SqlQueueDataSource({"url": uri, "queue": f'orders@"{schema}"'})
            writer = source.writer(row_schema, False)
            assert isinstance(writer, spark.QueueArrowWriter)
            if arrow:
                batch = pa.RecordBatch.from_pylist(
                    [dict(zip(row_schema.names, values, strict=True))], schema=to_arrow_schema(row_schema)
                )
                writer.commit([writer.write(iter([batch]))])
            else:
                writer.commit([writer.write(iter([Row(*values)]))])
            with QueueClient.connect(uri) as client:
                (message,) = client.receive(QueueAddress("orders", schema), 10)
            sent.append(
                (
                    message.body,
                    message.headers.get("a"),
                    message.headers.get("NServiceBus.TimeToBeReceived"),
                    message.headers.get("NServiceBus.ContentType"),
                )
            )
    assert sent == [
        *[(b"b", "1", "00:01:00", None)] * 2,
        *[(b"\x00b", "2", None, None)] * 2,
        *[(b'{"Name":"ada"}', "3", "00:00:01.5000000", "application/json")] * 2,
    ]


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
    assert _iso_duration(span) == text


@pytest.mark.parametrize("write_id", ["w\x00", 5, "w" * 2_000, ""])
def test_forget_write_checks_the_write_id(write_id: Any, shop) -> None:
    schema, uri = shop
    with pytest.raises(SqlQueueError):
        spark.forget_write(uri, f'orders@"{schema}"', write_id)


# -- the COPY and Arrow paths send what INSERT and rows send ------------------------------------------


@pytest.mark.parametrize("session", ["blocking", "asyncio"])
def test_messages_sent_by_copy_are_the_rows_send_inserts(pg_uri, queue, session) -> None:
    """A write's COPY and the transport's INSERT store the same bytes in every column (Expires NULL,
    Seq in send order), over a blocking and an asyncio session alike; messages with a time to be
    received take the INSERT, Expires from the database."""
    messages = [
        Message(b"\x00\xff binary", {"Shop.Note": 'naïve 😀 \t"q"\\', "Shop.Null": None}),
        Message("text body"),
        Message(None, {"NServiceBus.MessageId": "mine", "NServiceBus.TimeSent": "2026-01-01 00:00:00:000000 Z"}),
        Message(b""),
    ]
    other = QueueAddress("copied", queue.schema)
    with QueueClient.connect(pg_uri) as client:
        client.create_queue(other)
        client.send(queue, messages)
        if session == "blocking":
            assert client.copies_sends
            with client.transaction():
                assert client.send_copied(other, messages) == len(messages)
            assert client.send_copied(other, [Message(b"ttbr", time_to_be_received=60)]) == 1

    async def copy_over_asyncio() -> None:
        async with await AsyncQueueClient.connect(pg_uri) as client:
            assert client.copies_sends
            async with client.transaction():
                assert await client.send_copied(other, messages) == len(messages)
            assert await client.send_copied(other, [Message(b"ttbr", time_to_be_received=60)]) == 1

    if session == "asyncio":
        asyncio.run(copy_over_asyncio())

    def table(address: QueueAddress) -> list[tuple[Any, ...]]:
        with psycopg.connect(pg_uri) as raw:
            return raw.execute(
                sql.SQL("SELECT Id, Expires, Headers, Body, Seq FROM {} ORDER BY Seq").format(
                    sql.Identifier(address.schema, address.table)
                )
            ).fetchall()

    def stamped(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:  # each send stamps its own time
        sent = re.compile(r'"NServiceBus.TimeSent":"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d:\d{6} Z"')
        return [
            (i, e, sent.sub('"NServiceBus.TimeSent":"-"', h) if "mine" not in h else h, b) for i, e, h, b, _ in rows
        ]

    sent, copied = table(queue), table(other)
    assert stamped(copied[:-1]) == stamped(sent)
    assert [row[4] for row in copied[:-1]] == [1, 2, 3, 4]
    assert copied[-1][3] == b"ttbr" and copied[-1][1] is not None  # an expiring message: Expires set


def test_an_arrow_write_sends_the_messages_a_row_write_sends(pg_uri, queue) -> None:
    """The write's Arrow path (no Spark Row per row) against the row path, on columns of every type
    it takes: the same bodies and headers, one ledgered transaction each."""
    from decimal import Decimal

    from pyspark.sql import Row
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import (
        BinaryType,
        BooleanType,
        DateType,
        DecimalType,
        DoubleType,
        LongType,
        MapType,
        StringType,
        StructField,
        StructType,
    )

    schema = StructType(
        [
            StructField("n", LongType()),
            StructField("name", StringType()),
            StructField("price", DecimalType(10, 2)),
            StructField("ok", BooleanType()),
            StructField("day", DateType()),
            StructField("raw", BinaryType()),
            StructField("x", DoubleType()),
            StructField("headers", MapType(StringType(), StringType())),
        ]
    )
    import datetime as dt

    values = [
        (1, "naïve 😀", Decimal("2.50"), True, dt.date(2026, 1, 2), b"\x00\xff", 0.1, {"Shop.K": "v", "Shop.N": None}),
        (2, None, None, None, None, None, None, None),
    ]
    layout = spark.RowLayout.of(schema)
    assert layout.takes_arrow()
    got = {}
    for name, arrow in (("rows", False), ("arrow", True)):
        target = QueueAddress(name, queue.schema)
        with QueueClient.connect(pg_uri) as client:
            client.create_queue(target)
        options = spark.Options.parse({"url": pg_uri, "queue": f'{name}@"{queue.schema}"'})
        if arrow:
            batch = pa.RecordBatch.from_pylist(
                [dict(zip(schema.names, v, strict=True)) for v in values], schema=to_arrow_schema(schema)
            )
            assert spark.QueueArrowWriter(options, layout).write(iter([batch])).sent == 2
        else:
            rows = [Row(**dict(zip(schema.names, v, strict=True))) for v in values]
            assert spark.QueueWriter(options, layout).write(iter(rows)).sent == 2
        with QueueClient.connect(pg_uri) as client:
            got[name] = [
                (m.body, {k: v for k, v in m.headers.items() if k.startswith("Shop.")}) for m in client.browse(target)
            ]
    assert got["arrow"] == got["rows"]
    assert got["rows"][0][1] == {"Shop.K": "v", "Shop.N": None}


# -- a partition run again ----------------------------------------------------------------------------


def test_a_partition_run_again_after_it_committed_sends_nothing(space, pg_uri):
    """What Spark does when an executor dies after its task committed: the same partition runs again."""
    from pyspark.sql import Row
    from pyspark.sql.types import LongType, StructField, StructType

    from airflow_provider_sqlqueue.spark import QueueWriter, SqlQueueDataSource, WritePart

    orders = space("orders")
    schema = StructType([StructField("n", LongType())])
    source = SqlQueueDataSource({"url": pg_uri, "queue": orders, "writeId": "nightly:2026-11-24"})
    writer = source.writer(schema, overwrite=False)
    assert isinstance(writer, QueueWriter)
    rows = [Row(n=n) for n in range(500)]
    assert writer.write(iter(rows)) == WritePart(0, 500)
    assert writer.write(iter(rows)) == WritePart(0, None)
    again = SqlQueueDataSource({"url": pg_uri, "queue": orders, "writeId": "nightly:2026-11-24"})
    assert again.writer(schema, overwrite=False).write(iter(rows)) == WritePart(0, None)
    assert len(bodies(pg_uri, orders)) == 500
