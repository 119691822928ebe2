"""The JVM read: a batch the driver's transaction holds locked, read by Spark's own JDBC reader.

The data source's reader is Python: every row it returns is fetched by psycopg and turned into Arrow
in a Python worker, at a third of the rate Spark's JDBC reader reads the same table in the JVM.
:func:`~.functions.claimed_from_queue` and :func:`~.functions.relay_batch` read their batch here
instead, where PostgreSQL's JDBC driver is on Spark's class path: each partition one query of the
locked rows in its Seq range (the dialect's :meth:`locked_rows_table_sql`), the headers parsed in the
JVM. Where it is not (or the url cannot be spelled as a JDBC one), they read through the data
source's reader and say once, in the log, why; option ``engine`` chooses: ``auto``, ``jvm`` (refused
where it cannot) or ``python``.

Two readings of a Headers text must never differ, or a batch could be acknowledged with headers
its job never saw. Spark's JSON parser reads some texts NServiceBus's rules refuse or read
otherwise (a number as a header's value, text after the object, a lone surrogate, a name given
twice), so the JVM's reading is used only for a text that is exactly what Spark would write for
what it read (one compact object of strings and nulls, each name once); any other text is read by
the library's own decoder, in a Python worker, for that row alone. A job that reads no headers
parses none: Spark leaves the column unread.
"""

from __future__ import annotations

import getpass
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyarrow as pa

from ..transport import defaults
from ..transport.drivers import dialect_for
from ..transport.drivers.postgres import CONNECT_ERRORS, connect_error
from ..transport.errors import SqlQueueError
from ..transport.message import readable_headers
from ..transport.operations import LockedBatch
from ..transport.operations.inspection import batch_ended
from .options import Options
from .read import seq_ranges

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

    from ..transport.addressing import QueueAddress
    from ..transport.dialects.base import Dialect

log = logging.getLogger("airflow_provider_sqlqueue.spark")

#: The class Spark loads to reach PostgreSQL: Debian's libpostgresql-jdbc-java, or
#: ``spark.jars.packages=org.postgresql:postgresql:<version>``.
JDBC_DRIVER = "org.postgresql.Driver"
#: libpq's connection parameters that PostgreSQL's JDBC driver takes under another name, with the
#: same meaning and values; any other parameter in a url keeps the read on the Python path.
_SAME_MEANING = {
    "sslmode": "sslmode",
    "sslrootcert": "sslrootcert",
    "application_name": "ApplicationName",
    "connect_timeout": "connectTimeout",
    "options": "options",
}
#: The environment variables libpq takes a connection parameter from when the url does not give it.
_LIBPQ_ENVIRONMENT = {
    "PGHOST": "host",
    "PGHOSTADDR": "hostaddr",
    "PGPORT": "port",
    "PGDATABASE": "dbname",
    "PGUSER": "user",
    "PGPASSWORD": "password",
    "PGSERVICE": "service",
    "PGOPTIONS": "options",
    "PGAPPNAME": "application_name",
    "PGSSLMODE": "sslmode",
    "PGSSLROOTCERT": "sslrootcert",
    "PGSSLCERT": "sslcert",
    "PGSSLKEY": "sslkey",
    "PGTARGETSESSIONATTRS": "target_session_attrs",
    "PGCONNECT_TIMEOUT": "connect_timeout",
    "PGGSSENCMODE": "gssencmode",
}
#: libpq's target_session_attrs as the JDBC driver's targetServerType.
_TARGET_SERVER = {
    "any": "any",
    "read-write": "primary",
    "primary": "primary",
    "standby": "secondary",
    "prefer-standby": "preferSecondary",
}
#: A Headers text as Spark reads it, held to JSON itself: no single quotes, no NaN (Spark's JSON
#: reader allows both by default).
_AS_MAP = "'map<string,string>', map('allowSingleQuotes', 'false', 'allowNonNumericNumbers', 'false')"
#: Whether Spark's reading of a text is NServiceBus's: the text is what Spark writes for what it
#: read (one compact object of strings and nulls, so nothing else was in it), each name once.
_EXACT = "parsed IS NOT NULL AND to_json(parsed) = headers AND size(array_distinct(map_keys(parsed))) = size(parsed)"


@dataclass(frozen=True)
class JdbcTarget:
    """A database as Spark's JDBC reader reaches it: the URL (no secret in it) and the connection's
    properties (the password among them, which Spark keeps out of plans and its UI)."""

    url: str
    properties: Mapping[str, str] = field(repr=False)


