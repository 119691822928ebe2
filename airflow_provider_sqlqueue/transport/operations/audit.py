"""The audit queue: copies of processed messages with NServiceBus's processing headers, written in
the same transaction as the acknowledgement or native receive they record.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

from ..addressing import QueueAddress
from ..dialects import Dialect, SendRow
from ..errors import InvalidHeadersError, SqlQueueError
from ..logs import logger
from ..message import (
    MESSAGE_ID,
    Headers,
    ReceivedMessage,
    audit_headers,
    decode_headers,
    encode_headers,
    processing_headers,
    wire_timestamp,
)
from .send import insert_rows
from .steps import Fetch, Operation, Step, as_uuid
from .tables import table_shape

log = logger("airflow_provider_sqlqueue.transport")


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


def ack_locked_audited(
    d: Dialect, address: QueueAddress, params: Mapping[str, int], audit_address: QueueAddress
) -> Operation[int]:
    """Delete a locked batch's rows (:func:`.locked.ack_locked`; ``params`` after, last, locked_by)
    and copy each unexpired one to the audit queue, in its transaction; returns how many were copied.
    Its messages' processing began when the batch was locked, unknown here: stamped with the ack's time."""
    rows = yield Step(d.ack_locked_copy_sql(address), params, Fetch.ALL, d.qualified_name(address))
    yield from _audit_copies(d, address, audit_address, [(as_uuid(i), h, b) for i, h, b in rows], {})
    return len(rows)


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
    yield from insert_rows(d, audit_address, shape, rows)
    log.debug(
        "Audited %d message(s) of %s in %s", len(rows), d.qualified_name(address), d.qualified_name(audit_address)
    )
