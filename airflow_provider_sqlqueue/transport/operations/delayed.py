"""Delayed delivery: storing messages in a queue's ``<queue>.Delayed`` table as NServiceBus stores
them, and moving them on when they are due (any number of movers at once, NServiceBus's included).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

from ..addressing import QueueAddress
from ..dialects import Dialect, DueRow, SendRow
from ..errors import InvalidArgumentError, InvalidHeadersError, NotAQueueError, QueueNotFoundError, SqlQueueError
from ..heads import EVERYTHING_MS
from ..logs import logger
from ..message import (
    FORWARD_DESTINATION,
    MESSAGE_ID,
    Message,
    decode_headers,
    encode_headers,
    failure_headers,
    readable_headers,
    wire_timestamp,
)
from ..tracing import producing
from .send import insert_rows
from .steps import Fetch, Operation, Step, as_uuid
from .tables import install_table, table_of, table_shape

log = logger("airflow_provider_sqlqueue.transport")


def create_delayed(d: Dialect, delayed: QueueAddress) -> Operation[None]:
    """Create a queue's delayed-message table (idempotent, safe concurrently)."""
    yield from install_table(d, delayed, d.create_delayed_sql(delayed), "delayed")


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
    yield from table_shape(d, address)
    yield from table_of(d, delayed, "delayed")
    destination = d.format_address(address)
    # A send span to the queue; its receiver starts a new trace linked to it, as NServiceBus has a
    # delayed message's (received at another moment), unless the message says otherwise.
    with producing("send", lambda: destination, messages, database=d.name, start_new_trace=True) as outgoing:
        yield from _store_delayed(d, delayed, outgoing, destination, delay_ms)
    return len(messages)


def _store_delayed(
    d: Dialect, delayed: QueueAddress, messages: Sequence[Message], destination: str, delay_ms: int
) -> Operation[None]:
    target = d.qualified_name(delayed)
    sent_at = wire_timestamp(datetime.now(UTC))
    stored = [
        Message(m.body, {**m.headers, FORWARD_DESTINATION: destination}, id=m.id).wire_headers(sent_at)
        for m in messages
    ]
    bodies = [m.body for m in messages]
    batch_sql = d.store_delayed_batch_sql(delayed)
    if batch_sql is not None and len(messages) > 1:
        yield Step(batch_sql, {"headers": stored, "bodies": bodies, "delay_ms": delay_ms}, Fetch.NONE, target)
        return
    for headers, body in zip(stored, bodies, strict=True):
        yield Step(
            d.store_delayed_sql(delayed), {"headers": headers, "body": body, "delay_ms": delay_ms}, Fetch.NONE, target
        )


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
                readable_headers(headers) or {},
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
        yield from insert_rows(d, destination, shape, batch)
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
    sent = (readable_headers(headers_text) or {}).get(MESSAGE_ID)
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
