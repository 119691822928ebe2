"""The health of queues and of their database: what an operator alerts on, judged once for every place that shows it.

Queues rarely fail by crashing. They age: every message consumed leaves a dead row, and one long
transaction anywhere in the database holds back vacuum for every queue; a delayed-message mover
that stopped leaves due messages where no receiver sees them; a handler that keeps failing fills
the error queue; a consumer that died holding claims leaves them to lapse. :func:`problems` turns
the figures (:class:`~.operations.QueueStats`, :class:`~.operations.Horizon`) into those findings,
with the thresholds of :mod:`.defaults`, so ``sqlqueue health``, the Queues page and the metrics
agree on what is wrong.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from . import defaults
from .addressing import QueueAddress
from .message import shown_time
from .operations.inspection import Horizon, QueueStats

#: What a finding is about, as metrics tag it and the page sorts it.
Concern = Literal["horizon", "lapsed", "overdue", "dead_rows", "failed", "unreadable"]


@dataclass(frozen=True)
class Problem:
    """One finding: its concern, the queue it is about (None: the whole database) and what to do."""

    concern: Concern
    queue: QueueAddress | None
    message: str


@dataclass(frozen=True)
class Health:
    """Figures of some queues and of their database, taken at ``checked_at``, and what is wrong with them."""

    queues: list[QueueStats]
    horizon: Horizon | None  #: None where the database keeps no such horizon (SQL Server)
    checked_at: datetime
    problems: list[Problem]


def _ago(span: timedelta) -> str:
    seconds = int(span.total_seconds())
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h"


def horizon_problem(horizon: Horizon | None, now: datetime) -> Problem | None:
    """The oldest holder of the xmin horizon, when it has held it longer than ``defaults.HORIZON_WARNING``."""
    oldest = None if horizon is None else horizon.oldest
    if oldest is None:
        return None
    held = oldest.held_for(now)
    if held is not None and held < defaults.HORIZON_WARNING:
        return None
    if held is None and (oldest.xid_age or 0) < defaults.HORIZON_WARNING_XIDS:
        return None  # a replication slot: judged by how many transactions it holds back
    since = f"for {_ago(held)}" if held is not None else f"{oldest.xid_age:,} transactions back"
    return Problem(
        "horizon",
        None,
        f"{oldest.holder} ({oldest.application or 'no application name'}, {oldest.state}) has held the xmin "
        f"horizon {since}: vacuum removes no dead row of any queue meanwhile, and receives slow down; "
        "end that transaction (pg_terminate_backend, or COMMIT/ROLLBACK PREPARED, or drop the slot)",
    )


def queue_problems(stats: QueueStats, *, is_error_queue: bool, named: Callable[[QueueAddress], str]) -> list[Problem]:
    """What is wrong with one queue, judged by its figures alone. Where a command or the Queues page
    can set it right, the finding names both, the queue written (``named``: its address as the
    commands take it) so the command can be pasted into a shell as it stands."""
    found: list[Problem] = []
    queue = stats.queue
    shell = shlex.quote(named(queue))
    if stats.lapsed:
        found.append(
            Problem(
                "lapsed",
                queue,
                f"{stats.lapsed:,} claim(s) lapsed: their holders died or stalled; receivers in claim mode take "
                f"them again; to give them back to every receiver now, run `sqlqueue release-lapsed {shell}` or "
                "press Give back on the Queues page (release_lapsed)",
            )
        )
    if stats.due_delayed and stats.overdue is not None and stats.overdue >= defaults.OVERDUE_WARNING:
        found.append(
            Problem(
                "overdue",
                queue,
                f"{stats.due_delayed:,} delayed message(s) due for {_ago(stats.overdue)} and not moved: no mover "
                "runs for this queue (a MessagePump or its NServiceBus endpoint); to move them now, run "
                f"`sqlqueue move-due {shell}` or press Move due on the Queues page (move_due)",
            )
        )
    if stats.dead_rows is not None and stats.dead_rows >= defaults.DEAD_ROWS_WARNING:
        vacuumed = "never vacuumed" if stats.last_vacuum is None else f"last vacuumed {shown_time(stats.last_vacuum)}"
        found.append(
            Problem(
                "dead_rows",
                queue,
                f"{stats.dead_rows:,} dead rows ({vacuumed}): is autovacuum on, and does a long transaction hold "
                "the xmin horizon?",
            )
        )
    if is_error_queue and stats.waiting:
        found.append(
            Problem(
                "failed",
                queue,
                f"about {stats.waiting:,} failed message(s) wait in this error queue: see them with "
                f"`sqlqueue errors --error-queue {shell}` and send them back with `sqlqueue retry --error-queue "
                f"{shell}`, or press Show and Retry in the Queues page's error panel",
            )
        )
    return found


def problems(
    stats: list[QueueStats],
    horizon: Horizon | None,
    error_queues: set[QueueAddress],
    now: datetime,
    named: Callable[[QueueAddress], str],
) -> list[Problem]:
    """Every finding: the database's first, then each queue's, in the order the queues were given."""
    found = [p for p in [horizon_problem(horizon, now)] if p is not None]
    for figures in stats:
        found += queue_problems(figures, is_error_queue=figures.queue in error_queues, named=named)
    return found


def nothing_read(unreadable: tuple[int, int] | None) -> Problem:
    """A survey of every queue that found none it may read: never "no problems", since nothing was
    looked at. ``unreadable``: the queue tables the role may not read and how many of those lie in
    schemas it may not use (None: the database hides them from it, as SQL Server does)."""
    grants = "grant the role what `sqlqueue grants` prints"
    if unreadable is None:
        why = (
            "none exists in this database, or the login lacks the rights to see them (SQL Server lists only "
            f"tables a login may use: it needs SELECT on the queue tables); {grants}"
        )
    elif unreadable[0] == 0:
        why = "there is no queue table in this database: is it the one the queues are in?"
    else:
        schemas = f", and USAGE on the schemas of {unreadable[1]:,} of them" if unreadable[1] else ""
        why = (
            f"{unreadable[0]:,} queue table(s) exist that it lacks SELECT on{schemas}; {grants} (USAGE on each "
            "schema, SELECT on the queue tables and on the schema's sqlqueue_inflight)"
        )
    return Problem("unreadable", None, f"this role could read no queue, so no queue was looked at: {why}")
