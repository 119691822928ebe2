"""SQL Server: every T-SQL statement the transport runs on SQL Server (2016 or newer), in one place.

The queue table is NServiceBus's SQL Server transport table: ``Id uniqueidentifier``,
``CorrelationId``/``ReplyToAddress varchar(255)`` (kept for wire compatibility with transport
version 2 and older, written NULL: their values travel in the headers), ``Recoverable bit``
(always 1), ``Expires datetime`` (UTC, by the server's clock), ``Headers nvarchar(max)``,
``Body varbinary(max)`` and ``RowVersion bigint IDENTITY`` giving the FIFO order. Reading works on
tables of either NServiceBus layout: ``varchar`` or ``nvarchar`` headers, clustered on RowVersion
or a heap with a nonclustered RowVersion index.

Names are bracket-quoted (``]`` doubled) and never formatted in as text. Statements use ``%s``
placeholders with a literal ``%`` written ``%%`` (the same convention as the PostgreSQL module);
the drivers turn them into what pymssql or pyodbc expect.

Only the SQL text is verified here (parsed as T-SQL in the tests); it has run against a real
server only where ``SQLQUEUE_MSSQL_URI`` was set for the integration suite.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from collections.abc import Sequence

from ..addressing import QueueAddress, split_outside, unquote
from ..errors import (
    DuplicateMessageError,
    InvalidQueueNameError,
    PermissionDeniedError,
    QueueNotFoundError,
    SqlQueueError,
    TransportUnavailableError,
)
from . import Dialect

#: SQL Server identifiers (sysname) hold at most 128 characters.
MAX_IDENTIFIER_CHARS = 128
#: The in-flight table keys claims by the queue's canonical address in an nvarchar(450) column
#: (the widest an index key can be everywhere).
MAX_ADDRESS_CHARS = 450
#: SQL Server caps one statement at 2,100 parameters; 4 per message leaves room for 500 rows.
ROWS_PER_INSERT = 500

_UTC_NOW = "GETUTCDATE()"  # datetime, the type and clock NServiceBus compares Expires with
_LEASE_NOW = "SYSUTCDATETIME()"  # datetime2 for leases: finer than datetime's 3.33 ms steps

#: Transaction control: sessions keep the connection in autocommit mode and open a transaction
#: only around an operation, so nothing stays open between calls.
BEGIN_TRANSACTION = "BEGIN TRANSACTION"
COMMIT_TRANSACTION = "COMMIT TRANSACTION"
ROLLBACK_TRANSACTION = "ROLLBACK TRANSACTION"
#: Run once per connection. With XACT_ABORT ON the server rolls the whole transaction back on any
#: error, including a client-side timeout (an attention), which would otherwise leave it open and
#: holding the rows it deleted.
SESSION_SETUP = ("SET XACT_ABORT ON",)

_ERROR_NUMBER = re.compile(r"\((\d+)\)")
_CONNECTION_LOST_STATES = ("08", "HYT")  # ODBC: connection exceptions and timeouts
_PERMISSION_NUMBERS = {229, 230, 262, 297, 300, 1088}  # object/statement permission denied
_RETRYABLE_NUMBERS = {
    1205,  # chosen as deadlock victim
    -2,  # client timeout
    233,  # no process on the other end of the pipe
    10053,
    10054,
    10060,  # network errors
    40197,
    40501,
    40613,  # Azure SQL: service busy / database unavailable
}


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
    """``now`` plus a bigint number of milliseconds, without DATEADD's int overflow past 24.8 days."""
    return f"DATEADD(millisecond, {expression} %% 1000, DATEADD(second, {expression} / 1000, {now}))"


