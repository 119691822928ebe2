"""Installation: creating, checking and dropping queue tables and the claim store.

Every operation that touches a queue table first passes :func:`table_shape`, which learns a
table's layout once per session and refuses a table that is not a queue, so a mistyped name can
never reach a business or catalog table.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar, runtime_checkable

from ..addressing import QueueAddress
from ..dialects import Dialect, TableShape
from ..errors import InvalidArgumentError, QueueNotFoundError, TransportMisconfiguredError
from ..logs import logger
from .steps import Fetch, Operation, Step

log = logger("airflow_provider_sqlqueue.transport")

T = TypeVar("T")


def create_queue(d: Dialect, address: QueueAddress, body_string: bool = False) -> Operation[None]:
    """Create the queue table with its indexes (idempotent, safe concurrently), or check the existing one.

    An existing table is never altered for indexes: building one on a live queue locks it. A
    missing Index_Expires is warned about, with the statement to create it at a quiet time.
    """
    yield from install_table(d, address, d.create_queue_sql(address))
    yield from check_queue(d, address)
    if body_string:
        yield Step(d.add_body_string_sql(address), {}, Fetch.NONE, d.qualified_name(address))


def install_table(d: Dialect, table: QueueAddress, ddl: Sequence[str], kind: str | None = None) -> Operation[None]:
    """Run ``ddl`` under the installer lock when ``table`` does not exist yet; an existing table is left as it
    is, and refused when it is not a table of ``kind`` (queue tables are checked by their installer)."""
    target = d.qualified_name(table)
    yield Step(d.install_lock_sql(table), {}, Fetch.NONE, target)
    existing = yield Step(d.queue_columns_sql(table), table_key(d, table), Fetch.ALL, target)
    if existing and kind is not None:
        d.learn_table_of(kind, table, existing)
    if not existing:
        for sql in ddl:
            yield Step(sql, {}, Fetch.NONE, target)


def table_key(d: Dialect, address: QueueAddress) -> dict[str, object]:
    """The schema and table parameters of the catalog queries."""
    return {"schema": address.schema or d.default_schema, "table": address.table}


def table_shape(d: Dialect, address: QueueAddress) -> Operation[TableShape]:
    """The layout of the queue table at ``address``, checked to be a queue table the first time a session touches it.

    Every operation that reads, writes, deletes from or drops a queue table passes here first, so
    a name that reaches the wrong table -- a business table, a catalog table, the claim store --
    is refused (:class:`~.errors.NotAQueueError`, :class:`~.errors.QueueNotFoundError`) before any
    statement touches it.
    """
    shape = d.table_shape(address)
    if shape is None:
        target = d.qualified_name(address)
        columns = yield Step(d.queue_columns_sql(address), table_key(d, address), Fetch.ALL, target)
        if not columns:
            raise (yield from not_found(d, address))
        shape = d.learn_table_shape(address, columns)
    return shape


def checked(d: Dialect, queues: Sequence[QueueAddress], op: Operation[T]) -> Operation[T]:
    """``op``, after checking that each of ``queues`` is a queue table: for calls that name a queue
    they do not otherwise touch (a filter, a default endpoint name), which must not be a typo either."""
    for queue in queues:
        yield from table_shape(d, queue)
    return (yield from op)


def check_existing(d: Dialect, tables: Sequence[tuple[str, QueueAddress]]) -> Operation[None]:
    """Refuse, before an installer creates anything, a plan naming a table that exists as something
    else (a business table given as the error or audit queue): a refused installation leaves no
    table behind. ``tables``: (kind, address), kind ``queue`` or one of :attr:`Dialect.kind_columns`."""
    holder_sql = d.index_name_holder_sql()
    for kind, address in tables:
        d.forget_table(address)
        target = d.qualified_name(address)
        columns = yield Step(d.queue_columns_sql(address), table_key(d, address), Fetch.ALL, target)
        if columns and kind == "queue":
            d.learn_table_shape(address, columns)
        elif columns:
            d.learn_table_of(kind, address, columns)
        for index in d.named_indexes(kind, address):
            if holder_sql is None:
                break
            held = yield Step(holder_sql, {**table_key(d, index), "on": address.table}, Fetch.ONE, target)
            if held is None or held[0]:
                continue
            clash = f"{index.table!r}, the name of an index on {target}, is already {held[1]} in its schema"
            if not columns:  # "IF NOT EXISTS" would skip the new table's index without a word
                raise InvalidArgumentError(f"{clash}; rename one of the two tables")
            # A table made so by an earlier version works without that index; it only goes slower.
            log.warning("%s: %s lacks that index; rename one of the two tables to have it", clash, target)


def table_of(d: Dialect, address: QueueAddress, kind: str) -> Operation[None]:
    """Check, the first time a session touches it, that ``address`` is a table of ``kind`` (a queue's
    delayed messages, a subscription table, a write ledger: :attr:`Dialect.kind_columns`)."""
    if not d.is_table_of(kind, address):
        target = d.qualified_name(address)
        columns = yield Step(d.queue_columns_sql(address), table_key(d, address), Fetch.ALL, target)
        if not columns:
            raise (yield from not_found(d, address, kind))
        d.learn_table_of(kind, address, columns)


def not_found(d: Dialect, address: QueueAddress, kind: str | None = None) -> Operation[QueueNotFoundError]:
    """The error for a table that is not there (a queue, or a table of ``kind``), saying what to
    create: the table, with the call that makes its kind, or, when its schema is missing too, the
    schema first, which no call of the library makes."""
    row = yield Step(d.schema_exists_sql(address), table_key(d, address), Fetch.ONE, d.qualified_name(address))
    return QueueNotFoundError(d.shown_name(address), schema_missing=not (row and row[0]), kind=kind)


def create_inflight(d: Dialect, address: QueueAddress) -> Operation[None]:
    """Create the in-flight table that claim mode needs in ``address``'s schema."""
    target = d.qualified_name(d.inflight_address(address))
    yield Step(d.install_lock_sql(d.inflight_address(address)), {}, Fetch.NONE, target)
    for sql in d.create_inflight_sql(address):
        yield Step(sql, {}, Fetch.NONE, target)


