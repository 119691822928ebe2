"""Queue operations, written once for every database and for sync and async callers.

Each operation is a generator that yields :class:`Step` objects (a statement, its parameters and
what to fetch) and receives each step's result; a driver runs the steps on a connection inside one
transaction (:func:`drive`). The operation decides *what* happens -- dropping
expired rows, routing poison rows to the error queue, counting deliveries -- and the dialect says
*how* in SQL, so those rules cannot drift between PostgreSQL and SQL Server or between the sync
client and the asyncio pump.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Awaitable, Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from enum import Enum
from operator import itemgetter
from typing import Any, ParamSpec, Protocol, TypeVar, runtime_checkable

import msgspec

from . import defaults
from .addressing import QueueAddress
from .dialects import (
    BrowsedRow,
    ClaimedRow,
    ClaimRow,
    DelayedFiguresRow,
    Dialect,
    DueRow,
    ErrorRow,
    FailedRow,
    HeldRow,
    HorizonRow,
    QueueFiguresRow,
    ReceivedRow,
    SendRow,
    TableShape,
)
from .errors import (
    InvalidArgumentError,
    InvalidHeadersError,
    LeaseLostError,
    NotAQueueError,
    QueueNotFoundError,
    SqlQueueError,
)
from .heads import EVERYTHING_MS, Head
from .logs import logger
from .message import (
    DELIVERY_COUNT,
    ENCLOSED_MESSAGE_TYPES,
    EXCEPTION_MESSAGE,
    EXCEPTION_TYPE,
    FAILED_QUEUE,
    FORWARD_DESTINATION,
    MESSAGE_ID,
    MESSAGE_INTENT,
    TIME_OF_FAILURE,
    TIME_SENT,
    Failure,
    Headers,
    Message,
    ReceivedMessage,
    audit_headers,
    decode_headers,
    encode_headers,
    failure_headers,
    parse_wire_timestamp,
    processing_headers,
    wire_timestamp,
    without_failure_headers,
)

log = logger("airflow_provider_sqlqueue.transport")

T = TypeVar("T")


class Fetch(Enum):
    """What a step's result is: nothing, one row, all rows, or the affected row count."""

    NONE = "none"
    ONE = "one"
    ALL = "all"
    ROWCOUNT = "rowcount"
    #: All rows, as ALL, with uuid columns as their text where the driver can load them so (a bulk
    #: read that wants text ids, without a UUID object made and printed per row).
    ALL_UUID_TEXT = "all_uuid_text"
    #: COPY ... FROM STDIN of ``params["rows"]`` typed ``params["types"]``; the result is the row count.
    COPY = "copy"


@dataclass(frozen=True)
class Step:
    """One statement to run with its named parameters; ``target`` names the queue in error messages."""

    sql: str
    params: Mapping[str, Any]
    fetch: Fetch
    target: str


Operation = Generator[Step, Any, T]
P = ParamSpec("P")


class _Autocommit(Generator[Step, Any, T]):
    """An operation whose statements need no enclosing transaction (see :func:`needs_no_transaction`)."""

    autocommit = True

    def __init__(self, op: Operation[T]) -> None:
        self._op = op

    def send(self, value: Any) -> Step:
        return self._op.send(value)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Step:
        return self._op.throw(typ, val, tb)


def autocommitted(make: Callable[P, Operation[T]]) -> Callable[P, Operation[T]]:
    """Declare that an operation's statements may each commit alone.

    Either it is a single statement (atomic by itself), or each of its statements is atomic and
    its guarantee does not need them to commit together -- a claim moves rows in flight in one
    statement, and whatever follows (dead-lettering, dropping expired claims) works on rows that
    are already safe in the in-flight table.
    """

    @functools.wraps(make)
    def declared(*args: P.args, **kwargs: P.kwargs) -> Operation[T]:
        return _Autocommit(make(*args, **kwargs))

    return declared


def needs_no_transaction(op: Operation[Any]) -> bool:
    """Whether ``op`` may run with each statement committing by itself.

    True for single statements, and for operations whose statements are each atomic and whose
    guarantee does not need them to commit together. On an autocommit connection the drivers
    then send no BEGIN and COMMIT, which saves two round trips.
    """
    return getattr(op, "autocommit", False) is True


async def drive(op: Operation[T], execute: Callable[[Step], Awaitable[Any]]) -> T:
    """Run an operation step by step with a session's ``execute``; the caller owns the transaction."""
    try:
        step = next(op)
        while True:
            step = op.send(await execute(step))
    except StopIteration as done:
        result: T = done.value
        return result


def as_uuid(value: Any) -> uuid.UUID:
    """A uniqueidentifier from any driver: psycopg and pymssql return UUIDs, pyodbc returns text."""
    return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))


# -- installation ------------------------------------------------------------------------------


def create_queue(d: Dialect, address: QueueAddress, body_string: bool = False) -> Operation[None]:
    """Create the queue table with its indexes (idempotent, safe concurrently), or check the existing one.

    An existing table is never altered for indexes: building one on a live queue locks it. A
    missing Index_Expires is warned about, with the statement to create it at a quiet time.
    """
    yield from _install_table(d, address, d.create_queue_sql(address))
    yield from check_queue(d, address)
    if body_string:
        yield Step(d.add_body_string_sql(address), {}, Fetch.NONE, d.qualified_name(address))


def _install_table(d: Dialect, table: QueueAddress, ddl: Sequence[str], kind: str | None = None) -> Operation[None]:
    """Run ``ddl`` under the installer lock when ``table`` does not exist yet; an existing table is left as it
    is, and refused when it is not a table of ``kind`` (queue tables are checked by their installer)."""
    target = d.qualified_name(table)
    yield Step(d.install_lock_sql(table), {}, Fetch.NONE, target)
    existing = yield Step(d.queue_columns_sql(table), _table_key(d, table), Fetch.ALL, target)
    if existing and kind is not None:
        d.learn_table_of(kind, table, existing)
    if not existing:
        for sql in ddl:
            yield Step(sql, {}, Fetch.NONE, target)


def _table_key(d: Dialect, address: QueueAddress) -> dict[str, object]:
    """The schema and table parameters of the catalog queries."""
    return {"schema": address.schema or d.default_schema, "table": address.table}


def table_shape(d: Dialect, address: QueueAddress) -> Operation[TableShape]:
    """The layout of the queue table at ``address``, checked to be a queue table the first time a session touches it.

    Every operation that reads, writes, deletes from or drops a queue table passes here first, so
    a name that reaches the wrong table -- a business table, a catalog table, the claim store --
    is refused (:class:`~.errors.NotAQueueError`, :class:`~.errors.QueueNotFoundError`) before any
    statement touches it.
    """
    shape = d.table_shape(address)
    if shape is None:
        target = d.qualified_name(address)
        columns = yield Step(d.queue_columns_sql(address), _table_key(d, address), Fetch.ALL, target)
        if not columns:
            raise QueueNotFoundError(target)
        shape = d.learn_table_shape(address, columns)
    return shape


def checked(d: Dialect, queues: Sequence[QueueAddress], op: Operation[T]) -> Operation[T]:
    """``op``, after checking that each of ``queues`` is a queue table: for calls that name a queue
    they do not otherwise touch (a filter, a default endpoint name), which must not be a typo either."""
    for queue in queues:
        yield from table_shape(d, queue)
    return (yield from op)


def check_existing(d: Dialect, tables: Sequence[tuple[str, QueueAddress]]) -> Operation[None]:
    """Refuse, before an installer creates anything, a plan naming a table that exists as something
    else (a business table given as the error or audit queue): a refused installation leaves no
    table behind. ``tables``: (kind, address), kind ``queue`` or one of :attr:`Dialect.kind_columns`."""
    holder_sql = d.index_name_holder_sql()
    for kind, address in tables:
        d.forget_table(address)
        target = d.qualified_name(address)
        columns = yield Step(d.queue_columns_sql(address), _table_key(d, address), Fetch.ALL, target)
        if columns and kind == "queue":
            d.learn_table_shape(address, columns)
        elif columns:
            d.learn_table_of(kind, address, columns)
        for index in d.named_indexes(kind, address):
            if holder_sql is None:
                break
            held = yield Step(holder_sql, {**_table_key(d, index), "on": address.table}, Fetch.ONE, target)
            if held is None or held[0]:
                continue
            clash = f"{index.table!r}, the name of an index on {target}, is already {held[1]} in its schema"
            if not columns:  # "IF NOT EXISTS" would skip the new table's index without a word
                raise InvalidArgumentError(f"{clash}; rename one of the two tables")
            # A table made so by an earlier version works without that index; it only goes slower.
            log.warning("%s: %s lacks that index; rename one of the two tables to have it", clash, target)


def table_of(d: Dialect, address: QueueAddress, kind: str) -> Operation[None]:
    """Check, the first time a session touches it, that ``address`` is a table of ``kind`` (a queue's
    delayed messages, a subscription table, a write ledger: :attr:`Dialect.kind_columns`)."""
    if not d.is_table_of(kind, address):
        target = d.qualified_name(address)
        columns = yield Step(d.queue_columns_sql(address), _table_key(d, address), Fetch.ALL, target)
        if not columns:
            raise QueueNotFoundError(target)
        d.learn_table_of(kind, address, columns)


def create_inflight(d: Dialect, address: QueueAddress) -> Operation[None]:
    """Create the in-flight table that claim mode needs in ``address``'s schema."""
    target = d.qualified_name(d.inflight_address(address))
    yield Step(d.install_lock_sql(d.inflight_address(address)), {}, Fetch.NONE, target)
    for sql in d.create_inflight_sql(address):
        yield Step(sql, {}, Fetch.NONE, target)


def check_queue(d: Dialect, address: QueueAddress) -> Operation[None]:
    """Fail clearly when the table is missing or not a queue table; warn when Index_Expires is missing."""
    d.forget_table(address)  # read the catalog afresh: the caller asks about the table as it is now
    yield from table_shape(d, address)
    target = d.qualified_name(address)
    indexed = yield Step(d.has_expires_index_sql(address), _table_key(d, address), Fetch.ONE, target)
    if not indexed[0]:
        log.warning(
            "Queue %s has no index on Expires, so purging expired messages scans the whole table. Create it with: %s",
            target,
            d.expires_index_ddl_sql(address),
        )


