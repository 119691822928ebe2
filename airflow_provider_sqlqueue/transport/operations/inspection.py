"""Inspection: peek, depth, browse, the figures an operator watches (:class:`QueueStats`), the
claims of a queue, the xmin horizon, and the list of a database's queues. Reads only; nothing here
takes or changes a message.
"""

from __future__ import annotations

import uuid
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

import msgspec

from .. import defaults
from ..addressing import QueueAddress
from ..dialects import BrowsedRow, ClaimRow, DelayedFiguresRow, Dialect, HorizonRow, QueueFiguresRow
from ..errors import InvalidArgumentError, InvalidHeadersError, SqlQueueError
from ..heads import EVERYTHING_MS
from ..logs import logger
from ..message import (
    TIME_SENT,
    Headers,
    ReceivedMessage,
    decode_headers,
    parse_wire_timestamp,
    readable_headers,
    whole_ms,
)
from .steps import Fetch, Operation, Step, after_head, as_uuid, autocommitted
from .tables import table_key, table_shape

T = TypeVar("T")

log = logger("airflow_provider_sqlqueue.transport")


@autocommitted
def probe(d: Dialect) -> Operation[None]:
    """One cheap statement: whether a connection that sat idle still answers (the server may have
    cut it meanwhile; a failure is the transport's TransportUnavailableError)."""
    yield Step(d.current_catalog_sql(), {}, Fetch.ONE, "the database")


def peek(d: Dialect, address: QueueAddress, include_claims: bool = False) -> Operation[int]:
    """Estimate pending messages cheaply (sequence range of unlocked rows); plus claims ready again.

    One query either way: a poller peeks many queues every interval.
    """
    yield from table_shape(d, address)
    if include_claims:
        pending, lapsed = yield from peek_claims(d, address)
        return pending + lapsed
    head = d.head(address)
    row = yield Step(d.peek_sql(address), after_head(head), Fetch.ONE, d.qualified_name(address))
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
        params |= {**after_head(head), "lapsed_ms": window}
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


def page_headers(texts: Sequence[str | None]) -> list[Headers] | None:
    """Every row's headers decoded, or None when one of them needs a row-by-row look (NULL, empty
    or unreadable). One row at a time, not one JSON array of the page: a row's text that is not
    one object (``{..},{..``) could otherwise pair the next rows with the wrong headers."""
    try:
        return list(map(_ROW_HEADERS.decode, texts))  # type: ignore[arg-type]  # a None fails here
    except (TypeError, msgspec.ValidationError, msgspec.DecodeError):
        return None


def unreadable_rows(texts: Sequence[str | None]) -> list[int]:
    """The places in ``texts`` of the headers :func:`~.message.decode_headers` cannot read. Every
    text is decoded and none kept (a batch of a million rows needs no million dicts), in C while
    all are readable; a row-by-row look only when one is not."""
    try:
        deque(map(_ROW_HEADERS.decode, texts), maxlen=0)  # type: ignore[arg-type]  # a None fails here
    except (TypeError, msgspec.ValidationError, msgspec.DecodeError):
        return [n for n, text in enumerate(texts) if readable_headers(text) is None]
    return []


@autocommitted
def browse_columns(
    d: Dialect,
    address: QueueAddress,
    limit: int,
    after: int = 0,
    last: int = defaults.LAST_SEQ,
    locked_by: int | None = None,
) -> Operation[BrowseColumns]:
    """:func:`browse` as columns, for a bulk reader (a Spark partition): the same rows and rules.

    No message object per row: the ids stay text (as the driver loads them, where it can), the
    page's headers are decoded by one ``map`` in C, and only a page holding a row that call refuses (NULL,
    empty or unreadable headers) is decoded row by row, skipping the unreadable rows as
    :func:`browse` does.

    ``locked_by``: only the rows that transaction holds locked (a batch of :func:`.locked.lock_batch`,
    read from another session while it is open). A page that finds none asks whether the transaction
    is still open, and raises if not: what it locked is acknowledged or back in the queue, and a
    read that went on would return nothing, or rows others may take, as if they were the batch.
    """
    sql = d.browse_sql(address) if locked_by is None else d.browse_locked_sql(address)
    yield from table_shape(d, address)
    params = {"after": after, "last": last, "limit": limit, **({} if locked_by is None else {"locked_by": locked_by})}
    rows = yield Step(sql, params, Fetch.ALL_UUID_TEXT, d.qualified_name(address))
    if not rows:
        if locked_by is not None:
            held = {"locked_by": locked_by}
            (still_open,) = yield Step(d.transaction_open_sql(), held, Fetch.ONE, d.qualified_name(address))
            if not still_open:
                raise InvalidArgumentError(batch_ended(locked_by, d.qualified_name(address)))
        return BrowseColumns([], [], [], None)
    seqs, ids, texts, bodies = (list(column) for column in zip(*rows, strict=True))
    more = int(seqs[-1]) if len(rows) == limit else None
    headers = page_headers(texts)
    if headers is None:  # one or more rows need a look of their own
        kept = []
        for n, text in enumerate(texts):
            try:
                kept.append((n, decode_headers(text)))
            except InvalidHeadersError:
                log.warning("Queue %s: skipping message %s with unreadable headers", d.qualified_name(address), ids[n])
        ids, bodies = [ids[n] for n, _ in kept], [bodies[n] for n, _ in kept]
        headers = [h for _, h in kept]
    return BrowseColumns(id_texts(ids), headers, body_bytes(bodies), more)


