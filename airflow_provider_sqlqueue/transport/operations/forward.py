"""Forward: acknowledging claims and sending (or publishing) their results in one transaction, so
a stage's result is sent once or not at all.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime

from ..addressing import QueueAddress
from ..dialects import Dialect
from ..errors import LeaseLostError
from ..message import Message
from .audit import ack_audited
from .claim import ack
from .publish import publish
from .send import send
from .steps import Operation


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
    that ``audit`` maps to an audit queue are audited as :func:`.audit.ack_audited` does.
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
    """Acknowledge ``claims`` and :func:`.publish.publish` ``messages`` in one transaction, as :func:`forward` sends them."""
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
