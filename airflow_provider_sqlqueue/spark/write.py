"""The data source's batch write: rows to messages, one transaction per partition, the write ledger.

:class:`RowLayout` decides on the driver, from the DataFrame's schema, how a row becomes a message
(its ``body`` column, or the row as a JSON object); :class:`QueueWriter` (rows) and
:class:`QueueArrowWriter` (Spark's Arrow batches) send each partition in one transaction recorded
in the write ledger, which :func:`forget_write` clears. :func:`send_rows` is the same send without
the ledger, as a plain helper.
"""

from __future__ import annotations

import base64
import json
import math
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    CharType,
    DataType,
    DateType,
    DayTimeIntervalType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    NullType,
    ShortType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
    VarcharType,
    VariantType,
)

from ..transport import Message, QueueClient, defaults
from ..transport.addressing import checked_text
from ..transport.errors import ArgumentTypeError, InvalidArgumentError
from ..transport.logs import logger
from ..transport.message import CONTENT_TYPE, ENCLOSED_MESSAGE_TYPES, JSON_CONTENT_TYPE, duration
from .options import Options

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, Row

#: The data source's one logger, whichever of its modules logs: its records keep the name logging
#: configurations know.
log = logger("airflow_provider_sqlqueue.spark")

#: Columns a written row may carry besides its content, recognised whatever the case of their names
#: (as Spark resolves column names by default: a ``Headers`` column is the ``headers`` one).
BODY_COLUMN, HEADERS_COLUMN, TTBR_COLUMN = "body", "headers", "ttbr"
#: Messages per COPY statement of a write on PostgreSQL.
COPY_ROWS = 10_000


# -- rows to messages ------------------------------------------------------------------------


_TEXT_TYPES = (StringType, CharType, VarcharType)
#: Column types a JSON row carries as they are (JSON strings, booleans and numbers).
_PLAIN_TYPES = (*_TEXT_TYPES, BooleanType, ByteType, ShortType, IntegerType, LongType, FloatType, DoubleType, NullType)
_NUMBER_TYPES = (ByteType, ShortType, IntegerType, LongType, FloatType, DoubleType, DecimalType)


