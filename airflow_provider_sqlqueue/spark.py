"""Queues from PySpark: the ``sqlqueue`` data source, and two plain helpers.

No Airflow import: this module runs in Spark's Python workers (on executors, and beside the driver
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
  the queue when the lease ends.
- **Streaming read**: each micro-batch claims messages under a holder derived from the query's
  checkpoint and the batch number; Spark replays an uncommitted batch from the same claims; a
  batch's claims are acknowledged once Spark has committed it. Messages of a batch that was never
  committed come back when their lease ends, and are then counted as a second delivery.

Connection options travel to executors inside the data source, never in plan text: ``url`` is
redacted by Spark's ``spark.sql.redaction.options.regex`` (default ``(?i)url``), as is a separate
``password``; nothing here logs either.
"""

from __future__ import annotations

import base64
import bisect
import difflib
import functools
import itertools
import json
import math
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow
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
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
    VarcharType,
    VariantType,
)

from .transport import Message, QueueAddress, QueueClient, defaults
from .transport.addressing import checked_text
from .transport.client import Addressing
from .transport.drivers import dialect_for
from .transport.errors import ArgumentTypeError, InvalidArgumentError, SqlQueueError
from .transport.logs import logger
from .transport.message import CONTENT_TYPE, ENCLOSED_MESSAGE_TYPES, JSON_CONTENT_TYPE, duration

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, Row, SparkSession
    from pyspark.sql.streaming.datasource import ReadLimit

log = logger("airflow_provider_sqlqueue.spark")

#: The format name: ``spark.read.format(NAME)``.
NAME = "sqlqueue"
#: Where the write ids given as text live: uuid5 of this namespace and the text.
WRITE_ID_NAMESPACE = uuid.UUID("6f0d5b3e-8d1c-4a57-9c4e-5a1f2b7c9e10")
#: What a read returns, one row per message (``deliveries`` is null in browse mode).
MESSAGE_SCHEMA = StructType(
    [
        StructField("id", StringType(), False),
        StructField("headers", MapType(StringType(), StringType(), True), False),
        StructField("body", BinaryType(), True),
        StructField("deliveries", IntegerType(), True),
    ]
)
#: Columns a written row may carry besides its content, recognised whatever the case of their names
#: (as Spark resolves column names by default: a ``Headers`` column is the ``headers`` one).
BODY_COLUMN, HEADERS_COLUMN, TTBR_COLUMN = "body", "headers", "ttbr"
#: Defaults of the options README lists (the lease and deliveries are the transport's).
PARTITIONS = 2
FETCH_SIZE = 10_000
MAX_MESSAGES_PER_BATCH = 10_000
BATCH_SIZE = 500
#: Messages per COPY statement of a write on PostgreSQL.
COPY_ROWS = 10_000
#: Every option the data source reads, as README spells them (Spark passes them case-insensitively,
#: and passes nothing of its own but ``path``, from ``load(path)``/``save(path)``): any other is refused.
OPTION_NAMES = (
    "url",
    "password",
    "queue",
    "errorQueue",
    "mode",
    "holder",
    "numPartitions",
    "fetchSize",
    "lease",
    "maxDeliveries",
    "maxMessagesPerBatch",
    "batchSize",
    "messageType",
    "contentType",
    "timeToBeReceived",
    "ledger",
    "writeId",
)
#: Options only a write reads, and options only a read (batch or streaming) reads; ``url``,
#: ``password`` and ``queue`` serve both. Spark hands a read and a write the same kind of options,
#: so an option given to the direction that ignores it would be dropped without a word (a
#: ``timeToBeReceived`` on a read, a ``lease`` on a write): it is refused instead.
WRITE_OPTIONS = frozenset({"batchSize", "messageType", "contentType", "timeToBeReceived", "ledger", "writeId"})
READ_OPTIONS = frozenset(
    {"mode", "holder", "numPartitions", "fetchSize", "lease", "maxDeliveries", "maxMessagesPerBatch", "errorQueue"}
)
#: What the options every direction needs hold, for the message refusing one given empty.
_REQUIRED = {
    "url": "a postgresql:// URI, a libpq or ODBC string",
    "queue": 'the queue\'s address, e.g. orders or orders@"sales"',
}