class SqlServerDialect(Dialect):
    """NServiceBus-compatible queue tables on SQL Server, driven through pymssql or pyodbc."""

    name = "sqlserver"
    default_schema = "dbo"
    required_columns = ("id", "recoverable", "expires", "headers", "body", "rowversion")

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
            parts = [None] * (3 - len(parts)) + parts  # type: ignore[list-item]
            address = QueueAddress(parts[2], parts[1], parts[0])  # type: ignore[arg-type]
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

    def _app_lock(self, address: QueueAddress) -> str:
        """Serialise concurrent installers of one table until their transaction ends.

        The resource is a digest of the qualified name: always within sp_getapplock's 255
        characters, and no user text in the statement.
        """
        digest = hashlib.sha256(self.qualified_name(address).encode("utf-8")).hexdigest()[:40]
        return (
            f"EXEC sp_getapplock @Resource = N'sqlqueue_{digest}', @LockMode = N'Exclusive', "
            "@LockOwner = N'Transaction'"
        )

    def _if_no_index(self, address: QueueAddress, index: str) -> str:
        return (
            f"IF NOT EXISTS (SELECT 1 FROM {self._catalog_prefix(address)}sys.indexes "
            f"WHERE object_id = OBJECT_ID({self._object_name(address)}) AND name = N'{index}') "
        )

    # -- installation --------------------------------------------------------------------------

    def create_queue(self, address: QueueAddress) -> Sequence[str]:
        q = self.qualified_name(address)
        return [
            self._app_lock(address),
            f"IF OBJECT_ID({self._object_name(address)}, N'U') IS NULL CREATE TABLE {q} ("
            "Id uniqueidentifier NOT NULL, "
            "CorrelationId varchar(255) NULL, "
            "ReplyToAddress varchar(255) NULL, "
            "Recoverable bit NOT NULL, "
            "Expires datetime NULL, "
            "Headers nvarchar(max) NOT NULL, "
            "Body varbinary(max) NULL, "
            "RowVersion bigint IDENTITY(1,1) NOT NULL)",
            # A heap with a nonclustered RowVersion index, as current NServiceBus creates it: a
            # clustered index on an ever-increasing key puts every insert on the same last page,
            # and senders then queue up on that page's latch. Receivers find the oldest row
            # through this index either way.
            self._if_no_index(address, "Index_RowVersion")
            + f"CREATE NONCLUSTERED INDEX [Index_RowVersion] ON {q} (RowVersion)",
        ]

    def add_body_string(self, address: QueueAddress) -> str:
        return (
            f"IF COL_LENGTH({self._object_name(address)}, N'BodyString') IS NULL "
            f"ALTER TABLE {self.qualified_name(address)} ADD BodyString AS CAST(Body AS nvarchar(max))"
        )

    def create_inflight(self, address: QueueAddress) -> Sequence[str]:
        inflight = self.inflight_address(address)
        f = self.qualified_name(inflight)
        return [
            self._app_lock(inflight),
            f"IF OBJECT_ID({self._object_name(inflight)}, N'U') IS NULL CREATE TABLE {f} ("
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
            "Holder nvarchar(400) NULL)",
            # Tables created before hand-off reservations existed lack Holder.
            f"IF COL_LENGTH({self._object_name(inflight)}, N'Holder') IS NULL ALTER TABLE {f} ADD Holder nvarchar(400) NULL",
            self._if_no_index(inflight, "Index_Token") + f"CREATE UNIQUE NONCLUSTERED INDEX [Index_Token] ON {f} (Token)",
            self._if_no_index(inflight, "Index_Lease")
            + f"CREATE NONCLUSTERED INDEX [Index_Lease] ON {f} (Queue, LeaseUntil)",
        ]

    def drop_queue(self, address: QueueAddress) -> str:
        return f"DROP TABLE IF EXISTS {self.qualified_name(address)}"

    # -- inspection ----------------------------------------------------------------------------

    def queue_columns(self, address: QueueAddress) -> str:
        c = self._catalog_prefix(address)
        return (
            f"SELECT LOWER(col.name), typ.name FROM {c}sys.columns AS col "
            f"JOIN {c}sys.types AS typ ON typ.user_type_id = col.user_type_id "
            f"JOIN {c}sys.tables AS tab ON tab.object_id = col.object_id "
            f"JOIN {c}sys.schemas AS sch ON sch.schema_id = tab.schema_id "
            "WHERE sch.name = %s AND tab.name = %s ORDER BY col.column_id"
        )

    def has_expires_index(self, address: QueueAddress) -> str:
        c = self._catalog_prefix(address)
        return (
            "SELECT CASE WHEN EXISTS (SELECT 1 "
            f"FROM {c}sys.index_columns AS ic "
            f"JOIN {c}sys.columns AS col ON col.object_id = ic.object_id AND col.column_id = ic.column_id "
            f"JOIN {c}sys.tables AS tab ON tab.object_id = ic.object_id "
            f"JOIN {c}sys.schemas AS sch ON sch.schema_id = tab.schema_id "
            "WHERE sch.name = %s AND tab.name = %s AND ic.key_ordinal = 1 AND col.name = N'Expires') "
            "THEN 1 ELSE 0 END"
        )

    def expires_index_ddl(self, address: QueueAddress) -> str:
        return self._if_no_index(address, "Index_Expires") + (
            f"CREATE NONCLUSTERED INDEX [Index_Expires] ON {self.qualified_name(address)} (Expires) "
            "INCLUDE (Id, RowVersion) WHERE Expires IS NOT NULL"
        )

    # -- runtime -------------------------------------------------------------------------------

    def _insert_values(self, address: QueueAddress, count: int) -> str:
        # Rows are numbered and inserted ORDER BY that number: SQL Server then assigns RowVersion
        # in batch order, so a batch keeps its FIFO order.
        values = ", ".join(f"({n}, %s, CAST(%s AS bigint), %s, %s)" for n in range(1, count + 1))
        return (
            f"INSERT INTO {self.qualified_name(address)} (Id, Recoverable, Expires, Headers, Body) "
            f"SELECT v.Id, 1, {_after_ms('v.Ttbr', _UTC_NOW)}, v.Headers, v.Body "
            f"FROM (VALUES {values}) AS v(Ord, Id, Ttbr, Headers, Body) ORDER BY v.Ord"
        )

    def send(self, address: QueueAddress) -> str:
        return self._insert_values(address, 1)

    def send_batch(self, address: QueueAddress, count: int) -> tuple[str, int]:
        rows = min(count, ROWS_PER_INSERT)
        return self._insert_values(address, rows), rows

    def send_batch_params(self, rows: Sequence[tuple[object, ...]]) -> tuple[object, ...]:
        return tuple(value for row in rows for value in row)

    def _expired(self, alias: str) -> str:
        return f"CASE WHEN {alias}.Expires IS NOT NULL AND {alias}.Expires <= {_UTC_NOW} THEN 1 ELSE 0 END"

    def receive(self, address: QueueAddress) -> str:
        # UPDLOCK + READPAST + ROWLOCK: each receiver locks the oldest rows nobody else holds and
        # skips the rest, so competing receivers never wait on or return each other's rows.
        return (
            f"WITH message AS (SELECT TOP (%s) * FROM {self.qualified_name(address)} "
            "WITH (UPDLOCK, READPAST, ROWLOCK) ORDER BY RowVersion) "
            f"DELETE FROM message OUTPUT deleted.Id, {self._expired('deleted')}, deleted.Headers, deleted.Body, "
            "deleted.RowVersion"
        )

    def peek(self, address: QueueAddress) -> str:
        # MIN and MAX come off Index_RowVersion: constant time on any queue size, where COUNT
        # would scan. READPAST leaves out rows receivers hold.
        return (
            "SELECT ISNULL(MAX(RowVersion) - MIN(RowVersion) + 1, 0) "
            f"FROM {self.qualified_name(address)} WITH (READPAST, READCOMMITTEDLOCK)"
        )

    def depth(self, address: QueueAddress) -> str:
        return f"SELECT COUNT_BIG(*) FROM {self.qualified_name(address)} WITH (READPAST)"

    def purge_expired(self, address: QueueAddress) -> str:
        return (
            f"WITH expired AS (SELECT TOP (%s) * FROM {self.qualified_name(address)} "
            f"WITH (UPDLOCK, READPAST, ROWLOCK) WHERE Expires < {_UTC_NOW}) DELETE FROM expired"
        )

    def purge_all(self, address: QueueAddress) -> str:
        return f"DELETE FROM {self.qualified_name(address)}"

    def insert_error(self, error_address: QueueAddress) -> str:
        return (
            f"INSERT INTO {self.qualified_name(error_address)} (Id, Recoverable, Expires, Headers, Body) "
            "VALUES (%s, 1, NULL, %s, %s)"
        )

    def browse(self, address: QueueAddress) -> str:
        return (
            f"SELECT TOP (%s) Id, Headers, Body FROM {self.qualified_name(address)} WITH (READPAST) "
            f"WHERE Expires IS NULL OR Expires > {_UTC_NOW} ORDER BY RowVersion"
        )

    def peek_error_rows(self, error_address: QueueAddress) -> str:
        return (
            f"SELECT TOP (%s) RowVersion, Id, Headers, Body FROM {self.qualified_name(error_address)} "
            "WITH (UPDLOCK, READPAST, ROWLOCK) ORDER BY RowVersion"
        )

    def delete_by_seq(self, address: QueueAddress) -> str:
        return f"DELETE FROM {self.qualified_name(address)} WHERE RowVersion = %s"

    def send_raw(self, address: QueueAddress) -> str:
        return self.insert_error(address)

    # -- claim mode ----------------------------------------------------------------------------

    def claim(self, address: QueueAddress) -> str:
        q = self.qualified_name(address)
        f = self.qualified_name(self.inflight_address(address))
        # One batch: delete the oldest unlocked rows into a table variable, move the unexpired ones
        # into the in-flight table, and return them together with the ids of the expired ones
        # (token NULL), which are just gone; one clock reading decides which is which.
        return (
            "DECLARE @limit int = %s, @queue nvarchar(450) = %s, @deliveries int = %s, @lease_ms bigint = %s, "
            f"@holder nvarchar(400) = %s, @now datetime = {_UTC_NOW}; "
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
            "SELECT NEWID(), @queue, t.Id, t.Expires, COALESCE(t.Headers, N''), t.Body, t.Seq, @deliveries, "
            f"{_after_ms('@lease_ms', _LEASE_NOW)}, @holder FROM @taken AS t "
            "WHERE t.Expires IS NULL OR t.Expires > @now; "
            "SELECT c.Token, c.Id, c.Headers, c.Body, c.Deliveries, c.Seq FROM @claimed AS c "
            "UNION ALL SELECT NULL, t.Id, NULL, NULL, 0, t.Seq FROM @taken AS t "
            "WHERE t.Expires IS NOT NULL AND t.Expires <= @now"
        )

    def reclaim(self, address: QueueAddress) -> str:
        f = self.qualified_name(self.inflight_address(address))
        return (
            "DECLARE @deliveries int = %s, @lease_ms bigint = %s, @holder nvarchar(400) = %s, "
            "@queue nvarchar(450) = %s, @limit int = %s; "
            f"WITH lapsed AS (SELECT TOP (@limit) * FROM {f} WITH (UPDLOCK, READPAST, ROWLOCK) "
            f"WHERE Queue = @queue AND LeaseUntil <= {_LEASE_NOW} ORDER BY Seq) "
            "UPDATE lapsed SET Token = NEWID(), Deliveries = Deliveries + @deliveries, "
            f"LeaseUntil = {_after_ms('@lease_ms', _LEASE_NOW)}, Holder = @holder "
            f"OUTPUT inserted.Token, inserted.Id, {self._expired('inserted')}, inserted.Headers, inserted.Body, "
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

    def take(self, address: QueueAddress) -> str:
        f = self.qualified_name(self.inflight_address(address))
        return (
            "DECLARE @lease_ms bigint = %s, @holder nvarchar(400) = %s, @tokens nvarchar(max) = %s, "
            "@queue nvarchar(450) = %s; "
            + self._take_into(
                f"SELECT * FROM {f} WITH (UPDLOCK, ROWLOCK) WHERE Queue = @queue AND Holder IS NULL "
                f"AND Token IN ({_TOKENS})",
            )
        )

    def adopt(self, address: QueueAddress) -> str:
        f = self.qualified_name(self.inflight_address(address))
        return (
            "DECLARE @lease_ms bigint = %s, @holder nvarchar(400) = %s, @queue nvarchar(450) = %s, @limit int = %s; "
            + self._take_into(
                f"SELECT TOP (@limit) * FROM {f} WITH (UPDLOCK, READPAST, ROWLOCK) "
                "WHERE Queue = @queue AND Holder IS NULL ORDER BY Seq",
            )
        )

    def peek_with_claims(self, address: QueueAddress) -> str:
        f = self.qualified_name(self.inflight_address(address))
        return (
            f"SELECT ({self.peek(address)}) + "
            f"(SELECT COUNT_BIG(*) FROM {f} WITH (READPAST) WHERE Queue = %s AND LeaseUntil <= {_LEASE_NOW})"
        )

    def count_inflight(self, address: QueueAddress) -> str:
        f = self.qualified_name(self.inflight_address(address))
        return f"SELECT COUNT_BIG(*) FROM {f} WITH (READPAST) WHERE Queue = %s"

    def token_list(self, tokens: Sequence[uuid.UUID]) -> object:
        # A JSON array of token strings, opened server side with OPENJSON (SQL Server 2016+).
        return json.dumps([str(token) for token in tokens])

    def ack(self, address: QueueAddress) -> str:
        f = self.qualified_name(self.inflight_address(address))
        return (
            "DECLARE @tokens nvarchar(max) = %s, @queue nvarchar(450) = %s; "
            f"WITH settled AS (SELECT * FROM {f} WHERE Queue = @queue AND Token IN ({_TOKENS})) "
            "DELETE FROM settled OUTPUT deleted.Token"
        )

    def nack(self, address: QueueAddress) -> str:
        f = self.qualified_name(self.inflight_address(address))
        return (
            "DECLARE @delay_ms bigint = %s, @error nvarchar(max) = %s, @tokens nvarchar(max) = %s, "
            "@queue nvarchar(450) = %s; "
            f"WITH given AS (SELECT * FROM {f} WHERE Queue = @queue AND Token IN ({_TOKENS})) "
            f"UPDATE given SET LeaseUntil = {_after_ms('@delay_ms', _LEASE_NOW)}, LastError = @error "
            "OUTPUT inserted.Token"
        )

    def extend(self, address: QueueAddress) -> str:
        f = self.qualified_name(self.inflight_address(address))
        return (
            "DECLARE @lease_ms bigint = %s, @tokens nvarchar(max) = %s, @queue nvarchar(450) = %s; "
            f"WITH held AS (SELECT * FROM {f} WHERE Queue = @queue AND Token IN ({_TOKENS})) "
            f"UPDATE held SET LeaseUntil = {_after_ms('@lease_ms', _LEASE_NOW)} OUTPUT inserted.Token"
        )

    def claim_to_error(self, address: QueueAddress, error_address: QueueAddress) -> str:
        f = self.qualified_name(self.inflight_address(address))
        e = self.qualified_name(error_address)
        return (
            "DECLARE @token uniqueidentifier = %s, @headers nvarchar(max) = %s; "
            "DECLARE @moved TABLE (Id uniqueidentifier, Body varbinary(max)); "
            f"WITH claimed AS (SELECT * FROM {f} WHERE Token = @token) "
            "DELETE FROM claimed OUTPUT deleted.Id, deleted.Body INTO @moved; "
            f"INSERT INTO {e} (Id, Recoverable, Expires, Headers, Body) SELECT m.Id, 1, NULL, @headers, m.Body "
            "FROM @moved AS m"
        )

    # -- errors --------------------------------------------------------------------------------

    def translate_error(self, exc: BaseException, address: str) -> SqlQueueError | None:
        number, sqlstate = _error_number(exc), _sqlstate(exc)
        text = _error_text(exc)
        if number == 208 or sqlstate == "42S02":  # invalid object name
            return QueueNotFoundError(address, text)
        if number == 2760:  # the schema does not exist (or is not visible to this login)
            return QueueNotFoundError(address, text)
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
        if number in _RETRYABLE_NUMBERS or (sqlstate is not None and sqlstate.startswith(_CONNECTION_LOST_STATES)):
            return TransportUnavailableError(f"database unavailable while working on {address}: {text}")
        driver = type(exc).__module__.split(".", 1)[0]
        if driver in ("pymssql", "pyodbc") and type(exc).__name__ in ("OperationalError", "InterfaceError"):
            return TransportUnavailableError(f"database unavailable while working on {address}: {text}")
        return None


def _error_args(exc: BaseException) -> tuple[object, ...]:
    """The driver's arguments: pymssql gives ``(number, bytes)`` (sometimes wrapped in a 1-tuple), pyodbc ``(sqlstate, text)``."""
    args = tuple(getattr(exc, "args", ()))
    if len(args) == 1 and isinstance(args[0], tuple):
        args = args[0]
    return args


def _error_text(exc: BaseException) -> str:
    args = _error_args(exc)
    if len(args) >= 2 and isinstance(args[1], bytes):
        return args[1].decode("utf-8", "replace").strip()
    if len(args) >= 2 and isinstance(args[1], str):
        return args[1].strip()
    return str(exc).strip()


def _error_number(exc: BaseException) -> int | None:
    """SQL Server's error number: pymssql's ``number`` or first argument, or ``(208)`` in pyodbc's text."""
    number = getattr(exc, "number", None)
    if isinstance(number, int):
        return number
    args = _error_args(exc)
    if args and isinstance(args[0], int):
        return args[0]
    match = _ERROR_NUMBER.search(_error_text(exc))
    return int(match.group(1)) if match else None


def _sqlstate(exc: BaseException) -> str | None:
    """pyodbc's SQLSTATE (its first argument), else None."""
    args = _error_args(exc)
    if args and isinstance(args[0], str) and re.fullmatch(r"[0-9A-Z]{5}", args[0]):
        return args[0]
    return None
