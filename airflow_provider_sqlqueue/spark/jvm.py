"""The JVM path: each row's message built by Spark's SQL engine, loaded into the queue by COPY.

``format("sqlqueue")`` is a Python data source: Spark hands every row it writes to a Python
worker, which builds a message from it (an id, the headers' JSON, the row's JSON) at more cost per
row than PostgreSQL's insert. :func:`~.functions.save_to_queue` takes the same options and builds
the same messages as Spark expressions instead -- a time-ordered id, the headers' text with the
id in it, the body as the ``body`` column or ``to_json`` of the row, as bytea hex -- so what
reaches Python is Arrow batches of three text columns, which Arrow's CSV writer turns into the
text of a ``COPY ... FROM STDIN (FORMAT csv)`` without a value of Python per row. Each partition
is loaded in one transaction that first records it in the write ledger, as the data source's
write does, so a task Spark runs again after its partition committed sends nothing, and a write
repeated under its ``writeId`` by either path sends only the partitions that did not commit.

Where Spark cannot build the message as the data source would (a SQL Server queue, a ``ttbr``
column or a ``timeToBeReceived``: an ``Expires`` is the database's clock at insert, which a COPY
cannot take; a column type whose JSON Spark would spell differently) the write takes the data
source's Python path and says so once in the log; option ``engine`` chooses: ``auto`` (the
default), ``jvm`` (refused where it cannot) or ``python``.
"""

from __future__ import annotations

import math
import secrets
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import pyarrow as pa
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StructType,
)

from ..transport import Message
from ..transport.drivers import dialect_for
from ..transport.errors import InvalidArgumentError
from ..transport.message import CONTENT_TYPE, JSON_CONTENT_TYPE, MESSAGE_ID, TIME_SENT, wire_timestamp
from .options import Options
from .write import (
    BODY_COLUMN,
    HEADERS_COLUMN,
    NOT_JSON,
    NOT_JSON_END,
    TTBR_COLUMN,
    RowLayout,
    _option_headers,
    end_write,
    in_ledger,
    log,
)

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

#: The id a message's headers are first written with, then replaced by each row's own.
_PLACEHOLDER = uuid.UUID(int=0)
#: What a task of :func:`write_in_jvm` reports: its partition, and how many it sent (-1: committed before).
_REPORT = pa.schema([("part", pa.int32()), ("sent", pa.int64())])
#: The low 62 bits of a 64-bit number: a version-7 id's random part after its variant bits.
_LOW_62 = (1 << 62) - 1


def jvm_reason(options: Options, layout: RowLayout) -> str | None:
    """Why this write cannot have its messages built by Spark's SQL engine (None: it can)."""
    if dialect_for(options.url).name != "postgres":
        return "the JVM path loads by PostgreSQL's COPY, which SQL Server does not have"
    if options.time_to_be_received is not None:
        return (
            "option 'timeToBeReceived' (a message's Expires is the database's clock at insert, which a COPY "
            "cannot take)"
        )
    return layout_reason(layout)


# -- rows to messages, as Spark expressions ---------------------------------------------

#: Scalar types whose values ``to_json`` writes as the data source's JSON rows hold them (strings,
#: booleans, integers; floating-point numbers with the same value, NaN and infinities refused).
_JSON_SCALARS = (BooleanType, ByteType, ShortType, IntegerType, LongType, FloatType, DoubleType)


def _column(name: str) -> Column:
    """The column ``name`` of the written DataFrame, whatever characters its name holds."""
    from pyspark.sql import functions as sf

    return sf.col("`" + name.replace("`", "``") + "`")


def _jvm_json(data_type: DataType) -> bool:
    """Whether Spark's ``to_json`` spells a value of ``data_type`` as the data source's encoder does."""
    from pyspark.sql.types import CharType, StringType, VarcharType

    if isinstance(data_type, (StringType, CharType, VarcharType, *_JSON_SCALARS)):
        return not isinstance(data_type, (FloatType, DoubleType))  # nested: NaN is checked at the top only
    if isinstance(data_type, ArrayType):
        return _jvm_json(data_type.elementType)
    if isinstance(data_type, MapType):
        return isinstance(data_type.keyType, StringType) and _jvm_json(data_type.valueType)
    if isinstance(data_type, StructType):
        return all(_jvm_json(f.dataType) for f in data_type.fields)
    return False


