"""What the message pump checks: its settings, what a handler raised, which errors are the setup's.

:func:`check_peek_interval` warns of a peek interval outside the recommended range or longer than
the queue's time-to-be-received (read from a message's header with :func:`parse_timespan`);
:func:`handler_failure` decides whether what a handler raised fails the delivery or stops the
pump; :data:`SETUP_ERRORS` are the failures no retry can fix until the setup is.
"""

from __future__ import annotations

import asyncio
import re
from datetime import timedelta

from . import defaults
from .errors import NotAQueueError, PermissionDeniedError, QueueNotFoundError, TransportMisconfiguredError

_TIMESPAN = re.compile(r"^(?:(\d+)\.)?(\d+):(\d+):(\d+)(?:\.(\d+))?$")


def parse_timespan(text: str) -> timedelta | None:
    """Parse a .NET TimeSpan header (``[d.]hh:mm:ss[.fffffff]``); None if it is not one."""
    match = _TIMESPAN.match(text.strip())
    if not match:
        return None
    days, hours, minutes, seconds, fraction = match.groups()
    micros = int((fraction or "0")[:6].ljust(6, "0"))
    return timedelta(
        days=int(days or 0), hours=int(hours), minutes=int(minutes), seconds=int(seconds), microseconds=micros
    )


def check_peek_interval(peek_interval: float, smallest_ttbr: timedelta | None = None) -> list[str]:
    """Warnings the recommended range and the queue's TTBR call for (also logged by the pump)."""
    warnings = []
    if peek_interval < defaults.MIN_RECOMMENDED_PEEK_INTERVAL:
        warnings.append(
            f"peek_interval {peek_interval}s is below {defaults.MIN_RECOMMENDED_PEEK_INTERVAL}s: idle consumers will put "
            "unnecessary load on the database"
        )
    if peek_interval > defaults.MAX_RECOMMENDED_PEEK_INTERVAL:
        warnings.append(
            f"peek_interval {peek_interval}s is above {defaults.MAX_RECOMMENDED_PEEK_INTERVAL}s: messages may back up in the queue"
        )
    if smallest_ttbr is not None and peek_interval > smallest_ttbr.total_seconds():
        warnings.append(
            f"peek_interval {peek_interval}s is longer than the queue's time-to-be-received {smallest_ttbr}: "
            "messages may expire before they are peeked"
        )
    return warnings


def handler_failure(exc: BaseException) -> None:
    """Decide whether what a handler raised is its failure (the message's business) or the process's.

    A ``CancelledError`` the handler raised itself (a cancelled inner wait) and any other exception
    fail the delivery like any error; a cancellation of the pump's own task, ``KeyboardInterrupt``,
    ``SystemExit`` and ``GeneratorExit`` are re-raised: they stop the pump, and the message stays as
    the mode leaves it (back to the queue in ``native``, its claim lapsing in ``claim``).
    """
    if isinstance(exc, (KeyboardInterrupt, SystemExit, GeneratorExit)):
        raise exc
    if isinstance(exc, asyncio.CancelledError):
        task = asyncio.current_task()
        cancelling = getattr(task, "cancelling", None)  # Python 3.11+: whether this task was cancelled
        if task is None or cancelling is None or cancelling():
            raise exc


#: Errors that say the setup is wrong, not the message: a native delivery they interrupt is not
#: counted against the message (retrying cannot help until the setup is fixed; the pump backs off).
SETUP_ERRORS = (TransportMisconfiguredError, PermissionDeniedError, QueueNotFoundError, NotAQueueError)
