"""What the loops that move messages did, counted for whatever metrics system the caller runs.

The core imports no metrics library: clients and the message pump report each event to their
:class:`Meter`, which does nothing unless it is replaced -- the Airflow provider's
:class:`~airflow_provider_sqlqueue.metrics.StatsMeter` sends them through Airflow's metrics.
Gauges say how things stand (:mod:`.health`); these say what happened, so a rate of failures or of
lost leases can be alerted on while the queue itself still looks fine.

Reports go through :class:`Reporter`, which never lets a meter's failure reach the code that moved
the messages: by the time an event is reported it has happened (a send committed, a message
deleted), and an exception then would make a caller retry a send or lose a received message.
"""

from __future__ import annotations

import math
from typing import Literal

from .addressing import QueueAddress
from .errors import ArgumentTypeError
from .logs import logger
from .operations.receive import Taken

log = logger("airflow_provider_sqlqueue.transport")

#: Each event, counted per message:
#: ``sent`` (send, publish, forward), ``received`` (receive, claim, take, a native receive, the pump),
#: ``handled`` (acknowledged, forwarded, or handled by a pump's handler), ``failed`` (given back by
#: nack, or a pump's handler raised), ``moved_to_error``, ``retried`` (sent back from an error queue),
#: ``leases_lost`` (a claim that could not be renewed or settled: someone else may have it),
#: ``moved_due`` (delayed messages moved into their queue).
Event = Literal["sent", "received", "handled", "failed", "moved_to_error", "retried", "leases_lost", "moved_due"]


class Meter:
    """Receives every event of a client or pump; this one discards them (the default).

    Called from whichever thread or task moved the messages (a client shared by threads calls it
    from all of them). What it raises is logged and otherwise ignored.
    """

    def count(self, event: Event, queue: QueueAddress, n: int) -> None:
        """``n`` messages of ``queue`` went through ``event`` (called only with n > 0)."""

    def handler_time(self, queue: QueueAddress, seconds: float) -> None:
        """A pump's handler took ``seconds`` on one message (or one batch, for a batch handler)."""


class Reporter:
    """Holds a client's or pump's :class:`Meter` and reports to it safely: checked when set, and
    whatever the meter raises logged (once per kind of failure), never passed on."""

    def __init__(self, meter: Meter | None = None) -> None:
        self.meter = Meter() if meter is None else meter
        self._said: set[str] = set()

    @property
    def meter(self) -> Meter:
        return self._meter

    @meter.setter
    def meter(self, meter: Meter) -> None:
        if not isinstance(meter, Meter):
            raise ArgumentTypeError(f"meter must be a transport.meter.Meter, got {type(meter).__name__}")
        self._meter = meter

    def count(self, event: Event, queue: QueueAddress, n: int) -> None:
        if n > 0:
            try:
                self._meter.count(event, queue, n)
            except Exception as exc:  # noqa: BLE001  # the messages moved: a metrics failure must not undo that
                self._failed(exc)

    def taken(self, queue: QueueAddress, taken: Taken) -> None:
        """Messages a receive, claim or take handed out, and those it moved to the error queue instead."""
        self.count("received", queue, len(taken))
        self.count("moved_to_error", queue, taken.moved_to_error)

    def settled(self, queue: QueueAddress, handled: int, failed: int) -> None:
        """Messages settled: handled (acknowledged, or committed), failed (given back, or rolled back)."""
        self.count("handled", queue, handled)
        self.count("failed", queue, failed)

    def handler_time(self, queue: QueueAddress, seconds: float) -> None:
        if math.isfinite(seconds) and seconds >= 0:
            try:
                self._meter.handler_time(queue, seconds)
            except Exception as exc:  # noqa: BLE001  # as in count
                self._failed(exc)

    def _failed(self, exc: Exception) -> None:
        kind = type(exc).__name__
        if kind not in self._said:
            self._said.add(kind)
            log.warning(
                "The meter %s failed (%s: %s); its events are not counted", type(self._meter).__name__, kind, exc
            )
