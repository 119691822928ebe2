"""Queue operations, written once for every database and for sync and async callers.

Each operation is a generator that yields :class:`Step` objects (a statement, its parameters and
what to fetch) and receives each step's result; a driver runs the steps on a connection inside one
transaction (:func:`drive`). The operation decides *what* happens -- dropping expired rows,
routing poison rows to the error queue, counting deliveries -- and the dialect says *how* in SQL,
so those rules cannot drift between PostgreSQL and SQL Server or between the sync client and the
asyncio pump.

One module per capability, named by the glossary's words: :mod:`.steps` (the core),
:mod:`.tables` (installation), :mod:`.send`, :mod:`.receive`, :mod:`.claim`, :mod:`.audit`,
:mod:`.forward`, :mod:`.delayed`, :mod:`.publish`, :mod:`.ledger` (the write ledger),
:mod:`.inspection` and :mod:`.error_queue`. This package's namespace is their catalogue: callers
write ``ops.claim(...)`` whichever module defines it.
"""

from .audit import ack_audited, audit
from .claim import (
    HeldColumns,
    ack,
    ack_held,
    ack_held_audited,
    claim,
    extend,
    extend_held,
    fail_claim,
    held,
    held_columns,
    nack,
    nack_held,
    release_lapsed,
    settle,
    settle_then_claim,
    take,
)
from .delayed import create_delayed, move_due, next_due, send_delayed
from .error_queue import ErrorGroup, FailedMessage, RetryPage, error_summary, failed_messages, retry_from_error
from .forward import forward, forward_published
from .inspection import (
    BrowseColumns,
    BrowsePage,
    ClaimInfo,
    Holder,
    Horizon,
    QueuePage,
    QueueStats,
    browse,
    browse_columns,
    claims,
    depth,
    horizon,
    in_flight,
    list_queues,
    peek,
    peek_claims,
    queue_stats,
    seq_range,
)
from .ledger import create_writes, forget_write, record_write
from .publish import create_subscriptions, publish, subscribe, subscribers, unsubscribe
from .receive import Taken, move_to_error, purge_all, purge_expired_batch, receive
from .send import copies_sends, send, send_copied
from .steps import Fetch, Operation, Step, autocommitted, drive, needs_no_transaction
from .tables import check_existing, check_queue, checked, create_inflight, create_queue, drop_queue, table_shape

__all__ = [
    "BrowseColumns",
    "BrowsePage",
    "ClaimInfo",
    "ErrorGroup",
    "FailedMessage",
    "Fetch",
    "HeldColumns",
    "Holder",
    "Horizon",
    "Operation",
    "QueuePage",
    "QueueStats",
    "RetryPage",
    "Step",
    "Taken",
    "ack",
    "ack_audited",
    "ack_held",
    "ack_held_audited",
    "audit",
    "autocommitted",
    "browse",
    "browse_columns",
    "check_existing",
    "check_queue",
    "checked",
    "claim",
    "claims",
    "copies_sends",
    "create_delayed",
    "create_inflight",
    "create_queue",
    "create_subscriptions",
    "create_writes",
    "depth",
    "drive",
    "drop_queue",
    "error_summary",
    "extend",
    "extend_held",
    "fail_claim",
    "failed_messages",
    "forget_write",
    "forward",
    "forward_published",
    "held",
    "held_columns",
    "horizon",
    "in_flight",
    "list_queues",
    "move_due",
    "move_to_error",
    "nack",
    "nack_held",
    "needs_no_transaction",
    "next_due",
    "peek",
    "peek_claims",
    "publish",
    "purge_all",
    "purge_expired_batch",
    "queue_stats",
    "receive",
    "record_write",
    "release_lapsed",
    "retry_from_error",
    "send",
    "send_copied",
    "send_delayed",
    "seq_range",
    "settle",
    "settle_then_claim",
    "subscribe",
    "subscribers",
    "table_shape",
    "take",
    "unsubscribe",
]