def check_queue(d: Dialect, address: QueueAddress) -> Operation[None]:
    """Fail clearly when the table is missing or not a queue table; warn when Index_Expires is missing."""
    d.forget_table(address)  # read the catalog afresh: the caller asks about the table as it is now
    yield from table_shape(d, address)
    target = d.qualified_name(address)
    indexed = yield Step(d.has_expires_index_sql(address), table_key(d, address), Fetch.ONE, target)
    if not indexed[0]:
        log.warning(
            "Queue %s has no index on Expires, so purging expired messages scans the whole table. Create it with: %s",
            target,
            d.expires_index_ddl_sql(address),
        )


def drop_queue(d: Dialect, address: QueueAddress) -> Operation[None]:
    """Drop a queue table; a missing one is already gone, and a table that is not a queue is refused."""
    d.forget_table(address)
    try:
        yield from table_shape(d, address)
    except QueueNotFoundError:
        return
    yield Step(d.drop_queue_sql(address), {}, Fetch.NONE, d.qualified_name(address))
    d.forget_table(address)
    delayed = address.delayed()  # its delayed-message table goes with it
    columns = yield Step(d.queue_columns_sql(delayed), table_key(d, delayed), Fetch.ALL, d.qualified_name(delayed))
    if columns:
        d.learn_table_of("delayed", delayed, columns)
        yield Step(d.drop_queue_sql(delayed), {}, Fetch.NONE, d.qualified_name(delayed))
        d.forget_table(delayed)


@runtime_checkable
class NotifiesInserts(Protocol):
    """A dialect whose queue tables can notify listeners of every insert (PostgreSQL's triggers)."""

    def notify_on_insert_sql(self, address: QueueAddress) -> Sequence[str]:
        """The function and statement-level trigger that notify the queue's channel on every insert."""


def notifies_inserts(d: Dialect) -> NotifiesInserts:
    """``d``, refused unless :func:`notify_on_insert` can be installed on its queue tables."""
    if not isinstance(d, NotifiesInserts):
        raise TransportMisconfiguredError(
            f"{d.name} has no notifications: its consumers find new messages by polling (the peek interval); "
            "notify_on_insert is for PostgreSQL queues"
        )
    return d


def notify_on_insert(d: Dialect, address: QueueAddress) -> Operation[None]:
    """Make every insert into the queue notify its channel, whoever inserts (idempotent, under the
    installer lock): senders that are not this library wake pumps, triggers and sensors too."""
    notifying = notifies_inserts(d)
    yield from table_shape(d, address)
    target = d.qualified_name(address)
    yield Step(d.install_lock_sql(address), {}, Fetch.NONE, target)
    for sql in notifying.notify_on_insert_sql(address):
        yield Step(sql, {}, Fetch.NONE, target)
