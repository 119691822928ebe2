"""What the loops that move messages did, counted for whatever metrics system the caller runs.

The core imports no metrics library: clients and the message pump report each event to their
:class:`Meter`, which does nothing unless it is replaced -- the Airflow provider's
:class:`~airflow_provider_sqlqueue.metrics.StatsMeter` sends them through Airflow's metrics.
Gauges say how things stand (:mod:`.health`); these say what happened, so a rate of failures or of
lost leases can be alerted on while the queue itself still looks fine.
"""

from __future__ import annotations

from typing import Literal

from .addressing import QueueAddress

#: Each event, counted per message:
#: ``sent`` (send, publish, forward), ``received`` (receive, claim, take, a native receive, the pump),
#: ``handled`` (acknowledged, forwarded, or handled by a pump's handler), ``failed`` (given back by
#: nack, or a pump's handler raised), ``moved_to_error``, ``retried`` (sent back from an error queue),
#: ``leases_lost`` (a claim that could not be renewed or settled: someone else may have it),
#: ``moved_due`` (delayed messages moved into their queue).
Event = Literal["sent", "received", "handled", "failed", "moved_to_error", "retried", "leases_lost", "moved_due"]


class Meter:
    """Receives every event of a client or pump; this one discards them (the default)."""

    def count(self, event: Event, queue: QueueAddress, n: int) -> None:
        """``n`` messages of ``queue`` went through ``event`` (called only with n > 0)."""

    def handler_time(self, queue: QueueAddress, seconds: float) -> None:
        """A pump's handler took ``seconds`` on one message (or one batch, for a batch handler)."""