def _iso_duration(span: timedelta) -> str:
    """An ISO-8601 duration (``P1DT2H3M4.5S``, ``-PT0.25S``): days of 24 hours, exact to the microsecond."""
    sign = "-" if span < timedelta(0) else ""
    span = abs(span)
    hours, rest = divmod(span.seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    second = f"{seconds}.{span.microseconds:06d}".rstrip("0").rstrip(".") if span.microseconds else str(seconds)
    days = f"{span.days}D" if span.days else ""
    time = "".join(f"{n}{unit}" for n, unit in ((hours, "H"), (minutes, "M")) if n)
    if seconds or span.microseconds or not (days or time):
        time += f"{second}S"
    return f"{sign}P{days}{'T' + time if time else ''}"


def _binary_text(value: bytes | bytearray) -> str:
    return base64.b64encode(value).decode("ascii")


def _decimal_text(value: Decimal) -> str:
    """Plain notation (``0.0000001``, not ``1E-7``), as Spark casts a decimal to text on the JVM path."""
    return format(value, "f")


def _date_text(value: date) -> str:
    return value.isoformat()


def _instant_text(value: datetime) -> str:
    """A TIMESTAMP (an instant; PySpark hands it over as naive local time) in UTC, with its offset."""
    return value.astimezone(UTC).isoformat()


def _variant_json(value: Any) -> Any:
    return json.loads(value.toJson())


_SCALAR_ENCODERS: tuple[tuple[type[DataType], Callable[[Any], Any]], ...] = (
    (BinaryType, _binary_text),
    (DecimalType, _decimal_text),
    (DateType, _date_text),
    (TimestampType, _instant_text),
    (TimestampNTZType, _date_text),  # a wall-clock time with no zone: ISO-8601 without an offset
    (DayTimeIntervalType, _iso_duration),
    (VariantType, _variant_json),
)


#: Column types whose values Arrow's ``to_pylist`` gives as a Spark row holds them (see RowLayout.takes_arrow).
_ARROW_TYPES = (*_PLAIN_TYPES, DecimalType, DateType, BinaryType)
#: Map key types a JSON object's (text) keys can stand for.
_KEY_TYPES = (*_PLAIN_TYPES, BinaryType, DecimalType, DateType, TimestampType, TimestampNTZType, DayTimeIntervalType)


def _json_encoder(data_type: DataType, where: str) -> Callable[[Any], Any] | None:
    """How a value of ``data_type`` goes into a JSON row (None: as it is); a type JSON cannot carry
    faithfully (year-month and calendar intervals, user-defined types...) is refused, naming ``where``."""
    if isinstance(data_type, _PLAIN_TYPES):
        return None
    for kind, encode in _SCALAR_ENCODERS:
        if isinstance(data_type, kind):
            return encode
    if isinstance(data_type, ArrayType):
        return _array_encoder(_json_encoder(data_type.elementType, f"{where} (its elements)"))
    if isinstance(data_type, MapType):
        if not isinstance(data_type.keyType, _KEY_TYPES):
            raise ArgumentTypeError(
                f"{where} is {data_type.simpleString()}: a JSON object's keys are text, so a map's keys must be "
                "scalars; cast the column or write a 'body' column of your own"
            )
        key = _json_encoder(data_type.keyType, f"{where} (its keys)")
        return _map_encoder(key, _json_encoder(data_type.valueType, f"{where} (its values)"))
    if isinstance(data_type, StructType):
        _unique_names(data_type, where)
        return _struct_encoder([(f.name, _json_encoder(f.dataType, f"{where}.{f.name}")) for f in data_type.fields])
    raise ArgumentTypeError(
        f"{where} is {data_type.simpleString()}, which a JSON row cannot carry faithfully: cast it (e.g. to "
        "string, or a year-month interval to months) or write a 'body' column of your own"
    )


def _array_encoder(element: Callable[[Any], Any] | None) -> Callable[[Any], Any]:
    def encode(values: Any) -> Any:
        return [None if v is None or element is None else element(v) for v in values]

    return encode if element is not None else list


def _map_encoder(key: Callable[[Any], Any] | None, value: Callable[[Any], Any] | None) -> Callable[[Any], Any]:
    def encode(items: Any) -> Any:
        return {
            (k if key is None else key(k)): (v if v is None or value is None else value(v)) for k, v in items.items()
        }

    return encode


def _struct_encoder(fields: list[tuple[str, Callable[[Any], Any] | None]]) -> Callable[[Any], Any]:
    def encode(row: Any) -> Any:
        return {
            name: (v if v is None or field_encoder is None else field_encoder(v))
            for (name, field_encoder), v in zip(fields, row, strict=True)
        }

    return encode


def _unique_names(schema: StructType, where: str) -> None:
    names = schema.fieldNames()
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise InvalidArgumentError(
            f"{where} has more than one column named {', '.join(map(repr, twice))}: a message would keep only one "
            "of them; rename or drop the others"
        )


@dataclass(frozen=True)
class RowLayout:
    """How a written row becomes a message, decided on the driver from the DataFrame's schema (so a
    column that cannot be sent is refused before anything is), and applied by each task."""

    schema: StructType

    @classmethod
    def of(cls, schema: StructType) -> RowLayout:
        """The layout of ``schema``, refusing on the driver what a task could only get wrong.

        The ``body``, ``headers`` and ``ttbr`` columns are found whatever their case: Spark resolves
        column names case-insensitively by default, and a ``Headers`` column sent as content would
        lose the headers without a word. The data source cannot see the session's setting, so two
        columns whose names differ only in case are refused whatever it is, as is a column named
        like a special one, in any case, whose type is not that column's.
        """
        if not schema.fields:
            raise InvalidArgumentError(
                "the DataFrame has no columns, so its rows would be no messages: select the columns to send "
                "(a 'body' column, or columns sent as a JSON object)"
            )
        _unique_names(schema, "the DataFrame")
        by_case: dict[str, list[str]] = {}
        for name in schema.fieldNames():
            by_case.setdefault(name.lower(), []).append(name)
        for names in by_case.values():
            if len(names) > 1:
                raise InvalidArgumentError(
                    f"the DataFrame has columns {' and '.join(map(repr, names))}, whose names differ only in case: "
                    "Spark takes them for one column unless spark.sql.caseSensitive is set, and the message "
                    "columns (body, headers, ttbr) are found whatever the case; rename or drop all but one"
                )
        for column in schema.fields:
            kind, role = column.dataType, column.name.lower()
            # A differently cased name is said to be taken for the special column, and how to avoid it.
            taken = "" if column.name == role else f" (it is taken as column {role!r}: rename it if it is not)"
            if role == BODY_COLUMN and not isinstance(kind, (BinaryType, *_TEXT_TYPES)):
                raise ArgumentTypeError(
                    f"column {column.name!r} must be binary or string, got {kind.simpleString()}{taken}"
                )
            if role == HEADERS_COLUMN and not (
                isinstance(kind, MapType)
                and isinstance(kind.keyType, _TEXT_TYPES)
                and isinstance(kind.valueType, _TEXT_TYPES)
            ):
                raise ArgumentTypeError(
                    f"column {column.name!r} must be a map<string,string> of header names to values, got "
                    f"{kind.simpleString()}{taken}"
                )
            if role == TTBR_COLUMN and not isinstance(kind, (*_NUMBER_TYPES, DayTimeIntervalType)):
                raise ArgumentTypeError(
                    f"column {column.name!r} (the time to be received) must be a number of seconds or a day-time "
                    f"interval, got {kind.simpleString()}{taken}"  # booleans too, as the core refuses them
                )
        layout = cls(schema)
        layout.encoder()  # refuses a column JSON cannot carry
        return layout

    def special(self) -> dict[str, int]:
        """Where the ``body``, ``headers`` and ``ttbr`` columns are, by their lower-case names: the one
        place they are looked up, so the row path, the Arrow path and the JSON content agree."""
        return {
            name.lower(): n
            for n, name in enumerate(self.schema.fieldNames())
            if name.lower() in (BODY_COLUMN, HEADERS_COLUMN, TTBR_COLUMN)
        }

    def messages(self, rows: Iterable[Row | tuple[Any, ...]], options: Options) -> Iterator[Message]:
        """The message of each written row: its ``body`` column, or the row as JSON (``application/json``).

        A ``headers`` column (map of string to string) adds to or overrides the option headers, a
        ``ttbr`` column (seconds or a day-time interval) the ``timeToBeReceived`` option. Columns are
        found once per partition and rows read as plain tuples: a Row's own item access and
        ``asDict`` cost more per row than building its message.
        """
        at = self.special()
        body_at, headers_at, ttbr_at = at.get(BODY_COLUMN), at.get(HEADERS_COLUMN), at.get(TTBR_COLUMN)
        names = {role: self.schema.names[n] for role, n in at.items()}  # as the DataFrame spells them
        encode = self.encoder() if body_at is None else None
        headers = _option_headers(options)
        if encode is not None:
            headers.setdefault(CONTENT_TYPE, JSON_CONTENT_TYPE)
        for row in rows:
            values = tuple(row)
            if encode is not None:
                body: str | bytes | bytearray | None = _json_body(encode(values))
            else:
                body = values[body_at]  # type: ignore[index]  # body_at is set when there is no encoder
                if body is not None and not isinstance(body, (bytes, bytearray, str)):
                    raise ArgumentTypeError(
                        f"column {names[BODY_COLUMN]!r} must be binary or string, got {type(body).__name__}"
                    )
            merged: Mapping[str, str | None] = headers
            row_headers = None if headers_at is None else values[headers_at]
            if row_headers:
                if not isinstance(row_headers, Mapping):
                    raise ArgumentTypeError(
                        f"column {names[HEADERS_COLUMN]!r} must be a map, got {type(row_headers).__name__}"
                    )
                merged = {**headers, **row_headers}
            ttbr = None if ttbr_at is None else values[ttbr_at]
            time_to_be_received = options.time_to_be_received if ttbr is None else _row_ttbr(ttbr, names[TTBR_COLUMN])
            yield Message(body, merged, time_to_be_received=time_to_be_received)

    def takes_arrow(self) -> bool:
        """Whether every column reads from Arrow as it reads from a Spark row (:meth:`arrow_rows`):
        text, numbers, decimals, booleans, dates and binary (and a text headers map, a ttbr in seconds);
        not timestamps, which a row holds in the session's time zone, nor nested types."""
        for column in self.schema.fields:
            kind, role = column.dataType, column.name.lower()
            if role == HEADERS_COLUMN or (role == BODY_COLUMN and isinstance(kind, BinaryType)):
                continue
            if role == TTBR_COLUMN:
                if not isinstance(kind, _NUMBER_TYPES):
                    return False
            elif not isinstance(kind, _ARROW_TYPES) or isinstance(kind, NullType):
                return False
        return True

    def arrow_rows(self, batches: Iterable[pa.RecordBatch | Row]) -> Iterator[tuple[Any, ...]]:
        """The rows of Arrow batches as the tuples :meth:`messages` reads, column by column in C:
        no Spark ``Row`` built per row, which costs a write more than its message. Only for a layout
        that :meth:`takes_arrow`; a headers map comes from Arrow as pairs, made a dict here."""
        headers_at = self.special().get(HEADERS_COLUMN)
        for batch in batches:
            if not isinstance(batch, pa.RecordBatch):  # a row, from a caller that is not Spark's Arrow writer
                yield tuple(batch)
                continue
            columns = [column.to_pylist() for column in batch.columns]
            if headers_at is not None:
                columns[headers_at] = [None if pairs is None else dict(pairs) for pairs in columns[headers_at]]
            yield from zip(*columns, strict=True)

    def encoder(self) -> Callable[[Sequence[Any]], dict[str, Any]]:
        """A row's content columns (every column but ``headers`` and ``ttbr``, by position) as a JSON
        object whose keys are the columns' own names, as the DataFrame spells them."""
        at = self.special()
        skipped = {at.get(HEADERS_COLUMN), at.get(TTBR_COLUMN)}
        columns = [
            (n, f.name, _json_encoder(f.dataType, f"column {f.name!r}"))
            for n, f in enumerate(self.schema.fields)
            if n not in skipped
        ]

        def encode(row: Sequence[Any]) -> dict[str, Any]:
            return {name: (row[n] if row[n] is None or enc is None else enc(row[n])) for n, name, enc in columns}

        return encode


def _row_ttbr(value: object, column: str) -> timedelta:
    if isinstance(value, Decimal):
        value = float(value)
    return duration(f"column {column!r}", value, maximum=defaults.MAX_TIME_TO_BE_RECEIVED)


#: One encoder for every row: ``json.dumps`` with these arguments builds a new one per call. JSON has
#: no NaN or infinity, so they are refused rather than sent as invalid JSON labelled application/json.
_JSON_ROW = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


#: How a row holding NaN or an infinity is refused, around the columns that hold them: the Python
#: path's words, which the JVM path's tasks raise too (and its driver finds again in Spark's error).
NOT_JSON = "a row holds NaN or an infinite number in"
NOT_JSON_END = "which JSON cannot carry: replace them (e.g. with null) or write a 'body' column of your own"


def _json_body(content: dict[str, Any]) -> str:
    try:
        return _JSON_ROW.encode(content)
    except ValueError:
        columns = sorted(
            name for name, value in content.items() if isinstance(value, float) and not math.isfinite(value)
        )
        raise InvalidArgumentError(f"{NOT_JSON} {', '.join(columns) or 'a nested value'}, {NOT_JSON_END}") from None
    except TypeError as exc:  # a value of a type the layout did not plan for (rows built by hand)
        raise ArgumentTypeError(f"a row holds a value JSON cannot carry: {exc}") from None


def _option_headers(options: Options) -> dict[str, str | None]:
    headers: dict[str, str | None] = {}
    if options.message_type:
        headers[ENCLOSED_MESSAGE_TYPES] = options.message_type
    if options.content_type:
        headers[CONTENT_TYPE] = options.content_type
    return headers


def in_ledger(client: QueueClient, ledger: tuple[str, uuid.UUID, int] | None, send: Callable[[], int]) -> int | None:
    """Run ``send`` (a partition's sends) in one transaction that first records the partition in the
    write ledger (table, write, partition), when there is one; returns what ``send`` sent, or None
    when the partition had committed before and nothing was sent."""
    with client.transaction():
        if ledger is not None and not client.record_write(*ledger):
            _, write, part = ledger
            log.info("Partition %d of write %s committed before; sent nothing this time", part, write)
            return None
        return send()


def end_write(options: Options, key: uuid.UUID) -> None:
    """A write without a ``writeId`` cannot be repeated, so its ledger rows are done with once it
    ends, committed or not; one with a ``writeId`` keeps them until the caller forgets the id
    (:func:`forget_write`)."""
    if options.write_id is None:
        with options.connect() as client:
            client.forget_write(options.ledger, key)


def _send_partition(
    client: QueueClient,
    queue: str,
    messages: Iterable[Message],
    batch_size: int,
    ledger: tuple[str, uuid.UUID, int] | None = None,
) -> int | None:
    """Send a partition's messages in one transaction (:func:`in_ledger`); returns how many.

    On PostgreSQL they are loaded by COPY (:meth:`QueueClient.send_copied`), COPY_ROWS per
    statement; elsewhere, or for messages with a time to be received, ``batch_size`` per INSERT.
    """

    def send() -> int:
        sent = 0
        step = max(batch_size, COPY_ROWS)
        batch: list[Message] = []
        for message in messages:
            batch.append(message)
            if len(batch) >= step:
                sent += _send_some(client, queue, batch, batch_size)
                batch = []
        if batch:
            sent += _send_some(client, queue, batch, batch_size)
        return sent

    return in_ledger(client, ledger, send)


def _send_some(client: QueueClient, queue: str, batch: list[Message], batch_size: int) -> int:
    if client.copies_sends and all(m.time_to_be_received is None for m in batch):
        return client.send_copied(queue, batch)
    return sum(client.send(queue, batch[n : n + batch_size]) for n in range(0, len(batch), batch_size))


@dataclass
class WritePart(WriterCommitMessage):
    """What a write task reports: its partition, and how many it sent (None: committed before)."""

    part: int
    sent: int | None


class QueueWriter(DataSourceWriter):
    """A batch write: one transaction per partition, each recorded in the write ledger."""

    def __init__(self, options: Options, layout: RowLayout) -> None:
        self.options = options
        self.layout = layout  # checked on the driver, before the database is touched
        self.key = options.write_key(options.write_id)
        with options.connect() as client:
            options.check_sink(client)

    def write(self, iterator: Iterator[Row]) -> WritePart:
        return self._write(iterator)

    def _write(self, rows: Iterator[Row] | Iterator[tuple[Any, ...]]) -> WritePart:
        from pyspark import TaskContext

        context = TaskContext.get()
        part = context.partitionId() if context is not None else 0
        options = self.options
        messages = self.layout.messages(rows, options)
        with options.connect() as client:
            sent = _send_partition(
                client, options.queue, messages, options.batch_size, (options.ledger, self.key, part)
            )
        return WritePart(part, sent)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        parts = [m for m in messages if isinstance(m, WritePart)]
        sent = sum(m.sent or 0 for m in parts)
        skipped = sum(1 for m in parts if m.sent is None)
        log.info(
            "Write %s to %s: %d messages from %d partitions (%d committed before)",
            self.key,
            self.options.queue,
            sent,
            len(parts),
            skipped,
        )
        end_write(self.options, self.key)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        committed = [m.part for m in messages if isinstance(m, WritePart)]
        log.error(
            "Write %s to %s failed; partitions %s were sent and stay sent",
            self.key,
            self.options.queue,
            committed,
        )
        end_write(self.options, self.key)


class QueueArrowWriter(QueueWriter, DataSourceArrowWriter):
    """:class:`QueueWriter` taking Spark's Arrow batches instead of rows, for a layout whose columns
    read the same from both (:meth:`RowLayout.takes_arrow`): the same messages, the same ledger."""

    def write(self, iterator: Iterator[pa.RecordBatch] | Iterator[Row]) -> WritePart:
        """Spark's Arrow batches; rows too, as :meth:`QueueWriter.write` takes them (a caller's own task)."""
        return self._write(self.layout.arrow_rows(iterator))


# -- forgetting writes ----------------------------------------------------------------------------


def forget_write(url: str, queue: str, write_id: str, *, ledger: str = defaults.WRITE_LEDGER) -> int:
    """Forget a ``writeId`` whose write can no longer be repeated; returns the ledger rows deleted."""
    checked_text("write_id", write_id, limit=defaults.MAX_LABEL)
    options = Options.parse({"url": url, "queue": queue, "ledger": ledger})
    with options.connect() as client:
        return client.forget_write(options.ledger, options.write_key(write_id))


# -- plain helper --------------------------------------------------------------------------------


def send_rows(
    df: DataFrame,
    conninfo: str,
    queue: str,
    *,
    batch_size: int = defaults.SPARK_SEND_BATCH,
    headers: Mapping[str, str | None] | None = None,
    time_to_be_received: timedelta | float | None = None,
) -> int:
    """Send every row of ``df`` as one JSON message (``application/json``) to ``queue``; returns how many.

    The data source's write without its ledger: one connection and one transaction per partition,
    so a partition is all or nothing, but a task Spark re-runs after its partition committed sends
    it again. ``conninfo`` travels to executors with the task.
    """
    if batch_size < 1:
        raise InvalidArgumentError(f"batch_size must be at least 1, got {batch_size}")
    message_headers = {CONTENT_TYPE: JSON_CONTENT_TYPE, **(headers or {})}

    def send(rows: Iterable[Any]) -> Iterator[int]:
        messages = (
            Message(
                json.dumps(row.asDict(recursive=True), default=str, separators=(",", ":")),
                message_headers,
                time_to_be_received=time_to_be_received,
            )
            for row in rows
        )
        with QueueClient.connect(conninfo) as client:
            yield _send_partition(client, queue, messages, batch_size) or 0

    return int(df.rdd.mapPartitions(send).sum())
