"""PostgreSQL: every SQL statement the transport runs on PostgreSQL (13 or newer), in one place.

The queue table is NServiceBus's PostgreSQL transport table: ``Id uuid`` primary key,
``Expires timestamp`` (UTC, no time zone), ``Headers text``, ``Body bytea``, ``Seq serial``. Column
names are unquoted -- PostgreSQL folds them to lower case, which is what NServiceBus reads -- and
the table name is always a quoted identifier, so its case and any odd characters are kept and
never read as SQL.

Statements use psycopg's named ``%(name)s`` placeholders; a literal ``%`` in a quoted identifier is doubled so
that a table named ``50%`` cannot be mistaken for a placeholder.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from ..addressing import QueueAddress, split_outside, unquote
from ..errors import (
    DuplicateMessageError,
    InvalidArgumentError,
    InvalidQueueNameError,
    LockTimeoutError,
    NotAQueueError,
    ObjectExistsError,
    PermissionDeniedError,
    QueueNotFoundError,
    SqlQueueError,
    StatementRejectedError,
    StorageFullError,
    TransactionAbortedError,
    TransportMisconfiguredError,
    TransportUnavailableError,
)
from .base import Dialect, SendRow, TableShape

#: PostgreSQL's identifiers are at most 63 bytes (longer ones are cut short without a word).
MAX_IDENTIFIER_BYTES = 63
#: The longest name of a queue's table (a queue, its delayed table): the names derived from it, its Seq
#: column's sequence ``<table>_seq_seq`` and its index ``<table>_Expires``, are 8 bytes longer and must
#: still fit in 63. NServiceBus's PostgreSQL transport keeps the same limit. A queue with a delayed table
#: (``<queue>.Delayed``, 8 bytes more) may therefore have a name of at most 47 bytes.
MAX_TABLE_BYTES = 55

_UTC_NOW = "(now() AT TIME ZONE 'UTC')"
#: A queue's claims whose lease ended within the last %(lapsed_ms)s (see transport/heads.py: the
#: range of the lease index a look walks, dead entries of settled claims included).
_LAPSED = (
    f"Queue = %(queue)s AND LeaseUntil <= {_UTC_NOW} "
    f"AND LeaseUntil > {_UTC_NOW} - %(lapsed_ms)s::bigint * interval '1 millisecond'"
)
#: Claims named by token: found through the primary key alone. A plain ``Queue = %(queue)s`` lets
#: the planner, on stale statistics, AND in the (Queue, ...) indexes, whose entries for a busy queue
#: include every claim settled since vacuum last ran; ``IS TRUE`` keeps the queue check a filter.
_BY_TOKENS = "Token = ANY(%(tokens)s::uuid[]) AND (Queue = %(queue)s) IS TRUE"
#: The rows the transaction %(locked_by)s (an xid8) holds locked: its id in xmax, 32 bits of it.
_LOCKED_BY = "xmax = %(locked_by)s::text::xid8::xid"
#: Connection errors that retrying cannot fix, by SQLSTATE.
#: Not a SQLSTATE: connection settings libpq refuses before it reaches any server.
SETTINGS = "settings"
#: SQLSTATEs that end the caller's transaction, and what each tells the caller (``address``, ``detail``).
_ABORTED = {
    # idle_in_transaction_session_timeout: the server ended the session the code idled in
    "25P03": (
        "the server ended the session working on {address}: its transaction stayed idle longer than "
        "idle_in_transaction_session_timeout; a native-mode handler must finish within it (or the role's "
        "setting must be raised). The transaction was rolled back ({detail})"
    ),
    # in_failed_sql_transaction: an error the caller caught aborted the transaction
    "25P02": (
        "the transaction working on {address} was aborted by an earlier error that was caught: nothing more "
        "runs in it and nothing done in it can commit; roll it back ({detail})"
    ),
    # invalid_savepoint_specification: a nested block's savepoint went with its transaction
    "3B001": (
        "the code inside a nested transaction block ended the transaction it was nested in (COMMIT or "
        "ROLLBACK on the connection), and the block's savepoint with it: the block's work cannot be kept "
        "or undone on its own; leave ending the transaction to the outermost block ({detail})"
    ),
}
_MISCONFIGURED = {
    SETTINGS: "connection settings libpq cannot use",
    "28000": "invalid authorization: unknown role, or not allowed by pg_hba.conf",
    "28P01": "wrong password",
    "3D000": "unknown database",
}
#: SQLSTATE too_many_connections: no connection slot was free.
TOO_MANY_CONNECTIONS = "53300"
#: The SQLSTATEs of refused connections (the misconfigurations above, and no slot free), recognised
#: in the server's FATAL message: libpq reports no SQLSTATE for a refused connection. These are the
#: server's English texts; with other lc_messages the error stays "unavailable" (retried), in words
#: less precise.
_CONNECT_TEXT = (
    (re.compile(r'FATAL:\s+role "[^"]*" does not exist'), "28000"),
    (re.compile(r'FATAL:\s+role "[^"]*" is not permitted to log in'), "28000"),
    (re.compile(r"FATAL:\s+no pg_hba\.conf entry"), "28000"),
    (re.compile(r"FATAL:\s+password authentication failed"), "28P01"),
    (re.compile(r'FATAL:\s+database "[^"]*" does not exist'), "3D000"),
    # Settings libpq itself refuses before it connects: no server can make them work.
    (
        re.compile(r"invalid (sslmode|target_session_attrs|load_balance_hosts|gssencmode|channel_binding) value"),
        SETTINGS,
    ),
    (re.compile(r'invalid port number|invalid integer value "[^"]*" for connection option'), SETTINGS),
    (
        re.compile(r"invalid connection option|invalid percent-encoded token|end of string reached when looking"),
        SETTINGS,
    ),
    (re.compile(r"missing \"=\" after|unterminated quoted string in connection info"), SETTINGS),
    # Startup options (``options=-c ...``) the server refuses: FATAL before the session exists.
    (
        re.compile(
            r"FATAL:\s+(invalid value for parameter|unrecognized configuration parameter"
            r"|invalid command-line argument for server process)"
        ),
        SETTINGS,
    ),
    # sslmode=require (or stricter) against a server without SSL: the setting must change.
    (re.compile(r"server does not support SSL, but SSL was required"), SETTINGS),
    # No connection slot free (too_many_connections): max_connections, or a role's or database's
    # CONNECTION LIMIT. Not a misconfiguration: a slot frees when another session closes.
    (
        re.compile(
            r"FATAL:\s+(too many connections for (role|database)|sorry, too many clients already"
            r"|remaining connection slots are reserved)"
        ),
        TOO_MANY_CONNECTIONS,
    ),
)
_CANONICAL = re.compile(r'^(?P<table>.+)@(?P<schema>"(?:[^"]|"")+")$', re.DOTALL)


#: The open transaction's start, in whole microseconds since the epoch: what identifies a block's
#: transaction on its session (see :func:`check_started_sql`).
_STARTED = "(extract(epoch FROM transaction_timestamp()) * 1000000)::bigint"

#: No params -> one row: when the open transaction started (read with BEGIN, in the same message).
TRANSACTION_STARTED_SQL = f"SELECT {_STARTED}"


def check_started_sql(started: int) -> str:
    """Fail unless the open transaction is the one that started at ``started``
    (:data:`TRANSACTION_STARTED_SQL`), with :data:`NOT_THE_SAME_TRANSACTION` in the error's text (no
    error of the caller's own work, such as a deferred trigger's at COMMIT, carries it). Sent with
    COMMIT in one message, a failure leaves the COMMIT after it unrun and the transaction aborted, to
    be rolled back.

    A transaction's start is the time of its first statement and no statement can change it
    (``RESET ALL`` included); one the code inside a block begins after ending the block's own
    (``ROLLBACK; BEGIN``) starts at least a round trip to the client later. Inlined (a whole
    number): the check travels with COMMIT in a message without parameters. The failing branch is
    not a constant, so the planner cannot fold it into an error of every check."""
    if isinstance(started, bool) or not isinstance(started, int):
        raise TypeError("a transaction's start is a whole number of microseconds")
    return (
        f"SELECT CASE WHEN {_STARTED} = {started} THEN 1 "
        f"ELSE ('{NOT_THE_SAME_TRANSACTION}, started at ' || {_STARTED})::int END"
    )


#: In the text of the error of a failed check of :func:`check_started_sql` (SQLSTATE 22P02, as the
#: integer it could not read).
NOT_THE_SAME_TRANSACTION = "sqlqueue: the open transaction is not the one the block began"


#: Where the server points into the statement it refused (``LINE 1: SELECT ...`` and a caret under
#: it): the library's own SQL, of no use to whoever reads the error.
_QUERY_EXCERPT = re.compile(r"^LINE \d+: .*\n *\^ *$", re.MULTILINE)

#: psycopg's ``IsolationLevel`` values (the DB-API's numbers), as PostgreSQL names the levels.
_ISOLATION_LEVELS = {1: "READ UNCOMMITTED", 2: "READ COMMITTED", 3: "REPEATABLE READ", 4: "SERIALIZABLE"}


def transaction_characteristics_sql(
    isolation_level: int | None, read_only: bool | None, deferrable: bool | None
) -> str:
    """What follows BEGIN for a connection's ``isolation_level``, ``read_only`` and ``deferrable``
    (psycopg's attributes; None: the session's default), as psycopg's own blocks begin: a borrowed
    connection set to SERIALIZABLE runs the library's blocks SERIALIZABLE too. Only these fixed
    words are written, whatever the values are."""
    words = []
    if isolation_level is not None:
        words.append(f" ISOLATION LEVEL {_ISOLATION_LEVELS[int(isolation_level)]}")
    if read_only is not None:
        words.append(" READ ONLY" if read_only else " READ WRITE")
    if deferrable is not None:
        words.append(" DEFERRABLE" if deferrable else " NOT DEFERRABLE")
    return "".join(words)


#: SQLSTATE classes of errors the work in a transaction causes at its COMMIT: a deferred trigger's
#: (09 triggered action, 2F/38/39 routines, P0 RAISE, 42 its own statements), a deferred constraint's
#: (22 data, 23 integrity, 27 triggered data change, 44 check option), a conflict lost (40).
_WORK_FAILURE_CLASSES = ("09", "22", "23", "27", "2F", "38", "39", "40", "42", "44", "P0")
#: ... and single conditions: the session idled in the transaction too long (25P03), a deferred
#: trigger's lock timed out (55P03).
_WORK_FAILURES = ("25P03", "55P03")


def the_works_failure(sqlstate: str | None) -> bool:
    """Whether an error at the COMMIT of a block that ran the caller's code is that work's own (it
    could not commit: the delivery failed), rather than the database's (lost, out of memory or disk,
    shutting down, a statement cancelled: an outage to back off from)."""
    return sqlstate is not None and (sqlstate[:2] in _WORK_FAILURE_CLASSES or sqlstate in _WORK_FAILURES)


def connection_lost(sqlstate: str | None) -> bool:
    """Whether an error's SQLSTATE says the connection is gone (class 08) or the server is shutting
    down: an outage, whatever statement was running."""
    return sqlstate is not None and (sqlstate.startswith("08") or sqlstate in ("57P01", "57P02", "57P03"))


def quote_ident(name: str) -> str:
    """A PostgreSQL quoted identifier (``"`` doubled), with ``%`` doubled for psycopg's placeholder parser."""
    return '"' + name.replace('"', '""').replace("%", "%%") + '"'


def _dollar_quoted(body: str) -> str:
    """``body`` between dollar quotes whose tag it does not contain, so no text in it can end the quote."""
    tag = "grant"
    while f"${tag}$" in body:
        tag += "_"
    return f"${tag}$ {body} ${tag}$"


def quote_literal(text: str) -> str:
    """A PostgreSQL string literal, for the one place a name must appear as text (the advisory lock key)."""
    return "'" + text.replace("'", "''").replace("%", "%%") + "'"


#: A column's type as the catalog queries report it. ``Seq`` without a default (a sequence or an
#: identity) is reported as another type: rows sent to such a table get no Seq, and no receive,
#: which reads in Seq order, would ever see them. format_type's quotes are dropped: a session with
#: ``quote_all_identifiers`` on would name every type quoted ("uuid"), and no table would be a queue.
_TYPE_NAME = "replace(format_type(a.atttypid, NULL), '\"', '')"
_COLUMN_TYPE = (
    "CASE WHEN a.attname = 'seq' AND NOT (a.atthasdef OR a.attidentity <> '') "
    f"THEN {_TYPE_NAME} || ' without a default' ELSE {_TYPE_NAME} END"
)

#: What a connection the library opened is switched to when a role's or the URI's setting chose
#: another client encoding: names, headers and failure text travel as UTF-8.
CLIENT_ENCODING_SQL = "SET client_encoding TO 'UTF8'"


class PostgresDialect(Dialect):
    """NServiceBus-compatible queue tables on PostgreSQL, driven through psycopg 3."""

    name = "postgres"
    walks_dead_rows = True
    one_statement_sends = True  # a batch travels as arrays, unnested by one INSERT
    begin_sql = "BEGIN"
    script_separator = ";\n\n"
    commit_sql = "COMMIT"
    rollback_sql = "ROLLBACK"
    default_schema = "public"
    column_types: ClassVar[Mapping[str, tuple[str, ...]]] = {
        "id": ("uuid",),
        "expires": ("timestamp without time zone", "timestamp with time zone"),
        "headers": ("text", "character varying"),
        "body": ("bytea",),
        "seq": ("integer", "bigint"),
    }

    # -- addressing ---------------------------------------------------------------------------

    def validate_address(self, address: QueueAddress) -> None:
        size = len(address.table.encode("utf-8"))
        if size > MAX_TABLE_BYTES:
            raise InvalidQueueNameError(
                f"table name {address.table!r} is {size} bytes in UTF-8; a PostgreSQL queue's table names are "
                f"limited to {MAX_TABLE_BYTES} bytes so that the names derived from them ('<table>_seq_seq', "
                f"'<table>_Expires') fit in PostgreSQL's {MAX_IDENTIFIER_BYTES}-byte identifiers"
            )
        if address.schema is not None and len(address.schema.encode("utf-8")) > MAX_IDENTIFIER_BYTES:
            raise InvalidQueueNameError(f"schema name {address.schema!r} is over {MAX_IDENTIFIER_BYTES} bytes")
        if address.catalog is not None:
            raise InvalidQueueNameError(
                f"PostgreSQL queues cannot name a catalog (got {address.catalog!r}); connect to that database instead"
            )

    def parse_address(self, text: str) -> QueueAddress:
        """Accept ``table@"schema"`` (NServiceBus's canonical form), ``"schema"."table"``, ``schema.table``, ``table``.

        A table name containing a dot (a secondary queue ``Endpoint.Machine``) must be quoted in the
        dotted forms: ``"Endpoint.Machine"``.
        """
        match = _CANONICAL.match(text)
        if match:
            address = QueueAddress(match["table"], unquote(match["schema"], '"', '"'))
        else:
            parts = split_outside(text, ".", '"', '"')
            if len(parts) == 1:
                address = QueueAddress(unquote(parts[0], '"', '"'))
            elif len(parts) == 2:
                address = QueueAddress(unquote(parts[1], '"', '"'), unquote(parts[0], '"', '"'))
            else:
                raise InvalidQueueNameError(
                    f"address {text!r} has more than schema.table; quote a table name that contains dots"
                )
        self.validate_address(address)
        return address

    def format_address(self, address: QueueAddress) -> str:
        schema = address.schema or self.default_schema
        return address.table + "@" + '"' + schema.replace('"', '""') + '"'

    def qualified_name(self, address: QueueAddress) -> str:
        self.validate_address(address)
        return quote_ident(address.schema or self.default_schema) + "." + quote_ident(address.table)

    # -- installation --------------------------------------------------------------------------

    def install_lock_sql(self, address: QueueAddress) -> str:
        # Serialise concurrent installers of the same table: CREATE ... IF NOT EXISTS alone can
        # still fail with a unique violation in pg_type when two sessions race.
        return f"SELECT pg_advisory_xact_lock(hashtext('sqlqueue'), hashtext({quote_literal(self.qualified_name(address))}))"

    def current_catalog_sql(self) -> str:
        return "SELECT current_database()"

    def create_queue_sql(self, address: QueueAddress) -> Sequence[str]:
        q = self.qualified_name(address)
        return [
            f"""CREATE TABLE IF NOT EXISTS {q} (
    Id uuid NOT NULL PRIMARY KEY,
    Expires timestamp,
    Headers text NOT NULL,
    Body bytea,
    Seq serial NOT NULL UNIQUE
)""",
            self.expires_index_ddl_sql(address),
        ]

    def add_body_string_sql(self, address: QueueAddress) -> str:
        return (
            f"ALTER TABLE {self.qualified_name(address)} ADD COLUMN IF NOT EXISTS BodyString text "
            "GENERATED ALWAYS AS (encode(Body, 'escape')) STORED"
        )

    def create_inflight_sql(self, address: QueueAddress) -> Sequence[str]:
        inflight = self.inflight_address(address)
        f = self.qualified_name(inflight)
        lease_index = quote_ident(inflight.table + "_lease")
        return [
            f"""CREATE TABLE IF NOT EXISTS {f} (
    Token uuid NOT NULL PRIMARY KEY,
    Queue text NOT NULL,
    Id uuid NOT NULL,
    Expires timestamp,
    Headers text NOT NULL,
    Body bytea,
    Seq bigint NOT NULL,
    Deliveries integer NOT NULL,
    LeaseUntil timestamp NOT NULL,
    LastError text,
    Holder text
)""",
            # Tables created before hand-off reservations existed lack Holder.
            f"ALTER TABLE {f} ADD COLUMN IF NOT EXISTS Holder text",
            f"CREATE INDEX IF NOT EXISTS {lease_index} ON {f} (Queue, LeaseUntil)",
            # Readers that find their claims again by holder (a Spark batch's claims), and takers of
            # a queue's reservations, oldest first. Partial, so that no statement that names only
            # the queue can use them: the lease index is the one such statements must use (an index
            # led by Queue alone walks every claim the queue had since vacuum last ran).
            f"CREATE INDEX IF NOT EXISTS {quote_ident(inflight.table + '_held')} ON {f} (Holder) WHERE Holder IS NOT NULL",
            f"CREATE INDEX IF NOT EXISTS {quote_ident(inflight.table + '_reserved')} ON {f} (Queue, Seq) WHERE Holder IS NULL",
            # Stores made by earlier versions had one index on (Queue, Holder) for both.
            f"DROP INDEX IF EXISTS {self.qualified_name(QueueAddress(inflight.table + '_holder', inflight.schema))}",
        ]

    def named_indexes(self, kind: str, table: QueueAddress) -> list[QueueAddress]:
        # What the create statements name (the implicit _pkey, _seq_seq and _seq_key names PostgreSQL
        # chooses itself, around any name already taken); the claim store's _holder is dropped by name.
        suffixes = {"queue": ["_Expires"], "inflight": ["_lease", "_held", "_reserved", "_holder"], "delayed": ["_Due"]}
        return [table.sibling(table.table + suffix) for suffix in suffixes.get(kind, [])]

    def index_name_holder_sql(self) -> str:
        return (
            "SELECT t.relname IS NOT DISTINCT FROM %(on)s AND c.relkind = 'i', "
            "CASE WHEN c.relkind = 'i' THEN 'an index on ' || quote_ident(t.relname) ELSE 'a table' END "
            "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "LEFT JOIN pg_index i ON i.indexrelid = c.oid LEFT JOIN pg_class t ON t.oid = i.indrelid "
            "WHERE n.nspname = %(schema)s AND c.relname = %(table)s"
        )

    def create_delayed_sql(self, delayed: QueueAddress) -> Sequence[str]:
        d = self.qualified_name(delayed)
        # NServiceBus's columns and types; its index on Due is UNIQUE, which makes two messages
        # stored for the same instant collide (one of them fails). This one is not unique, and
        # both transports read and write either kind.
        return [
            f"""CREATE TABLE IF NOT EXISTS {d} (
    Id uuid NOT NULL DEFAULT gen_random_uuid() PRIMARY KEY,
    Headers text NOT NULL,
    Body bytea,
    Due timestamptz NOT NULL
)""",
            f"CREATE INDEX IF NOT EXISTS {quote_ident(delayed.table + '_Due')} ON {d} (Due)",
        ]

    def create_subscriptions_sql(self, table: QueueAddress) -> Sequence[str]:
        return [
            f"""CREATE TABLE IF NOT EXISTS {self.qualified_name(table)} (
    QueueAddress varchar(200) NOT NULL,
    Endpoint varchar(200) NOT NULL,
    Topic varchar(200) NOT NULL,
    PRIMARY KEY (Endpoint, Topic)
)"""
        ]

    def validate_role(self, role: str) -> None:
        if len(role.encode("utf-8")) > MAX_IDENTIFIER_BYTES:
            raise InvalidArgumentError(
                f"role name {role[:40]!r}... is over {MAX_IDENTIFIER_BYTES} bytes: PostgreSQL would shorten it and "
                "grant to whichever role has the shortened name"
            )
        if role.lower() in ("public", "none", "current_user", "current_role", "session_user") or role.startswith("pg_"):
            raise InvalidArgumentError(
                f"role {role!r} is not a role of its own (public is every role; pg_ roles are PostgreSQL's): "
                "grant to the application's role"
            )

    def grant_schema_usage_sql(self, address: QueueAddress, role: str) -> Sequence[str]:
        return [f"GRANT USAGE ON SCHEMA {quote_ident(address.schema or self.default_schema)} TO {quote_ident(role)}"]

    def grant_runtime_sql(self, table: QueueAddress, role: str, *, sequence: bool) -> Sequence[str]:
        # UPDATE as well: FOR UPDATE SKIP LOCKED, which every receive and move takes, needs it.
        statements = [f"GRANT SELECT, INSERT, UPDATE, DELETE ON {self.qualified_name(table)} TO {quote_ident(role)}"]
        if sequence:
            # Seq is a serial: a send draws from its sequence, whose name PostgreSQL chose (and
            # may have shortened), so the server looks it up. format() quotes the role.
            name = self.qualified_name(table).replace("%%", "%")
            body = (
                "BEGIN EXECUTE format('GRANT USAGE ON SEQUENCE %%s TO %%I', "
                f"pg_get_serial_sequence({quote_literal(name)}, 'seq'), {quote_literal(role)}); END"
            )
            statements.append(f"DO {_dollar_quoted(body)}")
        return statements

    def drop_queue_sql(self, address: QueueAddress) -> str:
        return f"DROP TABLE IF EXISTS {self.qualified_name(address)}"

    # -- inspection ----------------------------------------------------------------------------

    def queue_columns_sql(self, address: QueueAddress) -> str:
        return (
            # Exact names: NServiceBus's unquoted columns are folded to lower case, so a quoted "Id" is another column.
            f"SELECT a.attname, {_COLUMN_TYPE} "
            "FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %(schema)s AND c.relname = %(table)s AND a.attnum > 0 AND NOT a.attisdropped "
            "ORDER BY a.attnum"
        )

    def schema_exists_sql(self, address: QueueAddress) -> str:
        return "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = %(schema)s)"

    def _queue_tables(self, condition: str) -> str:
        """The queue tables (a queue's columns and types; the claim stores left out) meeting ``condition``."""
        pairs = ", ".join(
            f"({quote_literal(name)}, {quote_literal(type_name)})"
            for name, accepted in self.column_types.items()
            for type_name in accepted
        )
        return (
            "SELECT n.oid AS nspoid, n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.relkind IN ('r', 'p') AND NOT starts_with(n.nspname, 'pg_') AND n.nspname <> 'information_schema' "
            f"AND c.relname <> {quote_literal(self.inflight_table)} AND {condition} "
            "AND (SELECT count(*) FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped "
            f"AND (a.attname::text, {_COLUMN_TYPE}) IN ({pairs})) = {len(self.column_types)}"
        )

    def unreadable_queues_sql(self) -> str:
        hidden = self._queue_tables("NOT has_table_privilege(c.oid, 'SELECT')")
        return (
            f"SELECT count(*), count(*) FILTER (WHERE NOT has_schema_privilege(nspoid, 'USAGE')) FROM ({hidden}) AS q"
        )

    def list_queues_sql(self) -> str:
        readable = self._queue_tables(
            "strpos(lower(n.nspname || '.' || c.relname), lower(%(search)s)) > 0 AND has_table_privilege(c.oid, 'SELECT')"
        )
        return (
            f"WITH q AS ({readable}) "
            "SELECT t.total, p.nspname, p.relname FROM (SELECT count(*) AS total FROM q) AS t LEFT JOIN "
            "(SELECT nspname, relname FROM q ORDER BY nspname, relname OFFSET %(offset)s LIMIT %(limit)s) AS p ON true "
            "ORDER BY p.nspname, p.relname"
        )

    def queue_figures_sql(self, address: QueueAddress) -> str:
        # Each figure comes off an index: the Seq range and the oldest row off the Seq index, expired
        # rows off the partial Expires index, and no more than %(limit)s of them are counted. Unlike a
        # receiver's peek it locks no row: a role with SELECT alone can watch, and a watcher inside a
        # transaction hides no message from receivers (rows being received count as waiting).
        q = self.qualified_name(address)
        return (
            f"SELECT (SELECT COALESCE(max(Seq) - min(Seq) + 1, 0)::bigint FROM {q}), "
            f"(SELECT Headers FROM {q} ORDER BY Seq LIMIT 1), "
            f"(SELECT count(*) FROM (SELECT 1 FROM {q} WHERE Expires < {_UTC_NOW} LIMIT %(limit)s) AS expired), "
            "s.n_dead_tup, greatest(s.last_vacuum, s.last_autovacuum) "
            f"FROM (SELECT) AS one LEFT JOIN pg_stat_all_tables AS s "
            f"ON s.relid = to_regclass({quote_literal(self.table_reference(address))})"
        )

    def delayed_figures_sql(self, delayed: QueueAddress) -> str:
        # Off the Due index from its start: what is due and has not moved is what an operator needs,
        # however far back (a mover's own looks cover only what came due recently; heads.py).
        d = self.qualified_name(delayed)
        return (
            f"SELECT (SELECT count(*) FROM (SELECT 1 FROM {d} WHERE Due < now() LIMIT %(limit)s) AS due), "
            f"(SELECT (EXTRACT(EPOCH FROM now() - min(Due)) * 1000)::bigint FROM {d} WHERE Due < now())"
        )

    def lock_timeout_sql(self) -> str:
        return "SELECT set_config('lock_timeout', %(ms)s, true)"

    def current_lock_timeout_sql(self) -> str:
        return "SELECT current_setting('lock_timeout')"

    def session_lock_timeout_sql(self, ms: int) -> str:
        return f"SET lock_timeout = {int(ms)}"

    def horizon_sql(self) -> str:
        # What vacuum of this database's tables waits for: a session of this database with a snapshot
        # or a transaction id of its own (idle in a transaction after a write has no snapshot, and
        # holds the horizon all the same), a walsender (a standby's hot_standby_feedback, for every
        # database), a prepared transaction of this database, a slot's xmin (catalog_xmin holds only
        # catalog tables back). Sessions of other roles show their state and start only to
        # pg_read_all_stats (superusers too).
        return (
            "SELECT h.holder, h.application, h.state, h.since, h.xid_age, "
            "pg_has_role(current_user, 'pg_read_all_stats', 'USAGE') "
            "FROM (SELECT) AS one LEFT JOIN ("
            "SELECT 'pid ' || pid AS holder, application_name AS application, coalesce(state, backend_type) AS state, "
            "xact_start AS since, greatest(age(backend_xmin), age(backend_xid)) AS xid_age FROM pg_stat_activity "
            "WHERE (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL) AND pid <> pg_backend_pid() "
            "AND (datname = current_database() OR backend_type = 'walsender') "
            "UNION ALL SELECT gid, 'prepared transaction', 'prepared', prepared, age(transaction) FROM pg_prepared_xacts "
            "WHERE database = current_database() "
            "UNION ALL SELECT slot_name, 'replication slot', 'replication slot', NULL, age(xmin) FROM pg_replication_slots "
            "WHERE xmin IS NOT NULL AND (database IS NULL OR database = current_database()) "
            "ORDER BY xid_age DESC LIMIT %(limit)s) AS h ON true ORDER BY h.xid_age DESC"
        )

    def has_expires_index_sql(self, address: QueueAddress) -> str:
        return (
            "SELECT EXISTS (SELECT 1 FROM pg_index i "
            "JOIN pg_class c ON c.oid = i.indrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
            "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0] "
            "WHERE n.nspname = %(schema)s AND c.relname = %(table)s AND a.attname = 'expires')"
        )

    def expires_index_ddl_sql(self, address: QueueAddress) -> str:
        index = quote_ident(address.table + "_Expires")
        return (
            f"CREATE INDEX IF NOT EXISTS {index} ON {self.qualified_name(address)} (Expires) WHERE Expires IS NOT NULL"
        )

    # -- runtime -------------------------------------------------------------------------------

    def send_sql(self, address: QueueAddress, shape: TableShape) -> str:
        return (
            f"INSERT INTO {self.qualified_name(address)} (Id, Expires, Headers, Body) "
            f"VALUES (%(id)s, {_UTC_NOW} + %(ttbr_ms)s::bigint * interval '1 millisecond', %(headers)s, %(body)s)"
        )

    def send_batch_sql(self, address: QueueAddress, count: int, shape: TableShape) -> str:
        # One statement for any number of rows: arrays are unnested server side, in order, so Seq
        # follows the order of the batch. The arrays travel in binary (%(name)b): text-format arrays of
        # JSON headers cost more to escape on the client than the insert costs the server.
        return (
            f"INSERT INTO {self.qualified_name(address)} (Id, Expires, Headers, Body) "
            f"SELECT m.id, {_UTC_NOW} + m.ttbr * interval '1 millisecond', m.headers, m.body "
            "FROM unnest(%(ids)b::uuid[], %(ttbrs_ms)b::bigint[], %(headers)b::text[], %(bodies)b::bytea[]) "
            "WITH ORDINALITY AS m(id, ttbr, headers, body, ord) ORDER BY m.ord"
        )

    def copy_send_sql(self, address: QueueAddress, shape: TableShape) -> tuple[str, tuple[str, ...]]:
        # The columns send_batch_sql fills but Expires (NULL: a copied message never expires); Seq
        # is the column's default, drawn in the order the rows are copied, as the INSERT's ORDER BY.
        return (
            f"COPY {self.qualified_name(address)} (Id, Headers, Body) FROM STDIN (FORMAT BINARY)",
            ("uuid", "text", "bytea"),
        )

    def copy_csv_sql(self, address: QueueAddress, shape: TableShape) -> str:
        # CSV: a bulk loader writes it column by column without a value-by-value encoder (Arrow's
        # CSV writer), and the server parses it as fast as binary. Body is bytea's hex text (\x...).
        return f"COPY {self.qualified_name(address)} (Id, Headers, Body) FROM STDIN (FORMAT csv, ENCODING 'UTF8')"

    def send_batch_params(self, rows: Sequence[SendRow]) -> dict[str, object]:
        ids, ttbrs_ms, headers, bodies = (list(column) for column in zip(*rows, strict=True))
        return {"ids": ids, "ttbrs_ms": ttbrs_ms, "headers": headers, "bodies": bodies}

    def _head(self, q: str, lock: str) -> str:
        """The oldest unlocked rows after the session's head (``after``; see :mod:`..heads`), by the Seq index."""
        return f"SELECT Seq FROM {q} WHERE Seq > %(after)s ORDER BY Seq LIMIT %(limit)s FOR {lock} SKIP LOCKED"

    def receive_sql(self, address: QueueAddress) -> str:
        # The candidate set is computed once (ARRAY(...) is an init plan), so a concurrent
        # receiver can never make this return more rows than asked -- unlike DELETE ... USING.
        q = self.qualified_name(address)
        return (
            f"DELETE FROM {q} AS rs "
            f"WHERE rs.Seq = ANY(ARRAY({self._head(q, 'UPDATE')})) "
            f"RETURNING rs.Id, rs.Expires IS NOT NULL AND rs.Expires <= {_UTC_NOW}, rs.Headers, rs.Body, rs.Seq"
        )

    # Due is an absolute instant (timestamptz), written and compared against the server's clock
    # whatever the session's TimeZone: a sender in Tokyo and a mover in Los Angeles agree. NServiceBus
    # writes timestamptz(now() AT TIME ZONE 'UTC') + delay, the same instant in a session whose
    # TimeZone is UTC (the usual server default); its rows are moved here when due, and ours there.

    def store_delayed_sql(self, delayed: QueueAddress) -> str:
        return (
            f"INSERT INTO {self.qualified_name(delayed)} (Headers, Body, Due) VALUES (%(headers)s, %(body)s, "
            "clock_timestamp() + %(delay_ms)s::bigint * interval '1 millisecond')"
        )

    def store_delayed_batch_sql(self, delayed: QueueAddress) -> str | None:
        return (
            f"INSERT INTO {self.qualified_name(delayed)} (Headers, Body, Due) "
            "SELECT m.headers, m.body, clock_timestamp() + %(delay_ms)s::bigint * interval '1 millisecond' "
            "FROM unnest(%(headers)b::text[], %(bodies)b::bytea[]) AS m(headers, body)"
        )

    def due_delayed_sql(self, delayed: QueueAddress) -> str:
        d = self.qualified_name(delayed)
        return (
            # Due within the last %(due_ms)s only: the Due index's entries for messages already moved
            # stay until vacuum removes them (see transport/heads.py).
            f"SELECT Id, Headers, Body FROM {d} WHERE Due < now() "
            "AND Due > now() - %(due_ms)s::bigint * interval '1 millisecond' "
            "ORDER BY Due LIMIT %(limit)s FOR UPDATE SKIP LOCKED"
        )

    def delete_delayed_sql(self, delayed: QueueAddress) -> str:
        return f"DELETE FROM {self.qualified_name(delayed)} WHERE Id = ANY(%(keys)s::uuid[])"

    def next_due_sql(self, delayed: QueueAddress) -> str:
        return f"SELECT (EXTRACT(EPOCH FROM min(Due) - now()) * 1000)::bigint FROM {self.qualified_name(delayed)}"

    def key_list(self, keys: Sequence[Any]) -> object:
        return list(keys)

    def can_insert_sql(self) -> str:
        return "SELECT has_table_privilege(%(table)s, 'INSERT')"

    def table_reference(self, address: QueueAddress) -> str:
        return self.shown_name(address)

    def subscribe_sql(self, table: QueueAddress) -> str:
        return (
            f"INSERT INTO {self.qualified_name(table)} (QueueAddress, Topic, Endpoint) "
            "VALUES (%(address)s, %(topic)s, %(endpoint)s) "
            "ON CONFLICT (Endpoint, Topic) DO UPDATE SET QueueAddress = EXCLUDED.QueueAddress"
        )

    def unsubscribe_sql(self, table: QueueAddress) -> str:
        return f"DELETE FROM {self.qualified_name(table)} WHERE Endpoint = %(endpoint)s AND Topic = %(topic)s"

    def subscribers_sql(self, table: QueueAddress) -> str:
        return (
            f"SELECT DISTINCT QueueAddress FROM {self.qualified_name(table)} WHERE Topic = ANY(%(topics)s::text[]) "
            "ORDER BY QueueAddress"
        )

    def topic_list(self, topics: Sequence[str]) -> object:
        return list(topics)

    def peek_sql(self, address: QueueAddress) -> str:
        return self._peek(self.qualified_name(address), "%(after)s")

    @staticmethod
    def _peek(q: str, after: str) -> str:
        # The highest Seq and the lowest unlocked one after the head both come off the Seq index:
        # constant time on any queue size, where count(*) would scan the table. Also returns that
        # lowest Seq, which the session's head must not pass.
        return (
            f"SELECT COALESCE(h.top - h.low + 1, 0)::bigint AS waiting, h.low FROM (SELECT "
            f"(SELECT max(Seq) FROM {q} WHERE Seq > {after}) AS top, "
            f"(SELECT Seq FROM {q} WHERE Seq > {after} ORDER BY Seq LIMIT 1 FOR KEY SHARE SKIP LOCKED) AS low) AS h"
        )

    def depth_sql(self, address: QueueAddress) -> str:
        return f"SELECT count(*) FROM {self.qualified_name(address)}"

    def purge_expired_sql(self, address: QueueAddress) -> str:
        q = self.qualified_name(address)
        return (
            f"DELETE FROM {q} WHERE Seq = ANY(ARRAY("
            f"SELECT Seq FROM {q} WHERE Expires < {_UTC_NOW} LIMIT %(limit)s FOR UPDATE SKIP LOCKED))"
        )

    def purge_all_sql(self, address: QueueAddress) -> str:
        return f"DELETE FROM {self.qualified_name(address)}"

    def insert_error_sql(self, error_address: QueueAddress, shape: TableShape) -> str:
        return f"INSERT INTO {self.qualified_name(error_address)} (Id, Expires, Headers, Body) VALUES (%(id)s, NULL, %(headers)s, %(body)s)"

    def retry_insert_sql(self, address: QueueAddress, shape: TableShape) -> str:
        # Id is the queue's primary key here: a message already waiting keeps its place, and the
        # statement neither fails nor aborts the retry's transaction.
        return f"{self.insert_error_sql(address, shape)} ON CONFLICT DO NOTHING"

    def waiting_ids_sql(self, address: QueueAddress) -> str | None:
        # Id is the queue's primary key here: looked up through its index.
        return f"SELECT Id FROM {self.qualified_name(address)} WHERE Id = ANY(%(ids)s::uuid[])"

    def browse_sql(self, address: QueueAddress) -> str:
        q = self.qualified_name(address)
        return (
            f"SELECT Seq, Id, Headers, Body FROM {q} WHERE Seq > %(after)s AND Seq <= %(last)s "
            f"AND (Expires IS NULL OR Expires > {_UTC_NOW}) ORDER BY Seq LIMIT %(limit)s"
        )

    def seq_range_sql(self, address: QueueAddress) -> str:
        # Both ends come off the Seq index.
        return f"SELECT min(Seq), max(Seq) FROM {self.qualified_name(address)}"

    def error_headers_sql(self, error_address: QueueAddress) -> str:
        q = self.qualified_name(error_address)
        return f"SELECT Seq, Headers FROM {q} WHERE Seq > %(after)s ORDER BY Seq LIMIT %(limit)s"

    def error_rows_sql(self, error_address: QueueAddress) -> str:
        q = self.qualified_name(error_address)
        return f"SELECT Seq, Id, Headers, Body FROM {q} WHERE Seq = ANY(%(seqs)s::bigint[]) ORDER BY Seq FOR UPDATE SKIP LOCKED"

    def seq_list(self, seqs: Sequence[int]) -> object:
        return [int(seq) for seq in seqs]

    def failed_messages_sql(self, error_address: QueueAddress) -> str:
        q = self.qualified_name(error_address)
        return (
            f"SELECT Seq, Id, Headers, octet_length(Body), substring(Body FROM 1 FOR %(preview)s) FROM {q} "
            "WHERE Seq = ANY(%(seqs)s::bigint[]) ORDER BY Seq DESC"
        )

    def newest_headers_sql(self, address: QueueAddress) -> str:
        q = self.qualified_name(address)
        return f"SELECT Seq, Headers FROM {q} WHERE Seq < %(before)s ORDER BY Seq DESC LIMIT %(limit)s"

    def find_sql(self, address: QueueAddress) -> str:
        # The newest rows come off the Seq index; only their Headers are searched (bodies are not read).
        q = self.qualified_name(address)
        return (
            f"SELECT n.Seq, n.Id, n.Headers FROM (SELECT Seq, Id, Headers FROM {q} ORDER BY Seq DESC LIMIT %(scan)s) AS n "
            "WHERE strpos(lower(n.Headers), %(needle)s) > 0 ORDER BY n.Seq"
        )

    def find_by_id_sql(self, address: QueueAddress) -> str | None:
        # Id is the queue's primary key here: looked up through its index, however old the row.
        return f"SELECT Seq, Id, Headers FROM {self.qualified_name(address)} WHERE Id = %(id)s"

    def scanned_all_sql(self, address: QueueAddress) -> str:
        q = self.qualified_name(address)
        return f"SELECT count(*) <= %(scan)s FROM (SELECT 1 FROM {q} ORDER BY Seq DESC LIMIT %(scan)s + 1) AS n"

    def find_claims_sql(self, address: QueueAddress) -> str:
        f = self.qualified_name(self.inflight_address(address))
        return (
            "SELECT n.Queue, n.Seq, n.Id, n.Headers, n.Holder, n.Deliveries FROM "
            f"(SELECT Queue, Seq, Id, Headers, Holder, Deliveries FROM {f} LIMIT %(scan)s) AS n "
            "WHERE strpos(lower(n.Headers), %(needle)s) > 0"
        )

    def claims_scanned_all_sql(self, address: QueueAddress) -> str:
        f = self.qualified_name(self.inflight_address(address))
        return f"SELECT count(*) <= %(scan)s FROM (SELECT 1 FROM {f} LIMIT %(scan)s + 1) AS n"

    def can_read_sql(self) -> str:
        # to_regclass: NULL (so false) for a table that does not exist, where has_table_privilege would raise.
        return "SELECT COALESCE(has_table_privilege(to_regclass(%(table)s), 'SELECT'), false)"

    def delete_by_seq_sql(self, address: QueueAddress) -> str:
        return f"DELETE FROM {self.qualified_name(address)} WHERE Seq = %(seq)s"

    # -- wake-up notifications ----------------------------------------------------------------

    def notifying_sql(self, insert_sql: str) -> str | None:
        # One statement, so a notified send is still one round trip in autocommit: an INSERT in WITH
        # runs to completion whatever the outer query reads. The notification is delivered at
        # commit, once per statement, and carries the lowest Seq sent: a listener that has already
        # taken newer messages knows to look below them (a sender that committed late).
        return (
            f"WITH sent AS ({insert_sql} RETURNING Seq) "
            "SELECT pg_notify(%(channel)s, COALESCE((SELECT min(Seq) FROM sent)::text, ''))"
        )

    def notify_on_insert_sql(self, address: QueueAddress) -> Sequence[str]:
        # A statement-level trigger: one notification per INSERT, COPY or INSERT ... SELECT, however
        # many rows, with the payload a notified send carries (the lowest Seq inserted), so an
        # NServiceBus endpoint's or plain SQL's insert wakes listeners as a library send does. The
        # channel is the trigger's argument, a literal of hexadecimal digits and a prefix.
        schema = address.schema or self.default_schema
        function_address = QueueAddress("sqlqueue_notify_insert", schema)
        function = self.qualified_name(function_address)
        notify = (
            f"CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $sqlqueue$ "
            "BEGIN PERFORM pg_notify(TG_ARGV[0], COALESCE((SELECT min(Seq) FROM sent)::text, '')); RETURN NULL; END "
            "$sqlqueue$"
        )
        q = self.qualified_name(address)
        return [
            # Every notifying queue of the schema replaces the one function: installers of two queues
            # at once would otherwise update its catalog row together ("tuple concurrently updated").
            self.install_lock_sql(function_address),
            notify,
            # Dropped and made again (in the installer's transaction) rather than CREATE OR REPLACE
            # TRIGGER, which PostgreSQL 13 lacks.
            f"DROP TRIGGER IF EXISTS sqlqueue_notify_insert ON {q}",
            (
                f"CREATE TRIGGER sqlqueue_notify_insert AFTER INSERT ON {q} "
                "REFERENCING NEW TABLE AS sent FOR EACH STATEMENT "
                f"EXECUTE FUNCTION {function}({quote_literal(self.notify_channel(address))})"
            ),
        ]

    def listen_sql(self, channel: str) -> str | None:
        return f"LISTEN {quote_ident(channel)}"

    # -- claim mode ----------------------------------------------------------------------------

    def claim_sql(self, address: QueueAddress, bodies: bool = True) -> str:
        q = self.qualified_name(address)
        f = self.qualified_name(self.inflight_address(address))
        body = "Body" if bodies else "NULL::bytea"
        return (
            f"WITH taken AS (DELETE FROM {q} AS rs "
            f"WHERE rs.Seq = ANY(ARRAY({self._head(q, 'UPDATE')})) "
            "RETURNING rs.Id, rs.Expires, rs.Headers, rs.Body, rs.Seq), "
            f"claimed AS (INSERT INTO {f} (Token, Queue, Id, Expires, Headers, Body, Seq, Deliveries, LeaseUntil, Holder) "
            # NULL Headers (a hand-made table) are kept as the JSON text null: still poison, where
            # '' would read as no headers.
            f"SELECT gen_random_uuid(), %(queue)s, Id, Expires, COALESCE(Headers, 'null'), Body, Seq, %(deliveries)s, "
            f"{_UTC_NOW} + %(lease_ms)s::bigint * interval '1 millisecond', %(holder)s FROM taken "
            f"WHERE Expires IS NULL OR Expires > {_UTC_NOW} "
            "RETURNING Token, Id, Headers, Body, Deliveries, Seq) "
            f"SELECT Token, Id, Headers, {body}, Deliveries, Seq FROM claimed "
            "UNION ALL SELECT NULL::uuid, Id, NULL, NULL, 0, Seq FROM taken "
            f"WHERE Expires IS NOT NULL AND Expires <= {_UTC_NOW} ORDER BY Seq"
        )

    def reclaim_sql(self, address: QueueAddress, bodies: bool = True) -> str:
        f = self.qualified_name(self.inflight_address(address))
        body = "c.Body" if bodies else "NULL::bytea"
        return (
            f"UPDATE {f} AS c SET Token = gen_random_uuid(), Deliveries = c.Deliveries + %(deliveries)s, "
            f"LeaseUntil = {_UTC_NOW} + %(lease_ms)s::bigint * interval '1 millisecond', Holder = %(holder)s "
            f"WHERE c.Token = ANY(ARRAY(SELECT Token FROM {f} WHERE {_LAPSED} "
            "ORDER BY Seq LIMIT %(limit)s FOR UPDATE SKIP LOCKED)) "
            f"RETURNING c.Token, c.Id, c.Expires IS NOT NULL AND c.Expires <= {_UTC_NOW}, c.Headers, {body}, "
            "c.Deliveries, c.LastError, c.Seq"
        )

    def _take(self, address: QueueAddress, candidates: str) -> str:
        """Hand the claims ``candidates`` selects to a holder: a new token, a counted delivery, a lease.

        Params (lease_ms, holder, then those of ``candidates``).
        """
        f = self.qualified_name(self.inflight_address(address))
        return (
            f"UPDATE {f} AS c SET Token = gen_random_uuid(), Deliveries = c.Deliveries + 1, "
            f"LeaseUntil = {_UTC_NOW} + %(lease_ms)s::bigint * interval '1 millisecond', Holder = %(holder)s "
            f"WHERE {candidates} "
            f"RETURNING c.Token, c.Id, c.Expires IS NOT NULL AND c.Expires <= {_UTC_NOW}, c.Headers, c.Body, "
            "c.Deliveries, c.LastError, c.Seq"
        )

    def take_sql(self, address: QueueAddress) -> str:
        return self._take(address, f"c.{_BY_TOKENS} AND c.Holder IS NULL")

    def adopt_sql(self, address: QueueAddress) -> str:
        f = self.qualified_name(self.inflight_address(address))
        return self._take(
            address,
            f"c.Token = ANY(ARRAY(SELECT Token FROM {f} WHERE Queue = %(queue)s AND Holder IS NULL "
            "ORDER BY Seq LIMIT %(limit)s FOR UPDATE SKIP LOCKED))",
        )

    def peek_with_claims_sql(self, address: QueueAddress) -> str:
        f = self.qualified_name(self.inflight_address(address))
        return f"SELECT p.*, (SELECT count(*) FROM {f} WHERE {_LAPSED}) FROM ({self.peek_sql(address)}) AS p"

    def count_inflight_sql(self, address: QueueAddress) -> str:
        f = self.qualified_name(self.inflight_address(address))
        return f"SELECT count(*) FROM {f} WHERE Queue = %(queue)s"

    def claim_figures_sql(self, address: QueueAddress) -> str:
        f = self.qualified_name(self.inflight_address(address))
        return f"SELECT count(*), count(*) FILTER (WHERE LeaseUntil <= {_UTC_NOW}) FROM {f} WHERE Queue = %(queue)s"

    def claims_sql(self, address: QueueAddress) -> str:
        f = self.qualified_name(self.inflight_address(address))
        return (
            f"SELECT Id, Holder, Deliveries, (EXTRACT(EPOCH FROM LeaseUntil - {_UTC_NOW}) * 1000)::bigint, LastError "
            f"FROM {f} WHERE Queue = %(queue)s ORDER BY LeaseUntil LIMIT %(limit)s"
        )

    def purge_expired_claims_sql(self, address: QueueAddress) -> str:
        # Locked as a reclaim locks them (SKIP LOCKED): a claim being renewed meanwhile is left alone.
        f = self.qualified_name(self.inflight_address(address))
        return (
            f"DELETE FROM {f} WHERE Token = ANY(ARRAY(SELECT Token FROM {f} WHERE Queue = %(queue)s "
            f"AND LeaseUntil <= {_UTC_NOW} AND Expires < {_UTC_NOW} LIMIT %(limit)s FOR UPDATE SKIP LOCKED))"
        )

    def release_lapsed_sql(self, address: QueueAddress, shape: TableShape) -> str:
        # The claims are locked as a reclaim locks them (SKIP LOCKED), so a claim is either given
        # back here or renewed by a receiver, never both; rows get new Seq values, behind the queue.
        q = self.qualified_name(address)
        f = self.qualified_name(self.inflight_address(address))
        return (
            f"WITH released AS (DELETE FROM {f} AS c WHERE c.Token = ANY(ARRAY(SELECT Token FROM {f} "
            f"WHERE Queue = %(queue)s AND LeaseUntil <= {_UTC_NOW} ORDER BY Seq LIMIT %(limit)s FOR UPDATE SKIP LOCKED)) "
            "RETURNING c.Id, c.Expires, c.Headers, c.Body, c.Seq) "
            f"INSERT INTO {q} (Id, Expires, Headers, Body) SELECT Id, Expires, Headers, Body FROM released ORDER BY Seq "
            "RETURNING Id"
        )

    def token_list(self, tokens: Sequence[uuid.UUID]) -> object:
        return list(tokens)

    def ack_sql(self, address: QueueAddress) -> str:
        f = self.qualified_name(self.inflight_address(address))
        return f"DELETE FROM {f} WHERE {_BY_TOKENS} RETURNING Token"

    def ack_copy_sql(self, address: QueueAddress) -> str:
        f = self.qualified_name(self.inflight_address(address))
        return f"DELETE FROM {f} WHERE {_BY_TOKENS} RETURNING Token, Id, Headers, Body"

    def nack_sql(self, address: QueueAddress) -> str:
        f = self.qualified_name(self.inflight_address(address))
        return (
            f"UPDATE {f} SET LeaseUntil = {_UTC_NOW} + %(delay_ms)s::bigint * interval '1 millisecond', LastError = %(error)s "
            f"WHERE {_BY_TOKENS} RETURNING Token"
        )

    def extend_sql(self, address: QueueAddress) -> str:
        f = self.qualified_name(self.inflight_address(address))
        return (
            f"UPDATE {f} SET LeaseUntil = {_UTC_NOW} + %(lease_ms)s::bigint * interval '1 millisecond' "
            f"WHERE {_BY_TOKENS} RETURNING Token"
        )

    def held_sql(self, address: QueueAddress) -> str:
        f = self.qualified_name(self.inflight_address(address))
        return (
            f"SELECT Token, Id, Headers, Body, Deliveries, Seq FROM {f} WHERE Queue = %(queue)s AND Holder = %(holder)s "
            # A message whose time to be received passed while held is not handed out again; the
            # holder's ack_held deletes it with the rest.
            f"AND mod(Seq, %(parts)s) = %(part)s AND (Expires IS NULL OR Expires > {_UTC_NOW}) ORDER BY Seq"
        )

    def ack_held_sql(self, address: QueueAddress) -> str:
        f = self.qualified_name(self.inflight_address(address))
        return f"DELETE FROM {f} WHERE Queue = %(queue)s AND Holder = %(holder)s"

    def extend_held_sql(self, address: QueueAddress) -> str:
        f = self.qualified_name(self.inflight_address(address))
        return (
            f"UPDATE {f} SET LeaseUntil = {_UTC_NOW} + %(lease_ms)s::bigint * interval '1 millisecond' "
            "WHERE Queue = %(queue)s AND Holder = %(holder)s"
        )

    def nack_held_sql(self, address: QueueAddress) -> str:
        f = self.qualified_name(self.inflight_address(address))
        return (
            f"UPDATE {f} SET LeaseUntil = {_UTC_NOW} + %(delay_ms)s::bigint * interval '1 millisecond', "
            "LastError = %(error)s WHERE Queue = %(queue)s AND Holder = %(holder)s"
        )

    def create_writes_sql(self, ledger: QueueAddress) -> Sequence[str]:
        return [
            f"""CREATE TABLE IF NOT EXISTS {self.qualified_name(ledger)} (
    WriteId uuid NOT NULL,
    Part integer NOT NULL,
    Recorded timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (WriteId, Part)
)"""
        ]

    def record_write_sql(self, ledger: QueueAddress) -> str:
        # ON CONFLICT waits for a concurrent inserter of the same key to finish: it inserts if
        # that one rolled back, and does nothing if it committed.
        return (
            f"INSERT INTO {self.qualified_name(ledger)} (WriteId, Part) VALUES (%(write)s, %(part)s) "
            "ON CONFLICT (WriteId, Part) DO NOTHING"
        )

    def forget_write_sql(self, ledger: QueueAddress) -> str:
        return f"DELETE FROM {self.qualified_name(ledger)} WHERE WriteId = %(write)s"

    def claim_to_error_sql(self, address: QueueAddress, error_address: QueueAddress, shape: TableShape) -> str:
        f = self.qualified_name(self.inflight_address(address))
        e = self.qualified_name(error_address)
        return (
            f"WITH moved AS (DELETE FROM {f} WHERE Token = %(token)s AND (Queue = %(queue)s) IS TRUE RETURNING Id, Body) "
            f"INSERT INTO {e} (Id, Expires, Headers, Body) SELECT Id, NULL, %(headers)s, Body FROM moved"
        )

    # -- batches locked by a transaction -------------------------------------------------------
    #
    # A row lock is written into the row itself: its xmax holds the locking transaction's id until
    # another session locks, updates or deletes the row. Any session can read it, and a plain
    # SELECT neither waits for the lock nor takes one, so readers elsewhere find exactly the rows
    # one open transaction locked. xmax keeps that id after the transaction has ended too (a
    # rollback leaves it behind): reads check that the transaction is still open. The id travels
    # as xid8 (epoch and all, never reused), compared with xmax's 32 bits.

    def check_locked_batches(self) -> None:
        return None  # every statement below runs here

    def lock_batch_sql(self, address: QueueAddress) -> str:
        return (
            f"SELECT Seq, Headers FROM {self.qualified_name(address)} "
            f"WHERE Expires IS NULL OR Expires > {_UTC_NOW} ORDER BY Seq LIMIT %(limit)s FOR UPDATE SKIP LOCKED"
        )

    def locker_sql(self, address: QueueAddress) -> str:
        # pg_current_xact_id() is the top-level transaction's id, also inside a savepoint, whose
        # locks carry the savepoint's own id instead: a lock under a savepoint is told apart here.
        return (
            "SELECT pg_current_xact_id()::text::bigint, "
            f"(SELECT xmax = pg_current_xact_id()::xid FROM {self.qualified_name(address)} WHERE Seq = %(seq)s)"
        )

    def current_transaction_sql(self) -> str:
        return "SELECT pg_current_xact_id_if_assigned()::text::bigint"

    def browse_locked_sql(self, address: QueueAddress) -> str:
        # The transaction's state is read once per statement (an init plan), after its snapshot:
        # a transaction open then had not ended when the snapshot was taken, so each row read is one
        # it held. One that ended since leaves its id in xmax, on rows back in the queue.
        q = self.qualified_name(address)
        return (
            f"SELECT Seq, Id, Headers, Body FROM {q} WHERE Seq > %(after)s AND Seq <= %(last)s AND {_LOCKED_BY} "
            f"AND (Expires IS NULL OR Expires > {_UTC_NOW}) AND ({self.transaction_open_sql()}) "
            "ORDER BY Seq LIMIT %(limit)s"
        )

    def transaction_open_sql(self) -> str:
        return "SELECT pg_xact_status(%(locked_by)s::text::xid8) IS NOT DISTINCT FROM 'in progress'"

    def locked_rows_table_sql(self, address: QueueAddress, locked_by: int) -> str:
        # browse_locked_sql with the transaction's id written in (a whole number: nothing else is),
        # and the ended transaction's row, which the reader turns into an error: rows it had locked
        # are back in the queue (or gone) with its id still in xmax. The second branch reads the
        # status after the first: it can only have ended meanwhile, so a read that returned the
        # batch's rows from an ended transaction gets the row of NULLs too.
        q = self.qualified_name(address).replace("%%", "%")  # sent as it is, with no parameters to escape % from
        xid = int(locked_by)
        is_open = f"(SELECT pg_xact_status('{xid}'::xid8) IS NOT DISTINCT FROM 'in progress')"
        return (
            f"(SELECT Seq AS seq, Id::text AS id, Headers AS headers, Body AS body FROM {q} "
            f"WHERE xmax = '{xid}'::xid8::xid AND (Expires IS NULL OR Expires > {_UTC_NOW}) AND {is_open} "
            f"UNION ALL SELECT NULL, NULL, NULL, NULL WHERE NOT {is_open}) AS locked"
        )

    def seq_window_sql(self, after: int, last: int) -> str:
        return f"(seq > {int(after)} AND seq <= {int(last)}) OR seq IS NULL"

    def locked_to_error_sql(self, address: QueueAddress, error_address: QueueAddress, shape: TableShape) -> str:
        q, e = self.qualified_name(address), self.qualified_name(error_address)
        return (
            f"WITH moved AS (DELETE FROM {q} WHERE Seq = ANY(%(seqs)s::bigint[]) AND {_LOCKED_BY} "
            "RETURNING Id, Headers, Body, Seq), "
            # As a receive moves poison (insert_error_sql): a NULL Headers column becomes ''.
            f"copied AS (INSERT INTO {e} (Id, Expires, Headers, Body) "
            "SELECT Id, NULL, COALESCE(Headers, ''), Body FROM moved ORDER BY Seq) "
            "SELECT Id, Headers FROM moved ORDER BY Seq"
        )

    def ack_locked_sql(self, address: QueueAddress) -> str:
        # Only Expires comes back from the delete, to be counted: carrying 200,000 rows' headers and
        # bodies through the count would cost more than deleting them.
        unexpired = f"Expires IS NULL OR Expires > {_UTC_NOW}"
        return f"{self._delete_locked(address, 'Expires')} SELECT count(*) FILTER (WHERE {unexpired}) FROM gone"

    def ack_locked_copy_sql(self, address: QueueAddress) -> str:
        unexpired = f"Expires IS NULL OR Expires > {_UTC_NOW}"
        return f"{self._delete_locked(address, 'Id, Expires, Headers, Body')} SELECT Id, Headers, Body FROM gone WHERE {unexpired}"

    def _delete_locked(self, address: QueueAddress, returning: str) -> str:
        """``gone``: the rows with after < Seq <= last the transaction holds locked, deleted (one whose
        time to be received passed while held was read by nobody: deleted, neither counted nor copied)."""
        return (
            f"WITH gone AS (DELETE FROM {self.qualified_name(address)} "
            f"WHERE Seq > %(after)s AND Seq <= %(last)s AND {_LOCKED_BY} RETURNING {returning})"
        )

    # -- errors --------------------------------------------------------------------------------

    def translate_error(self, exc: BaseException, address: str) -> SqlQueueError | None:
        sqlstate = getattr(exc, "sqlstate", None) or next(
            (code for pattern, code in _CONNECT_TEXT if pattern.search(str(exc))), None
        )
        detail = _QUERY_EXCERPT.sub("", str(exc)).strip()
        if sqlstate == "23505":  # unique_violation: the only unique keys are Id (and Seq, which the database sets)
            return DuplicateMessageError(
                f"a message with this id is already in {address}: ids are unique per queue; send a new Message "
                f"(a new id) unless it is the same message resent ({detail})"
            )
        if sqlstate in _ABORTED:
            return TransactionAbortedError(_ABORTED[sqlstate].format(address=address, detail=detail))
        if sqlstate in ("42P07", "42710"):  # duplicate_table / duplicate_object: another installer won a race
            return ObjectExistsError(f"another installer created part of {address} at the same time: {detail}")
        if sqlstate == "42P01":  # undefined_table: the queue's, or the claim store beside it
            store = re.search(rf'relation "((?:[^"]+\.)?{re.escape(self.inflight_table)})" does not exist', detail)
            return QueueNotFoundError(address, detail, claim_store=store.group(1) if store else None)
        if sqlstate == "3F000":  # invalid_schema_name
            return QueueNotFoundError(address, detail, schema_missing=True)
        if sqlstate == "42501":  # insufficient_privilege
            return PermissionDeniedError(
                f"permission denied on {address}: {detail}. Creating queues needs CREATE on the schema "
                "(the installer's rights); sending and receiving need USAGE on the schema and its sequences and SELECT, "
                "INSERT, UPDATE and DELETE on the queue tables and on the schema's sqlqueue_inflight table"
            )
        if sqlstate == "55P03":  # lock_not_available: lock_timeout ran out (the server's first line says it all)
            return LockTimeoutError(
                f"{address} is locked by another session (a migration, VACUUM FULL, LOCK TABLE): "
                f"{detail.splitlines()[0] if detail else 'lock timeout'}"
            )
        if sqlstate in _MISCONFIGURED:
            return TransportMisconfiguredError(
                f"the database refused the connection ({_MISCONFIGURED[sqlstate]}): {detail}; fix the connection's "
                "settings, retrying will not help"
            )
        if sqlstate == TOO_MANY_CONNECTIONS:
            return TransportUnavailableError(
                f"the database has no connection slot free for {address} (max_connections, or the role's or the "
                f"database's CONNECTION LIMIT, is reached): {detail}; retry once other sessions close"
            )
        if sqlstate == "53100":  # disk_full: the server answers; only freeing space (or a bigger tablespace) helps
            return StorageFullError(
                f"the database has no disk space left to write to {address}, so nothing was written: {detail}; free "
                "space on the disk of the table's tablespace, or move the table to a larger one, then send again"
            )
        if connection_lost(sqlstate):
            return TransportUnavailableError(f"database connection lost while working on {address}: {detail}")
        if sqlstate in ("40001", "40P01"):  # serialization_failure, deadlock_detected: a conflict lost, not an outage
            return TransportUnavailableError(
                f"the transaction working on {address} lost a conflict with another and was rolled back: {detail}; "
                "retry"
            )
        try:
            import psycopg
        except ImportError:  # pragma: no cover - psycopg is a dependency
            return None
        if isinstance(exc, psycopg.OperationalError):
            return TransportUnavailableError(f"database unavailable ({address}): {detail}")
        if isinstance(exc, UnicodeEncodeError):
            return InvalidArgumentError(f"text sent to {address} is not valid Unicode ({exc.reason}); nothing was sent")
        if sqlstate is not None and sqlstate.startswith("22"):  # data_exception: a value no column can hold
            return InvalidArgumentError(f"the database refused a value for {address}: {detail}")
        if sqlstate in ("42703", "42804", "42883"):  # undefined column or function, datatype mismatch
            return NotAQueueError(f"{address} does not have the columns this library works with: {detail}")
        if isinstance(exc, psycopg.Error):
            return StatementRejectedError(f"the database refused a statement on {address}: {detail}")
        return None
