"""The JVM path: Spark's own JDBC writer on a queue, the queue's rules as Spark expressions.

``format("sqlqueue")`` is a Python data source: Spark hands every row it writes to a Python
worker, which costs more per row than PostgreSQL does. :func:`~.functions.save_to_queue` takes the
same options and, through this module, moves the rows through the JVM instead: each row's
NServiceBus columns are Spark expressions (``uuid()``, the headers' JSON text, the body as the
``body`` column or ``to_json`` of the row); Spark's JDBC writer loads them into an UNLOGGED staging
table beside the queue, and one transaction on the driver moves them into the queue, one row per
row key (a task Spark ran twice staged its rows twice), records the write in the ledger as sent
whole and drops the stage. The write is all or nothing, where the data source's is per partition.
A failed write drops its stage; a stage whose driver died is dropped by a later write once a day old.

Reads stay on the data source's columnar reader (:mod:`.read`): Spark's JDBC reader with
``from_json`` headers was measured no faster (BENCHMARKS.md), and Spark's JSON parser refuses
headers the library reads (empty text, names past 50,000 characters, values past 20 MB) and reads
some it refuses (numbers, nested objects), which a read that skips unreadable rows must not differ on.

Where the JVM cannot write as the data source would (no JDBC driver on Spark's classpath, a SQL
Server queue, a Unix-socket or otherwise JDBC-less url, a role that may not create the stage, a
column type whose JSON Spark would spell differently) the write takes the data source's Python
path and says so once in the log; option ``engine`` chooses: ``auto`` (the default), ``jdbc``
(refused where it cannot) or ``python``.
"""

from __future__ import annotations

import math
import threading
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING
from urllib.parse import quote

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
from ..transport.errors import InvalidArgumentError, PermissionDeniedError
from ..transport.message import (
    CONTENT_TYPE,
    JSON_CONTENT_TYPE,
    MESSAGE_ID,
    TIME_SENT,
    TIME_TO_BE_RECEIVED,
    wire_timespan,
    wire_timestamp,
)
from ..transport.operations import WHOLE_WRITE
from .options import InvalidOptionError, Options
from .write import (
    BODY_COLUMN,
    HEADERS_COLUMN,
    NOT_JSON,
    NOT_JSON_END,
    TTBR_COLUMN,
    RowLayout,
    _option_headers,
    log,
)

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

#: The id a message's headers are first written with, then replaced by each row's own.
_PLACEHOLDER = uuid.UUID(int=0)
#: The JDBC driver class Spark loads: PostgreSQL's (``org.postgresql:postgresql``, or Debian's
#: ``libpostgresql-jdbc-java``), given to Spark with ``spark.jars`` or ``spark.jars.packages``.
JDBC_DRIVER = "org.postgresql.Driver"
#: Rows per batch of the JDBC writer's INSERTs, which the driver rewrites into multi-row statements.
JDBC_BATCH = 10_000
#: libpq connection parameters with a PgJDBC property of the same meaning, by their JDBC names.
_JDBC_PROPERTIES = {
    "user": "user",
    "password": "password",
    "sslmode": "sslmode",
    "sslrootcert": "sslrootcert",
    "application_name": "ApplicationName",
    "connect_timeout": "connectTimeout",
    "options": "options",
}


@dataclass(frozen=True)
class JdbcTarget:
    """Where Spark's JDBC writer (and the probe, one read) connects: the URL, with no secret, and the properties."""

    url: str
    properties: Mapping[str, str] = field(repr=False)


def jdbc_target(url: str) -> JdbcTarget | str:
    """The JDBC URL and properties of a PostgreSQL connection string; a reason when it has none."""
    from psycopg.conninfo import conninfo_to_dict

    params = {k: str(v) for k, v in conninfo_to_dict(url).items()}
    hosts = params.pop("host", "")
    if not hosts or any(host.startswith(("/", "@")) for host in hosts.split(",")):
        return "the url reaches PostgreSQL by a Unix socket, which Spark's JDBC driver cannot"
    ports = params.pop("port", "5432").split(",")
    if len(ports) == 1:
        ports *= len(hosts.split(","))
    dbname = params.pop("dbname", params.get("user", ""))
    other = sorted(set(params) - set(_JDBC_PROPERTIES))
    if other:
        return f"the url's parameter(s) {', '.join(other)} have no JDBC property here"
    places = ",".join(
        f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        for host, port in zip(hosts.split(","), ports, strict=False)
    )
    properties = {_JDBC_PROPERTIES[k]: v for k, v in params.items()}
    properties["driver"] = JDBC_DRIVER
    return JdbcTarget(f"jdbc:postgresql://{places}/{quote(dbname, safe='')}", properties)