def layout_reason(layout: RowLayout) -> str | None:
    """Why ``layout``'s rows cannot be built by Spark expressions as the Python path builds them."""
    at = layout.special()
    if TTBR_COLUMN in at:
        return "a 'ttbr' column (each row's TimeToBeReceived header is written by the Python path)"
    if BODY_COLUMN in at:
        return None
    for column in layout.schema.fields:
        if column.name.lower() == HEADERS_COLUMN:
            continue
        kind = column.dataType
        if isinstance(kind, (FloatType, DoubleType, DecimalType, DateType)):
            continue  # checked for NaN and infinities row by row; cast to their text as the Python path writes them
        if not _jvm_json(kind):
            return f"column {column.name!r} is {kind.simpleString()}, whose JSON the Python path writes"
    return None


def _message_ids(taken: set[str]) -> tuple[str, Column]:
    """A column name no column of the DataFrame has, and each row's message id: a version-7 UUID
    (RFC 9562), the write's start in milliseconds and 12 random bits, then 62 bits of a random start
    plus the row's ``monotonically_increasing_id`` (its partition and place). Ids that follow each
    other land at the right edge of the queue's primary key, as NServiceBus's own sequential ids do,
    which PostgreSQL loads a third faster than random ones (BENCHMARKS.md)."""
    from pyspark.sql import functions as sf

    name = "__sqlqueue_id"
    while name.lower() in taken:
        name += "_"
    high = f"{(time.time_ns() // 1_000_000) << 16 | 0x7000 | secrets.randbits(12):016x}"
    # Both terms are under 2**62, so the sum cannot overflow; the top bit is the variant's (10).
    low = sf.lower(
        sf.hex(
            (
                (sf.monotonically_increasing_id().bitwiseAND(_LOW_62) + sf.lit(secrets.randbits(62))).bitwiseAND(
                    _LOW_62
                )
            ).bitwiseOR(sf.shiftleft(sf.lit(1).cast(LongType()), 63))
        )
    )
    text = sf.concat(
        sf.lit(f"{high[:8]}-{high[8:12]}-{high[12:]}-"), sf.substring(low, 1, 4), sf.lit("-"), sf.substring(low, 5, 12)
    )
    return name, text


def message_rows(df: DataFrame, layout: RowLayout, options: Options) -> DataFrame:
    """``df``'s rows as the text of the queue's (Id, Headers, Body) columns, built by Spark."""
    from pyspark.sql import functions as sf

    at = layout.special()
    names = layout.schema.names
    headers: dict[str, str | None] = _option_headers(options)
    content = [names[n] for n in range(len(names)) if n not in at.values()]
    if BODY_COLUMN in at:
        body_name = names[at[BODY_COLUMN]]
        raw = _column(body_name)
        if not isinstance(layout.schema[body_name].dataType, BinaryType):
            raw = sf.encode(raw, "UTF-8")
        body: Column = sf.coalesce(raw, sf.lit(b""))
    else:
        headers.setdefault(CONTENT_TYPE, JSON_CONTENT_TYPE)
        # Decimals and dates as the text the Python path writes; a float as the double Python reads it as.
        casts = {DecimalType: "string", DateType: "string", FloatType: "double"}
        fields = [
            next(
                (
                    _column(name).cast(to).alias(name)
                    for kind, to in casts.items()
                    if isinstance(layout.schema[name].dataType, kind)
                ),
                _column(name),
            )
            for name in content
        ]
        body = sf.encode(sf.to_json(sf.struct(*fields), {"ignoreNullFields": "false"}), "UTF-8")
        for name in content:
            if isinstance(layout.schema[name].dataType, (FloatType, DoubleType)):
                value = _column(name)
                bad = sf.isnan(value) | (sf.abs(value) == sf.lit(math.inf))
                body = sf.when(
                    bad,
                    sf.raise_error(sf.lit(f"{NOT_JSON} {name}, {NOT_JSON_END}")),
                ).otherwise(body)
    time_sent = wire_timestamp(datetime.now(UTC))  # one send time for the write, as a batched send has
    id_name, ids = _message_ids({name.lower() for name in names})
    message_id = sf.col(id_name)
    if HEADERS_COLUMN in at:
        headers_json = _merged_headers(_column(names[at[HEADERS_COLUMN]]), headers, message_id, time_sent)
    else:
        # The same headers for every row but its id: the text the Python path writes, made by the
        # library's own encoder once, with each row's id put in its place.
        text = Message(b"", headers, id=_PLACEHOLDER).wire_headers(time_sent)
        before, _, after = text.rpartition(str(_PLACEHOLDER))
        headers_json = sf.concat(sf.lit(before), message_id, sf.lit(after))
    return df.withColumn(id_name, ids).select(
        message_id.alias("Id"),
        headers_json.alias("Headers"),
        sf.concat(sf.lit("\\x"), sf.hex(body)).alias("Body"),  # bytea's hex text
    )