def batch_ended(locked_by: int, queue: str) -> str:
    """Why a locked batch of ``queue`` (its qualified name) can no longer be read, by any reader:
    its rows are acknowledged, or back in the queue with the ended transaction's id still on them."""
    return (
        f"the transaction {locked_by} that locked this batch of {queue} has ended (its block committed or rolled "
        "back, or its connection closed): its messages are acknowledged or back in the queue; read a locked batch "
        "while its block is open"
    )


def id_texts(ids: list[Any]) -> list[str]:
    """Ids as their canonical text, however the driver loaded them (text, upper-case text or UUIDs)."""
    return [(v if type(v) is str else str(v)).lower() for v in ids]


def body_bytes(bodies: list[Any]) -> list[bytes]:
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
    """:class:`QueueStats` of each queue: one indexed query per queue, one more per claim store, in
    one transaction that waits at most ``lock_wait`` for any lock (:func:`lock_bounded`). A schema
    without a claim store (tables an NServiceBus endpoint created) reports no claims instead of failing.
    """
    return (yield from lock_bounded(d, lock_wait, _queue_figures(d, addresses, expired_limit)))


def lock_bounded(d: Dialect, lock_wait: timedelta, operation: Operation[T]) -> Operation[T]:
    """``operation`` waiting at most ``lock_wait`` for any lock (where the dialect bounds waits): a
    table locked by a migration or ``VACUUM FULL`` gives :class:`~.errors.LockTimeoutError` instead
    of a dashboard that hangs. Run in a transaction (the bound lasts until it ends)."""
    bound, current = d.lock_timeout_sql(), d.current_lock_timeout_sql()
    if bound is None or current is None:
        return (yield from operation)
    # The caller's own bound comes back at the end: inside the caller's transaction (transaction())
    # the bound would otherwise last, and cut short the waits of the caller's later statements.
    [previous] = yield Step(current, {}, Fetch.ONE, "the session")
    yield Step(bound, {"ms": str(whole_ms(lock_wait))}, Fetch.ONE, "the session")
    result = yield from operation
    yield Step(bound, {"ms": str(previous)}, Fetch.ONE, "the session")
    return result


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
            columns = yield Step(d.queue_columns_sql(store), table_key(d, store), Fetch.ALL, d.qualified_name(store))
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
            key = table_key(d, delayed)
            columns = yield Step(d.queue_columns_sql(delayed), key, Fetch.ALL, d.qualified_name(delayed))
        if set(d.kind_columns["delayed"]) <= {str(name).lower() for name, _ in columns}:
            step = Step(d.delayed_figures_sql(delayed), {"limit": expired_limit}, Fetch.ONE, d.qualified_name(delayed))
            due = DelayedFiguresRow(*(yield step))
            due_delayed = int(due.due or 0)
            overdue = None if due.overdue_ms is None else timedelta(milliseconds=max(0, int(due.overdue_ms)))
        oldest = readable_headers(figures.oldest_headers) if figures.oldest_headers is not None else None
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
def unreadable_queues(d: Dialect) -> Operation[tuple[int, int] | None]:
    """How many queue tables the connection may not read, and how many of those lie in schemas it may
    not use; None where the catalog hides them from it (SQL Server)."""
    sql = d.unreadable_queues_sql()
    if sql is None:
        return None
    row = yield Step(sql, {}, Fetch.ONE, "the database's catalog")
    return int(row[0]), int(row[1])


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
