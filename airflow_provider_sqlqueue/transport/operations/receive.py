"""Receiving in ``none`` and ``native`` modes: delete-and-return of the oldest rows, with the rules
every receive applies -- expired rows dropped (in bulk once met), unreadable rows moved unchanged
to the error queue -- and the maintenance purges.
"""

from __future__ import annotations

import uuid
from operator import itemgetter

from .. import defaults
from ..addressing import QueueAddress
from ..dialects import Dialect, ReceivedRow
from ..errors import InvalidHeadersError
from ..logs import logger
from ..message import ReceivedMessage, decode_headers, encode_headers, failure_headers
from ..tracing import clock, consumed
from .steps import Autocommit, Fetch, Operation, Step, after_head, as_uuid, autocommitted
from .tables import table_shape

log = logger("airflow_provider_sqlqueue.transport")


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
    return op if atomic else Autocommit(op)


_RECEIVED_SEQ = itemgetter(ReceivedRow._fields.index("seq"))


def _receive(d: Dialect, address: QueueAddress, error_address: QueueAddress, limit: int) -> Operation[Taken]:
    started = clock()
    yield from table_shape(d, address)
    yield from table_shape(d, error_address)  # a poison row must have somewhere to go: known before any receive
    target = d.qualified_name(address)
    head = d.head(address)
    received = Taken()
    requeued = False
    while len(received) < limit and not requeued:
        wanted = limit - len(received)
        params = {"limit": wanted, **after_head(head)}
        rows: list[ReceivedRow] = yield Step(d.receive_sql(address), params, Fetch.ALL, target)
        rows.sort(key=_RECEIVED_SEQ)  # plain driver tuples, in the shape of ReceivedRow
        if head is not None:
            head.taken([row[4] for row in rows])
        if any(row[1] for row in rows):
            yield from purge_expired_run(d, address)
        for message_id, expired, headers_text, body, _seq in rows:
            if expired:
                log.debug("Dropped expired message %s from %s", message_id, target)
                continue
            try:
                headers = decode_headers(headers_text)
            except InvalidHeadersError as exc:
                log_poison(d, address, error_address, message_id, exc)
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
    consumed("receive", lambda: d.format_address(address), received, started, database=d.name)
    return received


def purge_expired_run(d: Dialect, address: QueueAddress, *, claims: bool = False) -> Operation[int]:
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


def log_poison(
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
