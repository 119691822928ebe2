"""The dialect interface: every SQL statement the transport can run, which each database's dialect implements.

A dialect turns a :class:`~airflow_provider_sqlqueue.transport.addressing.QueueAddress` into quoted
SQL text and classifies driver errors. It never talks to a database itself: the operations in
:mod:`~airflow_provider_sqlqueue.transport.operations` decide what to run and the drivers in
:mod:`~airflow_provider_sqlqueue.transport.drivers` run it, so one set of queue semantics serves
both databases and both sync and async callers.

Statement parameters are named (``%(queue)s``), with one name per concept in every statement:
``schema``, ``table``, ``id``, ``ttbr_ms``, ``headers``, ``body``, ``limit``, ``seq``, ``queue`` (the
claim key), ``deliveries``, ``lease_ms``, ``holder``, ``token``, ``tokens``, ``delay_ms``, ``error``,
``channel``, ``keys`` (rows of a delayed table), ``address``, ``endpoint``, ``topic``, ``topics``
(subscriptions), ``after``, ``before``, ``seqs``, ``preview`` (reading an error queue), ``last``
(the end of a Seq range), ``parts``, ``part`` (one share of a holder's claims), ``write``
(a write of many partitions, in the write ledger), ``scan``, ``needle`` (a journey's search, :mod:`.journeys`), ``locked_by`` (the transaction holding a locked batch). Each method below says which it takes and what rows it returns; reviewing a
database's SQL means reading one file.
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar, NamedTuple

from ..addressing import QueueAddress
from ..errors import NotAQueueError, SqlQueueError
from ..heads import Head
from .journeys import FindsJourneys


class ReceivedRow(NamedTuple):
    """A row of :meth:`Dialect.receive_sql`: a message deleted from its queue."""

    id: Any
    expired: Any
    headers: str | None
    body: bytes | None
    seq: int


class ClaimedRow(NamedTuple):
    """A row of :meth:`Dialect.claim_sql`: a message moved in flight (token None: it had expired)."""

    token: Any
    id: Any
    headers: str | None
    body: bytes | None
    deliveries: int
    seq: int


class HeldRow(NamedTuple):
    """A row of :meth:`Dialect.reclaim_sql`, :meth:`Dialect.take_sql` and :meth:`Dialect.adopt_sql`: a claim handed out."""

    token: Any
    id: Any
    expired: Any
    headers: str | None
    body: bytes | None
    deliveries: int
    last_error: str | None
    seq: int


class ErrorRow(NamedTuple):
    """A row of :meth:`Dialect.error_rows_sql`: an error queue message, locked for retrying."""

    seq: int
    id: Any
    headers: str | None
    body: bytes | None


class DueRow(NamedTuple):
    """A row of :meth:`Dialect.due_delayed_sql`: a delayed message whose time has come, locked for moving."""

    key: Any  # the row's key in the delayed table: Id on PostgreSQL, RowVersion on SQL Server
    headers: str | None
    body: bytes | None


class FailedRow(NamedTuple):
    """A row of :meth:`Dialect.failed_messages_sql`: an error queue message with the start of its body."""

    seq: int
    id: Any
    headers: str | None
    body_size: int | None  # NULL body: None
    body_preview: bytes | None


class QueueFiguresRow(NamedTuple):
    """The row of :meth:`Dialect.queue_figures_sql`."""

    waiting: int  # the peek estimate
    oldest_headers: str | None  # Headers of the oldest row (None: the queue is empty)
    expired: int  # expired rows awaiting purge, counted up to ``limit``
    dead_rows: int | None  # dead row versions vacuum has yet to remove (None: the database does not say)
    last_vacuum: datetime | None  # when (auto)vacuum last ran on the table (None: never, or not said)


class DelayedFiguresRow(NamedTuple):
    """The row of :meth:`Dialect.delayed_figures_sql`."""

    due: int  # delayed messages already due, not yet moved, counted up to ``limit``
    overdue_ms: int | None  # how long the earliest of them has been due (None: none is due)


class HorizonRow(NamedTuple):
    """A row of :meth:`Dialect.horizon_sql`: something that holds back the removal of dead rows."""

    holder: str | None  # who: ``pid <n>``, a prepared transaction's gid or a replication slot (None: nothing)
    application: str | None  # its application_name (a session), or what kind of holder it is
    state: str | None  # its state (``idle in transaction``, ``active``, ``prepared``, ``replication slot``)
    since: datetime | None  # when its transaction began (None: a replication slot)
    xid_age: int | None  # how many transactions old its snapshot is
    complete: bool  # whether other roles' sessions show their state and start (pg_read_all_stats)


class ClaimRow(NamedTuple):
    """A row of :meth:`Dialect.claims_sql`: a claim as an operator sees it (its token stays private)."""

    id: Any
    holder: str | None  # None: a reservation nobody has taken yet
    deliveries: int
    lease_ms_left: int  # negative: the lease ran out that long ago
    last_error: str | None


class BrowsedRow(NamedTuple):
    """A row of :meth:`Dialect.browse_sql`: a waiting message, left in place."""

    seq: int
    id: Any
    headers: str | None
    body: bytes | None


#: One message as the send statements take it: (id, ttbr_ms or None, headers text, body).
SendRow = tuple[uuid.UUID, int | None, str, bytes]


@dataclass(frozen=True)
class TableShape:
    """What a writer must know of an existing queue table to write to it as NServiceBus does.

    NServiceBus reads tables of older layouts too: without the ``Recoverable`` column, or with
    ``varchar`` Headers. Writers must match the table they write to.
    """

    #: The table has ``Recoverable`` (NOT NULL, written 1); older tables do not.
    recoverable: bool = True
    #: Headers is ``varchar``: non-ASCII characters must travel \\u-escaped or they become ``?``.
    ascii_headers: bool = False


#: Each kind of :attr:`Dialect.kind_columns` as a refusal names it.
_KIND_NAMES = {
    "inflight": "a claim store",
    "delayed": "a delayed-message table",
    "subscriptions": "a subscription table",
    "writes": "a write ledger",
}


class Dialect(FindsJourneys, ABC):
    """What differs between databases: SQL text, identifier quoting, address syntax, error codes."""

    #: Short name used in configuration and logs (``postgres``, ``sqlserver``).
    name: str
    #: Schema used when an address has none.
    default_schema: str
    #: The columns every queue table has (what NServiceBus reads), lower-cased, with the types each may
    #: have as the catalog names them (NServiceBus's, in its current and older layouts). A table
    #: without them, or with other types under those names, is not a queue.
    column_types: ClassVar[Mapping[str, tuple[str, ...]]]
    #: Lower-cased columns each other kind of table has, as NServiceBus (or this library) makes it:
    #: a queue's delayed messages, the subscription table, the Spark data source's write ledger.
    kind_columns: ClassVar[Mapping[str, tuple[str, ...]]] = {
        "inflight": ("token", "queue", "id", "headers", "body", "seq", "deliveries", "leaseuntil"),
        "delayed": ("headers", "body", "due"),
        "subscriptions": ("queueaddress", "endpoint", "topic"),
        "writes": ("writeid", "part"),
    }
    #: Table holding claimed (in-flight) messages, one per schema, shared by that schema's queues.
    inflight_table: str = "sqlqueue_inflight"
    #: Whether :meth:`send_batch_sql` takes any number of messages in one statement (then a batched
    #: send is atomic by itself and needs no transaction).
    one_statement_sends: bool = False
    #: Transaction control, sent by the drivers around an operation's statements.
    begin_sql: str
    commit_sql: str
    rollback_sql: str
    #: What ends each statement of a script run by hand (a batch separator where the tools want one).
    script_separator: str

    # -- addressing ---------------------------------------------------------------------------

    @abstractmethod
    def validate_address(self, address: QueueAddress) -> None:
        """Raise InvalidQueueNameError when the database cannot hold this name (e.g. too long)."""

    @abstractmethod
    def parse_address(self, text: str) -> QueueAddress:
        """Parse the database's textual address form (as NServiceBus writes it in headers)."""

    @abstractmethod
    def format_address(self, address: QueueAddress) -> str:
        """The canonical textual address, as NServiceBus writes it in ``NServiceBus.FailedQ``."""

    @abstractmethod
    def qualified_name(self, address: QueueAddress) -> str:
        """The quoted, schema-qualified table name as it appears in SQL."""

    def name_key(self, address: QueueAddress) -> tuple[str | None, str, str]:
        """One key per name the database tells apart, for a table or an index (unchecked): two
        addresses with one key reach one table (``orders`` and ``orders@"public"``; on SQL Server,
        whose default collation ignores case, ``orders`` and ``ORDERS`` too)."""
        return (address.catalog, address.schema or self.default_schema, address.table)

    def inflight_address(self, address: QueueAddress) -> QueueAddress:
        """Where claims on ``address`` are kept: the in-flight table of the queue's schema."""
        return QueueAddress(self.inflight_table, address.schema or self.default_schema, address.catalog)

    def claim_key(self, address: QueueAddress) -> str:
        """How the in-flight table names the queue of a claim: one key however the address was written.

        The in-flight table lives in the queue's own catalog and schema, so the key is the table
        and schema alone (``orders``, ``orders@[dbo]`` and ``orders@[dbo]@[Shop]`` are one queue).
        """
        return self.format_address(QueueAddress(address.table, address.schema or self.default_schema))

    # -- table layouts -------------------------------------------------------------------------

    def __init__(self) -> None:
        #: Tables this dialect's session has found to be queue tables, with their layouts, by
        #: qualified name: each table's catalog is read once per session, not once per statement.
        self._queues: dict[str, TableShape] = {}
        #: Other tables this session has checked, with the kind each was found to be.
        self._kinds: dict[str, str] = {}
        #: Where each queue's live rows start, as this session has seen (see :mod:`..heads`).
        self._heads: dict[str, Head] = {}

    #: Whether index scans for a queue's head walk the dead row versions consumed messages leave
    #: (MVCC without in-place deletes): then receives start from a :class:`~..heads.Head`.
    walks_dead_rows: ClassVar[bool] = False

    def head(self, address: QueueAddress) -> Head | None:
        """This session's head of the queue at ``address``, where the database needs one."""
        if not self.walks_dead_rows:
            return None
        return self._heads.setdefault(self.qualified_name(address), Head())

    def rolled_back(self, since: float) -> None:
        """A transaction (or a block inside one) begun at ``since`` (``time.monotonic()``) rolled back:
        heads put back below their marks what was taken since."""
        for head in self._heads.values():
            head.rolled_back(since)

    def table_shape(self, address: QueueAddress) -> TableShape | None:
        """The layout of the queue table at ``address`` once this session has checked it, else None."""
        return self._queues.get(self.qualified_name(address))

    def learn_table_shape(self, address: QueueAddress, columns: Sequence[tuple[str, str]]) -> TableShape:
        """Check, from :meth:`queue_columns_sql` rows, that the table is a queue table, and remember its layout.

        The one test of "is this a queue" that every operation touching a table passes first: a
        table lacking the columns NServiceBus reads, or one of this library's own stores, is never
        written, deleted from, dropped or counted as a queue. Raises :class:`NotAQueueError`.
        """
        target = self.qualified_name(address)
        if address.table == self.inflight_table:
            raise NotAQueueError(f"table {target} is the schema's claim store, not a queue table")
        types = {name: type_name.lower() for name, type_name in columns}
        missing = set(self.column_types) - set(types)
        if missing:
            near = sorted(name for name in types if name.lower() in missing)
            hint = f" (it has {', '.join(near)}: quoted names of another case are other columns)" if near else ""
            raise NotAQueueError(
                f"table {target} exists but is not a queue table as NServiceBus defines it: it lacks column(s) "
                f"{', '.join(sorted(missing))}{hint}"
            )
        wrong = [name for name, accepted in self.column_types.items() if types[name] not in accepted]
        if wrong:
            raise NotAQueueError(
                f"table {target} exists but is not a queue table as NServiceBus defines it: "
                + "; ".join(
                    f"column {name} is {types[name]}, not {' or '.join(self.column_types[name])}" for name in wrong
                )
            )
        shape = self.layout(address, types)
        self._queues[target] = shape
        return shape

    def is_table_of(self, kind: str, address: QueueAddress) -> bool:
        """Whether this session has already found ``address`` to be a table of ``kind`` (see :attr:`kind_columns`)."""
        return self._kinds.get(self.qualified_name(address)) == kind

    def learn_table_of(self, kind: str, address: QueueAddress, columns: Sequence[tuple[str, str]]) -> None:
        """Check, from :meth:`queue_columns_sql` rows, that the table is a table of ``kind``, and remember
        it: a subscription table or ledger named by mistake is refused like a queue named by mistake.
        Raises :class:`NotAQueueError`."""
        target = self.qualified_name(address)
        missing = set(self.kind_columns[kind]) - {name.lower() for name, _ in columns}
        if missing:
            raise NotAQueueError(
                f"table {target} exists but is not {_KIND_NAMES[kind]}: it lacks column(s) {', '.join(sorted(missing))}"
            )
        self._kinds[target] = kind

    def forget_table(self, address: QueueAddress) -> None:
        """Forget what this session learnt of a table (it was dropped)."""
        self._queues.pop(self.qualified_name(address), None)
        self._kinds.pop(self.qualified_name(address), None)
        self._heads.pop(self.qualified_name(address), None)

    def layout(self, address: QueueAddress, types: Mapping[str, str]) -> TableShape:
        """The :class:`TableShape` of a queue table whose column types (lower-cased) are ``types``."""
        return TableShape()

    @abstractmethod
    def current_catalog_sql(self) -> str:
        """No params -> one row: the database the connection works in (an address without catalog names it)."""

    # -- installation (needs CREATE rights) ----------------------------------------------------

    @abstractmethod
    def install_lock_sql(self, address: QueueAddress) -> str:
        """Serialise installers of ``address`` until the transaction ends (NServiceBus's lock where it has one)."""

    @abstractmethod
    def create_queue_sql(self, address: QueueAddress) -> Sequence[str]:
        """Statements that create the queue table with its indexes, run after :meth:`install_lock_sql`
        and only when the table does not exist yet: indexes are never built on a live queue."""

    def named_indexes(self, kind: str, table: QueueAddress) -> list[QueueAddress]:
        """The indexes the statements of a table of ``kind`` (``queue``, ``inflight``, ``delayed``,
        ``subscriptions``, ``writes``) create or drop by a name of their own, where index names share
        the schema's namespace with tables (PostgreSQL): an installation plan refuses a table named
        like one of them, which would make the index be skipped or the statement fail. None where
        index names are per table (SQL Server)."""
        return []

    def index_name_holder_sql(self) -> str | None:
        """Params schema, table (an index name), on -> at most one row: (is it an index on table ``on``,
        what holds the name), for a name of :meth:`named_indexes` another relation may hold already;
        None where the dialect names no index that way."""
        return None

    @abstractmethod
    def add_body_string_sql(self, address: QueueAddress) -> str:
        """Add the optional human-readable BodyString column if absent."""

    @abstractmethod
    def create_inflight_sql(self, address: QueueAddress) -> Sequence[str]:
        """Statements, run after :meth:`install_lock_sql` of the in-flight table, that create it (or bring it up to date)."""

    @abstractmethod
    def validate_role(self, role: str) -> None:
        """Raise InvalidArgumentError for a role a grant must not name: one the database would shorten
        into another role's name, or one that stands for every role (``public``) or for built-in rights."""

    @abstractmethod
    def grant_schema_usage_sql(self, address: QueueAddress, role: str) -> Sequence[str]:
        """What ``role`` needs on the schema of ``address`` to reach its tables (nothing more: no CREATE)."""

    @abstractmethod
    def grant_runtime_sql(self, table: QueueAddress, role: str, *, sequence: bool) -> Sequence[str]:
        """The rights ``role`` needs on ``table`` at run time; ``sequence``: also on a queue table's Seq sequence."""

    def script(self, statements: Sequence[str]) -> str:
        """Statements as a DBA runs them by hand: the drivers' ``%%`` escape undone, each ended by :attr:`script_separator`."""
        for sql in statements:
            if "%(" in sql.replace("%%", ""):
                raise ValueError(f"a statement with parameters cannot go into a script: {sql[:80]}")
        return "".join(sql.replace("%%", "%") + self.script_separator for sql in statements)

    @abstractmethod
    def drop_queue_sql(self, address: QueueAddress) -> str:
        """Drop the queue table if it exists."""

    # -- inspection ----------------------------------------------------------------------------

    @abstractmethod
    def queue_columns_sql(self, address: QueueAddress) -> str:
        """Params schema, table -> rows (column name lower-cased, type name) of ``address``'s table.

        The address picks the database whose catalog is read (SQL Server addresses may name one).
        """

    @abstractmethod
    def schema_exists_sql(self, address: QueueAddress) -> str:
        """Params schema -> one row, whether ``address``'s schema exists: asked only when a table was not
        found, so that the error says what to create (a schema is not something create_queue makes)."""

    def unreadable_queues_sql(self) -> str | None:
        """No params -> one row (queue tables the connection may not read, how many of them lie in
        schemas it may not use), or None where the catalog hides from a login what it has no rights on
        (SQL Server): what a survey that could read no queue says is missing."""
        return None

    @abstractmethod
    def list_queues_sql(self) -> str:
        """%(search)s, %(offset)s, %(limit)s -> rows (total, schema, table): one page, by schema and name, of the
        tables of the connection's database that have a queue table's columns and types (:attr:`column_types`),
        that the connection may read and whose ``schema.table`` holds ``search`` (case-insensitively), the
        in-flight tables excepted; ``total`` counts all of them, and a page past the end is one row of
        ``total`` with no table."""

    @abstractmethod
    def queue_figures_sql(self, address: QueueAddress) -> str:
        """Params limit -> one :class:`QueueFiguresRow`: what a dashboard shows of a queue, from its indexes
        (the Seq range, the oldest row, expired rows counted up to ``limit``) however long the queue is,
        and from the statistics the database keeps on the table (dead rows, the last vacuum)."""

    @abstractmethod
    def delayed_figures_sql(self, delayed: QueueAddress) -> str:
        """Params limit -> one :class:`DelayedFiguresRow`: due messages no mover has moved yet (counted up
        to ``limit``) and how long the earliest has waited -- a mover that stopped shows here first."""

    def lock_timeout_sql(self) -> str | None:
        """Params ms -> one row: for the rest of the transaction, wait at most ``ms`` for a lock (then
        :class:`~..errors.LockTimeoutError`); None where the dialect does not bound waits. What watchers
        run first, so that a dashboard or a monitoring check never hangs behind a migration's lock."""
        return None

    def current_lock_timeout_sql(self) -> str | None:
        """No params -> one row: the lock wait bound in force now, in the form :meth:`lock_timeout_sql`
        takes back as ``ms`` (what a watcher restores when it is done); None where the dialect does
        not bound waits."""
        return None

    def session_lock_timeout_sql(self, ms: int) -> str | None:
        """No params, no rows: for the rest of the session, wait at most ``ms`` for a lock (then
        :class:`~..errors.LockTimeoutError`, as with :meth:`lock_timeout_sql`); None where the dialect
        does not bound waits. :meth:`lock_timeout_sql`'s bound for every statement of a short-lived
        session (the command line) instead of one transaction, so that no command hangs behind a lock.
        The bound is written into the statement, a whole number: SQL Server keeps a ``SET`` made in a
        parameterised batch only until that batch ends."""
        return None

    def horizon_sql(self) -> str | None:
        """Params limit -> :class:`HorizonRow` rows, the ``limit`` oldest holders first (one row with holder
        NULL when nothing holds it), or None where the database keeps no
        such horizon. PostgreSQL's vacuum removes no dead row that the oldest snapshot still in use --
        an open transaction, a prepared one, a replication slot -- could see, so one long transaction
        anywhere in the database makes every queue's dead rows pile up."""
        return None

    @abstractmethod
    def has_expires_index_sql(self, address: QueueAddress) -> str:
        """Params schema, table -> one row: whether an index leads with the Expires column."""

    @abstractmethod
    def expires_index_ddl_sql(self, address: QueueAddress) -> str:
        """The statement that creates the missing Expires index (quoted in the warning logged)."""

    # -- runtime (read/write/delete rights only) ------------------------------------------------

    @abstractmethod
    def send_sql(self, address: QueueAddress, shape: TableShape) -> str:
        """Params id, ttbr_ms (None: never expires), headers, body: insert one message."""

    def batch_size(self, rows: Sequence[SendRow]) -> int:
        """How many of ``rows`` the next :meth:`send_batch_sql` statement takes."""
        return len(rows)

    @abstractmethod
    def send_batch_sql(self, address: QueueAddress, count: int, shape: TableShape) -> str:
        """Insert ``count`` messages in one statement; params are :meth:`send_batch_params` of the messages."""

    @abstractmethod
    def send_batch_params(self, rows: Sequence[SendRow]) -> dict[str, object]:
        """Bind parameters for :meth:`send_batch_sql` from the messages' rows."""

    @abstractmethod
    def receive_sql(self, address: QueueAddress) -> str:
        """Params limit: delete up to ``limit`` oldest unlocked rows.

        Rows: :class:`ReceivedRow`. Never returns a row twice, never more than limit.
        """

    @abstractmethod
    def peek_sql(self, address: QueueAddress) -> str:
        """No params -> one row: estimate of pending messages from the sequence range of unlocked rows."""

    @abstractmethod
    def depth_sql(self, address: QueueAddress) -> str:
        """No params -> one row: exact number of rows in the queue table."""

    @abstractmethod
    def purge_expired_sql(self, address: QueueAddress) -> str:
        """Params limit: delete up to ``limit`` expired rows; rowcount is the number deleted."""

    @abstractmethod
    def purge_all_sql(self, address: QueueAddress) -> str:
        """Delete every message; rowcount is the number deleted."""

    def store_delayed_batch_sql(self, delayed: QueueAddress) -> str | None:
        """Params headers, bodies (lists), delay_ms: store a batch of delayed messages in one statement;
        None where the dialect stores them one statement each."""
        return None

    @abstractmethod
    def can_insert_sql(self) -> str:
        """Params table (:meth:`table_reference`) -> one row: whether the connection may insert into it."""

    def shown_name(self, address: QueueAddress) -> str:
        """The qualified name as people write it, for errors: without the drivers' ``%%`` escape."""
        return self.qualified_name(address).replace("%%", "%")

    @abstractmethod
    def table_reference(self, address: QueueAddress) -> str:
        """The qualified name as the database's privilege functions take it, as a parameter value."""

    @abstractmethod
    def insert_error_sql(self, error_address: QueueAddress, shape: TableShape) -> str:
        """Params id, headers, body: insert a row that never expires (into an error queue, or back from one)."""

    def retry_insert_sql(self, address: QueueAddress, shape: TableShape) -> str:
        """Params id, headers, body -> rowcount: put a failed message back into its queue; 0 when a
        message with its id already waits there (where ids are unique), so the retry leaves it be."""
        return self.insert_error_sql(address, shape)

    @abstractmethod
    def browse_sql(self, address: QueueAddress) -> str:
        """Read without removing or locking: unexpired rows in send order with after < Seq <= last.

        Params after, last, limit. Rows: :class:`BrowsedRow`.
        """

    @abstractmethod
    def seq_range_sql(self, address: QueueAddress) -> str:
        """One row (lowest Seq, highest Seq) of the queue's rows, (NULL, NULL) when it is empty: what
        a reader splits into ranges to read the queue in parallel. No params."""

    @abstractmethod
    def error_headers_sql(self, error_address: QueueAddress) -> str:
        """Params after, limit: rows (Seq, Headers) of the oldest ``limit`` rows with Seq above ``after``, oldest
        first, unlocked (what a retry scans to choose rows by their FailedQ; bodies are not read)."""

    @abstractmethod
    def error_rows_sql(self, error_address: QueueAddress) -> str:
        """Params seqs (see :meth:`seq_list`): lock and return those rows of an error queue, skipping rows
        another retry holds. Rows: :class:`ErrorRow`."""

    @abstractmethod
    def seq_list(self, seqs: Sequence[int]) -> object:
        """The ``seqs`` parameter of :meth:`error_rows_sql` and :meth:`failed_messages_sql`."""

    @abstractmethod
    def failed_messages_sql(self, error_address: QueueAddress) -> str:
        """Params seqs (see :meth:`seq_list`), preview: those rows of an error queue, newest first, unlocked,
        with the body's size and only its first ``preview`` bytes. Rows: :class:`FailedRow`."""

    @abstractmethod
    def newest_headers_sql(self, address: QueueAddress) -> str:
        """Params before, limit: rows (Seq, Headers) of the newest ``limit`` rows with Seq below ``before``,
        newest first, unlocked (bodies are not read)."""

    @abstractmethod
    def delete_by_seq_sql(self, address: QueueAddress) -> str:
        """Params seq: delete one row by its sequence value."""

    # -- delayed delivery: NServiceBus's ``<queue>.Delayed`` table ------------------------------

    @abstractmethod
    def create_delayed_sql(self, delayed: QueueAddress) -> Sequence[str]:
        """DDL of a delayed-message table with its index on Due, as NServiceBus creates it (idempotent)."""

    @abstractmethod
    def store_delayed_sql(self, delayed: QueueAddress) -> str:
        """Insert one delayed message (``headers``, ``body``) due ``delay_ms`` after the database's UTC clock."""

    @abstractmethod
    def due_delayed_sql(self, delayed: QueueAddress) -> str:
        """Lock up to ``limit`` rows whose Due has passed, earliest first, skipping rows another mover
        holds. Rows: :class:`DueRow`."""

    @abstractmethod
    def delete_delayed_sql(self, delayed: QueueAddress) -> str:
        """Delete the rows of a delayed table whose keys are in ``keys`` (see :meth:`key_list`)."""

    @abstractmethod
    def next_due_sql(self, delayed: QueueAddress) -> str:
        """One row: milliseconds from the database clock to the earliest Due (negative when overdue),
        NULL when the table is empty."""

    def waiting_ids_sql(self, address: QueueAddress) -> str | None:
        """Params ids (see :meth:`token_list`) -> rows (Id,) of those ids already in the queue table; None
        where the table does not key its rows by Id (then no id can collide)."""
        return None

    @abstractmethod
    def key_list(self, keys: Sequence[Any]) -> object:
        """The ``keys`` parameter of :meth:`delete_delayed_sql` for keys read by :meth:`due_delayed_sql`."""

    # -- publish/subscribe: NServiceBus's ``SubscriptionRouting`` table --------------------------

    @abstractmethod
    def create_subscriptions_sql(self, table: QueueAddress) -> Sequence[str]:
        """DDL of the subscription table (QueueAddress, Endpoint, Topic; key Endpoint + Topic), idempotent."""

    @abstractmethod
    def subscribe_sql(self, table: QueueAddress) -> str:
        """Subscribe ``endpoint`` at queue ``address`` to ``topic``; a repeat (or another address) updates the row."""

    @abstractmethod
    def unsubscribe_sql(self, table: QueueAddress) -> str:
        """Remove the subscription of ``endpoint`` to ``topic`` (nothing when there is none)."""

    @abstractmethod
    def subscribers_sql(self, table: QueueAddress) -> str:
        """Rows (QueueAddress,): the distinct queue addresses subscribed to any of ``topics`` (see :meth:`topic_list`)."""

    @abstractmethod
    def topic_list(self, topics: Sequence[str]) -> object:
        """The ``topics`` parameter of :meth:`subscribers_sql`."""

    # -- wake-up notifications (optional) --------------------------------------------------------

    def notifying_sql(self, insert_sql: str) -> str | None:
        """The insert ``insert_sql`` as one statement that also wakes the queue's listeners when its
        transaction commits, with the lowest Seq it inserted as the payload; None where the database
        has no notifications.

        Params: those of the insert, and channel (from :meth:`notify_channel`).
        """
        return None

    def notify_channel(self, address: QueueAddress) -> str:
        """The notification channel of a queue: derived from its canonical address, safe as an identifier."""
        import hashlib

        return "sqlqueue_" + hashlib.sha256(self.claim_key(address).encode("utf-8")).hexdigest()[:40]

    def listen_sql(self, channel: str) -> str | None:
        """Statement that subscribes a session to a channel; None if the database has no notifications."""
        return None

    # -- claim mode ----------------------------------------------------------------------------

    @abstractmethod
    def claim_sql(self, address: QueueAddress, bodies: bool = True) -> str:
        """Params limit, queue, deliveries, lease_ms, holder: move up to limit oldest unexpired rows in flight.

        ``bodies`` False returns every Body as NULL: for a bulk reader that reads the claims'
        bodies itself (a Spark read), so they do not cross the network twice.

        ``deliveries`` is 1 for a claim handed to a handler, 0 for a reservation (``holder`` NULL)
        that a task takes later. Expired rows met on the way are deleted and returned with a NULL
        token, so the caller can tell a drained queue from a run of expired messages.
        Rows: :class:`ClaimedRow`.
        """

    @abstractmethod
    def reclaim_sql(self, address: QueueAddress, bodies: bool = True) -> str:
        """Params deliveries (added), lease_ms, holder, queue, limit: renew up to limit lapsed claims
        (``bodies`` as in :meth:`claim_sql`).

        Every renewed claim gets a new token, so its previous holder can no longer settle it.
        Rows: :class:`HeldRow`.
        """

    @abstractmethod
    def take_sql(self, address: QueueAddress) -> str:
        """Params lease_ms, holder, tokens, queue: hand reservations (holder NULL) to ``holder``.

        A delivery is counted and the token replaced. Rows as :meth:`reclaim_sql`.
        """

    @abstractmethod
    def adopt_sql(self, address: QueueAddress) -> str:
        """Params lease_ms, holder, queue, limit: :meth:`take_sql` the queue's oldest reservations, whoever made them.

        Rows as :meth:`take_sql`.
        """

    @abstractmethod
    def peek_with_claims_sql(self, address: QueueAddress) -> str:
        """Params queue -> one row (pending, lapsed): :meth:`peek_sql`'s estimate, and the claims whose lease
        ran out, in one query."""

    @abstractmethod
    def count_inflight_sql(self, address: QueueAddress) -> str:
        """Params queue -> one row: claims currently held on the queue."""

    @abstractmethod
    def claim_figures_sql(self, address: QueueAddress) -> str:
        """Params queue -> one row (in flight, lapsed): the queue's claims, and those whose lease ran out."""

    @abstractmethod
    def claims_sql(self, address: QueueAddress) -> str:
        """Params queue, limit: the queue's ``limit`` claims whose leases end first (lapsed ones first).
        Rows: :class:`ClaimRow`."""

    @abstractmethod
    def purge_expired_claims_sql(self, address: QueueAddress) -> str:
        """Params queue, limit: delete up to ``limit`` lapsed claims of the queue whose messages expired
        (never to be delivered: nobody holds them); rowcount is the number deleted."""

    @abstractmethod
    def release_lapsed_sql(self, address: QueueAddress, shape: TableShape) -> str:
        """Params queue, limit: move up to ``limit`` lapsed claims back into the queue table, where every
        receiver (an NServiceBus endpoint too) finds them again; rows (Id,) of the messages moved."""

    @abstractmethod
    def token_list(self, tokens: Sequence[uuid.UUID]) -> object:
        """The parameter that carries several claim tokens into one statement."""

    @abstractmethod
    def ack_sql(self, address: QueueAddress) -> str:
        """Params tokens, queue: delete the queue's claims; rows: the tokens that were still held."""

    @abstractmethod
    def ack_copy_sql(self, address: QueueAddress) -> str:
        """As :meth:`ack_sql`, with rows (Token, Id, Headers, Body): what an audit copy of each is made of."""

    @abstractmethod
    def nack_sql(self, address: QueueAddress) -> str:
        """Params delay_ms, error, tokens, queue: end leases so the messages come again after delay_ms.

        Rows: the tokens that were still held.
        """

    @abstractmethod
    def extend_sql(self, address: QueueAddress) -> str:
        """Params lease_ms, tokens, queue: renew leases; rows: the tokens still held.

        A token is held until it is settled or someone else renews the lapsed claim (which replaces
        the token): a renewal that comes late but before anyone else took the message still holds.
        """

    @abstractmethod
    def held_sql(self, address: QueueAddress) -> str:
        """Params queue, holder, parts, part: the claims ``holder`` holds on the queue whose Seq modulo
        ``parts`` is ``part``, in send order, lapsed or not; rows: :class:`ClaimedRow`.

        A claim keeps its holder until it is settled or someone else takes it over, so reading
        again returns the same messages: what a reader whose work may be retried needs.
        """

    @abstractmethod
    def ack_held_sql(self, address: QueueAddress) -> str:
        """Params queue, holder: delete every claim ``holder`` holds on the queue; the row count says how many."""

    @abstractmethod
    def extend_held_sql(self, address: QueueAddress) -> str:
        """Params lease_ms, queue, holder: renew every claim ``holder`` holds, lapsed ones too; the row
        count says how many. A lapsed claim someone else took has another holder and is left alone."""

    @abstractmethod
    def nack_held_sql(self, address: QueueAddress) -> str:
        """Params delay_ms, error, queue, holder: end the leases of every claim ``holder`` holds, so
        they come again after delay_ms; the row count says how many."""

    @abstractmethod
    def create_writes_sql(self, ledger: QueueAddress) -> Sequence[str]:
        """DDL of a write ledger (WriteId, Part, Recorded; key WriteId + Part), idempotent: which
        partitions of a write of many partitions have committed, so a re-run partition is skipped."""

    @abstractmethod
    def record_write_sql(self, ledger: QueueAddress) -> str:
        """Params write, part: record that a partition commits; the row count is 1, or 0 when it was
        recorded before. A second recorder of the same partition waits for the first one's
        transaction, so of two attempts running at once one sends."""

    @abstractmethod
    def forget_write_sql(self, ledger: QueueAddress) -> str:
        """Params write: delete a write's ledger rows once the write is over; the row count says how many."""

    @abstractmethod
    def claim_to_error_sql(self, address: QueueAddress, error_address: QueueAddress, shape: TableShape) -> str:
        """Params token, queue, headers: move a claim of the queue, with new headers, to the error queue
        (a token of another queue's claim moves nothing: rowcount 0)."""

    # -- batches locked by a transaction -------------------------------------------------------
    #
    # The oldest rows locked by one open transaction and read meanwhile by other sessions, which
    # find them by that transaction's id: NServiceBus's native receive, for a batch read elsewhere
    # (see operations/locked.py). A dialect whose readers cannot tell one transaction's locks from
    # another's raises TransportMisconfiguredError from each, saying why.

    @abstractmethod
    def check_locked_batches(self) -> None:
        """Raise :class:`~..errors.TransportMisconfiguredError`, saying why, where this database cannot
        hold a batch by a transaction's locks: what a caller asks before it connects (a Spark read)."""

    @abstractmethod
    def lock_batch_sql(self, address: QueueAddress) -> str:
        """Params limit: lock up to ``limit`` of the oldest unexpired rows until the transaction ends,
        skipping rows another session holds. Rows (Seq, Headers), in Seq order."""

    @abstractmethod
    def locker_sql(self, address: QueueAddress) -> str:
        """Params seq -> one row: the open transaction's id (given one now if it had none), and whether
        the row at ``seq`` is locked under that id (False: under a savepoint's own id; NULL: no such row)."""

    @abstractmethod
    def current_transaction_sql(self) -> str:
        """No params -> one row: the open transaction's id, NULL while it has none (it locked and wrote nothing)."""

    @abstractmethod
    def browse_locked_sql(self, address: QueueAddress) -> str:
        """Params after, last, limit, locked_by: :meth:`browse_sql` of the rows the transaction
        ``locked_by`` holds locked, while it is open (none once it has ended). Rows: :class:`BrowsedRow`."""

    @abstractmethod
    def transaction_open_sql(self) -> str:
        """Params locked_by -> one row: whether that transaction is still open."""

    @abstractmethod
    def locked_rows_table_sql(self, address: QueueAddress, locked_by: int) -> str:
        """No params (a derived table for a bulk reader in another process, Spark's JDBC reader, which
        binds none): the rows (seq, id, headers, body) of :meth:`browse_locked_sql` while the
        transaction ``locked_by`` is open, and one row of NULLs once it has ended."""

    @abstractmethod
    def seq_window_sql(self, after: int, last: int) -> str:
        """A condition on :meth:`locked_rows_table_sql`'s rows: those with after < seq <= last, and its row
        of NULLs."""

    @abstractmethod
    def locked_to_error_sql(self, address: QueueAddress, error_address: QueueAddress, shape: TableShape) -> str:
        """Params seqs (see :meth:`seq_list`), locked_by: move those of the rows the transaction holds
        locked, unchanged, to the error queue. Rows (Id, Headers) of the rows moved, their headers as
        they were."""

    @abstractmethod
    def ack_locked_sql(self, address: QueueAddress) -> str:
        """Params after, last, locked_by -> one row: delete the rows with after < Seq <= last that the
        transaction holds locked, and count those that had not expired meanwhile."""

    @abstractmethod
    def ack_locked_copy_sql(self, address: QueueAddress) -> str:
        """As :meth:`ack_locked_sql`, with rows (Id, Headers, Body) of the unexpired rows deleted: what
        an audit copy of each is made of."""

    # -- errors --------------------------------------------------------------------------------

    @abstractmethod
    def translate_error(self, exc: BaseException, address: str) -> SqlQueueError | None:
        """Map a driver exception to the transport's error classes; None to let it propagate as is."""
