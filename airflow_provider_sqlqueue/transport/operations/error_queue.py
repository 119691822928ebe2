"""The error queue: failures grouped as an operator triages them, listing failed messages with a
preview of their bodies, and retrying them to the queue their ``NServiceBus.FailedQ`` names.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace

from .. import defaults
from ..addressing import QueueAddress
from ..dialects import Dialect, ErrorRow, FailedRow, TableShape
from ..errors import NotAQueueError, QueueNotFoundError, SqlQueueError
from ..logs import logger
from ..message import (
    EXCEPTION_MESSAGE,
    EXCEPTION_TYPE,
    FAILED_QUEUE,
    TIME_OF_FAILURE,
    Headers,
    decode_headers,
    encode_headers,
    readable_headers,
    without_failure_headers,
)
from .steps import Fetch, Operation, Step, as_uuid, autocommitted
from .tables import table_shape

log = logger("airflow_provider_sqlqueue.transport")


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
        headers = readable_headers(headers_text)
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
            if group is None or failure_group(readable_headers(headers_text)) == group:
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
            readable_headers(row.headers),
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
                if _failed_queue_key(d, readable_headers(headers_text), catalog) != _routing_key(
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
