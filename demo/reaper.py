"""Process groups this process started, killed however it ends.

The Airflow services and the Spark daemons each run in a session of their own, so that a kill
reaches everything they started (LocalExecutor task processes, executors). The same makes them
outlive this process: a demo or test run stopped by SIGTERM or SIGHUP (a CI timeout, a closed
terminal) or ended by an uncaught exception would leave them running, holding ports and memory.

So each group is registered here while it lives. :func:`interruptible` turns SIGTERM and SIGHUP
into ``KeyboardInterrupt``, which unwinds the stack through every ``finally`` and fixture teardown
(services are stopped gracefully there); at interpreter exit whatever group is still registered is
killed. Only a SIGKILL of this process itself escapes both: nothing runs after it.
"""

from __future__ import annotations

import atexit
import os
import signal
from types import FrameType

_groups: set[int] = set()


def track(pid: int) -> None:
    """Kill the process group led by ``pid`` when this process exits, unless :func:`forget` comes first."""
    _groups.add(pid)


def forget(pid: int) -> None:
    """The group led by ``pid`` was stopped by its owner."""
    _groups.discard(pid)


def kill_all() -> None:
    """SIGKILL every group still registered (already gone: nothing to do)."""
    while _groups:
        try:
            os.killpg(_groups.pop(), signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"stopped by {signal.Signals(signum).name}")


def interruptible() -> None:
    """Make SIGTERM and SIGHUP unwind this process as Ctrl-C does, so cleanup code runs."""
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _interrupt)


atexit.register(kill_all)
