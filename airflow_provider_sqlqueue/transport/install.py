"""What an installer creates, as operations to run or as a script a DBA reviews and runs.

One plan serves both: :meth:`~.client.QueueClient.create_queue` runs :meth:`Installation.operations`
and ``sqlqueue ddl`` prints :meth:`Installation.ddl`, built from the same dialect statements, so
the script is what the installer would have run (minus its lock and its checks of existing
tables). :meth:`Installation.grants` gives a runtime role exactly the rights the queue operations
use on those tables, and nothing on the schema beyond reaching them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from functools import partial

from . import operations as ops
from .addressing import QueueAddress, check_name
from .dialects import Dialect
from .errors import InvalidArgumentError


class TableKind(Enum):
    """What a table is for, which decides its DDL and the rights the runtime needs on it."""

    QUEUE = "queue"  # a queue table: queues, error and audit queues, secondaries
    INFLIGHT = "inflight"  # the claim store of a schema
    DELAYED = "delayed"  # a queue's delayed-message table
    SUBSCRIPTIONS = "subscriptions"  # NServiceBus's SubscriptionRouting
    WRITES = "writes"  # the Spark data source's write ledger


@dataclass(frozen=True)
class Installation:
    """The tables an installer creates, in the order it creates them (each at most once)."""

    dialect: Dialect
    tables: tuple[tuple[TableKind, QueueAddress], ...]
    body_string: bool = False
    #: Queues whose every insert notifies their listeners (:func:`~.operations.notify_on_insert`).
    notifying: tuple[QueueAddress, ...] = ()

    def __post_init__(self) -> None:
        _one_kind_each(self.dialect, self.tables)

    @classmethod
    def combine(cls, installations: Iterable[Installation]) -> Installation:
        """One plan for several queues: tables they share (an error queue, the claim store) appear once."""
        plans = list(installations)
        if not plans:
            raise InvalidArgumentError("nothing to install: name at least one queue")
        dialect = plans[0].dialect
        tables = [table for plan in plans for table in plan.tables]
        _one_kind_each(dialect, tables)
        seen: dict[tuple[str | None, str, str], tuple[TableKind, QueueAddress]] = {}
        for kind, address in tables:
            seen.setdefault(dialect.name_key(address), (kind, address))
        notifying = {dialect.name_key(a): a for plan in plans for a in plan.notifying}
        return cls(dialect, tuple(seen.values()), any(plan.body_string for plan in plans), tuple(notifying.values()))

    def with_subscriptions(self, table: QueueAddress) -> Installation:
        """This plan plus NServiceBus's subscription table (publishers and subscribers share it)."""
        return Installation.combine([self, Installation(self.dialect, ((TableKind.SUBSCRIPTIONS, table),))])

    def with_write_ledgers(self, ledgers: Iterable[QueueAddress]) -> Installation:
        """This plan plus the Spark data source's write ledgers, made ahead so a writing role needs no CREATE."""
        return Installation.combine([self, Installation(self.dialect, tuple((TableKind.WRITES, a) for a in ledgers))])

    def with_notify_on_insert(self, queues: Iterable[QueueAddress]) -> Installation:
        """This plan plus a trigger on each of ``queues`` that notifies its listeners of every insert,
        whoever makes it; refused, before anything is made, where the database has no notifications."""
        ops.notifies_inserts(self.dialect)
        return Installation.combine([self, Installation(self.dialect, (), notifying=tuple(queues))])

    def queue_tables(self) -> list[QueueAddress]:
        return [address for kind, address in self.tables if kind is TableKind.QUEUE]

    def operations(self) -> list[Callable[[], ops.Operation[None]]]:
        """The installer's operations (each takes the installer lock and leaves existing tables as they are)."""
        d = self.dialect
        makers = {
            TableKind.INFLIGHT: ops.create_inflight,
            TableKind.DELAYED: ops.create_delayed,
            TableKind.SUBSCRIPTIONS: ops.create_subscriptions,
            TableKind.WRITES: ops.create_writes,
        }
        made: list[Callable[[], ops.Operation[None]]] = [
            partial(ops.create_queue, d, address, self.body_string)
            if kind is TableKind.QUEUE
            else partial(makers[kind], d, address)
            for kind, address in self.tables
        ]
        return made + [partial(ops.notify_on_insert, d, address) for address in self.notifying]

    def check(self) -> ops.Operation[None]:
        """Refuse the plan, before anything is created, when one of its tables exists as something else
        (the claim store too: a business table of that name would be refused only after the queues)."""
        return ops.check_existing(self.dialect, [(kind.value, address) for kind, address in self.tables])

    def ddl(self) -> list[str]:
        """The statements that create every table and index (each one idempotent), as the operations run them."""
        d = self.dialect
        statements: list[str] = []
        for kind, address in self.tables:
            if kind is TableKind.QUEUE:
                statements += d.create_queue_sql(address)
                if self.body_string:
                    statements.append(d.add_body_string_sql(address))
            elif kind is TableKind.INFLIGHT:
                statements += d.create_inflight_sql(address)
            elif kind is TableKind.DELAYED:
                statements += d.create_delayed_sql(address)
            elif kind is TableKind.WRITES:
                statements += d.create_writes_sql(address)
            else:
                statements += d.create_subscriptions_sql(address)
        for address in self.notifying:
            statements += ops.notifies_inserts(d).notify_on_insert_sql(address)
        return statements

    def grants(self, role: str) -> list[str]:
        """What a runtime role needs to use the tables (send, receive in every mode, delay, publish, audit).

        Rights on the tables only (and, where the database asks for it, on the schema and on the
        queue tables' sequences): no CREATE, so a runtime role cannot install or alter anything.
        """
        check_name("role", role)  # quoted as an identifier, never formatted in: it must be one
        d = self.dialect
        d.validate_role(role)
        statements: list[str] = []
        for schema_of in _distinct_schemas(d, [address for _, address in self.tables]):
            statements += d.grant_schema_usage_sql(schema_of, role)
        for kind, address in self.tables:
            statements += d.grant_runtime_sql(address, role, sequence=kind is TableKind.QUEUE)
        return statements


