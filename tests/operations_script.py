"""Driving queue operations (``transport/operations/``) with fixed rows, without a database: the
helpers of the ``test_transport_operations_*`` modules.

Operations are sans-IO: they yield statements and receive what each returned. Driving them with
rows chosen by a test checks the decisions they make about those rows -- what is dropped, routed
to the error queue, retried, refused -- for both dialects' statements, including rows no real
server is easy to coax into returning on cue. That the statements do what the rows assume is what
the behaviour suites check on real servers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from airflow_provider_sqlqueue.transport import QueueAddress
from airflow_provider_sqlqueue.transport import operations as ops
from airflow_provider_sqlqueue.transport.dialects import Dialect, get_dialect
from airflow_provider_sqlqueue.transport.drivers import finish
from airflow_provider_sqlqueue.transport.errors import TransportMisconfiguredError

QUEUE = QueueAddress("orders", "sales")
ERROR = QueueAddress("error", "sales")
#: The queue as NServiceBus writes it in FailedQ, catalog and all.
CATALOGED = QueueAddress("orders", "sales", "SHOPDB")
AUDIT = QueueAddress("audit", "sales")
DELAYED = QUEUE.delayed()
SUBSCRIPTIONS = QueueAddress("SubscriptionRouting", "sales")
LEDGER = QueueAddress("sqlqueue_writes", "sales")


class Script:
    """Answers each statement by the dialect method that produced it, and records what ran."""

    def __init__(self, dialect: Dialect, answers: dict[str, Callable[[ops.Step], Any]]) -> None:
        self.dialect = dialect
        self.answers = answers
        self.ran: list[tuple[str, ops.Step]] = []

    def name_of(self, step: ops.Step) -> str:
        for name, produce in _PRODUCERS.items():
            if step.sql in produce(self.dialect):
                return name
        return "?"

    def __call__(self, step: ops.Step) -> Any:
        name = self.name_of(step)
        self.ran.append((name, step))
        answer = self.answers.get(name)
        return answer(step) if answer is not None else None

    def names(self) -> list[str]:
        return [name for name, _ in self.ran]


def _all(*texts: str) -> set[str]:
    return set(texts)


_PRODUCERS: dict[str, Callable[[Dialect], set[str]]] = {
    "receive": lambda d: _all(d.receive_sql(QUEUE), d.receive_sql(ERROR)),
    "insert_error": lambda d: _all(
        *(d.insert_error_sql(a, d.table_shape(a) or _shape()) for a in _addresses(d, QUEUE, ERROR, CATALOGED))
    ),
    "claim": lambda d: _all(d.claim_sql(QUEUE)),
    "reclaim": lambda d: _all(d.reclaim_sql(QUEUE)),
    "claim_to_error": lambda d: _all(d.claim_to_error_sql(QUEUE, ERROR, d.table_shape(ERROR) or _shape())),
    "ack": lambda d: _all(d.ack_sql(QUEUE)),
    "ack_copy": lambda d: _all(d.ack_copy_sql(QUEUE)),
    "send": lambda d: _all(d.send_sql(QUEUE, d.table_shape(QUEUE) or _shape())),
    "send_batch": lambda d: {d.send_batch_sql(QUEUE, n, d.table_shape(QUEUE) or _shape()) for n in range(1, 6)},
    "queue_columns": lambda d: _all(
        *(d.queue_columns_sql(a) for a in _addresses(d, QUEUE, CATALOGED, QUEUE.sibling("gone")))
    ),
    "has_expires_index": lambda d: _all(d.has_expires_index_sql(QUEUE)),
    "install_lock": lambda d: _all(d.install_lock_sql(QUEUE)),
    "create_queue": lambda d: set(d.create_queue_sql(QUEUE)),
    "error_headers": lambda d: _all(d.error_headers_sql(ERROR)),
    "error_rows": lambda d: _all(d.error_rows_sql(ERROR)),
    "current_catalog": lambda d: _all(d.current_catalog_sql()),
    "delete_by_seq": lambda d: _all(d.delete_by_seq_sql(ERROR)),
    "purge_expired": lambda d: _all(d.purge_expired_sql(QUEUE)),
    "audit_send": lambda d: {
        sql(AUDIT, d.table_shape(AUDIT) or _shape()) for sql in (d.send_sql, lambda a, s: d.send_batch_sql(a, 2, s))
    },
    "error_send": lambda d: _all(d.send_sql(ERROR, d.table_shape(ERROR) or _shape())),
    "subscribers": lambda d: _all(d.subscribers_sql(SUBSCRIPTIONS)),
    "record_write": lambda d: _all(d.record_write_sql(LEDGER)),
    "browse": lambda d: _all(d.browse_sql(QUEUE)),
    "due_delayed": lambda d: _all(d.due_delayed_sql(DELAYED)),
    "can_insert": lambda d: _all(d.can_insert_sql()),
    "waiting_ids": lambda d: {sql for sql in (d.waiting_ids_sql(ERROR),) if sql is not None},
    "delete_delayed": lambda d: _all(d.delete_delayed_sql(DELAYED)),
    "find": lambda d: _all(*(d.find_sql(a) for a in (QUEUE, QUEUE.sibling("gone")))),
    "scanned_all": lambda d: _all(d.scanned_all_sql(QUEUE)),
    "can_read": lambda d: _all(d.can_read_sql()),
    "schema_exists": lambda d: _all(d.schema_exists_sql(QUEUE.sibling("gone"))),
    "lock_timeout": lambda d: {sql for sql in (d.lock_timeout_sql(), d.current_lock_timeout_sql()) if sql is not None},
    "lock_batch": lambda d: _locked(lambda: d.lock_batch_sql(QUEUE)),
    "locker": lambda d: _locked(lambda: d.locker_sql(QUEUE)),
    "current_transaction": lambda d: _locked(d.current_transaction_sql),
    "browse_locked": lambda d: _locked(lambda: d.browse_locked_sql(QUEUE)),
    "transaction_open": lambda d: _locked(d.transaction_open_sql),
    "locked_to_error": lambda d: _locked(lambda: d.locked_to_error_sql(QUEUE, ERROR, d.table_shape(ERROR) or _shape())),
    "ack_locked": lambda d: _locked(lambda: d.ack_locked_sql(QUEUE)),
    "ack_locked_copy": lambda d: _locked(lambda: d.ack_locked_copy_sql(QUEUE)),
}


def _locked(make: Callable[[], str]) -> set[str]:
    """A statement of a batch locked by a transaction; none where the dialect refuses them (SQL Server)."""
    try:
        return {make()}
    except TransportMisconfiguredError:
        return set()


def _addresses(d: Dialect, *addresses: QueueAddress) -> list[QueueAddress]:
    """The addresses this dialect can name (PostgreSQL has no catalogs)."""
    return [a for a in addresses if a.catalog is None or d.name == "sqlserver"]


def _shape() -> Any:
    from airflow_provider_sqlqueue.transport.dialects import TableShape

    return TableShape()


def drive(op: ops.Operation[Any], script: Script) -> Any:
    async def execute(step: ops.Step) -> Any:
        return script(step)

    return finish(ops.drive(op, execute))


DIALECTS = ["postgres", "sqlserver"]
QUEUE_COLUMNS = {
    "postgres": [
        ("id", "uuid"),
        ("expires", "timestamp without time zone"),
        ("headers", "text"),
        ("body", "bytea"),
        ("seq", "integer"),
    ],
    "sqlserver": [
        ("id", "uniqueidentifier"),
        ("recoverable", "bit"),
        ("expires", "datetime"),
        ("headers", "nvarchar"),
        ("body", "varbinary"),
        ("rowversion", "bigint"),
    ],
}


def dialect_with_known_tables(name: str) -> Dialect:
    """A dialect that has checked the queue and error tables (each session reads a table's catalog once)."""
    d = get_dialect(name)
    for address in (QUEUE, ERROR, AUDIT):
        d.learn_table_shape(address, QUEUE_COLUMNS[name])
    for kind, address in (("delayed", DELAYED), ("subscriptions", SUBSCRIPTIONS), ("writes", LEDGER)):
        d.learn_table_of(kind, address, [(column, "") for column in d.kind_columns[kind]])
    return d