def jdbc_target(url: str) -> JdbcTarget | str:
    """The JDBC URL and properties of a libpq url, or why it has none (a Unix socket, a parameter the
    JDBC driver does not take as libpq does)."""
    if dialect_for(url).name != "postgres":
        return "a locked batch is PostgreSQL's"
    from psycopg.conninfo import conninfo_to_dict

    error: SqlQueueError | None
    try:
        parsed = conninfo_to_dict(url)
    except CONNECT_ERRORS as exc:
        error = connect_error(exc, url)  # in the library's words, the password masked
    else:
        error = None
    if error is not None:  # raised outside the except block: psycopg's error quotes the whole url
        raise error
    params = {key: str(value) for key, value in parsed.items()}
    for name in ("service", "hostaddr"):  # libpq reads a service file or skips the name lookup; JDBC cannot
        if name in params:
            return f"the url's {name!r}, which the JDBC driver does not take as libpq does"
    # libpq fills what the url leaves out from its environment (PGDATABASE, PGHOST...), which the JDBC
    # driver never reads: its reader could reach another database, and find no batch there.
    for variable, name in _LIBPQ_ENVIRONMENT.items():
        if os.environ.get(variable) and name not in params:
            return f"the url leaves {name} to libpq's environment ({variable}), which the JDBC driver does not read"
    hosts = params.pop("host", "").split(",") if params.get("host") else []
    if not hosts or any(host.startswith(("/", "@")) or not host for host in hosts):
        return "the url reaches PostgreSQL by a Unix socket, which the JDBC driver cannot (give host=)"
    ports = params.pop("port", "").split(",") if params.get("port") else []
    if len(ports) not in (0, 1, len(hosts)):
        return "the url gives a number of ports that is neither one nor one per host"
    ports = ports or ["5432"]
    ports = ports * len(hosts) if len(ports) == 1 else ports
    user = params.pop("user", None) or getpass.getuser()
    dbname = params.pop("dbname", None) or user
    properties = {"user": user, "driver": JDBC_DRIVER}
    password = params.pop("password", None)
    if password:
        properties["password"] = password
    attrs = params.pop("target_session_attrs", None)
    if attrs is not None:
        if attrs not in _TARGET_SERVER:
            return f"target_session_attrs={attrs[:40]!r}, which the JDBC driver has no match for"
        properties["targetServerType"] = _TARGET_SERVER[attrs]
    for name in sorted(params):
        if name not in _SAME_MEANING:
            return f"the url's {name[:40]!r}, which the JDBC driver does not take as libpq does"
        properties[_SAME_MEANING[name]] = params[name]
    where = ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in zip(hosts, ports, strict=True))
    return JdbcTarget(f"jdbc:postgresql://{where}/{_path_text(dbname)}", properties)


def _path_text(name: str) -> str:
    """A database name as a URL's path: every byte that is not plainly safe percent-encoded."""
    from urllib.parse import quote

    return quote(name, safe="")


def locked_rows(
    spark: SparkSession,
    target: JdbcTarget,
    options: Options,
    dialect: Dialect,
    address: QueueAddress,
    batch: LockedBatch,
) -> DataFrame | str:
    """The rows ``batch`` holds (its poison left out) as :data:`~.read.MESSAGE_SCHEMA`'s columns, read
    by Spark's JDBC reader from ``target`` (:func:`jdbc_target` of the url); or why that reader
    cannot (no JDBC driver on Spark's class path, a database it cannot reach), for the caller to take
    the Python path or refuse."""
    from pyspark.sql import functions as sf

    windows = [
        dialect.seq_window_sql(part.after, part.last)
        for part in seq_ranges(batch.after + 1, batch.last, options.partitions)
    ]
    try:
        rows = spark.read.jdbc(
            target.url,
            dialect.locked_rows_table_sql(address, batch.xid),
            predicates=windows,
            properties={**target.properties, "fetchsize": str(options.fetch_size)},
        )
        rows.schema  # noqa: B018  # resolved now (the driver class, the connection): a reason, not a failed job
    except Exception as exc:  # noqa: BLE001  # Py4J's or Spark Connect's error, worded below
        return _reason(exc, target)
    ended = batch_ended(batch.xid, dialect.qualified_name(address))
    rows = rows.where(sf.when(sf.col("seq").isNull(), sf.raise_error(sf.lit(ended))).otherwise(sf.lit(True)))
    if batch.poison:  # locked, never read: the settle moves them
        poison = spark.createDataFrame([(seq,) for seq in batch.poison], "seq long")
        rows = rows.join(sf.broadcast(poison), "seq", "left_anti")
    # Spark SQL text, not the Column API: each function of that is a call into the JVM, and their
    # hundreds cost a batch more than its whole read of 10,000 rows.
    rows = rows.selectExpr("id", "headers", "coalesce(body, X'') AS body", f"from_json(headers, {_AS_MAP}) AS parsed")
    rows = rows.selectExpr("id", "headers", "body", "parsed", f"{_EXACT} AS exact")
    return rows.select(
        "id",
        sf.when(sf.col("exact"), sf.col("parsed"))
        .otherwise(_library_reading(sf.when(sf.col("exact"), sf.lit(None)).otherwise(sf.col("headers"))))
        .alias("headers"),
        "body",
        sf.lit(None).cast("int").alias("deliveries"),
    )


def _library_reading(texts: Column) -> Column:
    """The library's own reading of each Headers text (null where it passes none), in a Python worker."""
    from pyspark.sql.pandas.functions import arrow_udf

    # A scalar Arrow function, by its type hints (the stubs know only the older, explicit spelling).
    reading: Column = arrow_udf(_decoded, "map<string,string>")(texts)  # type: ignore[call-overload]
    return reading


def _decoded(texts: pa.Array) -> pa.Array:
    """Headers texts as the library reads them (NServiceBus's rules), a null one null."""
    pairs = []
    for text in texts.to_pylist():
        headers = None if text is None else readable_headers(text)
        pairs.append(None if headers is None else list(headers.items()))
    return pa.array(pairs, pa.map_(pa.string(), pa.string()))


def _reason(exc: BaseException, target: JdbcTarget) -> str:
    """Why Spark's JDBC reader could not open the batch, in one line, without the password."""
    text = str(exc)
    if JDBC_DRIVER in text or "No suitable driver" in text:
        return (
            f"no PostgreSQL JDBC driver on Spark's class path ({JDBC_DRIVER}: spark.jars=/usr/share/java/"
            "postgresql.jar, or spark.jars.packages=org.postgresql:postgresql:<version>)"
        )
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    cause = next((line for line in lines if "PSQLException" in line), lines[0] if lines else type(exc).__name__)
    password = target.properties.get("password")
    if password:
        cause = cause.replace(password, "***")
    return f"Spark's JDBC reader could not read it: {cause[: defaults.MAX_LABEL]}"
