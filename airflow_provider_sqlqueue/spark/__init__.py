"""Queues from PySpark: the ``sqlqueue`` data source, and two plain helpers.

No Airflow import: this package runs in Spark's Python workers (on executors, and beside the driver
for planning), which need only this package, psycopg (or a SQL Server driver) and the database.
Register the source once per session (``register(spark)``), then::

    df.write.format("sqlqueue").option("url", url).option("queue", "orders").mode("append").save()
    spark.read.format("sqlqueue").option("url", url).option("queue", "orders").load()       # browse
    spark.readStream.format("sqlqueue").option("url", url).option("queue", "orders").load() # claims

Guarantees, which README states in full:

- **Batch write**: each Spark partition is sent in one transaction, and recorded in the write
  ledger in that transaction, so a partition is all or nothing and a retried or speculative task
  of a partition that committed sends nothing. With a ``writeId`` the ledger outlives the job: a
  write repeated under the same id (a replayed micro-batch) sends only what did not commit.
- **Batch read**: ``browse`` reads waiting messages without taking them. ``claim`` takes them under
  a ``holder`` name: reading again returns the same messages until the caller settles them with
  :func:`ack_held` (after its job committed) or :func:`nack_held`; unsettled, they come back to
  the queue when the lease ends. :func:`claimed_from_queue` holds its batch in the driver's open
  transaction instead, as row locks the executors read past: acknowledged when its block ends,
  back in the queue (with no delivery counted) if it raises or the driver dies. :func:`relay_batch`
  sends what a job makes of such a batch to another queue in the same transaction: exactly once,
  with no ledger.
- **Streaming read**: each micro-batch claims messages under a holder derived from the query's
  checkpoint and the batch number; Spark replays an uncommitted batch from the same claims; a
  batch's claims are acknowledged once Spark has committed it. Messages of a batch that was never
  committed come back when their lease ends, and are then counted as a second delivery.

Connection options travel to executors inside the data source, never in plan text: ``url`` is
redacted by Spark's ``spark.sql.redaction.options.regex`` (default ``(?i)url``), as is a separate
``password``; nothing here logs either.

The package's modules, each importing only those listed before it:

- ``options``: the options, parsed and checked once on the driver;
- ``write``: rows to messages, the batch writers and their ledger (:func:`forget_write`), and
  :func:`send_rows`;
- ``read``: batch reads (browse, claim), settling claims (:func:`ack_held`, :func:`nack_held`), and
  :func:`read_queue`;
- ``jvm``: the JVM path: the same writes, each message built by Spark's SQL engine, loaded by COPY;
- ``stream``: the streaming read;
- ``source``: the data source class Spark instantiates, and :func:`register`;
- ``functions``: :func:`save_to_queue` (the JVM path where it can, else the data source),
  :func:`batch_writer` for ``foreachBatch``, :func:`claimed_from_queue`, a batch read held by the
  driver's transaction, and :func:`relay_batch`, which sends such a batch on to another queue in it.

Their public names are imported here: ``from airflow_provider_sqlqueue.spark import ...`` is the
import path to use. Spark pickles the classes and module-level functions it ships to its Python
workers by reference to the module that defines them (``airflow_provider_sqlqueue.spark.read``,
...), which a worker imports as it imports this package.
"""

from __future__ import annotations

from .functions import Relayed, batch_writer, claimed_from_queue, relay_batch, save_to_queue
from .options import (
    BATCH_SIZE,
    ENGINES,
    FETCH_SIZE,
    MAX_MESSAGES_PER_BATCH,
    NAME,
    OPTION_NAMES,
    PARTITIONS,
    READ_OPTIONS,
    WRITE_ID_NAMESPACE,
    WRITE_OPTIONS,
    InvalidOptionError,
    Options,
)
from .read import (
    BATCH_BYTES,
    BATCH_ROWS,
    MESSAGE_SCHEMA,
    HeldShare,
    QueueReader,
    SeqRange,
    ack_held,
    nack_held,
    read_queue,
)
from .source import SqlQueueDataSource, register
from .stream import QueueStreamReader
from .write import (
    BODY_COLUMN,
    COPY_ROWS,
    HEADERS_COLUMN,
    TTBR_COLUMN,
    QueueArrowWriter,
    QueueWriter,
    RowLayout,
    WritePart,
    forget_write,
    log,
    send_rows,
)

__all__ = [
    "BATCH_BYTES",
    "BATCH_ROWS",
    "BATCH_SIZE",
    "BODY_COLUMN",
    "COPY_ROWS",
    "ENGINES",
    "FETCH_SIZE",
    "HEADERS_COLUMN",
    "MAX_MESSAGES_PER_BATCH",
    "MESSAGE_SCHEMA",
    "NAME",
    "OPTION_NAMES",
    "PARTITIONS",
    "READ_OPTIONS",
    "TTBR_COLUMN",
    "WRITE_ID_NAMESPACE",
    "WRITE_OPTIONS",
    "HeldShare",
    "InvalidOptionError",
    "Options",
    "QueueArrowWriter",
    "QueueReader",
    "QueueStreamReader",
    "QueueWriter",
    "Relayed",
    "RowLayout",
    "SeqRange",
    "SqlQueueDataSource",
    "WritePart",
    "ack_held",
    "batch_writer",
    "claimed_from_queue",
    "forget_write",
    "log",
    "nack_held",
    "read_queue",
    "register",
    "relay_batch",
    "save_to_queue",
    "send_rows",
]
