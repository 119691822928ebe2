"""The data source's streaming read.

:class:`QueueStreamReader` claims each micro-batch under a holder of its own (the claims of
:mod:`.read`), renewed from the driver while the batch runs and acknowledged once Spark committed
it. Its sink, ``batch_writer``, is in :mod:`.functions`.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

from ..transport import defaults
from ..transport.errors import SqlQueueError
from ..transport.logs import logger
from .options import Options
from .read import HeldShare, claim_for, holder_shares, read_share

if TYPE_CHECKING:
    from pyspark.sql.streaming.datasource import ReadLimit

#: The data source's one logger, whichever of its modules logs: its records keep the name logging
#: configurations know.
log = logger("airflow_provider_sqlqueue.spark")


class _Renewer:
    """Renews the claims of the batches a query has planned but not committed, every third of the
    lease, from a thread of the driver-side source: a micro-batch may take longer than one lease."""

    def __init__(self, options: Options) -> None:
        self.options = options
        self.holders: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def hold(self, holder: str) -> None:
        with self._lock:
            self.holders.add(holder)
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="sqlqueue-spark-lease", daemon=True)
            self._thread.start()

    def drop(self, holder: str) -> None:
        with self._lock:
            self.holders.discard(holder)

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        interval = defaults.renewal_interval(self.options.lease)
        while not self._stop.wait(interval):
            with self._lock:
                holders = sorted(self.holders)
            if not holders:
                continue
            try:
                with self.options.connect() as client:
                    for holder in holders:
                        renewed = client.extend_held(self.options.queue, holder, self.options.lease)
                        log.debug("Renewed %d claims of %s", renewed, holder)
            except SqlQueueError as exc:  # an outage: the next renewal tries again
                log.warning("Could not renew the claims of batches %s: %s", holders, exc)


class QueueStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """A streaming read: each micro-batch is the messages claimed under its own holder.

    The offset is ``{"consumer": id, "batch": n}``: the consumer id is drawn when a query starts
    without a checkpoint and lives on in its offsets, so a restarted query finds its claims again.
    Batch n's claims are held by ``spark:<consumer>:<n>``.

    Batches are sized by Spark's admission control: ``maxMessagesPerBatch`` is the source's default
    read limit (``ReadMaxRows``), and a smaller limit Spark passes wins.
    """

    def __init__(self, options: Options) -> None:
        self.options = options
        with options.connect() as client:
            options.check(client, claims=True)
        self.renewer = _Renewer(options)
        #: Under Trigger.AvailableNow, how many messages the query may still claim (None: no bound).
        self.available: int | None = None
        #: Batches whose claims :meth:`latestOffset` took (or renewed) in this run of the query: their
        #: leases are fresh, so planning them renews nothing; a batch replayed after a restart is not here.
        self.fresh: set[str] = set()

    def __getstate__(self) -> dict[str, Any]:
        """What a task needs: the options (Spark ships the reader to executors for :meth:`read`)."""
        return {"options": self.options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["options"])  # type: ignore[misc]

    @staticmethod
    def holder(offset: Mapping[str, Any], batch: int | None = None) -> str:
        return f"spark:{offset['consumer']}:{offset['batch'] if batch is None else batch}"

    def initialOffset(self) -> dict[str, Any]:
        return {"consumer": uuid.uuid4().hex, "batch": 0}

    def getDefaultReadLimit(self) -> ReadLimit:
        """``maxMessagesPerBatch`` as Spark's admission control knows a limit: it may pass a smaller one."""
        from pyspark.sql.streaming.datasource import ReadMaxRows

        return ReadMaxRows(self.options.max_messages_per_batch)

    def prepareForTriggerAvailableNow(self) -> None:
        """Trigger.AvailableNow: the query reads what waits now, then ends.

        Offsets here are batch numbers, not places in the queue, so "what waits now" is a count:
        the messages waiting when the query starts, which later batches claim oldest first, each
        at most what remains of the count. The query ends even while senders keep the queue full;
        with competing consumers taking some of those messages it reads as many newer ones instead.
        """
        with self.options.connect() as client:
            self.available = client.depth(self.options.queue)
        log.info("Trigger.AvailableNow: reading the %d messages waiting in %s", self.available, self.options.queue)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        """Claim the next batch; ``start`` as it is when nothing waits.

        Spark asks for a batch after ``start`` only once the batch ending at ``start`` has been
        committed by the sink, so its claims, if a commit did not already settle them (a query that
        stopped between the two), are acknowledged here first.
        """
        from pyspark.sql.streaming.datasource import ReadMaxRows

        wanted = self.options.max_messages_per_batch  # Spark's ReadAllAvailable: still one bounded claim
        if isinstance(limit, ReadMaxRows):
            wanted = min(wanted, limit.max_rows)
        if self.available is not None:
            wanted = min(wanted, self.available)
        batch = int(start["batch"]) + 1
        holder = self.holder(start, batch)
        with self.options.connect() as client:
            settled = client.ack_held(self.options.queue, self.holder(start))
            if settled:
                log.info("Acknowledged %d messages of committed batch %s", settled, self.holder(start))
            self.renewer.drop(self.holder(start))
            # With nothing left to claim this still finds claims an earlier attempt at this batch took.
            held = claim_for(client, self.options, holder, wanted)
        if self.available is not None:
            self.available = max(0, self.available - held)
        if not held:
            return start
        self.fresh.add(holder)
        self.renewer.hold(holder)
        log.info("Batch %s holds %d messages of %s", holder, held, self.options.queue)
        return {"consumer": start["consumer"], "batch": batch}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        shares: list[InputPartition] = []
        with self.options.connect() as client:
            for batch in range(int(start["batch"]) + 1, int(end["batch"]) + 1):
                holder = self.holder(end, batch)
                # A replayed batch (a restarted query): its claims are renewed before they are read.
                # Those latestOffset has just claimed or renewed are not: renewing every one of them
                # again was an UPDATE of the whole batch, most of a small batch's time in the database.
                if holder not in self.fresh:
                    client.extend_held(self.options.queue, holder, self.options.lease)
                self.fresh.discard(holder)
                self.renewer.hold(holder)
                shares.extend(holder_shares(holder, self.options.partitions))
        return shares

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, HeldShare)  # noqa: S101  # narrows a type Spark's interface erases
        return read_share(self.options, partition)

    def commit(self, end: dict[str, Any]) -> None:
        holder = self.holder(end)
        with self.options.connect() as client:
            settled = client.ack_held(self.options.queue, holder)
        self.renewer.drop(holder)
        log.info("Acknowledged %d messages of committed batch %s", settled, holder)

    def stop(self) -> None:
        """Claims of a batch that did not commit stay held until their lease ends: a restart within
        it replays them as they were, and after it they are delivered again."""
        self.renewer.stop()
