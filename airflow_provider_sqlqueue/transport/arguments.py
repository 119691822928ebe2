"""The checks every call of the queue API applies to its arguments, before anything is sent.

Each turns what a caller may pass (seconds or a ``timedelta``, a token or its text, one message or
many) into the one form the operations take, or raises the library's own error naming the
argument: :class:`~.errors.ArgumentTypeError` for a value of the wrong type,
:class:`~.errors.InvalidArgumentError` for one out of range. The clients (:mod:`.client`), the pump
and the lease keeper share them, so a value is judged alike whichever took it.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta

from . import defaults
from .addressing import QueueAddress, checked_text
from .dialects import Dialect
from .errors import ArgumentTypeError, InvalidArgumentError
from .message import Message, ReceivedMessage, duration, uuid_value, whole_ms
from .operations.locked import LockedBatch

#: A claim token as the caller has it: the UUID, or its text from XCom or an event payload.
Token = uuid.UUID | str


def lease_ms(lease: timedelta | float) -> int:
    """A lease in whole milliseconds, checked (positive, finite, at most ``defaults.MAX_LEASE``)."""
    return whole_ms(duration("lease", lease, maximum=defaults.MAX_LEASE))


def lock_wait_span(lock_wait: timedelta | float) -> timedelta:
    """How long a watcher waits for a locked table: positive, at most what either database holds
    (``defaults.LONGEST_LOCK_WAIT``), at least a millisecond (no database waits less; 0 would mean
    "for ever" to both)."""
    return duration("lock_wait", lock_wait, maximum=defaults.LONGEST_LOCK_WAIT)


def delay_ms(delay: timedelta | float) -> int:
    """A give-back delay in whole milliseconds; zero means at once."""
    return round(duration("delay", delay, minimum=timedelta(0), maximum=defaults.MAX_LEASE) / timedelta(milliseconds=1))


def as_messages(messages: Message | Iterable[Message]) -> list[Message]:
    """One message or many, checked to be :class:`Message` objects."""
    if isinstance(messages, Message):
        return [messages]
    if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Iterable):
        raise ArgumentTypeError(f"messages must be a Message or an iterable of them, got {type(messages).__name__}")
    batch = list(messages)
    for item in batch:
        if not isinstance(item, Message):
            raise ArgumentTypeError(f"expected Message objects, got {type(item).__name__}")
    return batch


def default_holder() -> str:
    """Who holds a claim when the caller does not say: this process (shown with in-flight claims)."""
    return f"{socket.gethostname()}:{os.getpid()}"


def as_tokens(tokens: Token | Iterable[Token]) -> list[uuid.UUID]:
    """Claim tokens from one token or many (UUIDs or their text), checked: at most one statement's worth."""
    if isinstance(tokens, (uuid.UUID, str)):
        tokens = [tokens]
    elif not isinstance(tokens, Iterable) or isinstance(tokens, (bytes, Mapping)):
        raise ArgumentTypeError(f"tokens must be a claim token or an iterable of them, got {type(tokens).__name__}")
    checked = [uuid_value("claim token", token) for token in tokens]
    if len(checked) > defaults.MAX_BATCH:
        raise InvalidArgumentError(
            f"at most {defaults.MAX_BATCH:,} tokens per call, got {len(checked):,}; settle in batches"
        )
    return checked


def label(what: str, value: object) -> str:
    """A holder or machine name as the database stores it: non-empty text it can hold, of bounded size."""
    return checked_text(what, value, limit=defaults.MAX_LABEL)


def received(what: str, message: object) -> ReceivedMessage:
    """A message as a receive or claim returned it (not a token, a body or a message to send)."""
    if not isinstance(message, ReceivedMessage):
        raise ArgumentTypeError(
            f"{what} must be a ReceivedMessage (as receive or claim return it), got {type(message).__name__}"
        )
    return message


def place(what: str, value: object) -> int:
    """A place in a queue (a Seq, or a partition number): an integer from 0 to the largest Seq."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise ArgumentTypeError(f"{what} must be an integer, got {type(value).__name__} {value!r:.40}")
    if not 0 <= value <= defaults.LAST_SEQ:
        raise InvalidArgumentError(f"{what} must be between 0 and {defaults.LAST_SEQ}, got {value}")
    return value


def started_times(started: object) -> Mapping[uuid.UUID, datetime] | None:
    """When processing of each message began (for audit headers), checked: aware datetimes by message id."""
    if started is None:
        return None
    if not isinstance(started, Mapping):
        raise ArgumentTypeError(f"started must map message ids to datetimes, got {type(started).__name__}")
    for key, value in started.items():
        uuid_value("message id", key)
        if not isinstance(value, datetime) or value.tzinfo is None:
            raise InvalidArgumentError(f"started must hold timezone-aware datetimes, got {value!r:.60}")
    return started


def one_or_many(tokens: Token | Iterable[Token], held: set[uuid.UUID]) -> bool | set[uuid.UUID]:
    """A settle call's answer in the caller's terms: a bool for one token, the held set for many."""
    return bool(held) if isinstance(tokens, (uuid.UUID, str)) else held


def error_seqs(seqs: Iterable[int]) -> list[int]:
    """Places in an error queue, checked: at least one, each a positive integer no larger than a Seq can be."""
    if isinstance(seqs, (str, bytes)) or not isinstance(seqs, Iterable):
        raise ArgumentTypeError(f"seqs must be an iterable of integers, got {type(seqs).__name__}")
    chosen = list(seqs)
    if not chosen:
        raise InvalidArgumentError("seqs must name at least one message")
    if len(chosen) > defaults.MAX_BATCH:
        raise InvalidArgumentError(f"seqs may name at most {defaults.MAX_BATCH:,} messages; retry in batches")
    for seq in chosen:
        if place("seqs", seq) < 1:
            raise InvalidArgumentError(f"seqs must be positive integers, got {seq!r}")
    return chosen


def same_table(dialect: Dialect, one: QueueAddress, other: QueueAddress) -> bool:
    """Whether two addresses reach one table (``orders`` and ``orders@"public"`` do)."""
    return dialect.name_key(one) == dialect.name_key(other)


def transaction_id(what: str, value: object) -> int:
    """A transaction's id as a locked batch carries it (``LockedBatch.xid``): a positive integer."""
    xid = place(what, value)
    if xid < 1:
        raise InvalidArgumentError(f"{what} must be a transaction id (a positive integer), got {xid}")
    return xid


def locked_batch(batch: object) -> LockedBatch:
    """A batch as :meth:`~.client.AsyncQueueClient.lock` returned it, checked whole: its id, a Seq
    range, and poison within that range."""
    if not isinstance(batch, LockedBatch):
        raise ArgumentTypeError(f"batch must be a LockedBatch (as lock returns it), got {type(batch).__name__}")
    if not isinstance(batch.queue, str):
        raise ArgumentTypeError(f"a batch's queue is its address as text, got {type(batch.queue).__name__}")
    transaction_id("batch's xid", batch.xid)
    if place("batch's after", batch.after) > place("batch's last", batch.last):
        raise InvalidArgumentError(f"a batch's range ends where it starts or later, got {batch.after} to {batch.last}")
    if not isinstance(batch.poison, tuple) or not all(
        type(seq) is int and batch.after < seq <= batch.last for seq in batch.poison
    ):
        raise InvalidArgumentError("a batch's poison are Seqs within its range")
    if type(batch.count) is not int or not len(batch.poison) <= batch.count <= batch.last - batch.after:
        raise InvalidArgumentError(f"a batch's count is how many rows of its range it locked, got {batch.count!r}")
    return batch
