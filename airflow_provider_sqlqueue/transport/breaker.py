"""The circuit breaker every loop shares (pump, shared pollers, triggers): back off, then raise the alarm.

A loop that meets a database error waits before trying again, twice as long after each further
failure up to a ceiling, so a database that is down is not hammered by every consumer at once;
once errors have lasted ``alarm_after`` seconds they are logged as errors, not warnings.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from .logs import logger

log = logger("airflow_provider_sqlqueue.pump")


@dataclass
class CircuitBreaker:
    """Backs off after database errors instead of spinning, and raises the alarm if they persist."""

    base_delay: float
    max_backoff: float
    alarm_after: float
    failures: int = 0
    failing_since: float | None = None

    def success(self) -> None:
        if self.failures:
            log.info("Database reachable again after %d failed attempt(s); resuming", self.failures)
        self.failures = 0
        self.failing_since = None

    def failure(self, exc: BaseException, queue: str) -> float:
        """Record a failure and return how long to wait before the next attempt."""
        now = time.monotonic()
        if self.failing_since is None:
            self.failing_since = now
        self.failures += 1
        delay = min(self.max_backoff, self.base_delay * float(2 ** min(self.failures - 1, 16)))
        failing_for = now - self.failing_since
        level = logging.ERROR if failing_for >= self.alarm_after else logging.WARNING
        log.log(
            level,
            "Queue %s: database error (%s: %s); attempt %d failed, %.0fs since the first; retrying in %.1fs",
            queue,
            type(exc).__name__,
            exc,
            self.failures,
            failing_for,
            delay,
        )
        return delay
