"""The data source's batch reads: browse waiting messages in Seq ranges, read a holder's claims, or
read a batch another session's transaction holds locked (option ``lock``, in Seq ranges too).

Each partition's messages reach Spark as Arrow batches built column by column
(:func:`_column_batches`). A claim-mode read takes its messages under a ``holder``
(:func:`claim_for`, which the streaming reader of :mod:`.stream` uses per micro-batch too);
:func:`ack_held` and :func:`nack_held` settle them. :func:`read_queue` is the plain helper: a
browse on the driver, as a DataFrame.
"""

from __future__ import annotations

import bisect
import functools
import itertools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.types import BinaryType, IntegerType, MapType, StringType, StructField, StructType

from ..transport import QueueClient, defaults
from ..transport.operations import BrowseColumns
from ..transport.tracing import Carried, clock, consumed
from .options import Options

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: What a read returns, one row per message (``deliveries`` is null in browse mode and for a locked
#: batch, which counts no delivery).
MESSAGE_SCHEMA = StructType(
    [
        StructField("id", StringType(), False),
        StructField("headers", MapType(StringType(), StringType(), True), False),
        StructField("body", BinaryType(), True),
        StructField("deliveries", IntegerType(), True),
    ]
)


@dataclass
class SeqRange(InputPartition):
    """Browse partition: the rows with ``after`` < Seq <= ``last`` (of a locked batch: those it holds)."""

    after: int
    last: int


def seq_ranges(low: int, high: int, parts: int) -> list[SeqRange]:
    """Seqs ``low`` to ``high`` in up to ``parts`` ranges of one size (one empty range when there are none)."""
    if low > high:
        return [SeqRange(0, 0)]
    size = max(1, -(-(high - low + 1) // parts))
    return [SeqRange(start - 1, min(start - 1 + size, high)) for start in range(low, high + 1, size)]


@dataclass
class HeldShare(InputPartition):
    """Claim partition: the claims ``holder`` holds whose Seq modulo ``parts`` is ``part``."""

    holder: str
    parts: int
    part: int


#: Rows and body bytes per Arrow batch a read yields: Spark's own default batch length, and a bound
#: that keeps a batch of large bodies well inside Arrow's 32-bit offsets of a binary column (2 GiB).
BATCH_ROWS = 10_000
BATCH_BYTES = 64 * 1024 * 1024


@functools.cache
def _arrow_schema() -> pa.Schema:
    """MESSAGE_SCHEMA as Spark expects a Python data source's Arrow batches (it compares them exactly)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(MESSAGE_SCHEMA, timezone="UTC")


def _column_batches(
    ids: list[str], headers: Sequence[Mapping[str, str | None]], bodies: list[bytes], deliveries: list[int] | None
) -> Iterator[pa.RecordBatch]:
    """Messages' columns as Arrow batches of MESSAGE_SCHEMA, cut at BATCH_ROWS rows or BATCH_BYTES of bodies.

    Spark turns tuples a reader yields into Arrow itself, one value at a time in Python, which cost
    more than reading the rows from the database; built here column by column, the values are
    copied into Arrow's buffers in C (headers as a map array of their keys and values, flattened).
    """
    start = 0
    sizes = list(itertools.accumulate(map(len, bodies)))
    while start < len(ids):
        before = sizes[start - 1] if start else 0
        end = min(len(ids), start + BATCH_ROWS, bisect.bisect_right(sizes, before + BATCH_BYTES, lo=start))
        end = max(end, start + 1)  # one body larger than the bound travels alone
        yield _batch(
            ids[start:end],
            headers[start:end],
            bodies[start:end],
            None if deliveries is None else deliveries[start:end],
        )
        start = end


def _batch(
    ids: list[str], headers: Sequence[Mapping[str, str | None]], bodies: list[bytes], deliveries: list[int] | None
) -> pa.RecordBatch:
    schema = _arrow_schema()
    offsets = pa.array(list(itertools.accumulate(map(len, headers), initial=0)), pa.int32())
    keys = pa.array(list(itertools.chain.from_iterable(headers)), pa.string())
    values = pa.array(list(itertools.chain.from_iterable(h.values() for h in headers)), pa.string())
    columns = [
        pa.array(ids, pa.string()),
        pa.MapArray.from_arrays(offsets, keys, values, type=schema.field("headers").type),
        pa.array(bodies, pa.binary()),
        pa.nulls(len(ids), pa.int32()) if deliveries is None else pa.array(deliveries, pa.int32()),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def read_share(options: Options, share: HeldShare) -> Iterator[pa.RecordBatch]:
    started = clock()
    with options.connect() as client:
        held = client.held_columns(options.queue, share.holder, parts=share.parts, part=share.part)
    _traced("read", options, held.ids, held.headers, started)
    return _column_batches(held.ids, held.headers, held.bodies, held.deliveries)


def _traced(
    operation: str, options: Options, ids: Sequence[str], headers: Sequence[Mapping[str, str | None]], started: int
) -> None:
    """A partition's read as a receive span linking to its messages' contexts (:mod:`..transport.tracing`);
    nothing unless tracing (``started`` is then 0)."""
    if started:
        carried = [Carried(i, h) for i, h in zip(ids, headers, strict=True)]
        consumed(operation, lambda: options.queue, carried, started)


def holder_shares(holder: str, parts: int) -> list[HeldShare]:
    return [HeldShare(holder, parts, part) for part in range(parts)]


class QueueReader(DataSourceReader):
    """A batch read: browse waiting messages in Seq ranges, read the claims of a holder, or read a
    locked batch in Seq ranges."""

    def __init__(self, options: Options) -> None:
        self.options = options
        with options.connect() as client:
            options.check(client, claims=options.mode == "claim")

    def partitions(self) -> Sequence[InputPartition]:
        options = self.options
        if options.lock is not None:  # the bounds are the lock's: nothing to ask the database
            return seq_ranges(options.lock.after + 1, options.lock.last, options.partitions)
        with options.connect() as client:
            if options.mode == "claim":
                assert options.holder is not None  # noqa: S101  # narrows a type Spark's interface erases
                claim_for(client, options, options.holder, options.max_messages_per_batch)
                return holder_shares(options.holder, options.partitions)
            bounds = client.seq_range(options.queue)
        return seq_ranges(*(bounds or (1, 0)), options.partitions)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        options = self.options
        if isinstance(partition, HeldShare):
            yield from read_share(options, partition)
            return
        assert isinstance(partition, SeqRange)  # noqa: S101  # narrows a type Spark's interface erases
        locked_by = None if options.lock is None else options.lock.xid
        after, width = partition.after, options.fetch_size
        with options.connect() as client:
            while after < partition.last:
                last = min(partition.last, after + width)
                started = clock()
                page = client.browse_columns(
                    options.queue, options.fetch_size, after=after, last=last, locked_by=locked_by
                )
                _traced("browse" if locked_by is None else "read", options, page.ids, page.headers, started)
                yield from _column_batches(page.ids, page.headers, page.bodies, None)
                after, width = next_window(last, width, page, options.fetch_size)


def next_window(last: int, width: int, page: BrowseColumns, fetch_size: int) -> tuple[int, int]:
    """Where a range read's next page starts after ``page`` of the window ending at ``last``, and how
    many Seqs wide its window is.

    A page reads a window of Seqs, not the next ``fetch_size`` rows of the whole range: on a queue
    whose statistics are stale (never analyzed, or filled since), PostgreSQL plans ``ORDER BY Seq
    LIMIT`` over a wide range as a scan of every row in it and a sort, for every page -- a partition
    of 100,000 rows read that way cost 40 times what its pages' index scans do. A window bounds each
    page's scan to the rows it reads. One as wide as ``fetch_size`` Seqs holds at most that many
    rows; a sparse one (messages consumed between the waiting ones) makes the next twice as wide, so
    a range of few rows over many Seqs takes few pages."""
    if page.after is not None:  # full before the window's end: dense rows, read on from the last one
        return page.after, fetch_size
    return last, width * 2 if len(page.ids) < fetch_size // 2 else width


def claim_for(client: QueueClient, options: Options, holder: str, wanted: int) -> int:
    """Make ``holder`` hold up to ``wanted`` messages (:meth:`QueueClient.hold`); returns how many it
    holds. What it holds already is what an earlier attempt of the same read or batch claimed, and
    all it keeps, so repeating the read returns the same messages; their bodies stay in the
    database, read by the tasks."""
    if wanted < 1:  # a batch Spark's read limit left empty: renew what the holder has, take nothing
        return client.extend_held(options.queue, holder, options.lease)
    return client.hold(options.queue, holder, wanted, lease=options.lease, max_deliveries=options.max_deliveries)


# -- settling claim-mode reads ------------------------------------------------------------------


def ack_held(url: str, queue: str, holder: str) -> int:
    """Acknowledge the messages a claim-mode read took under ``holder``: run it once the job's
    output is committed. Returns how many."""
    with QueueClient.connect(url) as client:
        return client.ack_held(queue, holder)


def nack_held(url: str, queue: str, holder: str, *, error: BaseException | str | None = None) -> int:
    """Give back the messages a claim-mode read took under ``holder`` (the job failed). Returns how many."""
    with QueueClient.connect(url) as client:
        return client.nack_held(queue, holder, error=error)


# -- plain helper --------------------------------------------------------------------------------


def read_queue(spark: SparkSession, conninfo: str, queue: str, *, limit: int = defaults.SPARK_READ_LIMIT) -> DataFrame:
    """The queue's waiting, unexpired messages (up to ``limit``) as a DataFrame, left in the queue.

    Columns: ``id`` (string), ``headers`` (map<string,string>), ``body`` (binary) and ``text``
    (the body as UTF-8, null when it is not). The read runs on the driver and takes no locks.
    """
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
