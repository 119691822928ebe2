"""Staged sends: rows a bulk loader outside the library (Spark's JDBC writer) put into a staging
table beside a queue, moved into the queue by one statement, in one transaction with the write
ledger.

The staging table is the bulk loader's, so every row it holds is one the library did not build:
the move takes one row per row key (a task the loader ran twice staged its rows twice) and casts
the id, so a malformed row fails the move and sends nothing. A stage whose write never ended (its
driver died) is dropped by the next :func:`create_stage` in its schema once it is
:data:`~..defaults.STAGE_STALE_AFTER` old.
"""

from __future__ import annotations

import time
import uuid
from typing import Protocol, runtime_checkable

from .. import defaults
from ..addressing import QueueAddress
from ..dialects import WHOLE_WRITE, Dialect
from ..errors import InvalidArgumentError, NotAQueueError, TransportMisconfiguredError
from ..logs import logger
from .ledger import record_write, recorded_parts
from .steps import Fetch, Operation, Step, autocommitted
from .tables import table_of, table_shape

log = logger("airflow_provider_sqlqueue.transport")

#: How the name of every staging table begins; the rest is its creation time (Unix seconds) and a random part.
STAGE_PREFIX = "sqlqueue_stage_"


@runtime_checkable
class StagesSends(Protocol):
    """A dialect whose queues take staged sends (PostgreSQL)."""

    def create_stage_sql(self, stage: QueueAddress) -> str:
        """CREATE the staging table (rowkey, id, headers, body, ttbr_ms)."""

    def stages_sql(self) -> str:
        """The staging tables of a schema: params ``schema``, ``prefix``."""

    def send_staged_sql(self, address: QueueAddress, stage: QueueAddress) -> str:
        """INSERT one row per row key of ``stage`` into the queue, in row-key order."""

    def drop_stage_sql(self, stage: QueueAddress) -> str:
        """DROP the staging table."""


def stages_sends(d: Dialect) -> StagesSends:
    """``d`` as a dialect with staged sends; a clear refusal for one without (SQL Server)."""
    if not isinstance(d, StagesSends):
        raise TransportMisconfiguredError(
            f"staged sends are built for PostgreSQL, not {d.name}: use the data source's Python path (engine 'python')"
        )
    return d


def _stage_born(name: str) -> float | None:
    """When a staging table was created, from its name (None: not a name :func:`create_stage` gives)."""
    stamp = name.removeprefix(STAGE_PREFIX).split("_", 1)[0]
    return float(stamp) if name.startswith(STAGE_PREFIX) and stamp.isdigit() else None


@autocommitted
def create_stage(d: Dialect, address: QueueAddress) -> Operation[QueueAddress]:
    """Create an empty staging table beside the queue, after dropping stale ones of its schema."""
    staging = stages_sends(d)
    yield from table_shape(d, address)
    schema = address.schema or d.default_schema
    now = time.time()
    found = yield Step(
        staging.stages_sql(), {"schema": schema, "prefix": STAGE_PREFIX}, Fetch.ALL, d.qualified_name(address)
    )
    for (name,) in found:
        born = _stage_born(name)
        if born is not None and now - born > defaults.STAGE_STALE_AFTER.total_seconds():
            stale = QueueAddress(name, schema)
            yield Step(staging.drop_stage_sql(stale), {}, Fetch.NONE, d.qualified_name(stale))
            log.warning("Dropped staging table %s, left by a write that never ended", d.qualified_name(stale))
    stage = QueueAddress(f"{STAGE_PREFIX}{int(now)}_{uuid.uuid4().hex[:12]}", schema)
    yield Step(staging.create_stage_sql(stage), {}, Fetch.NONE, d.qualified_name(stage))
    return stage


def _a_stage(d: Dialect, stage: QueueAddress) -> Operation[None]:
    if _stage_born(stage.table) is None:
        raise NotAQueueError(
            f"table {d.qualified_name(stage)} is not a staging table of a write (create_stage names them "
            f"{STAGE_PREFIX}...)"
        )
    yield from table_of(d, stage, "stage")


def send_staged(
    d: Dialect, address: QueueAddress, stage: QueueAddress, ledger: tuple[QueueAddress, uuid.UUID]
) -> Operation[int | None]:
    """Move the staged rows into the queue and drop the stage, in the caller's one transaction.

    The write is recorded in the ``ledger`` (table, write) first, as sent whole
    (:data:`~..dialects.base.WHOLE_WRITE`): None means it was sent before, and the stage is dropped with
    nothing sent. A write the ledger holds partitions of (sent in part by the data source's Python
    path) is refused: only that path knows which rows are missing.
    """
    staging = stages_sends(d)
    yield from table_shape(d, address)
    yield from _a_stage(d, stage)
    table, write = ledger
    parts = yield from recorded_parts(d, table, write)
    if parts and WHOLE_WRITE not in parts:
        raise InvalidArgumentError(
            f"write {write} was sent in part, partition by partition (the data source's Python path): which rows "
            "are missing is known only to that path, so repeat the write with engine 'python'"
        )
    sent: int | None = None
    if (yield from record_write(d, table, write, WHOLE_WRITE)):
        sent = int((yield Step(staging.send_staged_sql(address, stage), {}, Fetch.ROWCOUNT, d.qualified_name(address))))
    yield Step(staging.drop_stage_sql(stage), {}, Fetch.NONE, d.qualified_name(stage))
    d.forget_table(stage)
    return sent


@autocommitted
def drop_stage(d: Dialect, stage: QueueAddress) -> Operation[None]:
    """Drop a staging table (a write that failed): its rows were never sent."""
    staging = stages_sends(d)
    yield from _a_stage(d, stage)
    yield Step(staging.drop_stage_sql(stage), {}, Fetch.NONE, d.qualified_name(stage))
    d.forget_table(stage)
