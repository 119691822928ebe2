"""The ``sqlqueue`` data source's streaming read, and ``batch_writer``, as Spark drives them.

These run the stream reader Spark instantiates (offsets and planning on the driver, ``read`` per
partition as an executor's Python worker does, every batch through PySpark's own check) against
the real database without a JVM: micro-batches follow the read limit Spark passes and
Trigger.AvailableNow; ``batch_writer`` refuses bad arguments and a sink that is not a queue before
a query claims anything. The streams on a cluster are in ``tests/test_spark_cluster.py``.
"""

from __future__ import annotations

from typing import Any

import pytest
from pyspark.sql.worker.plan_data_source_read import records_to_arrow_batches

from airflow_provider_sqlqueue import spark
from airflow_provider_sqlqueue.transport import ArgumentTypeError, Message, QueueClient, SqlQueueError
from tests.test_contract import checksums
from tests.test_spark_options import raw_pg_fixture, shop_fixture  # noqa: F401 - the fixtures raw_pg and shop
from tests.test_spark_read import queue_fixture  # noqa: F401 - the fixture queue, shared

pytestmark = pytest.mark.postgres_only


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
            {"url": "postgresql://db/x", "queue": "q", "lease": "30"},
            "/ck",
            spark.InvalidOptionError,
            "option 'lease' applies only to reads",
        ),
        (
            {"url": "postgresql://db/x", "queue": "q", "ledger": " "},
            "/ck",
            spark.InvalidOptionError,
            "option 'ledger' is empty",
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
