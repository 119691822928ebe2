"""The ``sqlqueue`` data source's reads as Spark takes them: Arrow batches, partition by partition.

These run the reader Spark instantiates (planning on the driver, ``read`` per partition as an
executor's Python worker does) against the real database without a JVM, and hand every batch to
PySpark's own check of what a Python data source returns, so a batch Spark would refuse fails here.
The jobs themselves, on a cluster, are in ``tests/test_spark_cluster.py``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from psycopg import sql
from pyspark.sql.worker.plan_data_source_read import records_to_arrow_batches

from airflow_provider_sqlqueue import spark
from airflow_provider_sqlqueue.spark import read as spark_read
from airflow_provider_sqlqueue.transport import Message, QueueAddress, QueueClient

pytestmark = pytest.mark.postgres_only


@pytest.fixture(name="queue")  # a name of its own: the suites that import it take it as a parameter
def queue_fixture(pg_uri: str) -> Iterator[QueueAddress]:
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


def test_large_bodies_are_cut_into_bounded_batches_and_arrive_whole(pg_uri, queue, monkeypatch) -> None:
    monkeypatch.setattr(spark_read, "BATCH_BYTES", 3_000_000)  # the bound the batches are cut at
    bodies = [bytes([n]) * size for n, size in enumerate([1_000_000] * 7 + [20_000_000, 10, 2_000_000])]
    with QueueClient.connect(pg_uri) as client:
        client.send(queue, [Message(body) for body in bodies])
    name = f'orders@"{queue.schema}"'
    for options in ({}, {"mode": "claim", "holder": "big", "numPartitions": "1"}):
        batches = read({"url": pg_uri, "queue": name, **options})
        assert sorted(r["body"] for r in rows(batches)) == sorted(bodies)
        for batch in batches:  # within the bound, or one body larger than it alone
            size = sum(len(body) for body in batch.column("body").to_pylist())
            assert size <= spark_read.BATCH_BYTES or batch.num_rows == 1
        assert max(batch.num_rows for batch in batches) > 1
    assert spark.ack_held(pg_uri, name, "big") == len(bodies)


def test_a_range_is_read_in_windows_of_seqs_that_widen_where_it_is_sparse(pg_uri, queue, monkeypatch) -> None:
    """A page reads a window of Seqs (a scan bounded by the rows it reads, whatever the statistics
    say), and a sparse stretch of the range is crossed in few, wider windows: every message once."""
    with QueueClient.connect(pg_uri) as client:
        client.send(queue, [Message(f"m{n}") for n in range(3_000)])
        low, _high = client.seq_range(queue)
        with psycopg.connect(pg_uri, autocommit=True) as raw:  # consumed in the middle: a sparse stretch
            raw.execute(
                sql.SQL("DELETE FROM {} WHERE Seq > %s AND Seq < %s AND Seq %% 50 <> 0").format(
                    sql.Identifier(queue.schema, queue.table)
                ),
                (low + 500, low + 2_500),
            )
        left = [m.text for m in client.browse(queue, 3_000)]
    windows: list[tuple[int, int]] = []
    browse_columns = QueueClient.browse_columns

    def counted(self: QueueClient, *args: Any, **kwargs: Any) -> Any:
        windows.append((kwargs["after"], kwargs["last"]))
        return browse_columns(self, *args, **kwargs)

    monkeypatch.setattr(QueueClient, "browse_columns", counted)
    got = rows(read({"url": pg_uri, "queue": f'orders@"{queue.schema}"', "numPartitions": "1", "fetchSize": "100"}))
    assert sorted(r["body"].decode() for r in got) == sorted(left) and len(got) == len(left) > 1_000
    assert all(last - after <= 100 for after, last in windows[:5])  # dense: windows of fetchSize Seqs
    assert max(last - after for after, last in windows) > 100  # the sparse stretch, in wider ones
    assert len(windows) < 30  # some 1,040 rows at 100 a page, and a few to cross the gap


def test_the_next_window_follows_the_rows_found() -> None:
    full = spark_read.BrowseColumns(["a"] * 10, [{}] * 10, [b""] * 10, 57)
    sparse = spark_read.BrowseColumns(["a"], [{}], [b""], None)
    dense = spark_read.BrowseColumns(["a"] * 8, [{}] * 8, [b""] * 8, None)
    assert spark_read.next_window(60, 40, full, 10) == (57, 10)  # full before its end: on from its last row
    assert spark_read.next_window(60, 10, sparse, 10) == (60, 20)  # sparse: twice as wide
    assert spark_read.next_window(60, 10, dense, 10) == (60, 10)
