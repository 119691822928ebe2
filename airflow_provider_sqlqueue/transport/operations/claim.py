"""Claim mode: moving messages into the claim store under a lease, handing reservations over
(:func:`take`), and settling claims (acknowledge, give back, renew, fail), one by one or all of a
holder's at once.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from ..addressing import QueueAddress
from ..dialects import ClaimedRow, Dialect, HeldRow
from ..errors import InvalidHeadersError
from ..logs import logger
from ..message import DELIVERY_COUNT, Failure, Headers, ReceivedMessage, decode_headers, encode_headers, failure_headers
from ..tracing import clock, consumed
from .audit import ack_audited
from .inspection import body_bytes, id_texts, page_headers
from .receive import Taken, log_poison, purge_expired_run
from .steps import Fetch, Operation, Step, after_head, as_uuid, autocommitted
from .tables import table_shape

log = logger("airflow_provider_sqlqueue.transport")


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
    bodies: bool = True,
) -> Operation[Taken]:
    """Claim up to ``limit`` messages: first those whose lease ran out, then fresh ones from the queue.

    ``bodies=False`` leaves the messages' bodies in the claim store (every body handed back is
    empty): for a holder that reads them there in bulk (:func:`held_columns`, the Spark data source's claim read).

    ``reclaim=False`` skips looking for lapsed claims (one statement less), for a caller that has
    just seen there are none (:func:`.inspection.peek_claims`); claims lapsing meanwhile wait for the next look.

    With a ``holder`` the messages are delivered to it (their delivery count goes up); without one
    they are *reserved*: held for a task that takes them later (:func:`take`, with or without tokens), and
    only that taking counts as a delivery -- a reservation that lapses because nobody came for it
    (a paused DAG, a dead triggerer) costs the message none of its ``max_deliveries``.

    A message that has already been delivered ``max_deliveries`` times is moved to the error
    queue instead of being handed out again, with the failure its last holder reported. Lapsed
    claims whose messages expired are deleted in bulk once one is met, as expired rows of the
    queue are: holders that died long ago cost a claim a few statements, not one each.
    """
    started = clock()
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
        held = [HeldRow(*row) for row in (yield Step(d.reclaim_sql(address, bodies), params, Fetch.ALL, target))]
        if head is not None and len(held) == limit:
            head.look_again("reclaim")
        claimed = yield from _hand_out(d, address, error_address, held, counted, max_deliveries)
        if any(row.expired for row in held):
            yield from purge_expired_run(d, address, claims=True)
            if len(held) == limit and len(claimed) < limit:  # lapsed claims may wait behind the expired ones
                shortfall = {**params, "limit": limit - len(claimed)}
                held = [
                    HeldRow(*row) for row in (yield Step(d.reclaim_sql(address, bodies), shortfall, Fetch.ALL, target))
                ]
                more = yield from _hand_out(d, address, error_address, held, counted, max_deliveries)
                claimed.extend(more)
                claimed.moved_to_error += more.moved_to_error
    requeued = False  # a poison row moved into this very queue (its own error queue): do not meet it again
    while len(claimed) < limit and not requeued:
        wanted = limit - len(claimed)
        found = yield Step(
            d.claim_sql(address, bodies), {**params, "limit": wanted, **after_head(head)}, Fetch.ALL, target
        )
        rows = sorted((ClaimedRow(*row) for row in found), key=lambda row: row.seq)
        if head is not None:
            head.taken([row.seq for row in rows])
        if any(row.token is None for row in rows):
            yield from purge_expired_run(d, address)
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
    operation = "reserve" if holder is None else "claim"
    consumed(operation, lambda: d.format_address(address), claimed, started, database=d.name)
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
    log_poison(d, address, error_address, message_id, exc)
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
    started = clock()
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
    taken = yield from _hand_out(d, address, error_address, [HeldRow(*row) for row in found], 1, None)
    consumed("take", lambda: d.format_address(address), taken, started, database=d.name)
    return taken


@autocommitted
def ack(d: Dialect, address: QueueAddress, tokens: Sequence[uuid.UUID]) -> Operation[set[uuid.UUID]]:
    """Finish claims; returns the tokens that were still held (a missing one may be with someone else)."""
    yield from table_shape(d, address)
    params = {"tokens": d.token_list(tokens), "queue": d.claim_key(address)}
    rows = yield Step(d.ack_sql(address), params, Fetch.ALL, d.qualified_name(address))
    return {as_uuid(row[0]) for row in rows}


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
    headers = page_headers(texts)
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
    return HeldColumns(id_texts(ids), headers, body_bytes(bodies), deliveries)


@autocommitted
def ack_held_audited(d: Dialect, address: QueueAddress, holder: str, audit_address: QueueAddress) -> Operation[int]:
    """:func:`ack_held` with an audit copy of each message, in the same transaction (:func:`.audit.ack_audited`)."""
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