def drop_queue(d: Dialect, address: QueueAddress) -> Operation[None]:
    """Drop a queue table; a missing one is already gone, and a table that is not a queue is refused."""
    d.forget_table(address)
    try:
        yield from table_shape(d, address)
    except QueueNotFoundError:
        return
    yield Step(d.drop_queue_sql(address), {}, Fetch.NONE, d.qualified_name(address))
    d.forget_table(address)
    delayed = address.delayed()  # its delayed-message table goes with it
    columns = yield Step(d.queue_columns_sql(delayed), _table_key(d, delayed), Fetch.ALL, d.qualified_name(delayed))
    if columns:
        d.learn_table_of("delayed", delayed, columns)
        yield Step(d.drop_queue_sql(delayed), {}, Fetch.NONE, d.qualified_name(delayed))
        d.forget_table(delayed)


# -- sending -----------------------------------------------------------------------------------


def send(d: Dialect, address: QueueAddress, messages: Sequence[Message], notify: bool = False) -> Operation[int]:
    """Insert messages in as few statements as the dialect allows; returns how many were sent.

    With ``notify`` (where the database has notifications) listeners of the queue are woken when
    the transaction commits, once per send however many messages it holds: the last INSERT carries
    the notification, so a send that is one INSERT (one message, or any batch where the dialect
    inserts batches whole) needs no transaction (the table's layout, read once per session, is only
    read).
    """
    op = _send(d, address, messages, notify)
    return _Autocommit(op) if len(messages) == 1 or d.one_statement_sends else op


def _send(d: Dialect, address: QueueAddress, messages: Sequence[Message], notify: bool) -> Operation[int]:
    shape = yield from table_shape(d, address)
    sent_at = wire_timestamp(datetime.now(UTC))
    rows: list[SendRow] = [
        (m.id, m.ttbr_ms(), m.wire_headers(sent_at, ascii_only=shape.ascii_headers), m.body) for m in messages
    ]
    yield from _insert(d, address, shape, rows, d.notify_channel(address) if notify else None)
    return len(rows)


def _insert(
    d: Dialect, address: QueueAddress, shape: TableShape, rows: Sequence[SendRow], channel: str | None = None
) -> Operation[None]:
    """Insert ready-made rows into a queue table in as few statements as the dialect allows; the last
    statement also notifies ``channel`` when one is given and the database has notifications."""
    target = d.qualified_name(address)
    statements = list(_insert_statements(d, address, shape, rows))
    if not statements:
        return
    for sql, params in statements[:-1]:
        yield Step(sql, params, Fetch.NONE, target)
    sql, params = statements[-1]
    notifying = None if channel is None else d.notifying_sql(sql)
    if notifying is not None:
        sql, params = notifying, {**params, "channel": channel}
    yield Step(sql, params, Fetch.NONE, target)


def _insert_statements(
    d: Dialect, address: QueueAddress, shape: TableShape, rows: Sequence[SendRow]
) -> Iterator[tuple[str, dict[str, object]]]:
    """The INSERTs of ``rows`` with their parameters: one for a single row, else batches of the dialect's size."""
    if len(rows) == 1:
        message_id, ttbr_ms, headers, body = rows[0]
        yield d.send_sql(address, shape), {"id": message_id, "ttbr_ms": ttbr_ms, "headers": headers, "body": body}
        return
    sent = 0
    while sent < len(rows):
        count = d.batch_size(rows[sent:])
        yield d.send_batch_sql(address, count, shape), d.send_batch_params(rows[sent : sent + count])
        sent += count


@runtime_checkable
class CopiesSends(Protocol):
    """A dialect whose database loads many rows into a queue table faster than INSERTs (PostgreSQL's COPY)."""

    def copy_send_sql(self, address: QueueAddress, shape: TableShape) -> tuple[str, tuple[str, ...]]:
        """The COPY statement loading (Id, Headers, Body) rows, Expires left NULL; and the columns' types."""


def copies_sends(d: Dialect) -> bool:
    """Whether :func:`send_copied` can send to ``d``'s queue tables."""
    return isinstance(d, CopiesSends)


def send_copied(d: Dialect, address: QueueAddress, messages: Sequence[Message]) -> Operation[int]:
    """:func:`send` by the database's bulk load (COPY): the same rows ``send`` inserts, byte for byte.

    Only for messages that never expire: a message's ``Expires`` is the database's clock plus its
    time to be received, computed at insert, which a COPY cannot do; with any such message, or a
    dialect without COPY, this is :func:`send`. No notification: the caller's transaction (a Spark
    partition with its ledger row) decides when the rows appear.
    """
    if not isinstance(d, CopiesSends) or any(m.time_to_be_received is not None for m in messages):
        return (yield from _send(d, address, messages, False))
    shape = yield from table_shape(d, address)
    if not messages:
        return 0
    sent_at = wire_timestamp(datetime.now(UTC))
    rows = [(m.id, m.wire_headers(sent_at, ascii_only=shape.ascii_headers), m.body) for m in messages]
    sql, types = d.copy_send_sql(address, shape)
    yield Step(sql, {"rows": rows, "types": types}, Fetch.COPY, d.qualified_name(address))
    return len(rows)


# -- delayed delivery ----------------------------------------------------------------------------


def create_delayed(d: Dialect, delayed: QueueAddress) -> Operation[None]:
    """Create a queue's delayed-message table (idempotent, safe concurrently)."""
    yield from _install_table(d, delayed, d.create_delayed_sql(delayed), "delayed")


def send_delayed(
    d: Dialect, address: QueueAddress, delayed: QueueAddress, messages: Sequence[Message], delay_ms: int
) -> Operation[int]:
    """Store messages in the queue's delayed table, due ``delay_ms`` after the database's clock.

    Each is stored as NServiceBus stores one: its headers (with id and time sent filled in) plus
    ``NServiceBus.SqlServer.ForwardDestination`` naming the queue, which whoever moves it when it
    is due -- :func:`move_due` here, or the NServiceBus endpoint that owns the queue -- sends it on to.
    """
    for message in messages:
        if message.time_to_be_received is not None:
            # NServiceBus's rule: a delayed message would wait out part of its TTBR unseen.
            raise InvalidArgumentError(
                "Delayed delivery of messages with TimeToBeReceived set is not supported. "
                "Remove the time_to_be_received to delay this message."
            )
    target = d.qualified_name(delayed)
    yield from table_shape(d, address)
    yield from table_of(d, delayed, "delayed")
    destination = d.format_address(address)
    sent_at = wire_timestamp(datetime.now(UTC))
    stored = [
        Message(m.body, {**m.headers, FORWARD_DESTINATION: destination}, id=m.id).wire_headers(sent_at)
        for m in messages
    ]
    bodies = [m.body for m in messages]
    batch_sql = d.store_delayed_batch_sql(delayed)
    if batch_sql is not None and len(messages) > 1:
        yield Step(batch_sql, {"headers": stored, "bodies": bodies, "delay_ms": delay_ms}, Fetch.NONE, target)
        return len(messages)
    for headers, body in zip(stored, bodies, strict=True):
        yield Step(
            d.store_delayed_sql(delayed), {"headers": headers, "body": body, "delay_ms": delay_ms}, Fetch.NONE, target
        )
    return len(messages)


def move_due(
    d: Dialect,
    address: QueueAddress,
    delayed: QueueAddress,
    error_address: QueueAddress,
    limit: int,
    *,
    every_due: bool = False,
) -> Operation[int]:
    """Move up to ``limit`` due messages from the delayed table to where they are going, in one transaction.

    Rows are locked as they are read and rows other movers hold are skipped, so any number of
    movers (this package's and NServiceBus's own) can run at once: each row is moved by the one
    that deleted it, once. A row goes to the queue its ``ForwardDestination`` header names
    (without that header, as NServiceBus forwards it), or to the table's own queue when the header
    is missing or its headers cannot be read -- there its receiver deals with it as with any
    message. A row whose destination cannot take it -- no such table, a table that is not a queue,
    a queue this connection may not write -- goes to ``error_address`` with the reason in its
    failure headers, so one bad row never stops the others. Each message keeps the id it was sent
    with (``NServiceBus.MessageId``), unless a message of that id is already in its destination
    (the same message delayed twice): that copy goes in under its row's own key, as NServiceBus's
    mover moves every row, rather than failing the batch on the queue's key. Returns how many rows
    were moved.
    """
    target = d.qualified_name(delayed)
    yield from table_shape(d, address)
    yield from table_shape(d, error_address)
    yield from table_of(d, delayed, "delayed")
    head = d.head(delayed)
    params: dict[str, int] = {"limit": limit}
    if head is not None:
        # A mover that runs on and on (the pump's) looks at what came due since its last look, and at
        # everything every HEAD_FULL_RESCAN; ``every_due`` (a caller asking for every due message now)
        # looks at everything.
        params["due_ms"] = EVERYTHING_MS if every_due else head.look_back_ms("due")
    found = yield Step(d.due_delayed_sql(delayed), params, Fetch.ALL, target)
    rows = [DueRow(*row) for row in found]
    if head is not None and len(rows) == limit:
        head.look_again("due")
    if not rows:
        return 0
    routed: dict[QueueAddress, list[SendRow]] = {}
    row_keys: dict[uuid.UUID, uuid.UUID] = {}  # sent id -> the row's own key, for an id already taken
    refused: dict[QueueAddress, str | None] = {}
    for key, headers_text, body in rows:
        destination, headers = _due_destination(d, address, headers_text)
        message_id = _sent_id(headers, key)
        if destination not in refused:
            refused[destination] = yield from _refusal(d, destination)
        reason = refused[destination]
        if reason is not None:
            log.error(
                "A delayed message in %s cannot go to %s (%s); moving it to %s",
                target,
                d.qualified_name(destination),
                reason,
                d.qualified_name(error_address),
            )
            failed = failure_headers(
                _readable_headers(headers) or {},
                d.format_address(address),
                f"delayed delivery to {d.format_address(destination)} failed: {reason}",
            )
            destination, headers = error_address, encode_headers(failed)
        if isinstance(key, uuid.UUID):
            row_keys[message_id] = key
        routed.setdefault(destination, []).append((message_id, None, headers, bytes(body or b"")))
    for destination, batch in routed.items():
        shape = yield from table_shape(d, destination)
        batch = yield from _untaken_ids(d, destination, batch, row_keys)
        yield from _insert(d, destination, shape, batch)
    yield Step(d.delete_delayed_sql(delayed), {"keys": d.key_list([row.key for row in rows])}, Fetch.NONE, target)
    log.debug("Moved %d due delayed message(s) out of %s", len(rows), target)
    return len(rows)