class InvalidOptionError(SqlQueueError, ValueError):
    """A ``sqlqueue`` data source option that is missing or cannot be used as given."""


def _number(options: Mapping[str, str], name: str, default: float, *, whole: bool = False) -> float:
    text = options.get(name)
    if text is None:
        return default
    try:
        value = int(text) if whole else float(text)
    except ValueError:
        raise InvalidOptionError(f"option {name!r} must be a {'whole ' if whole else ''}number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise InvalidOptionError(f"option {name!r} must be positive, got {text!r}")
    return value


def _span(
    options: Mapping[str, str],
    name: str,
    default: timedelta | None,
    maximum: timedelta,
    minimum: timedelta = timedelta(milliseconds=1),
) -> timedelta:
    """A duration option in seconds, within what the core accepts (a lease up to ``MAX_LEASE``...)."""
    seconds = _number(options, name, 0 if default is None else default.total_seconds())
    try:
        return duration(name, seconds, maximum=maximum, minimum=minimum)
    except SqlQueueError as exc:
        raise InvalidOptionError(f"option {name!r}: {exc}") from None


def _text(options: Mapping[str, str], name: str) -> str:
    """A text option the data source stores or hashes: text a database can hold."""
    try:
        return checked_text(f"option {name!r}", options.get(name), limit=defaults.MAX_LABEL)
    except SqlQueueError as exc:
        raise InvalidOptionError(str(exc)) from None


def _count(options: Mapping[str, str], name: str, default: int, maximum: int = defaults.MAX_BATCH) -> int:
    value = int(_number(options, name, default, whole=True))
    if value > maximum:
        raise InvalidOptionError(f"option {name!r} must be at most {maximum:,}, got {value:,}")
    return value


def _known(options: Mapping[str, str]) -> dict[str, str]:
    """The options keyed by their README names, whatever case they came in; an unknown (misspelt)
    option is refused, naming the nearest known one, rather than silently left at its default.

    So is an option given with no value (empty or blank), whichever it is: an empty
    ``option("ledger", os.environ.get(...))`` more likely lost its value than meant the default,
    and reading it as the default would write somewhere the caller did not name. An option meant
    to be left at its default is left out.
    """
    names = {name.lower(): name for name in OPTION_NAMES}
    known: dict[str, str] = {}
    for key, value in options.items():
        if not isinstance(key, str):
            raise InvalidOptionError(f"option names are text, got {type(key).__name__}")
        name = names.get(key.lower())
        if name is None:
            if key.lower() == "path":
                raise InvalidOptionError(
                    "the sqlqueue data source takes no path (load(path) / save(path)): name the queue with option 'queue'"
                )
            near = difflib.get_close_matches(key.lower(), list(names), n=1, cutoff=0.6)
            hint = f": did you mean {names[near[0]]!r}?" if near else f"; known options: {', '.join(OPTION_NAMES)}"
            raise InvalidOptionError(f"unknown option {key[:60]!r}{hint}")
        if value is None or (isinstance(value, str) and not value.strip()):
            need = _REQUIRED.get(name)
            raise InvalidOptionError(
                f"option {name!r} is empty: give {need}"
                if need
                else f"option {name!r} is empty: give it a value, or leave the option out to use its default"
            )
        if not isinstance(value, str):
            raise ArgumentTypeError(
                f"option {name!r} must be text, as Spark passes options, got {type(value).__name__}"
            )
        if name in known and known[name] != value:  # two spellings of one option (a plain dict)
            raise InvalidOptionError(f"option {name!r} is given twice, with different values")
        known[name] = value
    return known


@dataclass(frozen=True)
class Options:
    """The data source's options, checked once on the driver; what every Spark task works from.

    Spark passes options case-insensitively; the names README lists are the camel-case ones.
    """

    url: str = field(repr=False)
    queue: str
    error_queue: str | None
    mode: str
    holder: str | None
    partitions: int
    fetch_size: int
    lease: timedelta
    max_deliveries: int
    max_messages_per_batch: int
    batch_size: int
    message_type: str | None
    content_type: str | None
    time_to_be_received: timedelta | None
    ledger: str
    write_id: str | None
    #: The options given, by their documented names: what :meth:`check_use` holds against a direction.
    given: frozenset[str] = field(default=frozenset(), compare=False)

    @classmethod
    def parse(cls, given: Mapping[str, str]) -> Options:
        options = _known(given)
        url = options.get("url")
        if not url:
            raise InvalidOptionError("option 'url' is required: a postgresql:// URI, a libpq or ODBC string")
        if options.get("password") is not None:
            url = _with_password(url, options["password"])
        queue = options.get("queue")
        if not queue:
            raise InvalidOptionError("option 'queue' is required: the queue's address, e.g. orders or orders@\"sales\"")
        mode = options.get("mode", "browse").lower()
        if mode not in ("browse", "claim"):
            raise InvalidOptionError(f"option 'mode' must be browse or claim, got {mode!r}")
        holder = options.get("holder")
        if mode == "claim" and holder is None:
            raise InvalidOptionError(
                "mode 'claim' needs option 'holder': the name the claims are taken under, which ack_held "
                "and nack_held settle once the job's output is committed"
            )
        ttbr = options.get("timeToBeReceived")
        try:
            addressing = Addressing(dialect_for(url))  # names are checked here, before any task runs
        except ValueError as exc:
            raise InvalidOptionError(f"option 'url': {exc}") from None
        address = addressing.address(queue)
        ledger = addressing.beside(options.get("ledger", defaults.WRITE_LEDGER), address)
        error_queue = options.get("errorQueue")
        if error_queue is not None:
            _not_its_own_error_queue(addressing, address, addressing.beside(error_queue, address))
        return cls(
            url=url,
            queue=queue,
            error_queue=error_queue,
            mode=mode,
            holder=holder,
            partitions=_count(options, "numPartitions", PARTITIONS, maximum=10_000),
            fetch_size=_count(options, "fetchSize", FETCH_SIZE),
            lease=_span(options, "lease", defaults.LEASE, defaults.MAX_LEASE, defaults.MIN_RENEWED_LEASE),  # renewed
            max_deliveries=_count(options, "maxDeliveries", defaults.MAX_DELIVERIES),
            max_messages_per_batch=_count(
                options, "maxMessagesPerBatch", MAX_MESSAGES_PER_BATCH, maximum=10 * defaults.MAX_BATCH
            ),
            batch_size=_count(options, "batchSize", BATCH_SIZE),
            message_type=options.get("messageType"),
            content_type=options.get("contentType"),
            time_to_be_received=None
            if ttbr is None
            else _span(options, "timeToBeReceived", None, defaults.MAX_TIME_TO_BE_RECEIVED),
            ledger=addressing.dialect.format_address(ledger),
            write_id=None if options.get("writeId") is None else _text(options, "writeId"),
            given=frozenset(options),
        )

    def check_use(self, use: Literal["read", "write"]) -> None:
        """Refuse an option that ``use`` ignores, before the database is touched: the data source
        parses its options before Spark says whether it reads or writes, and an option given to the
        direction that does not read it would be dropped without a word."""
        if use == "read":
            ignored, applies_to = WRITE_OPTIONS, "writes (df.write)"
        else:
            ignored, applies_to = READ_OPTIONS, "reads (spark.read, spark.readStream)"
        for name in OPTION_NAMES:  # in the documented order, so the option named is the same every time
            if name in self.given and name in ignored:
                raise InvalidOptionError(
                    f"option {name!r} applies only to {applies_to}, and this is a {use}: leave it out of the "
                    f"{use}'s options"
                )

    def connect(self) -> QueueClient:
        return QueueClient.connect(self.url, error_queue=self.error_queue)

    def check(self, client: QueueClient, *, claims: bool = False) -> None:
        """On the driver, before any task: the queue and the error queue are queue tables; a read that
        claims (whose poison goes to the error queue) may not use the queue as its own error queue."""
        client.check_queue(self.queue)
        queue = client.address(self.queue)
        if self.error_queue is not None or claims:
            error_queue = client.beside(self.error_queue or defaults.ERROR_QUEUE, queue)
            _not_its_own_error_queue(client, queue, error_queue)
            if self.error_queue is not None:
                client.check_queue(error_queue)

    def check_sink(self, client: QueueClient) -> None:
        """On the driver, before anything is sent: the queue is a queue table and the ledger a write
        ledger (created the first time)."""
        self.check(client)
        client.create_writes(self.ledger)

    def write_key(self, write_id: str | None) -> uuid.UUID:
        """The ledger key of a write: of ``write_id`` *to this queue* (the same id written to two queues
        is two writes, each sent once), or a fresh one for a write that cannot be repeated."""
        if write_id is None:
            return uuid.uuid4()
        addressing = Addressing(dialect_for(self.url))
        queue = addressing.dialect.claim_key(addressing.address(self.queue))  # one key however it is written
        return uuid.uuid5(WRITE_ID_NAMESPACE, f"{write_id}\n{queue}")


def _not_its_own_error_queue(addressing: Addressing, queue: QueueAddress, error_queue: QueueAddress) -> None:
    qualified = addressing.dialect.qualified_name
    if qualified(error_queue) == qualified(queue):
        raise InvalidArgumentError(
            f"queue {qualified(queue)} cannot be its own error queue (its poison would come back to it for ever): "
            "name another one with option 'errorQueue'"
        )


def _with_password(url: str, password: str) -> str:
    """``url`` with ``password`` added, in the url's own syntax (libpq or URI, ODBC, mssql URI)."""
    if dialect_for(url).name == "postgres":
        from psycopg.conninfo import make_conninfo

        return make_conninfo(url, password=password)
    if "://" not in url:  # an ODBC connection string
        return f"{url.rstrip(';')};PWD={{{password.replace('}', '}}')}}}"
    raise InvalidOptionError("option 'password' works with PostgreSQL and ODBC strings; put it in an mssql:// url")


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
    return str(value)


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


def _json_body(content: dict[str, Any]) -> str:
    try:
        return _JSON_ROW.encode(content)
    except ValueError:
        columns = sorted(
            name for name, value in content.items() if isinstance(value, float) and not math.isfinite(value)
        )
        raise InvalidArgumentError(
            f"a row holds NaN or an infinite number in {', '.join(columns) or 'a nested value'}, which JSON "
            "cannot carry: replace them (e.g. with null) or write a 'body' column of your own"
        ) from None
    except TypeError as exc:  # a value of a type the layout did not plan for (rows built by hand)
        raise ArgumentTypeError(f"a row holds a value JSON cannot carry: {exc}") from None


def _option_headers(options: Options) -> dict[str, str | None]:
    headers: dict[str, str | None] = {}
    if options.message_type:
        headers[ENCLOSED_MESSAGE_TYPES] = options.message_type
    if options.content_type:
        headers[CONTENT_TYPE] = options.content_type
    return headers


def _send_partition(
    client: QueueClient,
    queue: str,
    messages: Iterable[Message],
    batch_size: int,
    ledger: tuple[str, uuid.UUID, int] | None = None,
) -> int | None:
    """Send a partition's messages in one transaction; returns how many.

    On PostgreSQL they are loaded by COPY (:meth:`QueueClient.send_copied`), COPY_ROWS per
    statement; elsewhere, or for messages with a time to be received, ``batch_size`` per INSERT.
    With a ``ledger`` (table, write, partition) the partition is recorded there first, in the same
    transaction: None means it had committed before and nothing was sent.
    """
    sent = 0
    step = max(batch_size, COPY_ROWS)
    with client.transaction():
        if ledger is not None and not client.record_write(*ledger):
            return None
        batch: list[Message] = []
        for message in messages:
            batch.append(message)
            if len(batch) >= step:
                sent += _send_some(client, queue, batch, batch_size)
                batch = []
        if batch:
            sent += _send_some(client, queue, batch, batch_size)
    return sent


def _send_some(client: QueueClient, queue: str, batch: list[Message], batch_size: int) -> int:
    if client.copies_sends and all(m.time_to_be_received is None for m in batch):
        return client.send_copied(queue, batch)
    return sum(client.send(queue, batch[n : n + batch_size]) for n in range(0, len(batch), batch_size))


# -- the data source ---------------------------------------------------------------------------


class SqlQueueDataSource(DataSource):
    """``format("sqlqueue")``: queue tables as a Spark source (batch and streaming) and sink (batch)."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.parsed = Options.parse(options)

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        return MESSAGE_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        self.parsed.check_use("read")
        return QueueReader(self.parsed)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            raise InvalidOptionError("a queue is only appended to: use mode('append')")
        self.parsed.check_use("write")
        layout = RowLayout.of(schema)
        if layout.takes_arrow():
            return QueueArrowWriter(self.parsed, layout)
        return QueueWriter(self.parsed, layout)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        self.parsed.check_use("read")
        return QueueStreamReader(self.parsed)


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
        if sent is None:
            log.info("Partition %d of write %s committed before; sent nothing this time", part, self.key)
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
        self._forget()

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        committed = [m.part for m in messages if isinstance(m, WritePart)]
        log.error(
            "Write %s to %s failed; partitions %s were sent and stay sent",
            self.key,
            self.options.queue,
            committed,
        )
        self._forget()

    def _forget(self) -> None:
        """A write without a ``writeId`` cannot be repeated, so its ledger rows are done with; one
        with a ``writeId`` keeps them until the caller forgets the id (:func:`forget_write`)."""
        if self.options.write_id is None:
            with self.options.connect() as client:
                client.forget_write(self.options.ledger, self.key)


class QueueArrowWriter(QueueWriter, DataSourceArrowWriter):
    """:class:`QueueWriter` taking Spark's Arrow batches instead of rows, for a layout whose columns
    read the same from both (:meth:`RowLayout.takes_arrow`): the same messages, the same ledger."""

    def write(self, iterator: Iterator[pa.RecordBatch] | Iterator[Row]) -> WritePart:
        """Spark's Arrow batches; rows too, as :meth:`QueueWriter.write` takes them (a caller's own task)."""
        return self._write(self.layout.arrow_rows(iterator))


@dataclass
class SeqRange(InputPartition):
    """Browse partition: the rows with ``after`` < Seq <= ``last``."""

    after: int
    last: int


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


def _read_share(options: Options, share: HeldShare) -> Iterator[pa.RecordBatch]:
    with options.connect() as client:
        held = client.held_columns(options.queue, share.holder, parts=share.parts, part=share.part)
    return _column_batches(held.ids, held.headers, held.bodies, held.deliveries)


def _shares(holder: str, parts: int) -> list[HeldShare]:
    return [HeldShare(holder, parts, part) for part in range(parts)]


class QueueReader(DataSourceReader):
    """A batch read: browse waiting messages in Seq ranges, or read the claims of a holder."""

    def __init__(self, options: Options) -> None:
        self.options = options
        with options.connect() as client:
            options.check(client, claims=options.mode == "claim")

    def partitions(self) -> Sequence[InputPartition]:
        options = self.options
        with options.connect() as client:
            if options.mode == "claim":
                assert options.holder is not None  # noqa: S101  # narrows a type Spark's interface erases
                _claim_for(client, options, options.holder, options.max_messages_per_batch)
                return _shares(options.holder, options.partitions)
            bounds = client.seq_range(options.queue)
        if bounds is None:
            return [SeqRange(0, 0)]
        low, high = bounds
        size = max(1, -(-(high - low + 1) // options.partitions))
        return [SeqRange(start - 1, min(start - 1 + size, high)) for start in range(low, high + 1, size)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        options = self.options
        if isinstance(partition, HeldShare):
            yield from _read_share(options, partition)
            return
        assert isinstance(partition, SeqRange)  # noqa: S101  # narrows a type Spark's interface erases
        after = partition.after
        with options.connect() as client:
            while after < partition.last:
                page = client.browse_columns(options.queue, options.fetch_size, after=after, last=partition.last)
                yield from _column_batches(page.ids, page.headers, page.bodies, None)
                if page.after is None:
                    return
                after = page.after


def _claim_for(client: QueueClient, options: Options, holder: str, wanted: int) -> int:
    """Make ``holder`` hold up to ``wanted`` messages: those it holds already (renewed), then new
    claims; returns how many it holds. What it holds already is what an earlier attempt of the same
    read or batch claimed, so repeating the read returns the same messages."""
    held = client.extend_held(options.queue, holder, options.lease)
    while held < wanted:
        step = min(wanted - held, defaults.MAX_BATCH)
        claimed = client.claim(
            options.queue,
            step,
            lease=options.lease,
            max_deliveries=options.max_deliveries,
            error_queue=options.error_queue,
            holder=holder,
        )
        held += len(claimed)
        if len(claimed) < step:
            break
    return held


class _Renewer:
    """Renews the claims of the batches a query has planned but not committed, every third of the
    lease, from a thread of the driver-side source: a micro-batch may take longer than one lease."""

    def __init__(self, options: Options) -> None:
        self.options = options
        self.holders: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def hold(self, holder: str) -> None:
        with self._lock:
            self.holders.add(holder)
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="sqlqueue-spark-lease", daemon=True)
            self._thread.start()

    def drop(self, holder: str) -> None:
        with self._lock:
            self.holders.discard(holder)

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        interval = defaults.renewal_interval(self.options.lease)
        while not self._stop.wait(interval):
            with self._lock:
                holders = sorted(self.holders)
            if not holders:
                continue
            try:
                with self.options.connect() as client:
                    for holder in holders:
                        renewed = client.extend_held(self.options.queue, holder, self.options.lease)
                        log.debug("Renewed %d claims of %s", renewed, holder)
            except SqlQueueError as exc:  # an outage: the next renewal tries again
                log.warning("Could not renew the claims of batches %s: %s", holders, exc)


class QueueStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """A streaming read: each micro-batch is the messages claimed under its own holder.

    The offset is ``{"consumer": id, "batch": n}``: the consumer id is drawn when a query starts
    without a checkpoint and lives on in its offsets, so a restarted query finds its claims again.
    Batch n's claims are held by ``spark:<consumer>:<n>``.

    Batches are sized by Spark's admission control: ``maxMessagesPerBatch`` is the source's default
    read limit (``ReadMaxRows``), and a smaller limit Spark passes wins.
    """

    def __init__(self, options: Options) -> None:
        self.options = options
        with options.connect() as client:
            options.check(client, claims=True)
        self.renewer = _Renewer(options)
        #: Under Trigger.AvailableNow, how many messages the query may still claim (None: no bound).
        self.available: int | None = None
        #: Batches whose claims :meth:`latestOffset` took (or renewed) in this run of the query: their
        #: leases are fresh, so planning them renews nothing; a batch replayed after a restart is not here.
        self.fresh: set[str] = set()

    def __getstate__(self) -> dict[str, Any]:
        """What a task needs: the options (Spark ships the reader to executors for :meth:`read`)."""
        return {"options": self.options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["options"])  # type: ignore[misc]

    @staticmethod
    def holder(offset: Mapping[str, Any], batch: int | None = None) -> str:
        return f"spark:{offset['consumer']}:{offset['batch'] if batch is None else batch}"

    def initialOffset(self) -> dict[str, Any]:
        return {"consumer": uuid.uuid4().hex, "batch": 0}

    def getDefaultReadLimit(self) -> ReadLimit:
        """``maxMessagesPerBatch`` as Spark's admission control knows a limit: it may pass a smaller one."""
        from pyspark.sql.streaming.datasource import ReadMaxRows

        return ReadMaxRows(self.options.max_messages_per_batch)

    def prepareForTriggerAvailableNow(self) -> None:
        """Trigger.AvailableNow: the query reads what waits now, then ends.

        Offsets here are batch numbers, not places in the queue, so "what waits now" is a count:
        the messages waiting when the query starts, which later batches claim oldest first, each
        at most what remains of the count. The query ends even while senders keep the queue full;
        with competing consumers taking some of those messages it reads as many newer ones instead.
        """
        with self.options.connect() as client:
            self.available = client.depth(self.options.queue)
        log.info("Trigger.AvailableNow: reading the %d messages waiting in %s", self.available, self.options.queue)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        """Claim the next batch; ``start`` as it is when nothing waits.

        Spark asks for a batch after ``start`` only once the batch ending at ``start`` has been
        committed by the sink, so its claims, if a commit did not already settle them (a query that
        stopped between the two), are acknowledged here first.
        """
        from pyspark.sql.streaming.datasource import ReadMaxRows

        wanted = self.options.max_messages_per_batch  # Spark's ReadAllAvailable: still one bounded claim
        if isinstance(limit, ReadMaxRows):
            wanted = min(wanted, limit.max_rows)
        if self.available is not None:
            wanted = min(wanted, self.available)
        batch = int(start["batch"]) + 1
        holder = self.holder(start, batch)
        with self.options.connect() as client:
            settled = client.ack_held(self.options.queue, self.holder(start))
            if settled:
                log.info("Acknowledged %d messages of committed batch %s", settled, self.holder(start))
            self.renewer.drop(self.holder(start))
            # With nothing left to claim this still finds claims an earlier attempt at this batch took.
            held = _claim_for(client, self.options, holder, wanted)
        if self.available is not None:
            self.available = max(0, self.available - held)
        if not held:
            return start
        self.fresh.add(holder)
        self.renewer.hold(holder)
        log.info("Batch %s holds %d messages of %s", holder, held, self.options.queue)
        return {"consumer": start["consumer"], "batch": batch}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        shares: list[InputPartition] = []
        with self.options.connect() as client:
            for batch in range(int(start["batch"]) + 1, int(end["batch"]) + 1):
                holder = self.holder(end, batch)
                # A replayed batch (a restarted query): its claims are renewed before they are read.
                # Those latestOffset has just claimed or renewed are not: renewing every one of them
                # again was an UPDATE of the whole batch, most of a small batch's time in the database.
                if holder not in self.fresh:
                    client.extend_held(self.options.queue, holder, self.options.lease)
                self.fresh.discard(holder)
                self.renewer.hold(holder)
                shares.extend(_shares(holder, self.options.partitions))
        return shares

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, HeldShare)  # noqa: S101  # narrows a type Spark's interface erases
        return _read_share(self.options, partition)

    def commit(self, end: dict[str, Any]) -> None:
        holder = self.holder(end)
        with self.options.connect() as client:
            settled = client.ack_held(self.options.queue, holder)
        self.renewer.drop(holder)
        log.info("Acknowledged %d messages of committed batch %s", settled, holder)

    def stop(self) -> None:
        """Claims of a batch that did not commit stay held until their lease ends: a restart within
        it replays them as they were, and after it they are delivered again."""
        self.renewer.stop()


