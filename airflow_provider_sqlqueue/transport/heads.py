"""Where a queue's live messages start, so that finding them does not cost more as a database ages.

Every message a consumer takes leaves a dead row version in the queue table (and, in ``claim``
mode, another in the claim store). Vacuum removes them only once no transaction can still see
them; while anything holds the xmin horizon back -- a long report, ``pg_dump``, a session idle in
a transaction, a replica with ``hot_standby_feedback`` -- they stay, and an index scan for the
head of the queue visits every one of them before it reaches a live row. A receive that cost one
index probe then costs one per message consumed since the horizon stopped, until consumers fall
behind.

So each session remembers, per queue, its *mark*: the highest ``Seq`` it has taken. Receives and
peeks start after the mark, where the live rows are. Rows can still appear below it -- a sender
whose transaction committed after a newer message was taken, a receive that rolled back -- so
the scan goes back over what it skipped, on a bounded schedule:

- every :data:`~.defaults.HEAD_RECENT_RESCAN`, from the mark as it was
  :data:`~.defaults.HEAD_RECENT_WINDOW` earlier (late commits of concurrent senders: a short walk);
- every :data:`~.defaults.HEAD_FULL_RESCAN`, from the start (anything else);
- at once after a rollback of a transaction that had taken rows (the mark goes back below them).

A message is never skipped for good: at worst it waits one full rescan longer.

Looks by time walk dead rows the same way: lapsed claims are found through the claim store's
(Queue, LeaseUntil) index, whose entries for claims settled since the horizon stopped come into
the range ``LeaseUntil <= now`` as their leases would have ended; due delayed messages through
the delayed table's Due index, whose entries for messages already moved stay in ``Due < now``.
So such a look covers only what came due since the same kind of look last ran on this session
(with :data:`~.defaults.HEAD_RECENT_RESCAN` to spare), and everything every
:data:`~.defaults.HEAD_FULL_RESCAN`, or at once after a look that filled its batch (more may be
waiting).
"""

from __future__ import annotations

import time
from collections import deque

from . import defaults


class Head:
    """A session's knowledge of where a queue's live rows start (sessions of one pool share it)."""

    def __init__(self) -> None:
        #: The highest Seq taken (0: none yet).
        self.mark = 0
        #: (monotonic time, mark) now and then, to find the mark as it was a while ago.
        self._history: deque[tuple[float, int]] = deque()
        #: (monotonic time, lowest Seq) of each take: what a rollback of a transaction begun at a
        #: given time may have put back (any session's takes since then: a safe over-estimate).
        self._takes: deque[tuple[float, int]] = deque()
        #: Where the scan under way started (0: from the start).
        self._scan_from = 0
        self._full_due = 0.0
        self._recent_due = 0.0
        #: For each kind of look by time (a reclaim, a peek's count of lapsed claims, a move of due
        #: messages): when it last ran, and when it next looks at everything.
        self._looks: dict[str, tuple[float, float]] = {}

    def start(self) -> int:
        """Where the next scan for live rows starts (it reads rows with a Seq above this)."""
        now = time.monotonic()
        if now >= self._full_due:
            self._full_due = now + defaults.HEAD_FULL_RESCAN
            self._recent_due = now + defaults.HEAD_RECENT_RESCAN
            self._scan_from = 0
        elif now >= self._recent_due:
            self._recent_due = now + defaults.HEAD_RECENT_RESCAN
            self._scan_from = min(self._mark_at(now - defaults.HEAD_RECENT_WINDOW), self.mark)
        else:
            self._scan_from = self.mark
        return self._scan_from

    def _mark_at(self, moment: float) -> int:
        """The mark as it was at ``moment`` (0 when this head is younger than that)."""
        found = 0
        for at, mark in self._history:
            if at > moment:
                break
            found = mark
        return found

    def taken(self, seqs: list[int]) -> None:
        """Rows at ``seqs`` were taken (deleted) by the scan :meth:`start` began."""
        if not seqs:
            return
        now = time.monotonic()
        if self._scan_from == 0 and max(seqs) < self.mark:
            # A scan from the start found nothing as high as the mark: rows left behind, or a queue
            # dropped and made again (its Seq counts from 1 anew). Either way the mark was too high.
            self.mark = max(seqs)
        self.mark = max(self.mark, max(seqs))
        self._takes.append((now, min(seqs)))
        while self._takes and self._takes[0][0] < now - defaults.HEAD_FULL_RESCAN:
            self._takes.popleft()
        if not self._history or now - self._history[-1][0] >= defaults.HEAD_RECENT_RESCAN / 2:
            self._history.append((now, self.mark))
        # Keep the newest entry older than the window too: after an idle spell it is the mark of then.
        while len(self._history) > 1 and self._history[1][0] < now - 2 * defaults.HEAD_RECENT_WINDOW:
            self._history.popleft()

    def seen(self, seq: int | None) -> None:
        """A scan found a live row at ``seq``: a later scan must not start above it."""
        if seq is not None and seq <= self.mark:
            self.mark = seq - 1

    def rolled_back(self, since: float) -> None:
        """A transaction (or a block inside one) begun at ``since`` rolled back: what was taken since
        is waiting again, below the mark."""
        lows = [low for at, low in self._takes if at >= since]
        if lows:
            self.mark = min(self.mark, min(lows) - 1)

    def look_back_ms(self, look: str) -> int:
        """How far back from now a look of kind ``look`` reaches, in milliseconds (:data:`EVERYTHING_MS`:
        all of it)."""
        now = time.monotonic()
        last, full_due = self._looks.get(look, (0.0, 0.0))
        if now >= full_due:
            self._looks[look] = (now, now + defaults.HEAD_FULL_RESCAN)
            return EVERYTHING_MS
        self._looks[look] = (now, full_due)
        return round((now - last + defaults.HEAD_RECENT_RESCAN) * 1000)

    def look_again(self, look: str) -> None:
        """A look filled its batch: more may wait, so the next look of its kind reaches back all the way."""
        self._looks.pop(look, None)


#: A look back that reaches every lease and every due time there can be: a century, in milliseconds.
EVERYTHING_MS = 100 * 366 * 86_400_000