def _refusal(d: Dialect, destination: QueueAddress) -> Operation[str | None]:
    """Why ``destination`` cannot take a message (None: it can): missing, not a queue, or not writable."""
    try:
        yield from table_shape(d, destination)
    except (QueueNotFoundError, NotAQueueError) as exc:
        return str(exc)
    allowed = yield Step(
        d.can_insert_sql(), {"table": d.table_reference(destination)}, Fetch.ONE, d.qualified_name(destination)
    )
    return None if allowed and allowed[0] else f"this connection may not insert into {d.qualified_name(destination)}"


def _untaken_ids(
    d: Dialect, destination: QueueAddress, batch: list[SendRow], row_keys: Mapping[uuid.UUID, uuid.UUID]
) -> Operation[list[SendRow]]:
    """``batch`` with every id not yet in ``destination`` (nor twice in the batch): a row whose id is
    taken goes in under its delayed row's key (a new id where the delayed table has no uuid key)."""
    waiting_sql = d.waiting_ids_sql(destination)
    if waiting_sql is None:  # the table does not key its rows by Id
        return batch
    ids = d.token_list([row[0] for row in batch])
    found = yield Step(waiting_sql, {"ids": ids}, Fetch.ALL, d.qualified_name(destination))
    taken = {as_uuid(row[0]) for row in found}
    untaken: list[SendRow] = []
    for message_id, ttbr_ms, headers, body in batch:
        if message_id in taken:
            new_id = row_keys.get(message_id, uuid.uuid4())
            new_id = new_id if new_id not in taken else uuid.uuid4()
            log.warning(
                "Queue %s already holds message %s; its delayed copy goes in under id %s",
                d.qualified_name(destination),
                message_id,
                new_id,
            )
            message_id = new_id
        taken.add(message_id)
        untaken.append((message_id, ttbr_ms, headers, body))
    return untaken


def _sent_id(headers_text: str, key: object) -> uuid.UUID:
    """The id a delayed message was sent with (its ``NServiceBus.MessageId``), else its row's own key."""
    sent = (_readable_headers(headers_text) or {}).get(MESSAGE_ID)
    try:
        return uuid.UUID(str(sent))
    except ValueError:
        return key if isinstance(key, uuid.UUID) else uuid.uuid4()


def _due_destination(d: Dialect, address: QueueAddress, headers_text: str | None) -> tuple[QueueAddress, str]:
    """Where a due row goes and the headers it goes with (see :func:`move_due`)."""
    try:
        headers = decode_headers(headers_text)
    except InvalidHeadersError:
        return address, headers_text or ""
    forward = headers.pop(FORWARD_DESTINATION, None)
    if forward is None:
        return address, headers_text or ""
    try:
        destination = d.parse_address(forward)
    except SqlQueueError as exc:
        log.warning(
            "A delayed message names an unreadable destination %r (%s); moving it to its own queue", forward, exc
        )
        return address, headers_text or ""
    return destination, encode_headers(headers)


def next_due(d: Dialect, delayed: QueueAddress) -> Operation[int | None]:
    """Milliseconds until the earliest delayed message is due (negative: overdue), None when there is none."""
    yield from table_of(d, delayed, "delayed")
    row = yield Step(d.next_due_sql(delayed), {}, Fetch.ONE, d.qualified_name(delayed))
    return None if row is None or row[0] is None else int(row[0])


# -- publish/subscribe ----------------------------------------------------------------------------


def create_subscriptions(d: Dialect, table: QueueAddress) -> Operation[None]:
    """Create the subscription table (idempotent, safe concurrently)."""
    yield from _install_table(d, table, d.create_subscriptions_sql(table), "subscriptions")


def subscribe(
    d: Dialect, table: QueueAddress, queue: QueueAddress, endpoint: str, topics: Sequence[str]
) -> Operation[None]:
    """Subscribe ``endpoint``, whose queue is ``queue``, to each topic.

    Idempotent: subscribing again changes nothing, or moves the subscription to a new address.
    The queue must be a queue table: a subscription that points elsewhere would fail every publish.
    """
    yield from table_shape(d, queue)
    yield from table_of(d, table, "subscriptions")
    address = d.format_address(queue)
    target = d.qualified_name(table)
    for topic in topics:
        params = {"address": address, "endpoint": endpoint, "topic": topic}
        yield Step(d.subscribe_sql(table), params, Fetch.NONE, target)


def unsubscribe(d: Dialect, table: QueueAddress, endpoint: str, topics: Sequence[str]) -> Operation[None]:
    yield from table_of(d, table, "subscriptions")
    target = d.qualified_name(table)
    for topic in topics:
        yield Step(d.unsubscribe_sql(table), {"endpoint": endpoint, "topic": topic}, Fetch.NONE, target)


@autocommitted
def subscribers(d: Dialect, table: QueueAddress, topics: Sequence[str]) -> Operation[list[str]]:
    """The queue addresses subscribed to any of ``topics``, each once."""
    yield from table_of(d, table, "subscriptions")
    target = d.qualified_name(table)
    rows = yield Step(d.subscribers_sql(table), {"topics": d.topic_list(topics)}, Fetch.ALL, target)
    return [row[0] for row in rows]


def publish(
    d: Dialect, table: QueueAddress, topics: Sequence[str], messages: Sequence[Message], notify: bool = False
) -> Operation[list[QueueAddress]]:
    """Send ``messages`` to every queue subscribed to any of ``topics``, in this one transaction.

    ``topics`` are the event's type and the types it derives from, most specific first, as
    NServiceBus publishes; each message goes out with ``NServiceBus.MessageIntent: Publish`` and,
    unless it has them, ``NServiceBus.EnclosedMessageTypes`` naming the topics. Every subscriber
    gets the same message ids. A subscribed queue that does not exist fails the whole publish
    (nothing is sent), so no subscriber silently misses an event. Returns the queues reached.
    """
    found = yield from subscribers(d, table, topics)
    # Subscriptions written differently (``orders``, ``orders@"public"``) may name one table: each gets one copy.
    resolved: dict[tuple[str | None, str, str], QueueAddress] = {}
    for text in found:
        destination = d.parse_address(text)
        key = (destination.catalog, destination.schema or d.default_schema, destination.table)
        resolved.setdefault(key, destination)
    destinations = list(resolved.values())
    event_headers = {MESSAGE_INTENT: "Publish", ENCLOSED_MESSAGE_TYPES: ";".join(topics)}
    published = [
        Message(m.body, {**event_headers, **m.headers}, id=m.id, time_to_be_received=m.time_to_be_received)
        for m in messages
    ]
    for destination in destinations:
        yield from _send(d, destination, published, notify)
    log.debug("Published %d message(s) on %s to %d queue(s)", len(messages), ", ".join(topics), len(destinations))
    return destinations


# -- receiving ---------------------------------------------------------------------------------


class Taken(list[ReceivedMessage]):
    """Messages a receive, claim or take handed out, and how many rows it moved to the error queue
    instead (unreadable headers, delivered ``max_deliveries`` times): what a meter counts as such."""

    moved_to_error: int = 0


def receive(
    d: Dialect, address: QueueAddress, error_address: QueueAddress, limit: int, *, atomic: bool = True
) -> Operation[Taken]:
    """Delete and return up to ``limit`` of the oldest messages.

    Expired rows are deleted and never returned. Rows whose headers NServiceBus could not read are
    moved, unchanged, to the error queue in the same transaction. When rows are dropped this way
    the receive asks again for the shortfall, so a run of expired messages cannot make a non-empty
    queue look empty -- except on a queue that is its own error queue, where a moved row goes to
    the back of the same queue: then the receive returns what it has, so it never meets that row
    again within one call.

    ``atomic=False`` (``none`` mode, at-most-once already) lets each statement commit by itself:
    a receive is then one round trip, and a poison row is moved by a second statement -- a process
    that dies between the two loses that row, as it would any message it had received.
    """
    op = _receive(d, address, error_address, limit)
    return op if atomic else _Autocommit(op)


_RECEIVED_SEQ = itemgetter(ReceivedRow._fields.index("seq"))


def _receive(d: Dialect, address: QueueAddress, error_address: QueueAddress, limit: int) -> Operation[Taken]:
    yield from table_shape(d, address)
    yield from table_shape(d, error_address)  # a poison row must have somewhere to go: known before any receive
    target = d.qualified_name(address)
    head = d.head(address)
    received = Taken()
    requeued = False
    while len(received) < limit and not requeued:
        wanted = limit - len(received)
        params = {"limit": wanted, **_after_head(head)}
        rows: list[ReceivedRow] = yield Step(d.receive_sql(address), params, Fetch.ALL, target)
        rows.sort(key=_RECEIVED_SEQ)  # plain driver tuples, in the shape of ReceivedRow
        if head is not None:
            head.taken([row[4] for row in rows])
        if any(row[1] for row in rows):
            yield from _purge_expired_run(d, address)
        for message_id, expired, headers_text, body, _seq in rows:
            if expired:
                log.debug("Dropped expired message %s from %s", message_id, target)
                continue
            try:
                headers = decode_headers(headers_text)
            except InvalidHeadersError as exc:
                _log_poison(d, address, error_address, message_id, exc)
                error_shape = yield from table_shape(d, error_address)
                yield Step(
                    d.insert_error_sql(error_address, error_shape),
                    {"id": message_id, "headers": headers_text or "", "body": body},
                    Fetch.NONE,
                    d.qualified_name(error_address),
                )
                received.moved_to_error += 1
                requeued = requeued or d.qualified_name(error_address) == target
                continue
            received.append(ReceivedMessage(as_uuid(message_id), headers, bytes(body or b"")))
        if len(rows) < wanted:
            break
    return received


def _after_head(head: Head | None) -> dict[str, int]:
    """Where a scan for live rows starts, as its parameter: after the session's head, where the
    dialect keeps one (:mod:`.heads`)."""
    return {} if head is None else {"after": head.start()}


def _purge_expired_run(d: Dialect, address: QueueAddress, *, claims: bool = False) -> Operation[int]:
    """Delete the expired messages a receive has met, in bulk: a run of them at the head of a queue
    (a consumer that was down longer than their time to be received) then costs a few set-based
    statements instead of one receive per row. Bounded per statement, and rows other receivers
    hold are skipped. ``claims``: the queue's lapsed claims whose messages expired (consumers that
    died holding them), which would otherwise cost a claim one reclaim each."""
    if claims:
        sql, params, what = d.purge_expired_claims_sql(address), {"queue": d.claim_key(address)}, "lapsed claim(s)"
    else:
        sql, params, what = d.purge_expired_sql(address), {}, "message(s)"
    purged = 0
    while True:
        count = yield Step(sql, {**params, "limit": defaults.PURGE_BATCH}, Fetch.ROWCOUNT, d.qualified_name(address))
        purged += int(count)
        if int(count) < defaults.PURGE_BATCH:
            break
    if purged:
        log.info("Queue %s: deleted %d expired %s met by a receive", d.qualified_name(address), purged, what)
    return purged


