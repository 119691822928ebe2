"""Batches locked by a transaction: the oldest rows of a queue locked by the caller's open
transaction (``FOR UPDATE SKIP LOCKED``), read by other sessions while it stays open
(:func:`.inspection.browse_columns` with ``locked_by``), then deleted by that same transaction
(acknowledged) or left to its end (given back).

NServiceBus's native receive, for a batch that many readers read (a Spark job's executors):
nothing is moved while the batch is held, so holding it costs what locking its rows costs, where a
claim (:mod:`.claim`) moves each row into the claim store and out again. What the claim store
keeps and this gives up: a delivery count, and settling from another process. A batch is settled
by the transaction that locked it; if that transaction ends any other way -- its block raised, its
process died, its connection was cut -- every message is back in the queue as it was, with no
delivery counted (and ``max_deliveries`` never reached). While it is held, the open transaction
keeps PostgreSQL's xmin horizon where it began: vacuum removes no dead row of the database's
tables until it ends.

PostgreSQL only: there every row lock names its transaction in the row (``xmax``), which any session
reads. SQL Server's dialect refuses each statement, saying why.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..addressing import QueueAddress
from ..dialects import Dialect
from ..errors import InvalidArgumentError, InvalidHeadersError, TransportMisconfiguredError
from ..logs import logger
from ..message import decode_headers
from .audit import ack_locked_audited
from .inspection import unreadable_rows
from .receive import log_poison
from .steps import Fetch, Operation, Step, as_uuid
from .tables import table_shape

log = logger("airflow_provider_sqlqueue.transport")


@dataclass(frozen=True)
class LockedBatch:
    """A batch locked by one transaction: the rows of ``queue`` (its address as NServiceBus writes
    it) with ``after`` < Seq <= ``last`` that transaction ``xid`` holds locked -- ``count`` of them, of
    which those at the Seqs in ``poison`` have headers nobody can read (no reader returns them;
    settling moves them to the error queue).

    Rows sent into that range after the lock are not in the batch: the readers and the settle
    select by the lock, not by the range alone."""

    queue: str
    xid: int
    after: int
    last: int
    count: int
    poison: tuple[int, ...] = ()


def lock_batch(d: Dialect, address: QueueAddress, error_address: QueueAddress, limit: int) -> Operation[LockedBatch]:
    """Lock up to ``limit`` of the queue's oldest unexpired messages in the open transaction.

    Rows other sessions hold (receivers, other batches) are skipped, as every receive skips them;
    expired rows are left to the receives and purges that delete them. Only Seq and Headers come
    back: the headers are decoded here to find the poison, the bodies are for the readers. Run it
    in the transaction itself, not in a savepoint of it: a savepoint's row locks carry the
    savepoint's own id, which the readers would not find -- such a lock is refused.
    """
    sql = d.lock_batch_sql(address)  # refused here, before any statement, where the database cannot
    target = d.qualified_name(address)
    yield from table_shape(d, address)
    yield from table_shape(d, error_address)  # poison must have somewhere to go: known before anything is locked
    rows = yield Step(sql, {"limit": limit}, Fetch.ALL, target)
    seqs = [int(row[0]) for row in rows]
    xid, own = yield Step(d.locker_sql(address), {"seq": seqs[0] if seqs else 0}, Fetch.ONE, target)
    if seqs and own is not True:
        raise TransportMisconfiguredError(
            f"the batch of {target} was locked in a savepoint, not in the transaction itself (the connection "
            "given to the client had a transaction of its own open, and the client's block became a savepoint "
            "of it): its readers could not find it. Lock a batch on a connection in autocommit, or with none "
            "of its own transaction open"
        )
    poison = tuple(seqs[n] for n in unreadable_rows([row[1] for row in rows]))
    if seqs:
        log.debug("Locked %d message(s) of %s in transaction %s", len(seqs), target, xid)
    first, last = (seqs[0] - 1, seqs[-1]) if seqs else (0, 0)
    return LockedBatch(d.claim_key(address), int(xid), first, last, len(seqs), poison)


def ack_locked(
    d: Dialect,
    address: QueueAddress,
    error_address: QueueAddress,
    batch: LockedBatch,
    audit_address: QueueAddress | None,
) -> Operation[tuple[int, int]]:
    """Acknowledge a batch in the transaction that locked it: its poison moved, unchanged, to the
    error queue, its other messages deleted (and copied to the audit queue, when auditing), all
    committing with that transaction. Returns (acknowledged, moved to the error queue); a message
    whose time to be received passed while held is deleted without being counted or audited."""
    sql = d.ack_locked_sql(address)
    yield from _in_its_transaction(d, address, batch)
    moved = yield from _poison_to_error(d, address, error_address, batch)
    params = {"after": batch.after, "last": batch.last, "locked_by": batch.xid}
    if audit_address is not None:
        return (yield from ack_locked_audited(d, address, params, audit_address)), moved
    (handled,) = yield Step(sql, params, Fetch.ONE, d.qualified_name(address))
    return int(handled), moved


def nack_locked(
    d: Dialect, address: QueueAddress, error_address: QueueAddress, batch: LockedBatch
) -> Operation[tuple[int, int]]:
    """Give a batch back in the transaction that locked it: its poison moved, unchanged, to the error
    queue (the next batch would meet it again), nothing else touched -- the rest is receivable
    again when that transaction ends. Returns (given back, moved to the error queue)."""
    yield from _in_its_transaction(d, address, batch)
    moved = yield from _poison_to_error(d, address, error_address, batch)
    return batch.count - moved, moved


def _in_its_transaction(d: Dialect, address: QueueAddress, batch: LockedBatch) -> Operation[None]:
    """Refuse to settle a batch outside the transaction that locked it -- another could not delete its
    rows (it would wait for their lock) and nothing it did would commit with them -- or as another
    queue's: a transaction's locks on two queues carry one id, and their Seq ranges may overlap."""
    sql = d.current_transaction_sql()  # refused here, before any statement, where the database cannot
    if batch.queue != d.claim_key(address):
        raise InvalidArgumentError(
            f"the batch was locked on queue {batch.queue}, not on {d.claim_key(address)}: settle it on its own queue"
        )
    yield from table_shape(d, address)
    (current,) = yield Step(sql, {}, Fetch.ONE, d.qualified_name(address))
    if current is None or int(current) != batch.xid:
        raise InvalidArgumentError(
            f"the batch was locked by transaction {batch.xid}, and this call runs in "
            f"{'one that has locked nothing' if current is None else f'transaction {current}'}: settle a batch in "
            "the transaction block that locked it, before the block ends"
        )


def _poison_to_error(
    d: Dialect, address: QueueAddress, error_address: QueueAddress, batch: LockedBatch
) -> Operation[int]:
    """Move the batch's poison to the error queue, as a receive moves poison (unchanged, logged).
    The error queue is checked either way: a settle named one that cannot take poison is refused."""
    shape = yield from table_shape(d, error_address)
    if not batch.poison:
        return 0
    params = {"seqs": d.seq_list(batch.poison), "locked_by": batch.xid}
    rows = yield Step(
        d.locked_to_error_sql(address, error_address, shape), params, Fetch.ALL, d.qualified_name(address)
    )
    for message_id, headers_text in rows:
        try:
            decode_headers(headers_text)
        except InvalidHeadersError as exc:
            log_poison(d, address, error_address, as_uuid(message_id), exc)
    return len(rows)
