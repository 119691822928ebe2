"""The write ledger (``sqlqueue_writes``): which partitions of a Spark write have committed, so a
re-run task sends nothing twice.
"""

from __future__ import annotations

import uuid

from ..addressing import QueueAddress
from ..dialects import Dialect
from .steps import Fetch, Operation, Step, autocommitted
from .tables import install_table, table_of


def create_writes(d: Dialect, ledger: QueueAddress) -> Operation[None]:
    """Create a write ledger (idempotent, safe concurrently)."""
    yield from install_table(d, ledger, d.create_writes_sql(ledger), "writes")


def record_write(d: Dialect, ledger: QueueAddress, write: uuid.UUID, part: int) -> Operation[bool]:
    """Record that partition ``part`` of ``write`` commits with the caller's transaction; False when
    it committed before (a re-run: send nothing)."""
    yield from table_of(d, ledger, "writes")
    count = yield Step(
        d.record_write_sql(ledger), {"write": write, "part": part}, Fetch.ROWCOUNT, d.qualified_name(ledger)
    )
    return int(count) == 1


@autocommitted
def forget_write(d: Dialect, ledger: QueueAddress, write: uuid.UUID) -> Operation[int]:
    """Delete the ledger rows of a write that is over; returns how many."""
    yield from table_of(d, ledger, "writes")
    count = yield Step(d.forget_write_sql(ledger), {"write": write}, Fetch.ROWCOUNT, d.qualified_name(ledger))
    return int(count)
