"""SQL Server: every T-SQL statement the transport runs on SQL Server (2016 or newer), in one place.

The queue table is NServiceBus's SQL Server transport table: ``Id uniqueidentifier``,
``CorrelationId``/``ReplyToAddress varchar(255)`` (kept for wire compatibility with transport
version 2 and older, written NULL: their values travel in the headers), ``Recoverable bit``
(always 1), ``Expires datetime`` (UTC, by the server's clock), ``Headers nvarchar(max)``,
``Body varbinary(max)`` and ``RowVersion bigint IDENTITY`` giving the FIFO order. Reading works on
tables of either NServiceBus layout: ``varchar`` or ``nvarchar`` headers, clustered on RowVersion
or a heap with a nonclustered RowVersion index.

Names are bracket-quoted (``]`` doubled) and never formatted in as text. Statements use named
``%(name)s`` placeholders with a literal ``%`` written ``%%`` (the same convention as the PostgreSQL
module); the drivers turn them into what pymssql (inlined literals) or pyodbc (``?`` markers) expect.

Only the SQL text is verified here (parsed as T-SQL in the tests); it has run against a real
server only where ``SQLQUEUE_MSSQL_URI`` was set for the integration suite.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from ..addressing import QueueAddress, split_outside, unquote
from ..errors import (
    DuplicateMessageError,
    InvalidArgumentError,
    InvalidQueueNameError,
    LockTimeoutError,
    ObjectExistsError,
    PermissionDeniedError,
    QueueNotFoundError,
    SqlQueueError,
    StatementRejectedError,
    StorageFullError,
    TransportMisconfiguredError,
    TransportUnavailableError,
)
from ..logs import logger
from .base import Dialect, SendRow, TableShape

log = logger("airflow_provider_sqlqueue.transport")

#: SQL Server identifiers (sysname) hold at most 128 characters.
MAX_IDENTIFIER_CHARS = 128
#: The in-flight table keys claims by the queue's canonical address in an nvarchar(450) column
#: (the widest an index key can be everywhere).
MAX_ADDRESS_CHARS = 450
#: SQL Server caps one statement at 2,100 parameters; 4 per message leaves room for 500 rows.
ROWS_PER_INSERT = 500
#: pymssql sends values inlined in the text (bodies as 0x hex, twice their size): a batch stops
#: growing at this many bytes of values, so one statement stays far below SQL Server's batch limit
#: (65,536 network packets) and the client never builds a huge string. A larger message goes alone.
BYTES_PER_INSERT = 4 * 1024 * 1024

#: Why a batch cannot be held by a transaction's row locks here (see operations/locked.py): what
#: every statement of it raises, before anything is sent.
NO_LOCKED_BATCHES = (
    "a batch held by a transaction's row locks (lock, browse_columns(locked_by=...), ack_locked, nack_locked; "
    "the Spark data source's claimed_from_queue) needs PostgreSQL: on SQL Server another session cannot tell the "
    "rows one transaction locked from the rows other transactions locked -- a reader sees locked rows only under "
    "READ UNCOMMITTED, which shows every transaction's uncommitted work alike, and a row's locks name no "
    "transaction a query can read. Use claim mode (hold, held_columns and ack_held; the data source's "
    "mode='claim'), whose claims are rows of the claim store"
)
_UTC_NOW = "GETUTCDATE()"  # datetime, the type and clock NServiceBus compares Expires with
_LEASE_NOW = "SYSUTCDATETIME()"  # datetime2 for leases: finer than datetime's 3.33 ms steps

#: Transaction control: sessions keep the connection in autocommit mode and open a transaction
#: only around an operation, so nothing stays open between calls.
BEGIN_TRANSACTION = "BEGIN TRANSACTION"
#: How the COMMIT below reports a transaction that is already gone: RAISERROR's number for a
#: message given as text, and this text.
ROLLED_BACK_NUMBER = 50000
ROLLED_BACK_TEXT = (
    "sqlqueue: the transaction was rolled back by an error inside it (SET XACT_ABORT ON); nothing of it was "
    "committed, and statements run after that error ran on their own"
)
#: Commit only a transaction that is still whole. Under XACT_ABORT a failed statement rolls the
#: transaction back at once; if the caller (a native-mode handler) caught that error and went on,
#: its later statements ran in autocommit, and a plain COMMIT would fail with 3902 ("no
#: corresponding BEGIN TRANSACTION"), which says nothing of what happened. This says it.
COMMIT_TRANSACTION = (
    "IF XACT_STATE() = -1 BEGIN ROLLBACK TRANSACTION; END; "
    f"IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'{ROLLED_BACK_TEXT}', 16, 1); RETURN; END; "
    "COMMIT TRANSACTION"
)
ROLLBACK_TRANSACTION = "IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION"
#: Run once per connection, as one batch: the session state every statement here relies on,
#: set whatever the driver or the user's ``conn_properties`` did.
#:
#: - Writing to a table with a filtered index (Index_Expires) needs ANSI_NULLS, ANSI_PADDING,
#:   ANSI_WARNINGS, ARITHABORT, CONCAT_NULL_YIELDS_NULL and QUOTED_IDENTIFIER ON and
#:   NUMERIC_ROUNDABORT OFF (error 1934 otherwise).
#: - READPAST needs READ COMMITTED or REPEATABLE READ (error 650 otherwise).
#: - With XACT_ABORT ON the server rolls the whole transaction back on any error, including a
#:   client-side timeout (an attention), which would otherwise leave it open and holding the rows
#:   it deleted.
SESSION_SETUP = (
    "SET ANSI_NULLS ON; SET ANSI_PADDING ON; SET ANSI_WARNINGS ON; SET ARITHABORT ON; "
    "SET CONCAT_NULL_YIELDS_NULL ON; SET QUOTED_IDENTIFIER ON; SET NUMERIC_ROUNDABORT OFF; "
    "SET TRANSACTION ISOLATION LEVEL READ COMMITTED; SET XACT_ABORT ON"
)
#: Reads how the connection is configured, for borrowed connections: @@TRANCOUNT (a transaction
#: left open by the driver, as pymssql opens one at connect unless autocommit is on).
OPEN_TRANSACTIONS = "SELECT @@TRANCOUNT"
#: The connection's current database: a queue address without a catalog means this one.
CURRENT_CATALOG = "SELECT DB_NAME()"


#: How pyodbc reports the native error number: ``[SQLSTATE] text (number) (SQLFunction)``.
_ODBC_NATIVE = re.compile(r"\((-?\d+)\) \((SQL\w*)\)")
#: ODBC SQLSTATEs of a lost or unreachable connection: class 08, timeouts, a failed disconnect.
_ODBC_CONNECTION_STATES = ("08", "HYT00", "HYT01", "01002")
#: FreeTDS DB-Lib numbers (what pymssql reports for client-side failures) that mean the connection
#: is gone or never came up: connection failed (20002), timed out (20003), read or write failed
#: (20004, 20006), socket (20008), unable to connect (20009), unexpected EOF (20017), bad token
#: (20020), DBPROCESS dead (20047), closing the connection failed (20056).
_DBLIB_CONNECTION_NUMBERS = {20002, 20003, 20004, 20006, 20008, 20009, 20017, 20020, 20047, 20056}
_PERMISSION_NUMBERS = {229, 230, 262, 297, 300, 1088}  # object/statement permission denied
#: The server's error when a lock wait outlasts SET LOCK_TIMEOUT.
LOCK_TIMEOUT_NUMBER = 1222
#: Server errors a retry can get past (the list Microsoft's SqlClient retries, plus lock waits).
_RETRYABLE_NUMBERS = {
    1204,  # the server ran out of locks
    1205,  # chosen as deadlock victim
    3960,  # snapshot isolation update conflict (a concurrent writer changed the row)
    -2,  # client timeout
    20,
    64,
    233,  # no process on the other end of the pipe
    10053,
    10054,
    10060,  # network errors
    4060,  # cannot open the database (Azure SQL: during a failover)
    4221,  # login to a readable secondary while it is catching up
    10928,
    10929,  # Azure SQL: resource limits
    40143,
    40197,
    40501,
    40540,
    40613,  # Azure SQL: service busy / database unavailable
    42108,
    42109,
    49918,
    49919,
    49920,  # Azure SQL: too many operations in progress
}
#: Errors of the login or the database named: retrying cannot fix them.
_MISCONFIGURED_NUMBERS = {
    911: "the database does not exist",
    18452: "the login is from an untrusted domain",
    18456: "login failed",
    18470: "the login is disabled",
    18486: "the login is locked out",
    18487: "the login's password expired",
    18488: "the login's password must be changed",
}
#: Another installer created the object first (2714: table, 1913: index).
_EXISTS_NUMBERS = {2714, 1913}
#: A date computed from a duration left what datetime can hold (8115: overflow converting to int
#: or datetime; 517: adding to a datetime overflowed).
_OVERFLOW_NUMBERS = {8115, 517}
#: No space left to write (1101: no new page in the filegroup; 1105: filegroup full; 9002: transaction
#: log full): the server answers, but only an operator freeing or adding space helps.
_FULL_NUMBERS = {1101, 1105, 9002}


#: The claim tokens of a statement's @tokens parameter (a JSON array, see ``token_list``).
_TOKENS = "SELECT CONVERT(uniqueidentifier, j.value) FROM OPENJSON(@tokens) AS j"


def quote_ident(name: str) -> str:
    """A bracket-quoted identifier (``]`` doubled), with ``%`` doubled for the placeholder convention."""
    return "[" + name.replace("]", "]]").replace("%", "%%") + "]"


def _bracket(name: str) -> str:
    return "[" + name.replace("]", "]]") + "]"


def _unicode_literal(text: str) -> str:
    """An N'...' literal (``'`` doubled, ``%`` doubled), for the few places a name must be a string."""
    return "N'" + text.replace("'", "''").replace("%", "%%") + "'"


def _after_ms(expression: str, now: str) -> str:
    """``now`` plus a bigint number of milliseconds.

    DATEADD takes an int: milliseconds overflow it past 24.8 days and seconds past 68 years
    (error 8115), so whole days and the remaining milliseconds are added separately, which covers
    every duration up to ``defaults.MAX_TIME_TO_BE_RECEIVED``.
    """
    return f"DATEADD(millisecond, {expression} %% 86400000, DATEADD(day, {expression} / 86400000, {now}))"


#: A column's type as the catalog queries report it. ``RowVersion`` that is no identity column is
#: reported as another type: rows sent to such a table get no RowVersion, and no receive, which
#: reads in RowVersion order, would ever see them.
_COLUMN_TYPE = (
    "CASE WHEN LOWER(col.name) = N'rowversion' AND col.is_identity = 0 "
    "THEN typ.name + N' without identity' ELSE typ.name END"
)


class SqlServerDialect(Dialect):
    """NServiceBus-compatible queue tables on SQL Server, driven through pymssql or pyodbc."""

    name = "sqlserver"
    default_schema = "dbo"
    begin_sql = BEGIN_TRANSACTION
    script_separator = "\nGO\n\n"
    commit_sql = COMMIT_TRANSACTION
    rollback_sql = ROLLBACK_TRANSACTION
    # Recoverable is not required: NServiceBus reads and writes tables without it too.
    column_types: ClassVar[Mapping[str, tuple[str, ...]]] = {
        "id": ("uniqueidentifier",),
        "expires": ("datetime", "datetime2"),
        "headers": ("nvarchar", "varchar", "ntext", "text"),
        "body": ("varbinary",),
        "rowversion": ("bigint", "int"),
    }

    # -- table layouts -------------------------------------------------------------------------

    def layout(self, address: QueueAddress, types: Mapping[str, str]) -> TableShape:
        shape = TableShape(
            recoverable="recoverable" in types, ascii_headers=types.get("headers") in ("varchar", "text")
        )
        if shape.ascii_headers:
            log.warning(
                "Queue %s has a varchar Headers column (an older NServiceBus layout): non-ASCII header text is "
                "written \\u-escaped so it survives; NServiceBus recommends nvarchar(max) (ALTER TABLE %s ALTER "
                "COLUMN Headers nvarchar(max) NOT NULL)",
                self.qualified_name(address),
                self.qualified_name(address),
            )
        return shape

    def current_catalog_sql(self) -> str:
        return CURRENT_CATALOG

    # -- addressing ---------------------------------------------------------------------------

    def validate_address(self, address: QueueAddress) -> None:
        if address.table.startswith("#"):
            raise InvalidQueueNameError(
                f"queue table name {address.table!r} starts with '#': SQL Server makes that a temporary table, "
                "even when quoted, and it would vanish with the connection"
            )
        for kind, part in (("queue table", address.table), ("schema", address.schema), ("catalog", address.catalog)):
            if part is not None and len(part) > MAX_IDENTIFIER_CHARS:
                raise InvalidQueueNameError(
                    f"{kind} name {part[:40]!r}... is {len(part)} characters; SQL Server names are limited to "
                    f"{MAX_IDENTIFIER_CHARS}"
                )
        if len(self.format_address(address)) > MAX_ADDRESS_CHARS:
            raise InvalidQueueNameError(
                f"address {self.format_address(address)[:60]!r}... is over {MAX_ADDRESS_CHARS} characters"
            )

    def parse_address(self, text: str) -> QueueAddress:
        """Accept ``table@[schema]@[catalog]`` (NServiceBus's form), ``[catalog].[schema].[table]``,
        ``schema.table`` and ``table``.

        A table name containing a dot (a secondary queue ``Endpoint.Machine``) must be bracketed in
        the dotted forms: ``[Endpoint.Machine]``; in NServiceBus's form it needs no quoting.
        """
        at_parts = split_outside(text, "@", "[", "]")
        if len(at_parts) > 1:
            if len(at_parts) > 3:
                raise InvalidQueueNameError(f"address {text!r} has more than table@[schema]@[catalog]")
            table = unquote(at_parts[0], "[", "]")
            schema = unquote(at_parts[1], "[", "]") or None
            catalog = unquote(at_parts[2], "[", "]") if len(at_parts) == 3 else None
            address = QueueAddress(table, schema, catalog or None)
        else:
            parts = [unquote(part, "[", "]") for part in split_outside(text, ".", "[", "]")]
            if len(parts) > 3:
                raise InvalidQueueNameError(
                    f"address {text!r} has more than catalog.schema.table; bracket a table name that contains dots"
                )
            catalog_part, schema_part = ([None, None, *parts][-3:])[:2]
            address = QueueAddress(parts[-1], schema_part, catalog_part)
        self.validate_address(address)
        return address

    def format_address(self, address: QueueAddress) -> str:
        table = address.table
        if any(c in table for c in "@[]"):  # bracketed only when it must be, as NServiceBus writes it
            table = _bracket(table)
        text = table + "@" + _bracket(address.schema or self.default_schema)
        if address.catalog is not None:
            text += "@" + _bracket(address.catalog)
        return text

    def name_key(self, address: QueueAddress) -> tuple[str | None, str, str]:
        # Case-insensitive collations are SQL Server's default: names that differ only by case are
        # one table, refused as such even where a database's collation would tell them apart.
        catalog, schema, table = super().name_key(address)
        return (None if catalog is None else catalog.casefold(), schema.casefold(), table.casefold())

    def qualified_name(self, address: QueueAddress) -> str:
        self.validate_address(address)
        parts = [address.schema or self.default_schema, address.table]
        if address.catalog is not None:
            parts.insert(0, address.catalog)
        return ".".join(quote_ident(part) for part in parts)

    def _object_name(self, address: QueueAddress) -> str:
        """The qualified name as an N'' literal, for OBJECT_ID()."""
        parts = [address.schema or self.default_schema, address.table]
        if address.catalog is not None:
            parts.insert(0, address.catalog)
        return _unicode_literal(".".join(_bracket(part) for part in parts))

    def _catalog_prefix(self, address: QueueAddress) -> str:
        """``[catalog].`` for catalog views of another database, else nothing (the current database)."""
        return quote_ident(address.catalog) + "." if address.catalog is not None else ""

    def install_lock_sql(self, address: QueueAddress) -> str:
        """Serialise concurrent installers of one table until their transaction ends.

        The resource is NServiceBus's own, ``[catalog].[schema].[table]_lock`` (its
        ``CanonicalQueueAddress.QualifiedTableName`` + ``_lock``), so this installer and an
        NServiceBus endpoint installing the same queue wait for each other. Application locks
        compare resources byte for byte: without a catalog in the address the connection's
        database name (``DB_NAME()``) stands in, as NServiceBus takes it from its connection string.
        """
        catalog = "DB_NAME()" if address.catalog is None else _unicode_literal(address.catalog)
        schema = _unicode_literal(address.schema or self.default_schema)
        return (
            f"DECLARE @resource nvarchar(255) = QUOTENAME({catalog}) + N'.' + QUOTENAME({schema}) + N'.' "
            f"+ QUOTENAME({_unicode_literal(address.table)}) + N'_lock'; "
            "EXEC sp_getapplock @Resource = @resource, @LockMode = N'Exclusive', @LockOwner = N'Transaction'"
        )

    # -- installation --------------------------------------------------------------------------

    def create_queue_sql(self, address: QueueAddress) -> Sequence[str]:
        q = self.qualified_name(address)
        return [
            # Table and indexes together, as NServiceBus's installer creates them, and only when the
            # table is new: an index built later on a live queue would be an offline build holding
            # a table lock. An existing table without Index_Expires is warned about (check_queue).
            (
                f"IF OBJECT_ID({self._object_name(address)}, N'U') IS NULL BEGIN "
                f"CREATE TABLE {q} ("
                "Id uniqueidentifier NOT NULL, "
                "CorrelationId varchar(255) NULL, "
                "ReplyToAddress varchar(255) NULL, "
                "Recoverable bit NOT NULL, "
                "Expires datetime NULL, "
                "Headers nvarchar(max) NOT NULL, "
                "Body varbinary(max) NULL, "
                "RowVersion bigint IDENTITY(1,1) NOT NULL); "
                # A heap with a nonclustered RowVersion index, as current NServiceBus creates it: a
                # clustered index on an ever-increasing key puts every insert on the same last page,
                # and senders then queue up on that page's latch. Receivers find the oldest row
                # through this index either way.
                f"CREATE NONCLUSTERED INDEX [Index_RowVersion] ON {q} (RowVersion); "
                f"{self.expires_index_ddl_sql(address)}; END"
            ),
        ]

    def create_delayed_sql(self, delayed: QueueAddress) -> Sequence[str]:
        d = self.qualified_name(delayed)
        return [
            (
                f"IF OBJECT_ID({self._object_name(delayed)}, N'U') IS NULL BEGIN "
                f"CREATE TABLE {d} ("
                "Headers nvarchar(max) NOT NULL, "
                "Body varbinary(max) NULL, "
                "Due datetime NOT NULL, "
                "RowVersion bigint IDENTITY(1,1) NOT NULL); "
                f"CREATE NONCLUSTERED INDEX [Index_Due] ON {d} (Due); END"
            ),
        ]

    def create_subscriptions_sql(self, table: QueueAddress) -> Sequence[str]:
        t = self.qualified_name(table)
        # NServiceBus writes PRIMARY KEY CLUSTERED; a primary key on a table without a clustered
        # index is clustered by default, so this is the same table.
        return [
            (
                f"IF OBJECT_ID({self._object_name(table)}, N'U') IS NULL "
                f"CREATE TABLE {t} ("
                "QueueAddress nvarchar(200) NOT NULL, "
                "Endpoint nvarchar(200) NOT NULL, "
                "Topic nvarchar(200) NOT NULL, "
                "PRIMARY KEY (Endpoint, Topic))"
            ),
        ]

    def validate_role(self, role: str) -> None:
        if len(role) > MAX_IDENTIFIER_CHARS:
            raise InvalidArgumentError(
                f"role name {role[:40]!r}... is {len(role)} characters; SQL Server names are limited to "
                f"{MAX_IDENTIFIER_CHARS}"
            )
        if role.lower() in ("public", "dbo", "guest", "sys", "information_schema") or role.lower().startswith("db_"):
            raise InvalidArgumentError(
                f"role {role!r} is not a role of its own (public is every user; dbo, guest and the db_ roles are "
                "SQL Server's): grant to the application's role"
            )

    def grant_schema_usage_sql(self, address: QueueAddress, role: str) -> Sequence[str]:
        return []  # rights on a table reach it; the schema needs none of its own

    def grant_runtime_sql(self, table: QueueAddress, role: str, *, sequence: bool) -> Sequence[str]:
        # GRANT names objects by schema only: a table in another database is granted from there.
        use = f"USE {quote_ident(table.catalog)}; " if table.catalog is not None else ""
        name = f"{quote_ident(table.schema or self.default_schema)}.{quote_ident(table.table)}"
        return [f"{use}GRANT SELECT, INSERT, UPDATE, DELETE ON {name} TO {quote_ident(role)}"]

    def add_body_string_sql(self, address: QueueAddress) -> str:
        return (
            f"IF COL_LENGTH({self._object_name(address)}, N'BodyString') IS NULL "
            f"ALTER TABLE {self.qualified_name(address)} ADD BodyString AS CAST(Body AS nvarchar(max))"
        )

    def create_inflight_sql(self, address: QueueAddress) -> Sequence[str]:
        inflight = self.inflight_address(address)
        f = self.qualified_name(inflight)
        return [
            (
                f"IF OBJECT_ID({self._object_name(inflight)}, N'U') IS NULL BEGIN "
                f"CREATE TABLE {f} ("
                "Token uniqueidentifier NOT NULL, "
                "Queue nvarchar(450) NOT NULL, "
                "Id uniqueidentifier NOT NULL, "
                "Expires datetime NULL, "
                "Headers nvarchar(max) NOT NULL, "
                "Body varbinary(max) NULL, "
                "Seq bigint NOT NULL, "
                "Deliveries int NOT NULL, "
                "LeaseUntil datetime2 NOT NULL, "
                "LastError nvarchar(max) NULL, "
                "Holder nvarchar(400) NULL); "
                f"CREATE UNIQUE NONCLUSTERED INDEX [Index_Token] ON {f} (Token); "
                f"CREATE NONCLUSTERED INDEX [Index_Lease] ON {f} (Queue, LeaseUntil); END"
            ),
            # Tables created before hand-off reservations existed lack Holder.
            f"IF COL_LENGTH({self._object_name(inflight)}, N'Holder') IS NULL ALTER TABLE {f} ADD Holder nvarchar(400) NULL",
            # Readers that find their claims again by holder (a Spark batch's claims).
            (
                f"IF INDEXPROPERTY(OBJECT_ID({self._object_name(inflight)}), N'Index_Holder', 'IndexID') IS NULL "
                f"CREATE NONCLUSTERED INDEX [Index_Holder] ON {f} (Queue, Holder)"
            ),
        ]

    def drop_queue_sql(self, address: QueueAddress) -> str:
        return f"DROP TABLE IF EXISTS {self.qualified_name(address)}"

    # -- inspection ----------------------------------------------------------------------------

    def queue_columns_sql(self, address: QueueAddress) -> str:
        c = self._catalog_prefix(address)
        return (
            f"SELECT LOWER(col.name), {_COLUMN_TYPE} FROM {c}sys.columns AS col "
            f"JOIN {c}sys.types AS typ ON typ.user_type_id = col.user_type_id "
            f"JOIN {c}sys.tables AS tab ON tab.object_id = col.object_id "
            f"JOIN {c}sys.schemas AS sch ON sch.schema_id = tab.schema_id "
            "WHERE sch.name = %(schema)s AND tab.name = %(table)s ORDER BY col.column_id"
        )

    def schema_exists_sql(self, address: QueueAddress) -> str:
        c = self._catalog_prefix(address)
        return f"SELECT CASE WHEN EXISTS (SELECT 1 FROM {c}sys.schemas WHERE name = %(schema)s) THEN 1 ELSE 0 END"

    def list_queues_sql(self) -> str:
        pairs = ", ".join(
            _unicode_literal(f"{name}:{type_name}")
            for name, accepted in self.column_types.items()
            for type_name in accepted
        )
        return (
            "WITH q AS (SELECT sch.name AS schema_name, tab.name AS table_name FROM sys.tables AS tab "
            "JOIN sys.schemas AS sch ON sch.schema_id = tab.schema_id "
            f"WHERE tab.name <> {_unicode_literal(self.inflight_table)} "
            "AND (%(search)s = N'' OR CHARINDEX(LOWER(%(search)s), LOWER(sch.name + N'.' + tab.name)) > 0) "
            "AND HAS_PERMS_BY_NAME(QUOTENAME(sch.name) + N'.' + QUOTENAME(tab.name), N'OBJECT', N'SELECT') = 1 "
            "AND (SELECT COUNT(*) FROM sys.columns AS col JOIN sys.types AS typ ON typ.user_type_id = col.user_type_id "
            f"WHERE col.object_id = tab.object_id AND LOWER(col.name) + N':' + {_COLUMN_TYPE} IN ({pairs})) = {len(self.column_types)}) "
            "SELECT t.total, p.schema_name, p.table_name FROM (SELECT COUNT(*) AS total FROM q) AS t LEFT JOIN "
            "(SELECT schema_name, table_name FROM q ORDER BY schema_name, table_name "
            "OFFSET %(offset)s ROWS FETCH NEXT %(limit)s ROWS ONLY) AS p ON 1 = 1 "
            "ORDER BY p.schema_name, p.table_name"
        )

    def queue_figures_sql(self, address: QueueAddress) -> str:
        # The RowVersion range and the oldest row come off Index_RowVersion, expired rows off
        # Index_Expires, and no more than @limit of them are counted.
        q = self.qualified_name(address)
        return (
            "DECLARE @limit int = %(limit)s; "
            f"SELECT ({self.peek_sql(address)}), "
            f"(SELECT TOP (1) Headers FROM {q} WITH (READPAST, READCOMMITTEDLOCK) ORDER BY RowVersion), "
            f"(SELECT COUNT_BIG(*) FROM (SELECT TOP (@limit) RowVersion FROM {q} WITH (READPAST, READCOMMITTEDLOCK) "
            f"WHERE Expires < {_UTC_NOW}) AS expired), "
            # Ghost records are removed by SQL Server's background cleanup, not by a vacuum a long
            # transaction holds back: nothing to report (as the dialect's horizon_sql says).
            "CAST(NULL AS bigint), CAST(NULL AS datetime2)"
        )

    def delayed_figures_sql(self, delayed: QueueAddress) -> str:
        d = self.qualified_name(delayed)
        return (
            "DECLARE @limit int = %(limit)s; "
            f"SELECT (SELECT COUNT_BIG(*) FROM (SELECT TOP (@limit) Due FROM {d} WITH (READPAST, READCOMMITTEDLOCK) "
            f"WHERE Due < {_UTC_NOW}) AS due), "
            f"(SELECT DATEDIFF_BIG(millisecond, MIN(Due), {_UTC_NOW}) FROM {d} WITH (READPAST, READCOMMITTEDLOCK) "
            f"WHERE Due < {_UTC_NOW})"
        )

    def session_lock_timeout_sql(self, ms: int) -> str:
        return f"SET LOCK_TIMEOUT {int(ms)}"

    def has_expires_index_sql(self, address: QueueAddress) -> str:
        c = self._catalog_prefix(address)
        return (
            "SELECT CASE WHEN EXISTS (SELECT 1 "
            f"FROM {c}sys.index_columns AS ic "
            f"JOIN {c}sys.columns AS col ON col.object_id = ic.object_id AND col.column_id = ic.column_id "
            f"JOIN {c}sys.tables AS tab ON tab.object_id = ic.object_id "
            f"JOIN {c}sys.schemas AS sch ON sch.schema_id = tab.schema_id "
            "WHERE sch.name = %(schema)s AND tab.name = %(table)s AND ic.key_ordinal = 1 AND col.name = N'Expires') "
            "THEN 1 ELSE 0 END"
        )

    def expires_index_ddl_sql(self, address: QueueAddress) -> str:
        return (
            f"CREATE NONCLUSTERED INDEX [Index_Expires] ON {self.qualified_name(address)} (Expires) "
            "INCLUDE (Id, RowVersion) WHERE Expires IS NOT NULL"
        )

    # -- runtime -------------------------------------------------------------------------------

    def _insert_values(self, address: QueueAddress, suffixes: Sequence[str], shape: TableShape) -> str:
        """Insert one row per suffix; row n's parameters are ``id``, ``ttbr_ms``, ``headers``, ``body`` + suffix n."""
        # Rows are numbered and inserted ORDER BY that number: SQL Server then assigns RowVersion
        # in batch order, so a batch keeps its FIFO order.
        values = ", ".join(
            f"({n}, %(id{x})s, CAST(%(ttbr_ms{x})s AS bigint), %(headers{x})s, %(body{x})s)"
            for n, x in enumerate(suffixes, start=1)
        )
        recoverable = ("Recoverable, ", "1, ") if shape.recoverable else ("", "")
        return (
            f"INSERT INTO {self.qualified_name(address)} (Id, {recoverable[0]}Expires, Headers, Body) "
            f"SELECT v.Id, {recoverable[1]}{_after_ms('v.Ttbr', _UTC_NOW)}, v.Headers, v.Body "
            f"FROM (VALUES {values}) AS v(Ord, Id, Ttbr, Headers, Body) ORDER BY v.Ord"
        )

    def send_sql(self, address: QueueAddress, shape: TableShape) -> str:
        return self._insert_values(address, [""], shape)

    def batch_size(self, rows: Sequence[SendRow]) -> int:
        """Up to ROWS_PER_INSERT rows (the parameter limit) and BYTES_PER_INSERT bytes of values."""
        size = 0
        for count, row in enumerate(rows[:ROWS_PER_INSERT]):
            size += sum(2 * len(value) + 8 if isinstance(value, (bytes, str)) else 40 for value in row)
            if size > BYTES_PER_INSERT:
                return max(count, 1)
        return min(len(rows), ROWS_PER_INSERT)

    def send_batch_sql(self, address: QueueAddress, count: int, shape: TableShape) -> str:
        return self._insert_values(address, [str(n) for n in range(1, count + 1)], shape)

    def send_batch_params(self, rows: Sequence[SendRow]) -> dict[str, object]:
        params: dict[str, object] = {}
        for n, (message_id, ttbr_ms, headers, body) in enumerate(rows, start=1):
            params.update({f"id{n}": message_id, f"ttbr_ms{n}": ttbr_ms, f"headers{n}": headers, f"body{n}": body})
        return params

    def _expired(self, alias: str) -> str:
        return f"CASE WHEN {alias}.Expires IS NOT NULL AND {alias}.Expires <= {_UTC_NOW} THEN 1 ELSE 0 END"

    def receive_sql(self, address: QueueAddress) -> str:
        # UPDLOCK + READPAST + ROWLOCK: each receiver locks the oldest rows nobody else holds and
        # skips the rest, so competing receivers never wait on or return each other's rows.
        return (
            f"WITH message AS (SELECT TOP (%(limit)s) * FROM {self.qualified_name(address)} "
            "WITH (UPDLOCK, READPAST, ROWLOCK) ORDER BY RowVersion) "
            f"DELETE FROM message OUTPUT deleted.Id, {self._expired('deleted')}, deleted.Headers, deleted.Body, "
            "deleted.RowVersion"
        )

    def peek_sql(self, address: QueueAddress) -> str:
        # MIN and MAX come off Index_RowVersion: constant time on any queue size, where COUNT
        # would scan. READPAST leaves out rows receivers hold.
        return (
            "SELECT ISNULL(MAX(RowVersion) - MIN(RowVersion) + 1, 0) "
            f"FROM {self.qualified_name(address)} WITH (READPAST, READCOMMITTEDLOCK)"
        )

    def depth_sql(self, address: QueueAddress) -> str:
        return f"SELECT COUNT_BIG(*) FROM {self.qualified_name(address)} WITH (READPAST, READCOMMITTEDLOCK)"

    def purge_expired_sql(self, address: QueueAddress) -> str:
        return (
            f"WITH expired AS (SELECT TOP (%(limit)s) * FROM {self.qualified_name(address)} "
            f"WITH (UPDLOCK, READPAST, ROWLOCK) WHERE Expires < {_UTC_NOW}) DELETE FROM expired"
        )

    def purge_all_sql(self, address: QueueAddress) -> str:
        return f"DELETE FROM {self.qualified_name(address)}"

    def insert_error_sql(self, error_address: QueueAddress, shape: TableShape) -> str:
        # The body is typed: a NULL body (NServiceBus allows one) bound by pyodbc without a type
        # would arrive as varchar, which SQL Server refuses to convert to varbinary implicitly.
        if shape.recoverable:
            return (
                f"INSERT INTO {self.qualified_name(error_address)} (Id, Recoverable, Expires, Headers, Body) "
                "VALUES (%(id)s, 1, NULL, %(headers)s, CAST(%(body)s AS varbinary(max)))"
            )
        return (
            f"INSERT INTO {self.qualified_name(error_address)} (Id, Expires, Headers, Body) "
            "VALUES (%(id)s, NULL, %(headers)s, CAST(%(body)s AS varbinary(max)))"
        )

    def store_delayed_sql(self, delayed: QueueAddress) -> str:
        return (
            "DECLARE @delay_ms bigint = %(delay_ms)s; "
            f"INSERT INTO {self.qualified_name(delayed)} (Headers, Body, Due) "
            f"VALUES (%(headers)s, CAST(%(body)s AS varbinary(max)), {_after_ms('@delay_ms', _UTC_NOW)})"
        )

    def due_delayed_sql(self, delayed: QueueAddress) -> str:
        return (
            f"SELECT TOP (%(limit)s) RowVersion, Headers, Body FROM {self.qualified_name(delayed)} "
            f"WITH (UPDLOCK, READPAST, ROWLOCK) WHERE Due < {_UTC_NOW} ORDER BY Due"
        )

    def delete_delayed_sql(self, delayed: QueueAddress) -> str:
        return (
            f"DELETE FROM {self.qualified_name(delayed)} "
            "WHERE RowVersion IN (SELECT CAST(j.value AS bigint) FROM OPENJSON(%(keys)s) AS j)"
        )

    def next_due_sql(self, delayed: QueueAddress) -> str:
        return (
            f"SELECT DATEDIFF_BIG(millisecond, {_UTC_NOW}, min(Due)) FROM {self.qualified_name(delayed)} "
            "WITH (READPAST, READCOMMITTEDLOCK)"
        )

    def can_insert_sql(self) -> str:
        return "SELECT CAST(HAS_PERMS_BY_NAME(%(table)s, 'OBJECT', 'INSERT') AS bit)"

    def table_reference(self, address: QueueAddress) -> str:
        return self.qualified_name(address)

    def key_list(self, keys: Sequence[Any]) -> object:
        # A JSON array of RowVersions, opened server side with OPENJSON (SQL Server 2016+).
        return json.dumps([int(key) for key in keys])

    def subscribe_sql(self, table: QueueAddress) -> str:
        # NServiceBus's own statement: HOLDLOCK makes the match-then-insert one step, so two
        # subscribers racing for the same key cannot both insert.
        return (
            f"MERGE {self.qualified_name(table)} WITH (HOLDLOCK, TABLOCK) AS target "
            "USING (SELECT CAST(%(endpoint)s AS nvarchar(200)) AS Endpoint, CAST(%(address)s AS nvarchar(200)) "
            "AS QueueAddress, CAST(%(topic)s AS nvarchar(200)) AS Topic) AS source "
            "ON target.Endpoint = source.Endpoint AND target.Topic = source.Topic "
            "WHEN MATCHED AND target.QueueAddress <> source.QueueAddress THEN UPDATE SET QueueAddress = source.QueueAddress "
            "WHEN NOT MATCHED THEN INSERT (QueueAddress, Topic, Endpoint) "
            "VALUES (source.QueueAddress, source.Topic, source.Endpoint);"
        )

    def unsubscribe_sql(self, table: QueueAddress) -> str:
        return f"DELETE FROM {self.qualified_name(table)} WHERE Endpoint = %(endpoint)s AND Topic = %(topic)s"

    def subscribers_sql(self, table: QueueAddress) -> str:
        return (
            f"SELECT DISTINCT QueueAddress FROM {self.qualified_name(table)} "
            "WHERE Topic IN (SELECT CAST(j.value AS nvarchar(200)) FROM OPENJSON(%(topics)s) AS j) ORDER BY QueueAddress"
        )

    def topic_list(self, topics: Sequence[str]) -> object:
        return json.dumps(list(topics))

    def browse_sql(self, address: QueueAddress) -> str:
        return (
            f"SELECT TOP (%(limit)s) RowVersion, Id, Headers, Body FROM {self.qualified_name(address)} "
            "WITH (READPAST, READCOMMITTEDLOCK) WHERE RowVersion > %(after)s AND RowVersion <= %(last)s "
            f"AND (Expires IS NULL OR Expires > {_UTC_NOW}) ORDER BY RowVersion"
        )

    def seq_range_sql(self, address: QueueAddress) -> str:
        # Both ends come off Index_RowVersion; READPAST leaves out rows receivers hold.
        return (
            f"SELECT MIN(RowVersion), MAX(RowVersion) FROM {self.qualified_name(address)} "
            "WITH (READPAST, READCOMMITTEDLOCK)"
        )

    def newest_headers_sql(self, address: QueueAddress) -> str:
        return (
            f"SELECT TOP (%(limit)s) RowVersion, Headers FROM {self.qualified_name(address)} "
            "WITH (READPAST, READCOMMITTEDLOCK) WHERE RowVersion < %(before)s ORDER BY RowVersion DESC"
        )

    def find_sql(self, address: QueueAddress) -> str:
        # The newest rows come off Index_RowVersion; only their Headers are searched (bodies are not
        # read), lower-cased so that a case-sensitive collation finds what a sender wrote in capitals.
        q = self.qualified_name(address)
        return (
            "SELECT n.RowVersion, n.Id, n.Headers FROM "
            f"(SELECT TOP (%(scan)s) RowVersion, Id, Headers FROM {q} WITH (READPAST, READCOMMITTEDLOCK) "
            "ORDER BY RowVersion DESC) AS n WHERE CHARINDEX(%(needle)s, LOWER(n.Headers)) > 0 ORDER BY n.RowVersion"
        )

    def scanned_all_sql(self, address: QueueAddress) -> str:
        q = self.qualified_name(address)
        return (
            "SELECT CAST(CASE WHEN COUNT(*) <= %(scan)s THEN 1 ELSE 0 END AS bit) FROM "
            f"(SELECT TOP (%(scan)s + 1) RowVersion FROM {q} WITH (READPAST, READCOMMITTEDLOCK) "
            "ORDER BY RowVersion DESC) AS n"
        )

    def find_claims_sql(self, address: QueueAddress) -> str:
        f = self.qualified_name(self.inflight_address(address))
        return (
            "SELECT n.Queue, n.Seq, n.Id, n.Headers, n.Holder, n.Deliveries FROM "
            f"(SELECT TOP (%(scan)s) Queue, Seq, Id, Headers, Holder, Deliveries FROM {f} "
            "WITH (READPAST, READCOMMITTEDLOCK)) AS n WHERE CHARINDEX(%(needle)s, LOWER(n.Headers)) > 0"
        )

    def claims_scanned_all_sql(self, address: QueueAddress) -> str:
        f = self.qualified_name(self.inflight_address(address))
        return (
            "SELECT CAST(CASE WHEN COUNT(*) <= %(scan)s THEN 1 ELSE 0 END AS bit) FROM "
            f"(SELECT TOP (%(scan)s + 1) Token FROM {f} WITH (READPAST, READCOMMITTEDLOCK)) AS n"
        )

    def can_read_sql(self) -> str:
        # NULL (so false) for a table that does not exist.
        return "SELECT CAST(COALESCE(HAS_PERMS_BY_NAME(%(table)s, 'OBJECT', 'SELECT'), 0) AS bit)"

    def error_headers_sql(self, error_address: QueueAddress) -> str:
        return (
            f"SELECT TOP (%(limit)s) RowVersion, Headers FROM {self.qualified_name(error_address)} "
            "WITH (READPAST, READCOMMITTEDLOCK) WHERE RowVersion > %(after)s ORDER BY RowVersion"
        )

    def error_rows_sql(self, error_address: QueueAddress) -> str:
        return (
            f"SELECT RowVersion, Id, Headers, Body FROM {self.qualified_name(error_address)} "
            "WITH (UPDLOCK, READPAST, ROWLOCK) "
            "WHERE RowVersion IN (SELECT CAST(j.value AS bigint) FROM OPENJSON(%(seqs)s) AS j) ORDER BY RowVersion"
        )

    def seq_list(self, seqs: Sequence[int]) -> object:
        # A JSON array of RowVersions, opened server side with OPENJSON (SQL Server 2016+).
        return json.dumps([int(seq) for seq in seqs])

    def failed_messages_sql(self, error_address: QueueAddress) -> str:
        return (
            "SELECT RowVersion, Id, Headers, DATALENGTH(Body), SUBSTRING(Body, 1, %(preview)s) "
            f"FROM {self.qualified_name(error_address)} WITH (READPAST, READCOMMITTEDLOCK) "
            "WHERE RowVersion IN (SELECT CAST(j.value AS bigint) FROM OPENJSON(%(seqs)s) AS j) ORDER BY RowVersion DESC"
        )

    def delete_by_seq_sql(self, address: QueueAddress) -> str:
        return f"DELETE FROM {self.qualified_name(address)} WHERE RowVersion = %(seq)s"

    # -- claim mode ----------------------------------------------------------------------------

    def claim_sql(self, address: QueueAddress, bodies: bool = True) -> str:
        q = self.qualified_name(address)
        f = self.qualified_name(self.inflight_address(address))
        body = "c.Body" if bodies else "CAST(NULL AS varbinary(max))"
        # One batch: delete the oldest unlocked rows into a table variable, move the unexpired ones
        # into the in-flight table, and return them together with the ids of the expired ones
        # (token NULL), which are just gone; one clock reading decides which is which.
        # NULL Headers (possible in a hand-made table) are kept as the JSON text null, which no
        # reader takes for headers: the row stays poison, where '' would read as no headers.
        return (
            "DECLARE @limit int = %(limit)s, @queue nvarchar(450) = %(queue)s, @deliveries int = %(deliveries)s, "
            f"@lease_ms bigint = %(lease_ms)s, @holder nvarchar(400) = %(holder)s, @now datetime = {_UTC_NOW}; "
            "DECLARE @taken TABLE (Id uniqueidentifier, Expires datetime, Headers nvarchar(max), "
            "Body varbinary(max), Seq bigint); "
            "DECLARE @claimed TABLE (Token uniqueidentifier, Id uniqueidentifier, Headers nvarchar(max), "
            "Body varbinary(max), Deliveries int, Seq bigint); "
            f"WITH message AS (SELECT TOP (@limit) * FROM {q} WITH (UPDLOCK, READPAST, ROWLOCK) ORDER BY RowVersion) "
            "DELETE FROM message OUTPUT deleted.Id, deleted.Expires, deleted.Headers, deleted.Body, "
            "deleted.RowVersion INTO @taken; "
            f"INSERT INTO {f} (Token, Queue, Id, Expires, Headers, Body, Seq, Deliveries, LeaseUntil, Holder) "
            "OUTPUT inserted.Token, inserted.Id, inserted.Headers, inserted.Body, inserted.Deliveries, inserted.Seq "
            "INTO @claimed "
            "SELECT NEWID(), @queue, t.Id, t.Expires, COALESCE(t.Headers, N'null'), t.Body, t.Seq, @deliveries, "
            f"{_after_ms('@lease_ms', _LEASE_NOW)}, @holder FROM @taken AS t "
            "WHERE t.Expires IS NULL OR t.Expires > @now; "
            f"SELECT c.Token, c.Id, c.Headers, {body}, c.Deliveries, c.Seq FROM @claimed AS c "
            "UNION ALL SELECT NULL, t.Id, NULL, NULL, 0, t.Seq FROM @taken AS t "
            "WHERE t.Expires IS NOT NULL AND t.Expires <= @now"
        )

    def reclaim_sql(self, address: QueueAddress, bodies: bool = True) -> str:
        f = self.qualified_name(self.inflight_address(address))
        body = "inserted.Body" if bodies else "CAST(NULL AS varbinary(max))"
        return (
            "DECLARE @deliveries int = %(deliveries)s, @lease_ms bigint = %(lease_ms)s, @holder nvarchar(400) = %(holder)s, "
            "@queue nvarchar(450) = %(queue)s, @limit int = %(limit)s; "
            f"WITH lapsed AS (SELECT TOP (@limit) * FROM {f} WITH (UPDLOCK, READPAST, ROWLOCK) "
            f"WHERE Queue = @queue AND LeaseUntil <= {_LEASE_NOW} ORDER BY Seq) "
            "UPDATE lapsed SET Token = NEWID(), Deliveries = Deliveries + @deliveries, "
            f"LeaseUntil = {_after_ms('@lease_ms', _LEASE_NOW)}, Holder = @holder "
            f"OUTPUT inserted.Token, inserted.Id, {self._expired('inserted')}, inserted.Headers, {body}, "
            "inserted.Deliveries, inserted.LastError, inserted.Seq"
        )

    def _take_into(self, candidates: str) -> str:
        """Hand the claims ``candidates`` selects to @holder: a new token, a counted delivery, a lease."""
        return (
            f"WITH taken AS ({candidates}) "
            "UPDATE taken SET Token = NEWID(), Deliveries = Deliveries + 1, "
            f"LeaseUntil = {_after_ms('@lease_ms', _LEASE_NOW)}, Holder = @holder "
            f"OUTPUT inserted.Token, inserted.Id, {self._expired('inserted')}, inserted.Headers, inserted.Body, "
            "inserted.Deliveries, inserted.LastError, inserted.Seq"
        )

    def take_sql(self, address: QueueAddress) -> str:
        f = self.qualified_name(self.inflight_address(address))
        return (
            "DECLARE @lease_ms bigint = %(lease_ms)s, @holder nvarchar(400) = %(holder)s, @tokens nvarchar(max) = %(tokens)s, "
            "@queue nvarchar(450) = %(queue)s; "
            + self._take_into(
                f"SELECT * FROM {f} WITH (UPDLOCK, ROWLOCK) WHERE Queue = @queue AND Holder IS NULL "
                f"AND Token IN ({_TOKENS})",
            )
        )

    def adopt_sql(self, address: QueueAddress) -> str:
        f = self.qualified_name(self.inflight_address(address))
        return (
            "DECLARE @lease_ms bigint = %(lease_ms)s, @holder nvarchar(400) = %(holder)s, @queue nvarchar(450) = %(queue)s, "
            "@limit int = %(limit)s; "
            + self._take_into(
                f"SELECT TOP (@limit) * FROM {f} WITH (UPDLOCK, READPAST, ROWLOCK) "
                "WHERE Queue = @queue AND Holder IS NULL ORDER BY Seq",
            )
        )

    def peek_with_claims_sql(self, address: QueueAddress) -> str:
        f = self.qualified_name(self.inflight_address(address))
        return (
            f"SELECT ({self.peek_sql(address)}), "
            f"(SELECT COUNT_BIG(*) FROM {f} WITH (READPAST, READCOMMITTEDLOCK) WHERE Queue = %(queue)s AND LeaseUntil <= {_LEASE_NOW})"
        )

    def count_inflight_sql(self, address: QueueAddress) -> str:
        f = self.qualified_name(self.inflight_address(address))
        return f"SELECT COUNT_BIG(*) FROM {f} WITH (READPAST, READCOMMITTEDLOCK) WHERE Queue = %(queue)s"

    def claim_figures_sql(self, address: QueueAddress) -> str:
        f = self.qualified_name(self.inflight_address(address))
        return (
            f"SELECT COUNT_BIG(*), COUNT_BIG(CASE WHEN LeaseUntil <= {_LEASE_NOW} THEN 1 END) "
            f"FROM {f} WITH (READPAST, READCOMMITTEDLOCK) WHERE Queue = %(queue)s"
        )

    def claims_sql(self, address: QueueAddress) -> str:
        f = self.qualified_name(self.inflight_address(address))
        return (
            f"SELECT TOP (%(limit)s) Id, Holder, Deliveries, DATEDIFF_BIG(millisecond, {_LEASE_NOW}, LeaseUntil), "
            f"LastError FROM {f} WITH (READPAST, READCOMMITTEDLOCK) WHERE Queue = %(queue)s ORDER BY LeaseUntil"
        )

    def purge_expired_claims_sql(self, address: QueueAddress) -> str:
        # Locked as a reclaim locks them (UPDLOCK, READPAST): a claim being renewed meanwhile is left alone.
        f = self.qualified_name(self.inflight_address(address))
        return (
            "DECLARE @queue nvarchar(450) = %(queue)s, @limit int = %(limit)s; "
            f"WITH expired AS (SELECT TOP (@limit) * FROM {f} WITH (UPDLOCK, READPAST, ROWLOCK) "
            f"WHERE Queue = @queue AND LeaseUntil <= {_LEASE_NOW} AND Expires < {_UTC_NOW}) DELETE FROM expired"
        )

    def release_lapsed_sql(self, address: QueueAddress, shape: TableShape) -> str:
        # Locked as a reclaim locks them (UPDLOCK, READPAST), so a claim is either given back here
        # or renewed by a receiver, never both; the rows get new RowVersions, behind the queue.
        q = self.qualified_name(address)
        f = self.qualified_name(self.inflight_address(address))
        recoverable = ("Recoverable, ", "1, ") if shape.recoverable else ("", "")
        return (
            "DECLARE @queue nvarchar(450) = %(queue)s, @limit int = %(limit)s; "
            "DECLARE @released TABLE (Id uniqueidentifier, Expires datetime, Headers nvarchar(max), "
            "Body varbinary(max), Seq bigint); "
            f"WITH lapsed AS (SELECT TOP (@limit) * FROM {f} WITH (UPDLOCK, READPAST, ROWLOCK) "
            f"WHERE Queue = @queue AND LeaseUntil <= {_LEASE_NOW} ORDER BY Seq) "
            "DELETE FROM lapsed OUTPUT deleted.Id, deleted.Expires, deleted.Headers, deleted.Body, deleted.Seq "
            "INTO @released; "
            f"INSERT INTO {q} (Id, {recoverable[0]}Expires, Headers, Body) "
            f"SELECT r.Id, {recoverable[1]}r.Expires, r.Headers, r.Body FROM @released AS r ORDER BY r.Seq; "
            "SELECT r.Id FROM @released AS r ORDER BY r.Seq"
        )

    def token_list(self, tokens: Sequence[uuid.UUID]) -> object:
        # A JSON array of token strings, opened server side with OPENJSON (SQL Server 2016+).
        return json.dumps([str(token) for token in tokens])

    def ack_sql(self, address: QueueAddress) -> str:
        f = self.qualified_name(self.inflight_address(address))
        return (
            "DECLARE @tokens nvarchar(max) = %(tokens)s, @queue nvarchar(450) = %(queue)s; "
            f"WITH settled AS (SELECT * FROM {f} WHERE Queue = @queue AND Token IN ({_TOKENS})) "
            "DELETE FROM settled OUTPUT deleted.Token"
        )

    def ack_copy_sql(self, address: QueueAddress) -> str:
        f = self.qualified_name(self.inflight_address(address))
        return (
            "DECLARE @tokens nvarchar(max) = %(tokens)s, @queue nvarchar(450) = %(queue)s; "
            f"WITH settled AS (SELECT * FROM {f} WHERE Queue = @queue AND Token IN ({_TOKENS})) "
            "DELETE FROM settled OUTPUT deleted.Token, deleted.Id, deleted.Headers, deleted.Body"
        )

    def nack_sql(self, address: QueueAddress) -> str:
        f = self.qualified_name(self.inflight_address(address))
        return (
            "DECLARE @delay_ms bigint = %(delay_ms)s, @error nvarchar(max) = %(error)s, @tokens nvarchar(max) = %(tokens)s, "
            "@queue nvarchar(450) = %(queue)s; "
            f"WITH given AS (SELECT * FROM {f} WHERE Queue = @queue AND Token IN ({_TOKENS})) "
            f"UPDATE given SET LeaseUntil = {_after_ms('@delay_ms', _LEASE_NOW)}, LastError = @error "
            "OUTPUT inserted.Token"
        )

    def extend_sql(self, address: QueueAddress) -> str:
        f = self.qualified_name(self.inflight_address(address))
        return (
            "DECLARE @lease_ms bigint = %(lease_ms)s, @tokens nvarchar(max) = %(tokens)s, @queue nvarchar(450) = %(queue)s; "
            f"WITH held AS (SELECT * FROM {f} WHERE Queue = @queue AND Token IN ({_TOKENS})) "
            f"UPDATE held SET LeaseUntil = {_after_ms('@lease_ms', _LEASE_NOW)} OUTPUT inserted.Token"
        )

    def held_sql(self, address: QueueAddress) -> str:
        f = self.qualified_name(self.inflight_address(address))
        return (
            f"SELECT Token, Id, Headers, Body, Deliveries, Seq FROM {f} WITH (READCOMMITTEDLOCK) "
            "WHERE Queue = %(queue)s AND Holder = %(holder)s AND Seq %% %(parts)s = %(part)s "
            # A message whose time to be received passed while held is not handed out again; the
            # holder's ack_held deletes it with the rest.
            f"AND (Expires IS NULL OR Expires > {_UTC_NOW}) ORDER BY Seq"
        )

    def ack_held_sql(self, address: QueueAddress) -> str:
        f = self.qualified_name(self.inflight_address(address))
        return f"DELETE FROM {f} WHERE Queue = %(queue)s AND Holder = %(holder)s"

    def extend_held_sql(self, address: QueueAddress) -> str:
        f = self.qualified_name(self.inflight_address(address))
        return (
            "DECLARE @lease_ms bigint = %(lease_ms)s; "
            f"UPDATE {f} SET LeaseUntil = {_after_ms('@lease_ms', _LEASE_NOW)} "
            "WHERE Queue = %(queue)s AND Holder = %(holder)s"
        )

    def nack_held_sql(self, address: QueueAddress) -> str:
        f = self.qualified_name(self.inflight_address(address))
        return (
            "DECLARE @delay_ms bigint = %(delay_ms)s; "
            f"UPDATE {f} SET LeaseUntil = {_after_ms('@delay_ms', _LEASE_NOW)}, LastError = %(error)s "
            "WHERE Queue = %(queue)s AND Holder = %(holder)s"
        )

    def create_writes_sql(self, ledger: QueueAddress) -> Sequence[str]:
        return [
            (
                f"IF OBJECT_ID({self._object_name(ledger)}, N'U') IS NULL "
                f"CREATE TABLE {self.qualified_name(ledger)} ("
                "WriteId uniqueidentifier NOT NULL, "
                "Part int NOT NULL, "
                "Recorded datetime2 NOT NULL DEFAULT SYSUTCDATETIME(), "
                "PRIMARY KEY (WriteId, Part))"
            )
        ]

    def record_write_sql(self, ledger: QueueAddress) -> str:
        # UPDLOCK + HOLDLOCK make the check and the insert one step: a second recorder of the same
        # key waits for the first one's transaction, then finds its row (or none, if it rolled back).
        t = self.qualified_name(ledger)
        return (
            "DECLARE @write uniqueidentifier = %(write)s, @part int = %(part)s; "
            f"INSERT INTO {t} (WriteId, Part) SELECT @write, @part WHERE NOT EXISTS "
            f"(SELECT 1 FROM {t} WITH (UPDLOCK, HOLDLOCK) WHERE WriteId = @write AND Part = @part)"
        )

    def forget_write_sql(self, ledger: QueueAddress) -> str:
        return f"DELETE FROM {self.qualified_name(ledger)} WHERE WriteId = %(write)s"

    def claim_to_error_sql(self, address: QueueAddress, error_address: QueueAddress, shape: TableShape) -> str:
        f = self.qualified_name(self.inflight_address(address))
        e = self.qualified_name(error_address)
        recoverable = ("Recoverable, ", "1, ") if shape.recoverable else ("", "")
        return (
            "DECLARE @token uniqueidentifier = %(token)s, @queue nvarchar(450) = %(queue)s, "
            "@headers nvarchar(max) = %(headers)s; "
            "DECLARE @moved TABLE (Id uniqueidentifier, Body varbinary(max)); "
            f"WITH claimed AS (SELECT * FROM {f} WHERE Token = @token AND Queue = @queue) "
            "DELETE FROM claimed OUTPUT deleted.Id, deleted.Body INTO @moved; "
            f"INSERT INTO {e} (Id, {recoverable[0]}Expires, Headers, Body) SELECT m.Id, {recoverable[1]}NULL, "
            "@headers, m.Body FROM @moved AS m"
        )

    # -- batches locked by a transaction: refused -----------------------------------------------

    def check_locked_batches(self) -> None:
        raise TransportMisconfiguredError(NO_LOCKED_BATCHES)

    def lock_batch_sql(self, address: QueueAddress) -> str:
        raise TransportMisconfiguredError(NO_LOCKED_BATCHES)

    def locker_sql(self, address: QueueAddress) -> str:
        raise TransportMisconfiguredError(NO_LOCKED_BATCHES)

    def current_transaction_sql(self) -> str:
        raise TransportMisconfiguredError(NO_LOCKED_BATCHES)

    def browse_locked_sql(self, address: QueueAddress) -> str:
        raise TransportMisconfiguredError(NO_LOCKED_BATCHES)

    def transaction_open_sql(self) -> str:
        raise TransportMisconfiguredError(NO_LOCKED_BATCHES)

    def locked_rows_table_sql(self, address: QueueAddress, locked_by: int) -> str:
        raise TransportMisconfiguredError(NO_LOCKED_BATCHES)

    def seq_window_sql(self, after: int, last: int) -> str:
        raise TransportMisconfiguredError(NO_LOCKED_BATCHES)

    def locked_to_error_sql(self, address: QueueAddress, error_address: QueueAddress, shape: TableShape) -> str:
        raise TransportMisconfiguredError(NO_LOCKED_BATCHES)

    def ack_locked_sql(self, address: QueueAddress) -> str:
        raise TransportMisconfiguredError(NO_LOCKED_BATCHES)

    def ack_locked_copy_sql(self, address: QueueAddress) -> str:
        raise TransportMisconfiguredError(NO_LOCKED_BATCHES)

    # -- errors --------------------------------------------------------------------------------

    def translate_error(self, exc: BaseException, address: str) -> SqlQueueError | None:
        """Classify by what the driver reports, never by the exception class alone.

        pymssql raises OperationalError for nearly every server error, so the class says nothing;
        the native number (pymssql's first argument, pyodbc's ``(number) (SQLFunction)``) and, for
        pyodbc, the SQLSTATE do. Only a lost or unreachable connection and the server errors known
        to pass (deadlocks, lock timeouts, Azure SQL failovers) are "retry later"; every other
        server error is permanent and says its number.
        """
        error = native_error(exc)
        if error is None:
            return None
        number, sqlstate, text = error.number, error.sqlstate, error.text
        if error.connection_lost:
            return TransportUnavailableError(f"database connection lost or unreachable ({address}): {text}")
        if number == 208 or sqlstate == "42S02":  # invalid object name: the queue's, or the claim store beside it
            store = re.search(rf"Invalid object name '((?:[^']+\.)?{re.escape(self.inflight_table)})'", text)
            return QueueNotFoundError(address, text, claim_store=store.group(1) if store else None)
        if number == 2760:  # the schema does not exist (or is not visible to this login)
            return QueueNotFoundError(address, text, schema_missing=True)
        if number in (2627, 2601):  # duplicate key: the message id is the queue's key
            return DuplicateMessageError(
                f"a message with this id is already in {address}: ids are unique per queue; send a new Message "
                f"(a new id) unless it is the same message resent ({text})"
            )
        if number in _PERMISSION_NUMBERS:
            return PermissionDeniedError(
                f"permission denied on {address}: {text}. Creating queues needs CREATE TABLE and ALTER on the "
                "schema (the installer's rights); sending and receiving need SELECT, INSERT, UPDATE and DELETE on "
                "the queue tables and on the schema's sqlqueue_inflight table"
            )
        if number in _MISCONFIGURED_NUMBERS or sqlstate == "28000":
            reason = _MISCONFIGURED_NUMBERS.get(number or 0, "login failed")
            return TransportMisconfiguredError(
                f"the database refused the connection ({reason}, error {number}): {text}; fix the connection's "
                "settings (or the address's catalog), retrying will not help"
            )
        if number == LOCK_TIMEOUT_NUMBER:  # SET LOCK_TIMEOUT ran out: a lock held elsewhere, named like PostgreSQL's
            return LockTimeoutError(
                f"{address} is locked by another session (a migration, ALTER TABLE, an open transaction): {text}"
            )
        if number in _RETRYABLE_NUMBERS or (sqlstate is not None and sqlstate.startswith("40")):
            return TransportUnavailableError(f"database busy or failing over while working on {address}: {text}")
        if number in _EXISTS_NUMBERS:
            return ObjectExistsError(f"another installer created part of {address} at the same time: {text}", number)
        if number in _OVERFLOW_NUMBERS:
            return StatementRejectedError(
                f"a time computed for {address} does not fit SQL Server's datetime (error {number}): {text}; "
                "time_to_be_received, lease and delay must stay within the transport's bounds",
                number,
            )
        if number == ROLLED_BACK_NUMBER and ROLLED_BACK_TEXT[:40] in text:
            return StatementRejectedError(
                f"the transaction on {address} was rolled back by an error inside it: {text}. In native mode a "
                "handler that catches a database error must re-raise it (the message is received again)",
                number,
            )
        if number in _FULL_NUMBERS:
            return StorageFullError(
                f"the database has no space left to write to {address} (error {number}), so nothing was written: "
                f"{text}; free or add space to its filegroup or transaction log, then send again",
                number,
            )
        if number is not None:
            return StatementRejectedError(
                f"SQL Server refused a statement on {address} (error {number}): {text}", number
            )
        if sqlstate in ("IM002", "IM003", "IM004") or "Can't open lib" in text:
            # The ODBC driver manager could not load the driver the connection names: no retry loads it.
            return TransportMisconfiguredError(
                f"the ODBC driver or data source the connection names cannot be loaded: {text}; install the driver "
                "(e.g. Debian's tdsodbc) or fix the connection's driver setting"
            )
        return None


@dataclass(frozen=True)
class NativeError:
    """A driver error as SQL Server's native number, the ODBC SQLSTATE (pyodbc only) and the text."""

    number: int | None
    sqlstate: str | None
    text: str
    #: The connection failed or died (the driver's own report, not the server's).
    connection_lost: bool


def native_error(exc: BaseException) -> NativeError | None:
    """What pymssql or pyodbc reports about ``exc``; None for anything that is not theirs.

    - pymssql (its DB-API exceptions wrap ``(number, message bytes)``; ``_mssql`` exceptions carry
      ``number``): numbers from 20000 up are FreeTDS DB-Lib's own, client-side errors; a
      connection that failed or died is one of ``_DBLIB_CONNECTION_NUMBERS``, or an
      InterfaceError, which pymssql raises for "not connected".
    - pyodbc: ``(sqlstate, "[sqlstate] text (number) (SQLFunction)")``; a connection that failed
      or died has SQLSTATE class 08, or a timeout (HYT00/HYT01).
    """
    driver = type(exc).__module__.split(".", 1)[0]
    args = tuple(getattr(exc, "args", ()))
    if driver == "pymssql":
        if len(args) == 1 and isinstance(args[0], tuple):
            args = args[0]
        number = args[0] if args and isinstance(args[0], int) and not isinstance(args[0], bool) else None
        if number is None and isinstance(getattr(exc, "number", None), int) and exc.number:  # type: ignore[attr-defined]
            number = exc.number  # type: ignore[attr-defined]
        raw = args[1] if len(args) >= 2 else (args[0] if args else "")
        text = (raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)).strip()
        lost = number in _DBLIB_CONNECTION_NUMBERS or (number is None and type(exc).__name__ == "InterfaceError")
        return NativeError(number, None, text, lost)
    if driver == "pyodbc":
        sqlstate = args[0] if args and isinstance(args[0], str) and re.fullmatch(r"[0-9A-Z]{5}", args[0]) else None
        text = str(args[1] if len(args) >= 2 else exc).strip()
        matches = _ODBC_NATIVE.findall(text)
        number = int(matches[-1][0]) if matches else None
        lost = sqlstate is not None and sqlstate.startswith(_ODBC_CONNECTION_STATES)
        return NativeError(number or None, sqlstate, text, lost)
    return None
