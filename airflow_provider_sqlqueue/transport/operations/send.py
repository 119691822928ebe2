"""Sending: INSERTs of NServiceBus rows in as few statements as the dialect allows, and the bulk
load (COPY) where the database has one.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime
from typing import Protocol, runtime_checkable

from ..addressing import QueueAddress
from ..dialects import Dialect, SendRow, TableShape
from ..errors import ArgumentTypeError, InvalidArgumentError, TransportMisconfiguredError
from ..message import Message, wire_timestamp
from ..tracing import producing
from .steps import Autocommit, Fetch, Operation, Step
from .tables import table_shape


def send(d: Dialect, address: QueueAddress, messages: Sequence[Message], notify: bool = False) -> Operation[int]:
    """Insert messages in as few statements as the dialect allows; returns how many were sent.

    With ``notify`` (where the database has notifications) listeners of the queue are woken when
    the transaction commits, once per send however many messages it holds: the last INSERT carries
    the notification, so a send that is one INSERT (one message, or any batch where the dialect
    inserts batches whole) needs no transaction (the table's layout, read once per session, is only
    read).
    """
    op = send_messages(d, address, messages, notify)
    return Autocommit(op) if len(messages) == 1 or d.one_statement_sends else op


def send_messages(
    d: Dialect, address: QueueAddress, messages: Sequence[Message], notify: bool, *, traced: bool = True
) -> Operation[int]:
    """:func:`send`'s statements, in a ``send`` span (:mod:`..tracing`) unless ``traced`` is False (a
    publish, whose one span covers every subscriber's copy)."""
    shape = yield from table_shape(d, address)
    if not traced:
        return (yield from _insert_messages(d, address, shape, messages, notify))
    with producing("send", lambda: d.format_address(address), messages, database=d.name) as outgoing:
        return (yield from _insert_messages(d, address, shape, outgoing, notify))


def _insert_messages(
    d: Dialect, address: QueueAddress, shape: TableShape, messages: Sequence[Message], notify: bool
) -> Operation[int]:
    sent_at = wire_timestamp(datetime.now(UTC))
    rows: list[SendRow] = [
        (m.id, m.ttbr_ms(), m.wire_headers(sent_at, ascii_only=shape.ascii_headers), m.body) for m in messages
    ]
    yield from insert_rows(d, address, shape, rows, d.notify_channel(address) if notify else None)
    return len(rows)


def insert_rows(
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

    def copy_csv_sql(self, address: QueueAddress, shape: TableShape) -> str:
        """The COPY statement loading (Id, Headers, Body) rows given as CSV, Expires left NULL."""


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
        return (yield from send_messages(d, address, messages, False))
    shape = yield from table_shape(d, address)
    if not messages:
        return 0
    with producing("send", lambda: d.format_address(address), messages, database=d.name) as outgoing:
        sent_at = wire_timestamp(datetime.now(UTC))
        rows = [(m.id, m.wire_headers(sent_at, ascii_only=shape.ascii_headers), m.body) for m in outgoing]
        sql, types = d.copy_send_sql(address, shape)
        yield Step(sql, {"rows": rows, "types": types}, Fetch.COPY, d.qualified_name(address))
    return len(rows)


def send_csv(d: Dialect, address: QueueAddress, chunks: Iterable[bytes]) -> Operation[int]:
    """Load (Id, Headers, Body) rows a bulk loader wrote as CSV (Spark's rows, built by its SQL
    engine, written by Arrow) into a queue table; returns how many.

    The rows are not messages the library built, so the database checks what their columns' types
    check (a malformed id or hex body, a NULL Headers, a row of the wrong width, an id already in
    the queue fail the load, and the caller's transaction with it), and a line that would end the
    data early is refused. The Headers text is the loader's to make readable: one that is not a
    JSON object of strings is poison, which a browse skips and a claim moves to the error queue
    (checking every row's JSON on the server costs a third of the load; the Spark writer builds it
    with Spark's ``to_json``). The table must be a queue the library may write. PostgreSQL only:
    SQL Server has no COPY, and a refusal says so.
    """
    if not isinstance(d, CopiesSends):
        raise TransportMisconfiguredError(f"a CSV load needs PostgreSQL's COPY, which {d.name} does not have")
    if isinstance(chunks, (str, bytes, bytearray, memoryview)) or not isinstance(chunks, Iterable):
        raise ArgumentTypeError(f"chunks must be an iterable of bytes (CSV text), got {type(chunks).__name__}")
    shape = yield from table_shape(d, address)
    if shape.ascii_headers:
        raise TransportMisconfiguredError(
            f"{d.qualified_name(address)} keeps its Headers as varchar, whose non-ASCII text must be written "
            "\\u-escaped, which a CSV load does not do: send the messages with send"
        )
    count = yield Step(
        d.copy_csv_sql(address, shape), {"chunks": _bytes_only(chunks)}, Fetch.LOAD, d.qualified_name(address)
    )
    return int(count)


#: A line holding only a backslash and a dot: PostgreSQL's end of COPY data, after which it would
#: ignore the rest (the whole line: one that begins a longer line, or a quoted one, is data).
_END_OF_DATA = re.compile(rb"\n\\\.\r?\n")
_END_OF_DATA_AT_END = re.compile(rb"\n\\\.\r?$")


def _bytes_only(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """The chunks, each checked to be bytes, and the data to hold no line of only ``\\.`` (the rows
    after it would be dropped without a word), wherever the chunks split it."""
    before = b"\n"  # the data starts a line
    for chunk in chunks:
        if not isinstance(chunk, (bytes, bytearray, memoryview)):
            raise ArgumentTypeError(f"a CSV load's chunks are bytes, got {type(chunk).__name__}")
        data = chunk if isinstance(chunk, bytes) else bytes(chunk)  # a load's chunks are searched, not copied
        # A line of five bytes at most: one that spans the boundary lies in the 4 bytes either side of it.
        if _END_OF_DATA.search(before + data[:4]) or _END_OF_DATA.search(data):
            raise _end_of_data()
        before = (before + data[-4:])[-4:]
        yield chunk
    if _END_OF_DATA_AT_END.search(before):
        raise _end_of_data()


def _end_of_data() -> InvalidArgumentError:
    return InvalidArgumentError(
        "a CSV load's data holds a line of only \\. (PostgreSQL's end of data, which would drop the rows after "
        "it): quote that field"
    )