def _log_poison(
    d: Dialect, address: QueueAddress, error_address: QueueAddress, message_id: uuid.UUID, exc: Exception
) -> None:
    """Say why a row is moved, unchanged, to the error queue: its headers cannot be read."""
    log.error(
        "Message %s in %s has unreadable headers (%s); moving it unchanged to %s",
        message_id,
        d.qualified_name(address),
        exc,
        d.qualified_name(error_address),
    )


def move_to_error(
    d: Dialect,
    address: QueueAddress,
    error_address: QueueAddress,
    message: ReceivedMessage,
    error: BaseException | str | None,
) -> Operation[None]:
    """Put a message that was already removed from its queue into the error queue with failure headers."""
    yield from table_shape(d, address)
    headers = failure_headers(message.headers, d.format_address(address), error)
    shape = yield from table_shape(d, error_address)
    yield Step(
        d.insert_error_sql(error_address, shape),
        {"id": message.id, "headers": encode_headers(headers, ascii_only=shape.ascii_headers), "body": message.body},
        Fetch.NONE,
        d.qualified_name(error_address),
    )


# -- claim mode --------------------------------------------------------------------------------


@autocommitted
def claim(
    d: Dialect,
    address: QueueAddress,
    error_address: QueueAddress,
    limit: int,
    lease_ms: int,
    max_deliveries: int,
    holder: str | None,
    *,
    reclaim: bool = True,
) -> Operation[Taken]:
    """Claim up to ``limit`` messages: first those whose lease ran out, then fresh ones from the queue.

    ``reclaim=False`` skips looking for lapsed claims (one statement less), for a caller that has
    just seen there are none (:func:`peek_claims`); claims lapsing meanwhile wait for the next look.

    With a ``holder`` the messages are delivered to it (their delivery count goes up); without one
    they are *reserved*: held for a task that takes them later (:func:`take`, :func:`adopt`), and
    only that taking counts as a delivery -- a reservation that lapses because nobody came for it
    (a paused DAG, a dead triggerer) costs the message none of its ``max_deliveries``.

    A message that has already been delivered ``max_deliveries`` times is moved to the error
    queue instead of being handed out again, with the failure its last holder reported. Lapsed
    claims whose messages expired are deleted in bulk once one is met, as expired rows of the
    queue are: holders that died long ago cost a claim a few statements, not one each.
    """
    yield from table_shape(d, address)
    yield from table_shape(d, error_address)
    target = d.qualified_name(address)
    queue_key = d.claim_key(address)
    counted = 1 if holder is not None else 0
    params = {"deliveries": counted, "lease_ms": lease_ms, "holder": holder, "queue": queue_key, "limit": limit}
    head = d.head(address)
    claimed = Taken()
    if reclaim:
        if head is not None:
            params["lapsed_ms"] = head.look_back_ms("reclaim")
        held = [HeldRow(*row) for row in (yield Step(d.reclaim_sql(address), params, Fetch.ALL, target))]
        if head is not None and len(held) == limit:
            head.look_again("reclaim")
        claimed = yield from _hand_out(d, address, error_address, held, counted, max_deliveries)
        if any(row.expired for row in held):
            yield from _purge_expired_run(d, address, claims=True)
            if len(held) == limit and len(claimed) < limit:  # lapsed claims may wait behind the expired ones
                shortfall = {**params, "limit": limit - len(claimed)}
                held = [HeldRow(*row) for row in (yield Step(d.reclaim_sql(address), shortfall, Fetch.ALL, target))]
                more = yield from _hand_out(d, address, error_address, held, counted, max_deliveries)
                claimed.extend(more)
                claimed.moved_to_error += more.moved_to_error
    requeued = False  # a poison row moved into this very queue (its own error queue): do not meet it again
    while len(claimed) < limit and not requeued:
        wanted = limit - len(claimed)
        found = yield Step(d.claim_sql(address), {**params, "limit": wanted, **_after_head(head)}, Fetch.ALL, target)
        rows = sorted((ClaimedRow(*row) for row in found), key=lambda row: row.seq)
        if head is not None:
            head.taken([row.seq for row in rows])
        if any(row.token is None for row in rows):
            yield from _purge_expired_run(d, address)
        for token, message_id, headers_text, body, deliveries, _seq in rows:
            if token is None:  # expired: deleted by the statement, reported so the shortfall is asked again
                log.debug("Dropped expired message %s from %s", message_id, target)
                continue
            try:
                headers = decode_headers(headers_text)
            except InvalidHeadersError as exc:
                yield from _claim_poison_to_error(d, address, error_address, token, message_id, headers_text, exc)
                claimed.moved_to_error += 1
                requeued = requeued or d.qualified_name(error_address) == target
                continue
            claimed.append(
                ReceivedMessage(as_uuid(message_id), headers, bytes(body or b""), as_uuid(token), deliveries)
            )
        if len(rows) < wanted:
            break
    return claimed


def _hand_out(
    d: Dialect,
    address: QueueAddress,
    error_address: QueueAddress,
    rows: list[HeldRow],
    counted: int,
    max_deliveries: int | None,
) -> Operation[Taken]:
    """The messages of handed-out claims, in send order.

    Expired messages are dropped, unreadable ones moved to the error queue, and -- given
    ``max_deliveries`` -- those already delivered that often moved there with their last failure.
    """
    target = d.qualified_name(address)
    rows = sorted(rows, key=lambda row: row.seq)
    handed = Taken()
    expired_tokens: list[uuid.UUID] = []
    for token, message_id, expired, headers_text, body, deliveries, last_error, _seq in rows:
        if expired:
            log.debug("Dropped expired claimed message %s from %s", message_id, target)
            expired_tokens.append(as_uuid(token))
            continue
        try:
            headers = decode_headers(headers_text)
        except InvalidHeadersError as exc:
            yield from _claim_poison_to_error(d, address, error_address, token, message_id, headers_text, exc)
            handed.moved_to_error += 1
            continue
        delivered = deliveries - counted  # deliveries before this one
        if max_deliveries is not None and delivered >= max_deliveries:
            log.error(
                "Message %s in %s was delivered %d times without being acknowledged; moving it to %s",
                message_id,
                target,
                delivered,
                d.qualified_name(error_address),
            )
            failure = Failure.from_text(last_error) or f"lease expired {delivered} times without acknowledgement"
            failed = failure_headers(headers, d.format_address(address), failure)
            failed[DELIVERY_COUNT] = str(delivered)
            shape = yield from table_shape(d, error_address)
            yield Step(
                d.claim_to_error_sql(address, error_address, shape),
                {
                    "token": token,
                    "queue": d.claim_key(address),
                    "headers": encode_headers(failed, ascii_only=shape.ascii_headers),
                },
                Fetch.NONE,
                target,
            )
            handed.moved_to_error += 1
            continue
        handed.append(ReceivedMessage(as_uuid(message_id), headers, bytes(body or b""), as_uuid(token), deliveries))
    if expired_tokens:
        params = {"tokens": d.token_list(expired_tokens), "queue": d.claim_key(address)}
        yield Step(d.ack_sql(address), params, Fetch.ALL, target)
    return handed


def _claim_poison_to_error(
    d: Dialect,
    address: QueueAddress,
    error_address: QueueAddress,
    token: uuid.UUID,
    message_id: uuid.UUID,
    headers_text: str | None,
    exc: InvalidHeadersError,
) -> Operation[None]:
    _log_poison(d, address, error_address, message_id, exc)
    shape = yield from table_shape(d, error_address)
    yield Step(
        d.claim_to_error_sql(address, error_address, shape),
        {"token": token, "queue": d.claim_key(address), "headers": headers_text or ""},
        Fetch.NONE,
        d.qualified_name(address),
    )


@autocommitted
def take(
    d: Dialect,
    address: QueueAddress,
    error_address: QueueAddress,
    tokens: Sequence[uuid.UUID] | None,
    lease_ms: int,
    holder: str,
    limit: int,
) -> Operation[Taken]:
    """Hand reservations to ``holder``: those of ``tokens``, or (None) the queue's oldest, up to ``limit``.

    Each taken message gets a new token and a counted delivery, so whoever else still knows the
    reservation's token can neither take nor settle it: a message has one owner at a time.
    Reservations that are gone (taken by someone else, lapsed and renewed, settled) are skipped;
    expired messages are dropped.
    """
    yield from table_shape(d, address)
    yield from table_shape(d, error_address)
    target = d.qualified_name(address)
    queue_key = d.claim_key(address)
    if tokens is None:
        params = {"lease_ms": lease_ms, "holder": holder, "queue": queue_key, "limit": limit}
        found = yield Step(d.adopt_sql(address), params, Fetch.ALL, target)
    elif tokens:
        params = {"lease_ms": lease_ms, "holder": holder, "tokens": d.token_list(tokens), "queue": queue_key}
        found = yield Step(d.take_sql(address), params, Fetch.ALL, target)
    else:
        return Taken()
    return (yield from _hand_out(d, address, error_address, [HeldRow(*row) for row in found], 1, None))


@autocommitted
def ack(d: Dialect, address: QueueAddress, tokens: Sequence[uuid.UUID]) -> Operation[set[uuid.UUID]]:
    """Finish claims; returns the tokens that were still held (a missing one may be with someone else)."""
    yield from table_shape(d, address)
    params = {"tokens": d.token_list(tokens), "queue": d.claim_key(address)}
    rows = yield Step(d.ack_sql(address), params, Fetch.ALL, d.qualified_name(address))
    return {as_uuid(row[0]) for row in rows}


def ack_audited(
    d: Dialect,
    address: QueueAddress,
    tokens: Sequence[uuid.UUID],
    audit_address: QueueAddress,
    started: Mapping[uuid.UUID, datetime],
) -> Operation[set[uuid.UUID]]:
    """Finish claims and copy each finished message to the audit queue, in one transaction.

    Both happen or neither: no message is audited without being acknowledged, none acknowledged
    without its audit copy. A claim no longer held is neither. ``started`` says when the
    processing of each message (by id) began; one missing from it is stamped with the ack's time.
    """
    yield from table_shape(d, address)
    params = {"tokens": d.token_list(tokens), "queue": d.claim_key(address)}
    rows = yield Step(d.ack_copy_sql(address), params, Fetch.ALL, d.qualified_name(address))
    copies = [(as_uuid(message_id), headers_text, body) for _token, message_id, headers_text, body in rows]
    yield from _audit_copies(d, address, audit_address, copies, started)
    return {as_uuid(row[0]) for row in rows}