# -- settling claim-mode reads, forgetting writes ------------------------------------------------


def register(spark: SparkSession) -> None:
    """Make ``format("sqlqueue")`` known to ``spark`` (a classic or a Spark Connect session)."""
    spark.dataSource.register(SqlQueueDataSource)


def ack_held(url: str, queue: str, holder: str) -> int:
    """Acknowledge the messages a claim-mode read took under ``holder``: run it once the job's
    output is committed. Returns how many."""
    with QueueClient.connect(url) as client:
        return client.ack_held(queue, holder)


def nack_held(url: str, queue: str, holder: str, *, error: BaseException | str | None = None) -> int:
    """Give back the messages a claim-mode read took under ``holder`` (the job failed). Returns how many."""
    with QueueClient.connect(url) as client:
        return client.nack_held(queue, holder, error=error)


def forget_write(url: str, queue: str, write_id: str, *, ledger: str = defaults.WRITE_LEDGER) -> int:
    """Forget a ``writeId`` whose write can no longer be repeated; returns the ledger rows deleted."""
    checked_text("write_id", write_id, limit=defaults.MAX_LABEL)
    options = Options.parse({"url": url, "queue": queue, "ledger": ledger})
    with options.connect() as client:
        return client.forget_write(options.ledger, options.write_key(write_id))


