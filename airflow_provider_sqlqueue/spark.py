"""Queues from PySpark: send a DataFrame's rows as messages, read a queue into a DataFrame.

No Airflow import: the sending function runs on Spark executors, which only need this package,
psycopg and network access to the database. Each partition opens one connection and sends its
rows in one transaction, ``batch_size`` rows per statement, so a partition is all-or-nothing: a
Spark task that fails and is retried does not leave half its rows behind to be sent twice.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from .transport import Message, QueueClient
from .transport.message import CONTENT_TYPE, JSON_CONTENT_TYPE

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def _partition_sender(
    conninfo: str,
    queue: str,
    batch_size: int,
    headers: Mapping[str, str | None],
    time_to_be_received: timedelta | float | None,
) -> Callable[[Iterable[Any]], Iterator[int]]:
    """The function each partition runs: rows in, one count out."""
    message_headers = {CONTENT_TYPE: JSON_CONTENT_TYPE, **headers}

    def send(rows: Iterable[Any]) -> Iterator[int]:
        sent = 0
        with QueueClient.connect(conninfo) as client, client.session.transaction():
            batch: list[Message] = []
            for row in rows:
                body = json.dumps(row.asDict(recursive=True), default=str, separators=(",", ":"))
                batch.append(Message(body, message_headers, time_to_be_received=time_to_be_received))
                if len(batch) >= batch_size:
                    sent += client.send(queue, batch)
                    batch = []
            if batch:
                sent += client.send(queue, batch)
        yield sent

    return send


def send_rows(
    df: DataFrame,
    conninfo: str,
    queue: str,
    *,
    batch_size: int = 500,
    headers: Mapping[str, str | None] | None = None,
    time_to_be_received: timedelta | float | None = None,
) -> int:
    """Send every row of ``df`` as one JSON message (``application/json``) to ``queue``; returns how many.

    ``conninfo`` is a PostgreSQL URI or libpq string the executors can use (it travels to them
    with the task, so prefer a role with only INSERT on the queue). One connection and one
    transaction per partition; repartition first to bound the number of connections.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    sender = _partition_sender(conninfo, queue, batch_size, dict(headers or {}), time_to_be_received)
    return int(df.rdd.mapPartitions(sender).sum())


def read_queue(spark: SparkSession, conninfo: str, queue: str, *, limit: int = 10_000) -> DataFrame:
    """The queue's waiting, unexpired messages (up to ``limit``) as a DataFrame, left in the queue.

    Columns: ``id`` (string), ``headers`` (map<string,string>), ``body`` (binary) and ``text``
    (the body as UTF-8, null when it is not). The read runs on the driver and takes no locks.
    """
    from pyspark.sql.types import BinaryType, MapType, StringType, StructField, StructType

    with QueueClient.connect(conninfo) as client:
        messages = client.browse(queue, limit)
    rows = []
    for message in messages:
        try:
            text: str | None = message.body.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        rows.append((str(message.id), message.headers, bytearray(message.body), text))
    schema = StructType(
        [
            StructField("id", StringType(), False),
            StructField("headers", MapType(StringType(), StringType(), True), False),
            StructField("body", BinaryType(), False),
            StructField("text", StringType(), True),
        ]
    )
    return spark.createDataFrame(rows, schema)