def audit(
    d: Dialect,
    address: QueueAddress,
    audit_address: QueueAddress,
    messages: Sequence[ReceivedMessage],
    started: Mapping[uuid.UUID, datetime],
) -> Operation[None]:
    """Copy messages received from ``address`` and processed to the audit queue.

    Run it in the transaction of their native receive, so that the copy commits with the receive.
    """
    yield from _audit_copies(d, address, audit_address, [(m.id, m.headers, m.body) for m in messages], started)


def _audit_copies(
    d: Dialect,
    address: QueueAddress,
    audit_address: QueueAddress,
    copies: Sequence[tuple[uuid.UUID, Headers | str | None, bytes | None]],
    started: Mapping[uuid.UUID, datetime],
) -> Operation[None]:
    """Insert the audit copies of processed messages, as NServiceBus's auditing sends them.

    Each copy is a new row (its own row id, never expiring) whose ``NServiceBus.MessageId``
    still names the original, with the processing headers added.
    """
    if not copies:
        return
    shape = yield from table_shape(d, audit_address)
    ended = datetime.now(UTC)
    ended_text, processing = wire_timestamp(ended), processing_headers(address.table)
    rows: list[SendRow] = []
    for message_id, headers, body in copies:
        if not isinstance(headers, dict):
            try:
                headers = decode_headers(headers)
            except InvalidHeadersError:  # a claim with unreadable headers goes to the error queue, never out
                raise SqlQueueError(f"acknowledged message {message_id} has unreadable headers") from None
        copy = audit_headers(headers, processing, started.get(message_id, ended), ended_text)
        copy.setdefault(MESSAGE_ID, str(message_id))
        rows.append((uuid.uuid4(), None, encode_headers(copy, ascii_only=shape.ascii_headers), bytes(body or b"")))
    yield from _insert(d, audit_address, shape, rows)
    log.debug(
        "Audited %d message(s) of %s in %s", len(rows), d.qualified_name(address), d.qualified_name(audit_address)
    )


@autocommitted
def nack(
    d: Dialect, address: QueueAddress, tokens: Sequence[uuid.UUID], failure: Failure | None, delay_ms: int
) -> Operation[set[uuid.UUID]]:
    """Give claims back for redelivery after ``delay_ms``, keeping why; returns the tokens still held."""
    yield from table_shape(d, address)
    params = {
        "delay_ms": delay_ms,
        "error": None if failure is None else failure.to_text(),
        "tokens": d.token_list(tokens),
        "queue": d.claim_key(address),
    }
    rows = yield Step(d.nack_sql(address), params, Fetch.ALL, d.qualified_name(address))
    return {as_uuid(row[0]) for row in rows}


def settle(
    d: Dialect,
    address: QueueAddress,
    done: Sequence[uuid.UUID],
    failed: Sequence[tuple[uuid.UUID, Failure]],
    audit_address: QueueAddress | None = None,
    started: Mapping[uuid.UUID, datetime] | None = None,
) -> Operation[set[uuid.UUID]]:
    """Finish a batch of claims: acknowledge the handled ones (with their audit copies when auditing)
    and give each failed one back at once with its own failure; returns the tokens still held."""
    held: set[uuid.UUID] = set()
    if done and audit_address is not None:
        held |= yield from ack_audited(d, address, done, audit_address, started or {})
    elif done:
        held |= yield from ack(d, address, done)
    for token, failure in failed:
        held |= yield from nack(d, address, [token], failure, 0)
    return held


def settle_then_claim(
    settling: Operation[set[uuid.UUID]], claiming: Operation[Taken]
) -> Operation[tuple[set[uuid.UUID], Taken]]:
    """A consumer's settlement of its last batch and its claim of the next, in one transaction.

    One commit where there were two: a commit waits for the WAL to reach disk, which is most of
    what a claim loop pays per batch. The batch's acknowledgement still precedes the claim, so a
    claim never meets the messages just handled; if the transaction fails, neither happened, and
    the caller settles alone (:func:`settle`) before reporting the failure.
    """
    held = yield from settling
    return held, (yield from claiming)


@autocommitted
def extend(d: Dialect, address: QueueAddress, tokens: Sequence[uuid.UUID], lease_ms: int) -> Operation[set[uuid.UUID]]:
    """Renew leases; returns the tokens still held."""
    yield from table_shape(d, address)
    params = {"lease_ms": lease_ms, "tokens": d.token_list(tokens), "queue": d.claim_key(address)}
    rows = yield Step(d.extend_sql(address), params, Fetch.ALL, d.qualified_name(address))
    return {as_uuid(row[0]) for row in rows}


@autocommitted
def held(d: Dialect, address: QueueAddress, holder: str, parts: int, part: int) -> Operation[list[ReceivedMessage]]:
    """The claims ``holder`` holds on the queue whose Seq modulo ``parts`` is ``part``, in send order.

    The claims were handed out by :func:`claim`, which applied the queue's rules (expired messages
    dropped, unreadable ones and those delivered too often dead-lettered), so every row here is
    readable; one that is not (edited since) is left out with a warning, not dead-lettered here.
    """
    yield from table_shape(d, address)
    params = {"queue": d.claim_key(address), "holder": holder, "parts": parts, "part": part}
    target = d.qualified_name(address)
    messages = []
    for token, message_id, headers_text, body, deliveries, _seq in (
        ClaimedRow(*row) for row in (yield Step(d.held_sql(address), params, Fetch.ALL, target))
    ):
        try:
            headers = decode_headers(headers_text)
        except InvalidHeadersError:
            log.warning("Queue %s: claim of message %s held by %s has unreadable headers", target, message_id, holder)
            continue
        messages.append(ReceivedMessage(as_uuid(message_id), headers, bytes(body or b""), as_uuid(token), deliveries))
    return messages


@dataclass(frozen=True)
class HeldColumns:
    """:func:`held` as columns: the messages' ids (text), headers, bodies and delivery counts."""

    ids: list[str]
    headers: list[Headers]
    bodies: list[bytes]
    deliveries: list[int]


@autocommitted
def held_columns(d: Dialect, address: QueueAddress, holder: str, parts: int, part: int) -> Operation[HeldColumns]:
    """:func:`held` as columns, for a bulk reader (a Spark partition of claims): the same rows, in
    send order, with no message object per row; a row with unreadable headers is left out with a
    warning, as :func:`held` leaves it out."""
    yield from table_shape(d, address)
    params = {"queue": d.claim_key(address), "holder": holder, "parts": parts, "part": part}
    target = d.qualified_name(address)
    rows = yield Step(d.held_sql(address), params, Fetch.ALL_UUID_TEXT, target)
    if not rows:
        return HeldColumns([], [], [], [])
    _tokens, ids, texts, bodies, deliveries, _seqs = (list(column) for column in zip(*rows, strict=True))
    headers = _page_headers(texts)
    if headers is None:
        kept = []
        for n, text in enumerate(texts):
            try:
                kept.append((n, decode_headers(text)))
            except InvalidHeadersError:
                log.warning("Queue %s: claim of message %s held by %s has unreadable headers", target, ids[n], holder)
        ids, bodies = [ids[n] for n, _ in kept], [bodies[n] for n, _ in kept]
        deliveries = [deliveries[n] for n, _ in kept]
        headers = [h for _, h in kept]
    return HeldColumns(_id_texts(ids), headers, _bodies(bodies), deliveries)


@autocommitted
def ack_held_audited(d: Dialect, address: QueueAddress, holder: str, audit_address: QueueAddress) -> Operation[int]:
    """:func:`ack_held` with an audit copy of each message, in the same transaction (:func:`ack_audited`)."""
    messages = yield from held(d, address, holder, 1, 0)
    tokens = [m.claim_token for m in messages if m.claim_token is not None]
    return len((yield from ack_audited(d, address, tokens, audit_address, {}))) if tokens else 0


def ack_held(d: Dialect, address: QueueAddress, holder: str) -> Operation[int]:
    """Finish every claim ``holder`` holds on the queue; returns how many."""
    yield from table_shape(d, address)
    params = {"queue": d.claim_key(address), "holder": holder}
    count = yield Step(d.ack_held_sql(address), params, Fetch.ROWCOUNT, d.qualified_name(address))
    return int(count)


@autocommitted
def extend_held(d: Dialect, address: QueueAddress, holder: str, lease_ms: int) -> Operation[int]:
    """Renew every claim ``holder`` still holds on the queue; returns how many."""
    yield from table_shape(d, address)
    params = {"lease_ms": lease_ms, "queue": d.claim_key(address), "holder": holder}
    count = yield Step(d.extend_held_sql(address), params, Fetch.ROWCOUNT, d.qualified_name(address))
    return int(count)


@autocommitted
def nack_held(d: Dialect, address: QueueAddress, holder: str, failure: Failure | None, delay_ms: int) -> Operation[int]:
    """Give back every claim ``holder`` holds on the queue, delivered again after ``delay_ms``; returns how many."""
    yield from table_shape(d, address)
    params = {
        "delay_ms": delay_ms,
        "error": None if failure is None else failure.to_text(),
        "queue": d.claim_key(address),
        "holder": holder,
    }
    count = yield Step(d.nack_held_sql(address), params, Fetch.ROWCOUNT, d.qualified_name(address))
    return int(count)


# -- the write ledger ----------------------------------------------------------------------------


def create_writes(d: Dialect, ledger: QueueAddress) -> Operation[None]:
    """Create a write ledger (idempotent, safe concurrently)."""
    yield from _install_table(d, ledger, d.create_writes_sql(ledger), "writes")


def record_write(d: Dialect, ledger: QueueAddress, write: uuid.UUID, part: int) -> Operation[bool]:
    """Record that partition ``part`` of ``write`` commits with the caller's transaction; False when
    it committed before (a re-run: send nothing)."""
    yield from table_of(d, ledger, "writes")
    count = yield Step(
        d.record_write_sql(ledger), {"write": write, "part": part}, Fetch.ROWCOUNT, d.qualified_name(ledger)
    )
    return int(count) == 1


@autocommitted
def forget_write(d: Dialect, ledger: QueueAddress, write: uuid.UUID) -> Operation[int]:
    """Delete the ledger rows of a write that is over; returns how many."""
    yield from table_of(d, ledger, "writes")
    count = yield Step(d.forget_write_sql(ledger), {"write": write}, Fetch.ROWCOUNT, d.qualified_name(ledger))
    return int(count)