#: Each (session, url) pair's decision, made once: the JDBC target, or why the Python path runs.
_decided: dict[tuple[int, str], JdbcTarget | str] = {}
_deciding = threading.Lock()


def _probe(spark: SparkSession, target: JdbcTarget) -> str | None:
    """Why Spark's JDBC reader cannot read the database (None: it can), from one ``SELECT 1``."""
    try:
        spark.read.jdbc(target.url, "(SELECT 1 AS one) AS probe", properties=dict(target.properties)).collect()
    except Exception as exc:  # noqa: BLE001  # any failure means "not this path"; the reason is logged
        text = str(exc)
        if "ClassNotFoundException" in text or "No suitable driver" in text or JDBC_DRIVER in text:
            return (
                f"PostgreSQL's JDBC driver ({JDBC_DRIVER}) is not on Spark's classpath: give Spark its jar "
                "(spark.jars) or package (spark.jars.packages, org.postgresql:postgresql)"
            )
        lines = text.strip().splitlines()
        first = _root_cause(exc) or (lines[0] if lines else type(exc).__name__)
        password = target.properties.get("password")
        if password:
            first = first.replace(password, "***")
        return f"Spark's JDBC reader could not read the database: {first[:300]}"
    return None


def _root_cause(exc: BaseException) -> str | None:
    """The driver's own words (``database "x" does not exist``, ``Connection ... refused``): the
    innermost cause of the JVM exception a classic session captured, which Spark's message leaves out."""
    cause = getattr(exc, "_origin", None)  # the Java exception behind PySpark's captured one
    said = None
    try:
        while cause is not None:
            said = cause.getMessage() or said
            cause = cause.getCause()
    except Exception:  # noqa: BLE001  # not a Java exception (Spark Connect): Spark's message stands
        return None
    return str(said) if said else None


def jdbc_path(spark: SparkSession, options: Options) -> JdbcTarget | None:
    """The JDBC target a write runs through, or None for the Python path.

    Decided once per session and url, and said once in the log; ``engine`` ``jdbc`` turns a reason
    for the Python path into a refusal, ``python`` skips the question.
    """
    if options.engine == "python":
        return None
    key = (id(spark), options.url)
    with _deciding:
        decided = _decided.get(key)
        if decided is None:
            if dialect_for(options.url).name != "postgres":
                decided = "the JVM path is built for PostgreSQL queues"
            else:
                decided = jdbc_target(options.url)
                if isinstance(decided, JdbcTarget):
                    decided = _probe(spark, decided) or decided
            _decided[key] = decided
            if isinstance(decided, JdbcTarget):
                log.info("Queue %s: rows move through Spark's JDBC writer", options.queue)
            else:
                log.info("Queue %s: rows move through Spark's Python workers: %s", options.queue, decided)
    if isinstance(decided, str):
        if options.engine == "jdbc":
            raise InvalidOptionError(f"option 'engine' 'jdbc': {decided}")
        return None
    return decided


# -- rows to staged messages, as Spark expressions ---------------------------------------------

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