def batch_writer(options: Mapping[str, str], checkpoint: str) -> Callable[[DataFrame, int], None]:
    """A ``foreachBatch`` function writing each micro-batch to a queue exactly once.

    ``checkpoint`` is the query's ``checkpointLocation``. Batch n is written with the ``writeId``
    ``<query id>:<n>``, the query id being the one Spark keeps in the checkpoint's ``metadata``
    (a deleted checkpoint starts a new query, whose batches share nothing with the old one's). A
    batch Spark replays after a restart therefore sends only the partitions that did not commit
    (the batch must be computed the same way again: no non-deterministic shuffles). Spark starts
    batch n only after committing n - 1, which can then never be replayed: its ledger rows are
    forgotten.
    """
    if not isinstance(options, Mapping):
        raise ArgumentTypeError(
            f"batch_writer's options must be a mapping of option names to text, got {type(options).__name__}"
        )
    for name, value in options.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise ArgumentTypeError(f"batch_writer's options are text: option {name!r} is {type(value).__name__}")
    if any(name.lower() == "writeid" for name in options):
        raise InvalidOptionError(
            "batch_writer names each batch's write itself (<query id>:<batch>): drop option 'writeId'"
        )
    try:
        checkpoint = checked_text("checkpoint", checkpoint)
    except SqlQueueError as exc:
        raise InvalidOptionError(f"batch_writer: {exc}") from None
    checked = Options.parse(options)
    checked.check_use("write")
    with checked.connect() as client:  # a wrong sink is refused now, before the query claims its first batch
        checked.check_sink(client)
    query: dict[str, str] = {}

    def write(batch: DataFrame, batch_id: int) -> None:
        if "id" not in query:  # written by Spark when the query first started, read through its filesystem
            try:
                metadata = batch.sparkSession.read.text(f"{checkpoint.rstrip('/')}/metadata").first()
            except Exception as exc:  # noqa: BLE001  # Spark's AnalysisException (no such path), worded for the caller
                raise InvalidOptionError(
                    f"cannot read the query metadata in checkpoint {checkpoint!r} ({type(exc).__name__}): pass the "
                    "query's checkpointLocation"
                ) from None
            if metadata is None:
                raise InvalidOptionError(f"no query metadata in checkpoint {checkpoint!r}: pass its checkpointLocation")
            query["id"] = str(json.loads(metadata[0])["id"])
        writer = batch.write.format(NAME).options(**options).option("writeId", f"{query['id']}:{batch_id}")
        writer.mode("append").save()
        if batch_id > 0:
            forget_write(checked.url, checked.queue, f"{query['id']}:{batch_id - 1}", ledger=checked.ledger)

    return write


# -- plain helpers -------------------------------------------------------------------------------


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