def forward(
    d: Dialect,
    claims: Sequence[tuple[QueueAddress, Sequence[uuid.UUID]]],
    sends: Sequence[tuple[QueueAddress, Sequence[Message]]],
    notify: bool = False,
    audit: Mapping[QueueAddress, QueueAddress] | None = None,
    started: Mapping[uuid.UUID, datetime] | None = None,
) -> Operation[int]:
    """Acknowledge ``claims`` and send ``sends`` in one transaction: both happen, or neither.

    If any claim is no longer held (its lease ran out and someone else may be handling the
    message) :class:`LeaseLostError` is raised and the caller's transaction rolls the whole
    forward back, so a stage's result is never sent twice for one message. The claims of a queue
    that ``audit`` maps to an audit queue are audited as :func:`ack_audited` does.
    """
    yield from _settle_all(d, claims, audit, started)
    sent = 0
    for address, messages in sends:
        if messages:
            sent += yield from send(d, address, messages, notify)
    return sent


def forward_published(
    d: Dialect,
    claims: Sequence[tuple[QueueAddress, Sequence[uuid.UUID]]],
    table: QueueAddress,
    topics: Sequence[str],
    messages: Sequence[Message],
    notify: bool = False,
    audit: Mapping[QueueAddress, QueueAddress] | None = None,
    started: Mapping[uuid.UUID, datetime] | None = None,
) -> Operation[list[QueueAddress]]:
    """Acknowledge ``claims`` and :func:`publish` ``messages`` in one transaction, as :func:`forward` sends them."""
    yield from _settle_all(d, claims, audit, started)
    return (yield from publish(d, table, topics, messages, notify))


def _settle_all(
    d: Dialect,
    claims: Sequence[tuple[QueueAddress, Sequence[uuid.UUID]]],
    audit: Mapping[QueueAddress, QueueAddress] | None,
    started: Mapping[uuid.UUID, datetime] | None,
) -> Operation[None]:
    """Acknowledge every claim (auditing those of queues ``audit`` maps), or raise :class:`LeaseLostError`."""
    for address, tokens in claims:
        wanted = set(tokens)
        audit_address = (audit or {}).get(address)
        if audit_address is None:
            held = yield from ack(d, address, list(wanted))
        else:
            held = yield from ack_audited(d, address, list(wanted), audit_address, started or {})
        if held != wanted:
            raise LeaseLostError(d.qualified_name(address), sorted(str(token) for token in wanted - held))


def fail_claim(
    d: Dialect,
    address: QueueAddress,
    error_address: QueueAddress,
    message: ReceivedMessage,
    error: BaseException | str | Failure,
) -> Operation[bool]:
    """Move a claimed message straight to the error queue (the handler knows it can never succeed)."""
    yield from table_shape(d, address)
    headers = failure_headers(message.headers, d.format_address(address), error)
    headers[DELIVERY_COUNT] = str(message.deliveries)
    shape = yield from table_shape(d, error_address)
    count = yield Step(
        d.claim_to_error_sql(address, error_address, shape),
        {
            "token": message.claim_token,
            "queue": d.claim_key(address),
            "headers": encode_headers(headers, ascii_only=shape.ascii_headers),
        },
        Fetch.ROWCOUNT,
        d.qualified_name(address),
    )
    return bool(count == 1)


# -- inspection and maintenance ------------------------------------------------------------------


@autocommitted
def peek(d: Dialect, address: QueueAddress, include_claims: bool = False) -> Operation[int]:
    """Estimate pending messages cheaply (sequence range of unlocked rows); plus claims ready again.

    One query either way: a poller peeks many queues every interval.
    """
    yield from table_shape(d, address)
    if include_claims:
        pending, lapsed = yield from peek_claims(d, address)
        return pending + lapsed
    head = d.head(address)
    row = yield Step(d.peek_sql(address), _after_head(head), Fetch.ONE, d.qualified_name(address))
    if head is not None:
        head.seen(row[1])
    return int(row[0] or 0)


@autocommitted
def peek_claims(d: Dialect, address: QueueAddress, *, since_last: bool = False) -> Operation[tuple[int, int]]:
    """(pending, lapsed): :func:`peek`'s estimate and the claims whose lease ran out, in one query.

    ``since_last``: count only the claims whose lease ended since this session's last such count
    (a loop that claims what a count finds: the count then walks none of the claims settled since
    the horizon stopped, see :mod:`.heads`); a count that finds some makes the next count and the
    next reclaim look at every lease, so a backlog of lapsed claims drains at the claims' pace.
    """
    yield from table_shape(d, address)
    target = d.qualified_name(address)
    head = d.head(address)
    params: dict[str, object] = {"queue": d.claim_key(address)}
    if head is not None:
        window = head.look_back_ms("peek") if since_last else EVERYTHING_MS
        params |= {**_after_head(head), "lapsed_ms": window}
    row = yield Step(d.peek_with_claims_sql(address), params, Fetch.ONE, target)
    lapsed = int(row[-1] or 0)
    if head is not None:
        head.seen(row[1])
        if lapsed:
            head.look_again("peek")
            head.look_again("reclaim")
    return int(row[0] or 0), lapsed


@autocommitted
def depth(d: Dialect, address: QueueAddress) -> Operation[int]:
    """Exact number of messages waiting (a full count: use for reports, not in a polling loop)."""
    yield from table_shape(d, address)
    row = yield Step(d.depth_sql(address), {}, Fetch.ONE, d.qualified_name(address))
    return int(row[0])


@dataclass(frozen=True)
class BrowsePage:
    """Waiting messages of one page of a browse, and the Seq to continue after (None: the range is done)."""

    messages: list[ReceivedMessage]
    after: int | None


@autocommitted
def browse(
    d: Dialect, address: QueueAddress, limit: int, after: int = 0, last: int = defaults.LAST_SEQ
) -> Operation[BrowsePage]:
    """Waiting, unexpired messages with ``after`` < Seq <= ``last`` in send order, up to ``limit``,
    left in the queue (no locks: receivers are not blocked).

    Rows whose headers NServiceBus could not read are skipped here; a receive dead-letters them.
    """
    yield from table_shape(d, address)
    params = {"after": after, "last": last, "limit": limit}
    rows = [
        BrowsedRow(*row) for row in (yield Step(d.browse_sql(address), params, Fetch.ALL, d.qualified_name(address)))
    ]
    messages = []
    for _seq, message_id, headers, body in rows:
        try:
            messages.append(ReceivedMessage(as_uuid(message_id), decode_headers(headers), bytes(body or b"")))
        except InvalidHeadersError:
            log.warning("Queue %s: skipping message %s with unreadable headers", d.qualified_name(address), message_id)
    return BrowsePage(messages, int(rows[-1].seq) if len(rows) == limit else None)


@dataclass(frozen=True)
class BrowseColumns:
    """One page of a browse as columns: the messages' ids (text), headers and bodies (a NULL body
    reads empty), and the Seq to continue after (None: the range is done)."""

    ids: list[str]
    headers: list[Headers]
    bodies: list[bytes]
    after: int | None


#: Headers as :func:`~.message.decode_headers` reads them (an object of strings or nulls), without
#: its Python frame per row: a page's headers are decoded by one ``map`` of this C method.
_ROW_HEADERS = msgspec.json.Decoder(dict[str, str | None])


def _page_headers(texts: Sequence[str | None]) -> list[Headers] | None:
    """Every row's headers decoded, or None when one of them needs a row-by-row look (NULL, empty
    or unreadable). One row at a time, not one JSON array of the page: a row's text that is not
    one object (``{..},{..``) could otherwise pair the next rows with the wrong headers."""
    try:
        return list(map(_ROW_HEADERS.decode, texts))  # type: ignore[arg-type]  # a None fails here
    except (TypeError, msgspec.ValidationError, msgspec.DecodeError):
        return None


@autocommitted
def browse_columns(
    d: Dialect, address: QueueAddress, limit: int, after: int = 0, last: int = defaults.LAST_SEQ
) -> Operation[BrowseColumns]:
    """:func:`browse` as columns, for a bulk reader (a Spark partition): the same rows and rules.

    No message object per row: the ids stay text (as the driver loads them, where it can), the
    page's headers are decoded by one ``map`` in C, and only a page holding a row that call refuses (NULL,
    empty or unreadable headers) is decoded row by row, skipping the unreadable rows as
    :func:`browse` does.
    """
    yield from table_shape(d, address)
    params = {"after": after, "last": last, "limit": limit}
    rows = yield Step(d.browse_sql(address), params, Fetch.ALL_UUID_TEXT, d.qualified_name(address))
    if not rows:
        return BrowseColumns([], [], [], None)
    seqs, ids, texts, bodies = (list(column) for column in zip(*rows, strict=True))
    more = int(seqs[-1]) if len(rows) == limit else None
    headers = _page_headers(texts)
    if headers is None:  # one or more rows need a look of their own
        kept = []
        for n, text in enumerate(texts):
            try:
                kept.append((n, decode_headers(text)))
            except InvalidHeadersError:
                log.warning("Queue %s: skipping message %s with unreadable headers", d.qualified_name(address), ids[n])
        ids, bodies = [ids[n] for n, _ in kept], [bodies[n] for n, _ in kept]
        headers = [h for _, h in kept]
    return BrowseColumns(_id_texts(ids), headers, _bodies(bodies), more)


def _id_texts(ids: list[Any]) -> list[str]:
    """Ids as their canonical text, however the driver loaded them (text, upper-case text or UUIDs)."""
    return [(v if type(v) is str else str(v)).lower() for v in ids]


def _bodies(bodies: list[Any]) -> list[bytes]:
    """Bodies as bytes, a NULL one empty (as every read hands them out)."""
    return [b"" if b is None else b if type(b) is bytes else bytes(b) for b in bodies]


@autocommitted
def seq_range(d: Dialect, address: QueueAddress) -> Operation[tuple[int, int] | None]:
    """The lowest and highest Seq of the queue's rows; None when it is empty."""
    yield from table_shape(d, address)
    low, high = yield Step(d.seq_range_sql(address), {}, Fetch.ONE, d.qualified_name(address))
    return None if low is None else (int(low), int(high))


@autocommitted
def in_flight(d: Dialect, address: QueueAddress) -> Operation[int]:
    """Number of claimed, unacknowledged messages of the queue."""
    yield from table_shape(d, address)
    row = yield Step(
        d.count_inflight_sql(address), {"queue": d.claim_key(address)}, Fetch.ONE, d.qualified_name(address)
    )
    return int(row[0])