def _staged(df: DataFrame, layout: RowLayout, options: Options) -> DataFrame:
    """``df``'s rows as staged messages: (rowkey, id, headers, body, ttbr_ms), built by Spark."""
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
    ttbr = options.time_to_be_received
    time_sent = wire_timestamp(datetime.now(UTC))  # one send time for the write, as a batched send has
    message_id = sf.col("__sqlqueue_id")
    if HEADERS_COLUMN in at:
        headers_json = _merged_headers(_column(names[at[HEADERS_COLUMN]]), headers, message_id, time_sent, ttbr)
    else:
        # The same headers for every row but its id: the text the Python path writes, made by the
        # library's own encoder once, with each row's id put in its place.
        text = Message(b"", headers, id=_PLACEHOLDER, time_to_be_received=ttbr).wire_headers(time_sent)
        before, _, after = text.rpartition(str(_PLACEHOLDER))
        headers_json = sf.concat(sf.lit(before), message_id, sf.lit(after))
    ttbr_ms = None if ttbr is None else max(1, round(ttbr.total_seconds() * 1000))
    with_id = df.withColumn("__sqlqueue_id", sf.expr("uuid()"))
    return with_id.select(
        sf.monotonically_increasing_id().alias("rowkey"),
        message_id.alias("id"),
        headers_json.alias("headers"),
        body.alias("body"),
        sf.lit(ttbr_ms).cast("bigint").alias("ttbr_ms"),
    )


def _merged_headers(
    given: Column, headers: Mapping[str, str | None], message_id: Column, time_sent: str, ttbr: timedelta | None
) -> Column:
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
    defaults_given = {TIME_SENT: time_sent}
    if ttbr is not None:
        defaults_given[TIME_TO_BE_RECEIVED] = wire_timespan(ttbr)
    filled = sf.map_concat(sf.create_map(sf.lit(MESSAGE_ID), message_id), literal_map(defaults_given))
    merged = sf.map_concat(merged, sf.map_filter(filled, lambda k, _: ~sf.array_contains(sf.map_keys(merged), k)))
    return sf.to_json(merged)


class NotThisPath(Exception):  # noqa: N818  # not an error: a reason to take the Python path
    """Why a write cannot take the JVM path after all, found before any row was sent."""


def write_through_jdbc(df: DataFrame, options: Options, layout: RowLayout, target: JdbcTarget) -> int | None:
    """Stage ``df``'s messages with Spark's JDBC writer, then send them in one transaction; returns
    how many (None: a write with this ``writeId`` was sent before). A failed write drops its stage.

    Raises :class:`NotThisPath` before staging anything when the write belongs to the Python path:
    the role may not create the stage, or the ledger holds partitions of this ``writeId``.
    """
    staged = _staged(df, layout, options)
    write = options.write_key(options.write_id)
    with options.connect() as client:
        options.check_sink(client)
        parts = client.recorded_parts(options.ledger, write) if options.write_id is not None else []
        if parts and WHOLE_WRITE not in parts:
            raise NotThisPath(
                f"write {options.write_id!r} was sent in part by the data source's Python path, which alone knows "
                "what is missing"
            )
        try:
            stage = client.create_stage(options.queue)
        except PermissionDeniedError:
            raise NotThisPath(
                "the role may not create the write's staging table beside the queue (it needs CREATE on the "
                "queue's schema)"
            ) from None
        # The dialect doubles % for the driver's placeholders; Spark's JDBC writer sends the name as it is.
        table = client.dialect.qualified_name(stage).replace("%%", "%")
    try:
        staged.write.jdbc(
            target.url,
            table,
            mode="append",
            properties={**target.properties, "batchsize": str(JDBC_BATCH), "reWriteBatchedInserts": "true"},
        )
        with options.connect() as client:
            sent = client.send_staged(options.queue, stage, write, ledger=options.ledger)
            if options.write_id is None:  # a write that cannot be repeated: its ledger row is done with
                client.forget_write(options.ledger, write)
            return sent
    except BaseException as exc:
        try:
            with options.connect() as client:
                client.drop_stage(stage)
        except Exception:  # noqa: BLE001  # the write's own failure is the one to raise
            log.warning("Could not drop staging table %s; a later write drops it once a day old", table)
        refused = _refusal(exc)
        if refused is not None:
            raise InvalidArgumentError(refused) from None
        raise


def _refusal(exc: BaseException) -> str | None:
    """The library's own refusal of a row (NaN in a JSON row), when Spark's error carries it."""
    text = str(exc)
    start = text.find(NOT_JSON)
    if start < 0:
        return None
    end = text.find(NOT_JSON_END, start)
    return text[start : end + len(NOT_JSON_END)] if end >= 0 else None