def _one_kind_each(d: Dialect, tables: Iterable[tuple[TableKind, QueueAddress]]) -> None:
    """Refuse a table planned as two kinds (a queue named as another queue's delayed table, a write
    ledger or subscription table named as a queue): one table cannot be both, the installer would
    make only the first, and the runtime refuses a table that exists as another kind."""
    kinds: dict[tuple[str | None, str, str], TableKind] = {}  # name_key -> kind
    names: dict[tuple[str | None, str, str], str] = {}  # name_key -> the table's qualified name
    indexes: dict[tuple[str | None, str, str], str] = {}  # name_key of an index -> the table it is on
    for kind, address in tables:
        name = d.qualified_name(address)
        if d.name_key(address) == d.name_key(d.inflight_address(address)) and kind is not TableKind.INFLIGHT:
            raise InvalidArgumentError(f"{name} is the name of each schema's claim store; name the table otherwise")
        first = kinds.setdefault(d.name_key(address), kind)
        if first is not kind:
            raise InvalidArgumentError(f"{name} cannot be both {_ROLES[first]} and {_ROLES[kind]}: name another table")
        names[d.name_key(address)] = name
        indexes.update((d.name_key(index), name) for index in d.named_indexes(kind.value, address))
    delayed_of = {d.name_key(a.delayed()): names[d.name_key(a)] for kind, a in tables if kind is TableKind.QUEUE}
    for kind, address in tables:
        queue = delayed_of.get(d.name_key(address))
        if queue is not None and kind is not TableKind.DELAYED:
            # Even when the plan leaves the delayed table out: the runtime takes that name for the
            # queue's delayed messages (a delayed send, drop_queue) and would refuse the other table.
            raise InvalidArgumentError(
                f"{names[d.name_key(address)]} is the name of the delayed-message table of {queue}; name another table"
            )
    for key in names.keys() & indexes.keys():
        raise InvalidArgumentError(
            f"{names[key]} cannot be a table: it is the name of an index on {indexes[key]}, and tables and "
            "indexes share a schema's names; name another table"
        )


#: What each kind of table is, as a refusal names it.
_ROLES = {
    TableKind.QUEUE: "a queue",
    TableKind.INFLIGHT: "the claim store",
    TableKind.DELAYED: "a delayed-message table",
    TableKind.SUBSCRIPTIONS: "the subscription table",
    TableKind.WRITES: "the write ledger",
}


def _distinct_schemas(d: Dialect, addresses: Sequence[QueueAddress]) -> list[QueueAddress]:
    """One address per schema (and catalog) among ``addresses``, in order."""
    seen: dict[tuple[str | None, str], QueueAddress] = {}
    for address in addresses:
        seen.setdefault((address.catalog, address.schema or d.default_schema), address)
    return list(seen.values())
