"""A message's journey: the rows it -- or every message of one trace -- left in a database's queues.

A message that went through a pipeline leaves rows behind: its audit copies (one per stage that
processed it, with NServiceBus's ``ProcessingStarted``, ``ProcessingEnded`` and
``ProcessingEndpoint``), its failure copies in the error queues (``FailedQ``, ``TimeOfFailure``,
``ExceptionInfo.*``), the row still waiting in a queue and the claim a stage holds on it. Each row
says when the message was sent (``TimeSent``) and, since NServiceBus 8, which trace it belongs to
(``traceparent``). A journey finds them by a message's id -- the row's ``Id`` or its
``NServiceBus.MessageId`` header, which an audit copy keeps under an Id of its own -- or by a trace
id, which every message of one trace carries inside its ``traceparent``, and puts them in order.

Headers have no index a database could search by their content (NServiceBus's tables are used as
they are), so a journey is a bounded scan: of each table, the newest ``scan`` rows' headers are
searched as text, and a table holding more says so (:attr:`Journey.partial`). Where a table's Id
is indexed (PostgreSQL's primary key), a message id also finds its row however old it is.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal

from .. import defaults
from ..addressing import QueueAddress
from ..dialects import Dialect, FoundClaimRow, FoundRow
from ..errors import CALL_ENDING, ArgumentTypeError, InvalidArgumentError, LockTimeoutError, SqlQueueError
from ..logs import logger
from ..message import (
    EXCEPTION_MESSAGE,
    EXCEPTION_TYPE,
    FAILED_QUEUE,
    MESSAGE_ID,
    PROCESSING_ENDED,
    PROCESSING_ENDPOINT,
    PROCESSING_STARTED,
    TIME_OF_FAILURE,
    TIME_SENT,
    Headers,
    parse_wire_timestamp,
    readable_headers,
)
from ..tracing import TRACEPARENT
from .inspection import lock_bounded
from .steps import Fetch, Operation, Step, as_uuid
from .tables import table_shape

#: A message id as NServiceBus writes one (a GUID's text), a trace id as W3C Trace Context does
#: (32 lower-case hex digits), and a whole ``traceparent`` (version, trace id, parent id, flags).
_MESSAGE_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_TRACE_ID = re.compile(r"[0-9a-f]{32}")
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")

Kind = Literal["message", "trace"]
log = logger("airflow_provider_sqlqueue.transport")


def journey_key(value: object) -> tuple[Kind, str]:
    """What a journey looks for: ``("message", id)`` for a message id (a UUID, or its text with
    hyphens), ``("trace", id)`` for a trace id (32 hex digits, or a whole ``traceparent``), both
    lower-cased. Anything else is refused, naming both forms."""
    if isinstance(value, uuid.UUID):
        return "message", str(value)
    if not isinstance(value, str):
        raise ArgumentTypeError(
            f"a journey is of a message id or a trace id (text), got {type(value).__name__} {value!r:.40}"
        )
    text = value.strip().lower()
    if _MESSAGE_ID.fullmatch(text):
        return "message", text
    parent = _TRACEPARENT.fullmatch(text)
    trace = parent.group(2) if parent else text
    if _TRACE_ID.fullmatch(trace):
        if trace == "0" * 32:
            raise InvalidArgumentError(
                "trace id 00000000000000000000000000000000 is W3C's invalid trace id, which no trace has: "
                "give another trace id or a message id"
            )
        return "trace", trace
    raise InvalidArgumentError(
        f"{value[:80]!r} is neither a message id (a UUID such as 1c6a8e3e-5b0e-4c1e-9f0e-2a8a4c1b7d20) nor a "
        "trace id (32 hex digits, as in a traceparent header: 00-<trace id>-<span id>-01)"
    )


def trace_context(headers: Headers) -> tuple[str, str] | None:
    """(trace id, parent span id) of a message's ``traceparent`` header; None when it has no
    readable one (a sender's malformed header is theirs: the message is simply in no trace)."""
    found = _TRACEPARENT.fullmatch((headers.get(TRACEPARENT) or "").strip())
    if found is None or found.group(1) == "ff" or found.group(2) == "0" * 32:
        return None
    return found.group(2), found.group(3)


#: What a row says of its message: processed (an audit copy), failed (an error queue's copy),
#: claimed (a stage holds it), waiting (in a queue), or unreadable: the message's own row (found by
#: its Id) whose headers cannot be read -- poison, which a receive moves to the error queue.
Station = Literal["processed", "failed", "claimed", "waiting", "unreadable"]


@dataclass(frozen=True)
class Sighting:
    """One row a message left: where, what it says happened, and when."""

    table: QueueAddress  #: the table the row is in (for a claim: its schema's claim store)
    seq: int  #: its place in that table (a claim's: in the queue it was claimed from)
    row_id: uuid.UUID
    headers: Headers
    station: Station
    queue: str  #: the stage: ``ProcessingEndpoint``, ``FailedQ``, the claimed queue, or the table
    holder: str | None = None  #: who holds a claim (None: a reservation nobody took, or no claim)
    deliveries: int | None = None  #: a claim's deliveries so far

    @property
    def message_id(self) -> str:
        """``NServiceBus.MessageId``, else the row's Id (an audit copy's Id is its own)."""
        return (self.headers.get(MESSAGE_ID) or str(self.row_id)).strip()

    @property
    def sent(self) -> datetime | None:
        return parse_wire_timestamp(self.headers.get(TIME_SENT))

    @property
    def started(self) -> datetime | None:
        """When a stage began processing it (an audit copy's ``ProcessingStarted``)."""
        return parse_wire_timestamp(self.headers.get(PROCESSING_STARTED))

    @property
    def ended(self) -> datetime | None:
        """When that stage ended (an audit copy's ``ProcessingEnded``), or when it failed (``TimeOfFailure``)."""
        return parse_wire_timestamp(
            self.headers.get(PROCESSING_ENDED if self.station == "processed" else TIME_OF_FAILURE)
        )

    @property
    def trace(self) -> tuple[str, str] | None:
        """(trace id, the sender's span id) from its ``traceparent``."""
        return trace_context(self.headers)

    @property
    def exception(self) -> str | None:
        """A failure's exception type and message (``ExceptionInfo.*``)."""
        if self.station != "failed":
            return None
        kind, text = self.headers.get(EXCEPTION_TYPE), self.headers.get(EXCEPTION_MESSAGE)
        return ": ".join(part for part in (kind, text) if part) or None

    def waited(self, now: datetime) -> timedelta | None:
        """From its send to the stage: until processing started, until it failed, or until ``now``
        for a message still waiting or held. None where a time is missing, or where the clocks that
        wrote the two disagree (the stage's says before the send): no figure rather than a wrong one."""
        until = {"processed": self.started, "failed": self.ended}.get(self.station, now)
        return None if self.sent is None or until is None else _span(self.sent, until)

    @property
    def processing(self) -> timedelta | None:
        """How long the stage processed it (an audit copy's ``ProcessingEnded - ProcessingStarted``;
        None where either is missing or they run backwards)."""
        if self.station != "processed" or self.started is None or self.ended is None:
            return None
        return _span(self.started, self.ended)

    @property
    def moment(self) -> datetime:
        """Where it stands in the journey: its send, else what happened at the stage."""
        return self.sent or self.started or self.ended or datetime.max.replace(tzinfo=UTC)


@dataclass(frozen=True)
class Journey:
    """The rows a message or a trace left, in the order they happened."""

    kind: Kind  #: what was looked for
    key: str  #: the message id or trace id, lower-cased
    sightings: tuple[Sighting, ...]  #: by send time, then by what happened at the stage
    searched: tuple[QueueAddress, ...]  #: the tables searched (queues, claim stores)
    #: Tables holding more rows than were searched: older rows of the message may be there.
    partial: tuple[QueueAddress, ...]
    more: bool  #: more rows matched than ``limit``: the newest are left out
    checked_at: datetime
    #: Queue tables the connection may not read, so not searched (None: not counted -- the queues
    #: were named, or the database hides such tables from the connection).
    unreadable: int | None = None
    #: Tables another session held locked past the journey's lock wait: not searched.
    locked: tuple[QueueAddress, ...] = ()

    @property
    def trace_ids(self) -> tuple[str, ...]:
        """The traces the rows belong to (a message id's rows name their trace: its journey is longer)."""
        found = (s.trace for s in self.sightings)
        return tuple(dict.fromkeys(t[0] for t in found if t is not None))


def _order(seen: Sighting) -> tuple[datetime, datetime, int]:
    return (seen.moment, seen.started or seen.ended or seen.moment, seen.seq)


def _span(start: datetime, end: datetime) -> timedelta | None:
    return end - start if end >= start else None


def _matches(kind: Kind, key: str, row_id: uuid.UUID, headers: Headers) -> bool:
    """Whether a row the text search found is the message (or of the trace): the text only narrows."""
    if kind == "message":
        return str(row_id) == key or (headers.get(MESSAGE_ID) or "").strip().lower() == key
    trace = trace_context(headers)
    return trace is not None and trace[0] == key


def _station(headers: Headers, table: str) -> tuple[Station, str]:
    if PROCESSING_ENDED in headers:
        return "processed", headers.get(PROCESSING_ENDPOINT) or table
    if FAILED_QUEUE in headers:
        return "failed", headers.get(FAILED_QUEUE) or table
    return "waiting", table


def _search(
    d: Dialect, kind: Kind, key: str, address: QueueAddress, scan: int
) -> Operation[tuple[list[FoundRow], bool]]:
    """One queue table's rows that may be the message's (or the trace's), and whether the scan saw all its rows."""
    yield from table_shape(d, address)
    target = d.qualified_name(address)
    found = yield Step(d.find_sql(address), {"scan": scan, "needle": key}, Fetch.ALL, target)
    rows = [FoundRow(*row) for row in found]
    by_id = d.find_by_id_sql(address)
    if kind == "message" and by_id is not None:
        rows += [FoundRow(*row) for row in (yield Step(by_id, {"id": uuid.UUID(key)}, Fetch.ALL, target))]
    [complete] = yield Step(d.scanned_all_sql(address), {"scan": scan}, Fetch.ONE, target)
    return rows, bool(complete)


#: What one table's search gives: the rows of the message (or trace) in it, and whether it saw all
#: the table's rows; None for a claim store the connection may not read (not searched).
Searched = tuple[list[Sighting], bool] | None


def _queue_sightings(d: Dialect, kind: Kind, key: str, address: QueueAddress, scan: int) -> Operation[Searched]:
    """A queue table's rows of the message (or trace). Rows whose headers cannot be read are passed
    over, as a browse passes them, but for the message's own row found by its Id (``unreadable``)."""
    rows, complete = yield from _search(d, kind, key, address, scan)
    table = d.format_address(address)
    sightings = []
    for seq, row_id, text in rows:
        headers, identity = readable_headers(text), as_uuid(row_id)
        if headers is None:
            if kind == "message" and str(identity) == key:  # its own row, found by Id: say it is there
                sightings.append(Sighting(address, int(seq), identity, {}, "unreadable", table))
        elif _matches(kind, key, identity, headers):
            station, queue = _station(headers, table)
            sightings.append(Sighting(address, int(seq), identity, headers, station, queue))
    return sightings, complete


def _claim_sightings(d: Dialect, kind: Kind, key: str, store: QueueAddress, scan: int) -> Operation[Searched]:
    """A claim store's claims on the message's rows (or the trace's), where the connection may read it."""
    [readable] = yield Step(d.can_read_sql(), {"table": d.table_reference(store)}, Fetch.ONE, d.qualified_name(store))
    if not readable:
        return None
    target = d.qualified_name(store)
    found = yield Step(d.find_claims_sql(store), {"scan": scan, "needle": key}, Fetch.ALL, target)
    sightings = []
    for claim in (FoundClaimRow(*row) for row in found):
        headers, identity = readable_headers(claim.headers), as_uuid(claim.id)
        if headers is not None and _matches(kind, key, identity, headers):
            queue, holder, deliveries = str(claim.queue), claim.holder, int(claim.deliveries)
            sightings.append(Sighting(store, int(claim.seq), identity, headers, "claimed", queue, holder, deliveries))
    [complete] = yield Step(d.claims_scanned_all_sql(store), {"scan": scan}, Fetch.ONE, target)
    return sightings, bool(complete)


async def journey(
    run: Callable[[Operation[Searched]], Awaitable[Searched]],
    d: Dialect,
    kind: Kind,
    key: str,
    queues: Sequence[QueueAddress],
    scan: int,
    limit: int,
    lock_wait: timedelta,
    *,
    survey: bool = False,
) -> Journey:
    """The rows of ``queues`` (and of their schemas' claim stores) left by the message ``key`` or by
    the messages of the trace ``key`` (``kind``, as :func:`journey_key` says), at most ``limit``:
    those that happened first.

    Each table is searched in a transaction of its own that waits at most ``lock_wait`` for a lock
    another session holds (a migration, ``VACUUM FULL``, a ``DROP`` queued behind a long reader):
    a locked table is left out and named (:attr:`Journey.locked`), and the tables after it wait at
    most ``defaults.WATCH_LOCK_TIMEOUT_AFTER_ONE`` each -- a journey is a watcher, and a watcher
    never hangs. A table costs a bounded scan of its newest ``scan`` rows' headers, one count of at
    most ``scan + 1`` rows off its Seq index and, for a message id where Id is indexed, one lookup
    by Id; a claim store is searched where the connection may read it.

    ``survey``: the queues are a listing of the database's, and a table that fails while it is
    searched (dropped or changed since it was listed) is left out instead of failing the journey.
    A lost connection, an aborted transaction or a closed client end it either way.
    """
    found: dict[tuple[QueueAddress, int, uuid.UUID], Sighting] = {}
    searched: list[QueueAddress] = []
    partial: list[QueueAddress] = []
    locked: list[QueueAddress] = []
    named = list(dict.fromkeys(queues))  # a table named twice is searched once
    stores = list(dict.fromkeys(d.inflight_address(address) for address in named))
    tables = [(a, _queue_sightings) for a in named] + [(s, _claim_sightings) for s in stores]
    for table, sightings_of in tables:
        try:
            result = await run(lock_bounded(d, lock_wait, sightings_of(d, kind, key, table, scan)))
        except LockTimeoutError:
            log.info("Journey: %s is locked by another session: not searched", d.qualified_name(table))
            locked.append(table)
            lock_wait = min(lock_wait, defaults.WATCH_LOCK_TIMEOUT_AFTER_ONE)
            continue
        except (*CALL_ENDING, InvalidArgumentError):
            raise
        except SqlQueueError as exc:
            if not survey:
                raise
            log.info("Journey: leaving out %s, which changed while searched: %s", d.qualified_name(table), exc)
            continue
        if result is None:
            continue
        rows, complete = result
        found.update(((seen.table, seen.seq, seen.row_id), seen) for seen in rows)
        searched.append(table)
        if not complete:
            partial.append(table)
    ordered = sorted(found.values(), key=_order)
    return Journey(
        kind,
        key,
        tuple(ordered[:limit]),
        tuple(searched),
        tuple(partial),
        len(ordered) > limit,
        datetime.now(UTC),
        locked=tuple(locked),
    )