@autocommitted
def purge_expired_batch(d: Dialect, address: QueueAddress, batch_size: int) -> Operation[int]:
    """Delete one bounded batch of expired messages; the caller loops while batches come back full."""
    yield from table_shape(d, address)
    count = yield Step(d.purge_expired_sql(address), {"limit": batch_size}, Fetch.ROWCOUNT, d.qualified_name(address))
    return int(count)


@autocommitted
def purge_all(d: Dialect, address: QueueAddress) -> Operation[int]:
    yield from table_shape(d, address)
    count = yield Step(d.purge_all_sql(address), {}, Fetch.ROWCOUNT, d.qualified_name(address))
    return int(count)


@dataclass(frozen=True)
class QueueStats:
    """What an operator watches on one queue, read off its indexes: as cheap on a million rows as on ten."""

    queue: QueueAddress
    waiting: int  #: the peek estimate (the Seq range of unlocked rows; exact while rows leave in order)
    oldest_sent: datetime | None  #: ``NServiceBus.TimeSent`` of the oldest message (None: empty, or not stated)
    expired: int  #: expired messages awaiting purge, counted up to the limit asked for
    in_flight: int | None  #: claims held (None: the queue's schema has no claim store)
    lapsed: int | None  #: claims whose lease ran out: their holders are gone or stuck
    #: Delayed messages already due that no mover has moved, counted up to the limit asked for
    #: (None: the queue has no delayed table).
    due_delayed: int | None = None
    overdue: timedelta | None = None  #: how long the earliest of them has been due (None: none is)
    dead_rows: int | None = None  #: dead row versions in the queue table vacuum has yet to remove (None: not said)
    last_vacuum: datetime | None = None  #: when (auto)vacuum last ran on the queue table (None: never, or not said)


@dataclass(frozen=True)
class Holder:
    """A transaction, prepared transaction or replication slot whose snapshot holds the xmin horizon back."""

    holder: str  #: ``pid <n>``, a prepared transaction's gid or a replication slot's name
    application: str | None  #: the session's application_name, or what kind of holder it is
    state: str | None  #: ``idle in transaction``, ``active``, ``prepared``, ``replication slot``...
    since: datetime | None  #: when its transaction began (None: a replication slot)
    xid_age: int | None  #: how many transactions old its snapshot is

    def held_for(self, now: datetime) -> timedelta | None:
        """How long it has held the horizon (None: a replication slot, which has no start)."""
        return None if self.since is None else max(timedelta(0), now - self.since)


@dataclass(frozen=True)
class Horizon:
    """What holds back the removal of dead rows in the database (PostgreSQL's xmin horizon).

    While it is held, every row a consumer deletes stays in its table and indexes as a dead row
    vacuum cannot remove, in every queue of the database; an operator finds the holders here.
    """

    holders: tuple[Holder, ...]  #: the oldest first, at most ``defaults.HORIZON_HOLDERS`` of them
    #: Whether other roles' sessions show their state and start: without pg_read_all_stats they show
    #: only their pid, application and snapshot age (``since`` None: judged by age, as a slot is).
    complete: bool

    @property
    def oldest(self) -> Holder | None:
        """The holder that holds it furthest back (None: nothing does)."""
        return self.holders[0] if self.holders else None


@dataclass(frozen=True)
class ClaimInfo:
    """A claim as an operator sees it; its token, which settles it, is never shown."""

    id: uuid.UUID
    holder: str | None  #: who holds it (None: a reservation nobody has taken)
    deliveries: int
    lease_left: timedelta  #: negative: the lease ran out that long ago
    last_error: str | None


@dataclass(frozen=True)
class ErrorGroup:
    """Failed messages of one source queue with one exception type, as an operator triages them."""

    source: str  #: ``NServiceBus.FailedQ``, or why the message names none
    exception_type: str  #: ``NServiceBus.ExceptionInfo.ExceptionType``, or why there is none
    count: int
    newest_failure: str | None  #: ``NServiceBus.TimeOfFailure`` of the newest one
    newest_message: str  #: its ``NServiceBus.ExceptionInfo.Message``, cut to 200 characters


@dataclass(frozen=True)
class FailedMessage:
    """A message of an error queue with the start of its body (never the whole of it)."""

    seq: int  #: its place in the error queue: what a retry of selected messages names
    id: uuid.UUID
    headers: Headers | None  #: None when they cannot be read
    body_size: int | None  #: None: the row has no body
    body_preview: bytes

    @property
    def group(self) -> tuple[str, str]:
        """(source queue, exception type), as :class:`ErrorGroup` names them."""
        return failure_group(self.headers)


@dataclass(frozen=True)
class RetryPage:
    """What one bounded pass of a retry did, and where the next one starts."""

    retried: int
    after: int  #: the Seq a next pass continues after
    done: bool  #: nothing beyond ``after`` was left to look at
    #: Messages left in the error queue because they cannot be routed: (Seq, why), in Seq order.
    skipped: tuple[tuple[int, str], ...] = ()


UNREADABLE = "(unreadable headers)"
#: Pages of headers one listing of a group's failures reads before it returns what it found.
MAX_SCAN_PAGES = 10


def failure_group(headers: Headers | None) -> tuple[str, str]:
    """(source queue, exception type) of a failed message; rows without them are grouped by what they lack."""
    if headers is None:
        return UNREADABLE, UNREADABLE
    return headers.get(FAILED_QUEUE) or "(no FailedQ)", headers.get(EXCEPTION_TYPE) or "(no exception type)"


def _readable_headers(text: str | None) -> Headers | None:
    try:
        return decode_headers(text)
    except InvalidHeadersError:
        return None


@dataclass(frozen=True)
class QueuePage:
    """One page of a database's queues (:func:`list_queues`), and how many there are in all."""

    total: int
    queues: list[QueueAddress]


@autocommitted
def list_queues(d: Dialect, search: str, offset: int, limit: int) -> Operation[QueuePage]:
    """A page of the queue tables of the connection's database that it may read, by schema and name.

    A table counts as a queue when it has the columns NServiceBus reads, with their types (whoever
    created it); the claim stores are left out. The database pages and filters, so a database of
    many schemas costs one page's rows. Names this library cannot address are skipped with a warning.
    """
    params = {"search": search, "offset": offset, "limit": limit}
    rows = yield Step(d.list_queues_sql(), params, Fetch.ALL, "the database's catalog")
    queues = []
    for _, schema, table in rows:
        if table is None:  # a page past the end: the total alone
            continue
        address = QueueAddress(str(table), str(schema))
        try:
            d.validate_address(address)
        except SqlQueueError as exc:
            log.warning("Leaving table %s.%s out of the queues: %s", schema, table, exc)
            continue
        queues.append(address)
    return QueuePage(int(rows[0][0]) if rows else 0, queues)


def queue_stats(
    d: Dialect,
    addresses: Sequence[QueueAddress],
    expired_limit: int,
    lock_wait: timedelta = defaults.WATCH_LOCK_TIMEOUT,
) -> Operation[list[QueueStats]]:
    """:class:`QueueStats` of each queue: one indexed query per queue, one more per claim store.

    One transaction that waits at most ``lock_wait`` for any lock (where the dialect bounds waits):
    a table locked by a migration or ``VACUUM FULL`` gives :class:`~.errors.LockTimeoutError`
    instead of a dashboard that hangs. A schema without a claim store (tables an NServiceBus
    endpoint created) reports no claims instead of failing.
    """
    bound, current = d.lock_timeout_sql(), d.current_lock_timeout_sql()
    previous = None
    if bound is not None and current is not None:
        # The caller's own bound comes back at the end: inside the caller's transaction (transaction())
        # the bound would otherwise last, and cut short the waits of the caller's later statements.
        [previous] = yield Step(current, {}, Fetch.ONE, "the session")
        ms = str(max(1, round(lock_wait / timedelta(milliseconds=1))))
        yield Step(bound, {"ms": ms}, Fetch.ONE, "the session")
    stats = yield from _queue_figures(d, addresses, expired_limit)
    if bound is not None and previous is not None:
        yield Step(bound, {"ms": str(previous)}, Fetch.ONE, "the session")
    return stats


def _queue_figures(d: Dialect, addresses: Sequence[QueueAddress], expired_limit: int) -> Operation[list[QueueStats]]:
    """The figures of :func:`queue_stats`, queue by queue."""
    stores: dict[QueueAddress, bool] = {}
    stats = []
    for address in addresses:
        target = d.qualified_name(address)
        yield from table_shape(d, address)
        row = yield Step(d.queue_figures_sql(address), {"limit": expired_limit}, Fetch.ONE, target)
        figures = QueueFiguresRow(*row)
        store = d.inflight_address(address)
        if store not in stores:
            columns = yield Step(d.queue_columns_sql(store), _table_key(d, store), Fetch.ALL, d.qualified_name(store))
            stores[store] = bool(columns)
        in_flight = lapsed = None
        if stores[store]:
            claimed = yield Step(
                d.claim_figures_sql(address), {"queue": d.claim_key(address)}, Fetch.ONE, d.qualified_name(store)
            )
            in_flight, lapsed = int(claimed[0]), int(claimed[1] or 0)
        due_delayed = overdue = None
        delayed = address.delayed()
        try:
            d.validate_address(delayed)
        except SqlQueueError:  # a name too long for a delayed table: the queue has none
            columns = []
        else:
            key = _table_key(d, delayed)
            columns = yield Step(d.queue_columns_sql(delayed), key, Fetch.ALL, d.qualified_name(delayed))
        if set(d.kind_columns["delayed"]) <= {str(name).lower() for name, _ in columns}:
            step = Step(d.delayed_figures_sql(delayed), {"limit": expired_limit}, Fetch.ONE, d.qualified_name(delayed))
            due = DelayedFiguresRow(*(yield step))
            due_delayed = int(due.due or 0)
            overdue = None if due.overdue_ms is None else timedelta(milliseconds=max(0, int(due.overdue_ms)))
        oldest = _readable_headers(figures.oldest_headers) if figures.oldest_headers is not None else None
        stats.append(
            QueueStats(
                address,
                int(figures.waiting or 0),
                parse_wire_timestamp((oldest or {}).get(TIME_SENT)),
                int(figures.expired or 0),
                in_flight,
                lapsed,
                due_delayed,
                overdue,
                None if figures.dead_rows is None else int(figures.dead_rows),
                figures.last_vacuum,
            )
        )
    return stats