def _merged_headers(given: Column, headers: Mapping[str, str | None], message_id: Column, time_sent: str) -> Column:
    """A row's headers JSON from its ``headers`` map, as :class:`Message` merges them: the option
    headers it does not override, its own, then the NServiceBus defaults it does not give."""
    from pyspark.sql import functions as sf

    def literal_map(pairs: Mapping[str, str | None]) -> Column:
        items = [part for k, v in pairs.items() for part in (sf.lit(k), sf.lit(v).cast("string"))]
        return sf.create_map(*items) if items else sf.create_map().cast("map<string,string>")

    # A row's NServiceBus.MessageId or TimeSent given as null asks for the default, as in Message.
    given = sf.map_filter(
        sf.coalesce(given, literal_map({})), lambda k, v: v.isNotNull() | ~k.isin(MESSAGE_ID, TIME_SENT)
    )
    merged = sf.map_concat(
        sf.map_filter(literal_map(headers), lambda k, _: ~sf.array_contains(sf.map_keys(given), k)), given
    )
    filled = sf.map_concat(sf.create_map(sf.lit(MESSAGE_ID), message_id), literal_map({TIME_SENT: time_sent}))
    merged = sf.map_concat(merged, sf.map_filter(filled, lambda k, _: ~sf.array_contains(sf.map_keys(merged), k)))
    return sf.to_json(merged)


def write_in_jvm(df: DataFrame, options: Options, layout: RowLayout) -> int:
    """Send ``df``'s rows as messages built by Spark, each partition loaded by COPY in one transaction
    recorded in the write ledger; returns how many were sent (a partition that committed before sends none)."""
    rows = message_rows(df, layout, options)
    key = options.write_key(options.write_id)
    with options.connect() as client:
        options.check_sink(client)
    try:
        results = rows.mapInArrow(_loader(options, key), "part int, sent long").collect()
    except Exception as exc:
        refused = library_refusal(exc)
        if refused is not None:
            raise InvalidArgumentError(refused) from None
        raise
    finally:
        end_write(options, key)
    sent = sum(max(int(row["sent"]), 0) for row in results)
    before = sum(1 for row in results if row["sent"] < 0)
    log.info(
        "Write %s to %s: %d messages from %d partitions built by Spark (%d committed before)",
        key,
        options.queue,
        sent,
        len(results),
        before,
    )
    return sent


def _loader(options: Options, key: uuid.UUID) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The task that loads one partition's rows (Arrow batches of Id, Headers, Body) by COPY, in one
    transaction that records the partition in the ledger first; it reports (part, sent), sent -1
    when the partition had committed before."""

    def load(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        context = TaskContext.get()
        part = context.partitionId() if context is not None else 0
        with options.connect() as client:
            sent = in_ledger(
                client, (options.ledger, key, part), lambda: client.send_csv(options.queue, csv_chunks(batches))
            )
        yield pa.RecordBatch.from_pydict({"part": [part], "sent": [-1 if sent is None else sent]}, schema=_REPORT)

    return load


def csv_chunks(batches: Iterable[pa.RecordBatch]) -> Iterator[bytes]:
    """Each Arrow batch as CSV text, written by Arrow in C++: strings quoted, quotes doubled."""
    from pyarrow import csv

    no_header = csv.WriteOptions(include_header=False)
    for batch in batches:
        sink = pa.BufferOutputStream()
        csv.write_csv(batch, sink, no_header)
        yield sink.getvalue().to_pybytes()


def library_refusal(exc: BaseException) -> str | None:
    """The library's own refusal of a row (NaN in a JSON row), when Spark's error carries it."""
    text = str(exc)
    start = text.find(NOT_JSON)
    if start < 0:
        return None
    end = text.find(NOT_JSON_END, start)
    return text[start : end + len(NOT_JSON_END)] if end >= 0 else None
