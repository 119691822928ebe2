"""The ``sqlqueue`` data source's reads as Spark takes them: Arrow batches, partition by partition.

These run the reader Spark instantiates (planning on the driver, ``read`` per partition as an
executor's Python worker does) against the real database without a JVM, and hand every batch to
PySpark's own check of what a Python data source returns, so a batch Spark would refuse fails here.
The jobs themselves, on a cluster, are in ``tests/test_spark.py``.
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from psycopg import sql
from pyspark.sql.worker.plan_data_source_read import records_to_arrow_batches

from airflow_provider_sqlqueue import spark
from airflow_provider_sqlqueue.transport import AsyncQueueClient, Message, QueueAddress, QueueClient

pytestmark = pytest.mark.postgres_only


@pytest.fixture
def queue(pg_uri: str) -> Iterator[QueueAddress]:
    schema = f"spr_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_uri, autocommit=True) as raw:
        raw.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    address = QueueAddress("orders", schema)
    with QueueClient.connect(pg_uri) as client:
        client.create_queue(address)
    try:
        yield address
    finally:
        with psycopg.connect(pg_uri, autocommit=True) as raw:
            raw.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


def insert_raw(pg_uri: str, queue: QueueAddress, headers: str | None, body: bytes | None) -> uuid.UUID:
    """A row as another program writes it, whatever it put in the Headers and Body columns."""
    message_id = uuid.uuid4()
    with psycopg.connect(pg_uri, autocommit=True) as raw:
        raw.execute(
            sql.SQL("INSERT INTO {} (Id, Expires, Headers, Body) VALUES (%s, NULL, %s, %s)").format(
                sql.Identifier(queue.schema, queue.table)
            ),
            (message_id, headers, body),
        )
    return message_id


def read(options: dict[str, str]) -> list[pa.RecordBatch]:
    """Every batch of a batch read, each through Spark's check of a Python data source's batches."""
    source = spark.SqlQueueDataSource(options)
    reader = source.reader(source.schema())
    batches: list[pa.RecordBatch] = []
    for partition in reader.partitions():
        batches += records_to_arrow_batches(reader.read(partition), 10_000, spark.MESSAGE_SCHEMA, source)
    return batches


def rows(batches: list[pa.RecordBatch]) -> list[dict[str, Any]]:
    return [row for batch in batches for row in batch.to_pylist()]


def test_a_partitioned_browse_returns_each_message_exactly_once(pg_uri, queue) -> None:
    with QueueClient.connect(pg_uri) as client:
        client.send(queue, [Message.of({"n": n}) for n in range(25_000)])
    name = f'orders@"{queue.schema}"'
    batches = read({"url": pg_uri, "queue": name, "numPartitions": "7", "fetchSize": "999"})
    got = rows(batches)
    assert sorted(json.loads(r["body"])["n"] for r in got) == list(range(25_000))
    assert len({r["id"] for r in got}) == 25_000 and all(r["deliveries"] is None for r in got)
    assert all(batch.num_rows <= spark.BATCH_ROWS for batch in batches)


def test_a_partitioned_claim_read_returns_each_held_message_once(pg_uri, queue) -> None:
    with QueueClient.connect(pg_uri) as client:
        client.send(queue, [Message.of({"n": n}) for n in range(12_000)])
    name = f'orders@"{queue.schema}"'
    options = {"url": pg_uri, "queue": name, "mode": "claim", "holder": "h1", "numPartitions": "5"}
    first = rows(read({**options, "maxMessagesPerBatch": "11000"}))
    again = rows(read({**options, "maxMessagesPerBatch": "11000"}))  # a retried job: the same messages
    assert sorted(json.loads(r["body"])["n"] for r in first) == list(range(11_000))
    assert sorted(r["id"] for r in again) == sorted(r["id"] for r in first)
    assert {r["deliveries"] for r in first} == {1}
    assert spark.ack_held(pg_uri, name, "h1") == 11_000


def test_arrow_batches_carry_null_bodies_odd_unicode_and_skip_unreadable_headers(pg_uri, queue) -> None:
    odd = {
        "Shop.Note": "naïve café — 日本語 😀 \u200f\u202e",
        "Shop.Escaped": '\u00e9\u0000\t"quoted"\\',
        "Shop.Null": None,
        "\U0001d518nicode \U0001f600 name": "value",  # outside the BMP
    }
    with QueueClient.connect(pg_uri) as client:
        client.send(queue, Message(b"\x00\xff binary", odd))
    null_body = insert_raw(pg_uri, queue, json.dumps({"NServiceBus.MessageId": "x"}), None)
    escaped = insert_raw(pg_uri, queue, '{"Shop.Escaped":"\\u00e9\\/\\ud83d\\ude00"}', b"{}")
    empty_headers = insert_raw(pg_uri, queue, "", b"e")
    for unreadable in ("{not json", '{"lone":"\\ud800"}', '{"n":1}', "[]", "null"):
        insert_raw(pg_uri, queue, unreadable, b"poison")
    got = {r["id"]: r for r in rows(read({"url": pg_uri, "queue": f'orders@"{queue.schema}"'}))}
    assert len(got) == 4  # the five unreadable rows are skipped, as a browse skips them
    (sent,) = [r for r in got.values() if r["body"] == b"\x00\xff binary"]
    assert {k: v for k, v in dict(sent["headers"]).items() if k.startswith(("Shop.", "\U0001d518"))} == odd
    assert got[str(null_body)]["body"] == b""  # a NULL Body reads as an empty body, as it always has
    assert dict(got[str(escaped)]["headers"]) == {"Shop.Escaped": "é/😀"}
    assert dict(got[str(empty_headers)]["headers"]) == {}


def test_the_columnar_browse_returns_what_browse_pages_return(pg_uri, queue) -> None:
    """The read's fast path (columns, no message objects) against the transport's browse, page by page:
    the same ids, headers and bodies in the same order, the same pages, unreadable rows skipped."""
    with QueueClient.connect(pg_uri) as client:
        client.send(queue, [Message(f"m{n}".encode(), {"Shop.N": str(n), "Shop.Null": None}) for n in range(7)])
        insert_raw(pg_uri, queue, "{not json", b"poison")
        insert_raw(pg_uri, queue, '{"a":"1"},{"b":"2"', b"two objects")  # not one object: skipped, not split
        insert_raw(pg_uri, queue, '"c":"3"}', b"the rest")
        insert_raw(pg_uri, queue, "", None)  # empty headers and a NULL body
        client.send(queue, Message(b"last", {"Shop.Note": "日本語 😀"}))
        after, pages = 0, 0
        while True:
            page = client.browse_page(queue, 4, after=after)
            columns = client.browse_columns(queue, 4, after=after)
            assert columns.ids == [str(m.id) for m in page.messages]
            assert columns.headers == [m.headers for m in page.messages]
            assert columns.bodies == [m.body for m in page.messages]
            assert columns.after == page.after
            pages += 1
            if page.after is None:
                break
            after = page.after
    assert pages == 4  # twelve rows: three full pages, then an empty one


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


def test_large_bodies_are_cut_into_bounded_batches_and_arrive_whole(pg_uri, queue, monkeypatch) -> None:
    monkeypatch.setattr(spark, "BATCH_BYTES", 3_000_000)
    bodies = [bytes([n]) * size for n, size in enumerate([1_000_000] * 7 + [20_000_000, 10, 2_000_000])]
    with QueueClient.connect(pg_uri) as client:
        client.send(queue, [Message(body) for body in bodies])
    name = f'orders@"{queue.schema}"'
    for options in ({}, {"mode": "claim", "holder": "big", "numPartitions": "1"}):
        batches = read({"url": pg_uri, "queue": name, **options})
        assert sorted(r["body"] for r in rows(batches)) == sorted(bodies)
        for batch in batches:  # within the bound, or one body larger than it alone
            size = sum(len(body) for body in batch.column("body").to_pylist())
            assert size <= spark.BATCH_BYTES or batch.num_rows == 1
        assert max(batch.num_rows for batch in batches) > 1
    assert spark.ack_held(pg_uri, name, "big") == len(bodies)


def stream_reader(options: dict[str, str]) -> spark.QueueStreamReader:
    source = spark.SqlQueueDataSource(options)
    reader = source.streamReader(source.schema())
    assert isinstance(reader, spark.QueueStreamReader)
    return reader


def run_batches(reader: spark.QueueStreamReader, limit: Any) -> list[int]:
    """What Spark's micro-batch loop does with the source: offsets until none is new, each batch read
    (every partition through Spark's check) and committed; returns each batch's length."""
    lengths = []
    start = reader.initialOffset()
    while (end := reader.latestOffset(start, limit)) != start:
        batch = [
            b
            for partition in reader.partitions(start, end)
            for b in records_to_arrow_batches(reader.read(partition), 10_000, spark.MESSAGE_SCHEMA, reader)
        ]
        lengths.append(sum(b.num_rows for b in batch))
        reader.commit(end)
        start = end
    return lengths


def test_micro_batches_follow_the_read_limit_spark_passes(pg_uri, queue) -> None:
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

    with QueueClient.connect(pg_uri) as client:
        client.send(queue, [Message.of({"n": n}) for n in range(2_500)])
    reader = stream_reader({"url": pg_uri, "queue": f'orders@"{queue.schema}"', "maxMessagesPerBatch": "1000"})
    try:
        assert reader.getDefaultReadLimit() == ReadMaxRows(1_000)  # maxMessagesPerBatch, as Spark knows limits
        assert run_batches(reader, ReadMaxRows(300)) == [300] * 8 + [100]  # a smaller limit wins
        with QueueClient.connect(pg_uri) as client:
            client.send(queue, [Message.of({"n": n}) for n in range(2_500)])
        assert run_batches(reader, ReadMaxRows(5_000)) == [1_000, 1_000, 500]  # never past the option
        with QueueClient.connect(pg_uri) as client:
            client.send(queue, [Message.of({"n": n}) for n in range(1_500)])
        assert run_batches(reader, ReadAllAvailable()) == [1_000, 500]  # still one bounded claim per batch
        with QueueClient.connect(pg_uri) as client:
            assert client.depth(queue) == 0 and client.in_flight(queue) == 0
    finally:
        reader.stop()


def test_trigger_available_now_reads_what_waited_when_it_started_and_ends(pg_uri, queue) -> None:
    from pyspark.sql.streaming.datasource import ReadMaxRows

    with QueueClient.connect(pg_uri) as client:
        client.send(queue, [Message.of({"n": n}) for n in range(2_300)])
    reader = stream_reader({"url": pg_uri, "queue": f'orders@"{queue.schema}"', "maxMessagesPerBatch": "1000"})
    try:
        reader.prepareForTriggerAvailableNow()
        with QueueClient.connect(pg_uri) as client:  # sent after the query started: for the next query
            client.send(queue, [Message.of({"late": n}) for n in range(700)])
        assert run_batches(reader, ReadMaxRows(1_000)) == [1_000, 1_000, 300]
        with QueueClient.connect(pg_uri) as client:
            late = client.browse(queue, 10_000)
            assert sorted(m.json()["late"] for m in late) == list(range(700))  # type: ignore[index]
            assert client.in_flight(queue) == 0
    finally:
        reader.stop()


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