@autocommitted
def horizon(d: Dialect, limit: int) -> Operation[Horizon | None]:
    """The database's :class:`Horizon`, its ``limit`` oldest holders; None where the database keeps none (SQL Server)."""
    sql = d.horizon_sql()
    if sql is None:
        return None
    rows = [HorizonRow(*row) for row in (yield Step(sql, {"limit": limit}, Fetch.ALL, "the database's sessions"))]
    holders = tuple(
        Holder(row.holder, row.application, row.state, row.since, None if row.xid_age is None else int(row.xid_age))
        for row in rows
        if row.holder is not None
    )
    return Horizon(holders, all(bool(row.complete) for row in rows))


@autocommitted
def claims(d: Dialect, address: QueueAddress, limit: int) -> Operation[list[ClaimInfo]]:
    """The queue's ``limit`` claims whose leases end first (lapsed ones first)."""
    yield from table_shape(d, address)
    params = {"queue": d.claim_key(address), "limit": limit}
    rows = yield Step(d.claims_sql(address), params, Fetch.ALL, d.qualified_name(d.inflight_address(address)))
    return [
        ClaimInfo(
            as_uuid(row.id),
            row.holder,
            int(row.deliveries),
            timedelta(milliseconds=int(row.lease_ms_left)),
            row.last_error,
        )
        for row in (ClaimRow(*raw) for raw in rows)
    ]


def release_lapsed(d: Dialect, address: QueueAddress, limit: int) -> Operation[int]:
    """Move up to ``limit`` lapsed claims back into the queue table, in one statement; returns how many.

    A lapsed claim is receivable again by claim-mode receivers only; given back, it is a row of the
    queue that every receiver finds, an NServiceBus endpoint included. It goes to the back of the
    queue and its delivery count starts again. A claim renewed or settled meanwhile is not touched.
    """
    shape = yield from table_shape(d, address)
    params = {"queue": d.claim_key(address), "limit": limit}
    rows = yield Step(d.release_lapsed_sql(address, shape), params, Fetch.ALL, d.qualified_name(address))
    if rows:
        log.info("Queue %s: gave %d lapsed claims back to the queue", d.qualified_name(address), len(rows))
    return len(rows)


@autocommitted
def error_summary(d: Dialect, error_address: QueueAddress, limit: int) -> Operation[list[ErrorGroup]]:
    """The newest ``limit`` messages of an error queue grouped by source queue and exception type, biggest group first.

    Only headers are read, newest first, so the cost is bounded by ``limit`` whatever the queue
    holds. Rows whose headers cannot be read form a group of their own.
    """
    yield from table_shape(d, error_address)
    params = {"before": defaults.LAST_SEQ, "limit": limit}
    rows = yield Step(d.newest_headers_sql(error_address), params, Fetch.ALL, d.qualified_name(error_address))
    groups: dict[tuple[str, str], ErrorGroup] = {}
    for _seq, headers_text in rows:
        headers = _readable_headers(headers_text)
        key = failure_group(headers)
        group = groups.get(key)
        if group is None:  # rows come newest first: the first of a group is its newest
            found = headers or {}
            groups[key] = ErrorGroup(*key, 1, found.get(TIME_OF_FAILURE), (found.get(EXCEPTION_MESSAGE) or "")[:200])
        else:
            groups[key] = replace(group, count=group.count + 1)
    return sorted(groups.values(), key=lambda g: (-g.count, g.source, g.exception_type))


@autocommitted
def failed_messages(
    d: Dialect,
    error_address: QueueAddress,
    *,
    before: int | None,
    limit: int,
    preview: int,
    group: tuple[str, str] | None,
    scan: int,
) -> Operation[tuple[list[FailedMessage], int | None]]:
    """The newest ``limit`` failed messages below Seq ``before`` (of one ``group`` when given), with body previews.

    Returns them newest first and the ``before`` of the next page (None: no more). Headers are read
    a page at a time until enough match; bodies are read only for the messages returned, and only
    their first ``preview`` bytes. One call reads ``limit`` rows' headers when no group is asked
    for; with a group, at most :data:`MAX_SCAN_PAGES` pages of
    ``scan`` rows, then it returns what it found with the cursor to continue from.
    """
    yield from table_shape(d, error_address)
    target = d.qualified_name(error_address)
    page = limit if group is None else scan
    chosen: list[int] = []
    cursor = defaults.LAST_SEQ if before is None else before
    exhausted = False
    for _ in range(MAX_SCAN_PAGES):
        rows = yield Step(d.newest_headers_sql(error_address), {"before": cursor, "limit": page}, Fetch.ALL, target)
        exhausted = len(rows) < page
        for seq, headers_text in rows:
            cursor = int(seq)
            if group is None or failure_group(_readable_headers(headers_text)) == group:
                chosen.append(cursor)
                if len(chosen) == limit:
                    exhausted = exhausted and cursor == int(rows[-1][0])
                    break
        if len(chosen) == limit or exhausted:
            break
    next_before = None if exhausted else cursor
    if not chosen:
        return [], next_before
    params = {"seqs": d.seq_list(chosen), "preview": preview}
    rows = yield Step(d.failed_messages_sql(error_address), params, Fetch.ALL, target)
    found = [
        FailedMessage(
            int(row.seq),
            as_uuid(row.id),
            _readable_headers(row.headers),
            None if row.body_size is None else int(row.body_size),
            bytes(row.body_preview or b""),
        )
        for row in (FailedRow(*raw) for raw in rows)
    ]
    return found, next_before


def retry_from_error(
    d: Dialect,
    error_address: QueueAddress,
    *,
    limit: int,
    after: int = 0,
    scan: int,
    only_queue: QueueAddress | None = None,
    seqs: Sequence[int] | None = None,
) -> Operation[RetryPage]:
    """Send error queue messages back to the queue in their ``NServiceBus.FailedQ``: one bounded pass.

    Either the messages at ``seqs`` (a selection), or up to ``limit`` of the ``scan`` oldest rows
    after Seq ``after`` (only ``only_queue``'s when given; the scan reads headers only). Failure
    headers are removed. Rows that cannot be routed stay where they are, each logged and returned
    with the reason (:attr:`RetryPage.skipped`): unreadable headers, no FailedQ, a FailedQ this
    database cannot address (another dialect's form, too many parts), a queue that no longer
    exists, a table that is not a queue, the error queue itself, or a queue where a message with
    the same id already waits; the rest of the pass goes on. Rows another retry holds
    are skipped, so two retries at once move each message once. Addresses are compared as queues,
    not as text: ``orders``, ``orders@[dbo]`` and ``orders@[dbo]@[MyDb]`` (as NServiceBus writes
    FailedQ) are one queue when the connection's database is MyDb.
    """
    yield from table_shape(d, error_address)
    target = d.qualified_name(error_address)
    if only_queue is not None:
        yield from table_shape(d, only_queue)
    catalog: str | None = None
    if seqs is None:
        scanned = yield Step(d.error_headers_sql(error_address), {"after": after, "limit": scan}, Fetch.ALL, target)
        done = len(scanned) < scan
        chosen: list[int] = []
        for seq, headers_text in scanned:
            if len(chosen) == limit:
                done = False
                break
            after = int(seq)
            if only_queue is not None:
                if catalog is None:
                    current = yield Step(d.current_catalog_sql(), {}, Fetch.ONE, target)
                    catalog = str(current[0])
                if _failed_queue_key(d, _readable_headers(headers_text), catalog) != _routing_key(
                    d, only_queue, catalog
                ):
                    continue
            chosen.append(after)
    else:
        chosen, done = sorted(set(seqs)), True
        after = max(chosen, default=after)
    if not chosen:
        return RetryPage(0, after, done)
    rows = yield Step(d.error_rows_sql(error_address), {"seqs": d.seq_list(chosen)}, Fetch.ALL, target)
    if catalog is None and rows:
        current = yield Step(d.current_catalog_sql(), {}, Fetch.ONE, target)
        catalog = str(current[0])
    shapes: dict[tuple[str, str, str], TableShape | str] = {}
    moved = 0
    skipped: list[tuple[int, str]] = []
    for seq, message_id, headers_text, body in (ErrorRow(*row) for row in rows):
        try:
            headers = decode_headers(headers_text)
            failed_q = headers.get(FAILED_QUEUE)
            if not failed_q:
                raise SqlQueueError("it has no NServiceBus.FailedQ header")
            destination = d.parse_address(failed_q)
        except SqlQueueError as exc:
            skipped.append((int(seq), f"it cannot be routed: {exc}"))
            continue
        assert catalog is not None  # noqa: S101  # read with the first row, before any row is routed
        key = _routing_key(d, destination, catalog)
        if key not in shapes:
            if key == _routing_key(d, error_address, catalog):
                shapes[key] = "its FailedQ is this error queue"
            else:
                try:
                    shapes[key] = yield from table_shape(d, destination)
                except (QueueNotFoundError, NotAQueueError) as exc:
                    shapes[key] = str(exc)
        shape = shapes[key]
        if isinstance(shape, str):
            skipped.append((int(seq), shape))
            continue
        headers = without_failure_headers(headers)
        inserted = yield Step(
            d.retry_insert_sql(destination, shape),
            {"id": message_id, "headers": encode_headers(headers, ascii_only=shape.ascii_headers), "body": body},
            Fetch.ROWCOUNT,
            d.qualified_name(destination),
        )
        if not inserted:
            skipped.append((int(seq), f"a message with its id already waits in {d.qualified_name(destination)}"))
            continue
        yield Step(d.delete_by_seq_sql(error_address), {"seq": seq}, Fetch.NONE, target)
        moved += 1
    for seq, reason in skipped:
        log.warning("Error queue %s: leaving the message at Seq %d: %s", target, seq, reason)
    return RetryPage(moved, after, done, tuple(skipped))


def _failed_queue_key(d: Dialect, headers: Headers | None, catalog: str) -> tuple[str, str, str] | None:
    """The routing key of a failed message's FailedQ; None when it has none this database can address."""
    failed_q = (headers or {}).get(FAILED_QUEUE)
    if not failed_q:
        return None
    try:
        return _routing_key(d, d.parse_address(failed_q), catalog)
    except SqlQueueError:
        return None


def _routing_key(d: Dialect, address: QueueAddress, current_catalog: str) -> tuple[str, str, str]:
    """(schema, table, catalog) with the default schema and the connection's database filled in.

    One queue, however its address was written; database names compare without case, as SQL
    Server's catalog does by default.
    """
    return (address.schema or d.default_schema, address.table, (address.catalog or current_catalog).casefold())
