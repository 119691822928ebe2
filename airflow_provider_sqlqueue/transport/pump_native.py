"""The ``native`` transaction mode's receives: the handler runs inside the transaction that receives.

Its writes on the receiving connection commit with the receive, or roll back with it and leave the
message queued. A rollback leaves no trace in the table, so failures are counted here, per message
id (:class:`FailureCounter`), and a message that failed ``max_deliveries`` times is moved to the
error queue in the next transaction that receives it. The pump (:mod:`.pump`) runs these receives
at its concurrency and backs off when one fails.
"""

from __future__ import annotations

import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, Protocol

from . import defaults
from . import operations as ops
from .addressing import QueueAddress
from .dialects import Dialect
from .drivers import Session, SessionPool
from .errors import TransactionAbortedError
from .logs import logger
from .message import ReceivedMessage, error_text, storable_text
from .meter import Reporter
from .pump_checks import SETUP_ERRORS, handler_failure
from .tracing import processing

log = logger("airflow_provider_sqlqueue.pump")  # the pump's own: these are the pump's receives

#: Handler of a whole batch in ``native`` mode: the messages and the connection of the one
#: transaction that received them all. Raising rolls the batch back: every message stays queued.
BatchHandler = Callable[[list[ReceivedMessage], Any], Awaitable[None]]


class FailureCounter:
    """Counts handler failures per message id in ``native`` mode, where a rollback leaves no trace in the table.

    Bounded (oldest entries forgotten first) so a stream of failures cannot grow memory without
    limit; as in NServiceBus, counts are per process.
    """

    def __init__(self, capacity: int = defaults.FAILURE_MEMORY) -> None:
        self._counts: OrderedDict[Any, tuple[int, BaseException]] = OrderedDict()
        self._capacity = capacity

    def record(self, message_id: Any, exc: BaseException) -> int:
        count = self._counts.pop(message_id, (0, exc))[0] + 1
        self._counts[message_id] = (count, exc)
        while len(self._counts) > self._capacity:
            self._counts.popitem(last=False)
        return count

    def get(self, message_id: Any) -> tuple[int, BaseException | None]:
        return self._counts.get(message_id, (0, None))

    def forget(self, message_id: Any) -> None:
        self._counts.pop(message_id, None)


def aborted(session: Session) -> TransactionAbortedError | None:
    """The failure of a native handler that returned normally from a transaction that is no longer
    whole: an error aborted it (the handler caught a database error), or the handler ended it with
    COMMIT or ROLLBACK. The pump cannot commit the receive with the work, so the delivery failed."""
    failure = session.transaction_failure()
    return None if failure is None else TransactionAbortedError(f"the handler returned normally, but {failure}")


class NativePump(Protocol):
    """What the receives use of their pump (:class:`~.pump.MessagePump`): its settings, its
    failure counts and its tallies of messages handled and failed, read and written as they are."""

    handled: int
    failed: int

    @property
    def pool(self) -> SessionPool: ...

    @property
    def dialect(self) -> Dialect: ...

    @property
    def queue(self) -> QueueAddress: ...

    @property
    def error_queue(self) -> QueueAddress: ...

    @property
    def audit_queue(self) -> QueueAddress | None: ...

    @property
    def max_deliveries(self) -> int: ...

    @property
    def name(self) -> str: ...

    @property
    def failures(self) -> FailureCounter: ...


class NativeReceiver:
    """The receives of a ``native`` pump: one message, or one batch for a batch handler, per transaction.

    ``handle`` runs the pump's handler on one message (counting it handled or failed, as the pump
    counts every handler's outcome); ``note_ttbr`` lets the pump warn of a time-to-be-received
    shorter than its peek interval.
    """

    def __init__(
        self,
        pump: NativePump,
        reporter: Reporter,
        handle: Callable[[ReceivedMessage, Any], Awaitable[BaseException | None]],
        note_ttbr: Callable[[ReceivedMessage], None],
    ) -> None:
        self.pump = pump
        self._reporter = reporter
        self._handle = handle
        self._note_ttbr = note_ttbr
        #: Receives left that take one message at a time, after a batch handler failed on a batch.
        self._isolating = 0

    async def receive(self) -> bool:
        """Receive one message and run the handler on it in one transaction; False when none came."""
        pump = self.pump
        outcome: BaseException | None = None
        message: ReceivedMessage | None = None
        handled = False  # the handler ran and returned normally: counted as handled, until the commit says otherwise
        moved = 0  # moved to the error queue in this transaction: counted once it commits
        try:
            async with pump.pool.session() as session:
                try:
                    async with session.transaction(begun_by_first_statement=True):
                        received = await ops.drive(
                            ops.receive(pump.dialect, pump.queue, pump.error_queue, 1), session.execute
                        )
                        self._reporter.count("received", pump.queue, len(received))
                        moved = received.moved_to_error
                        if not received:
                            return False
                        message = received[0]
                        if await self._dead_letter_if_exhausted(session, message):
                            pump.failures.forget(message.id)
                            moved += 1
                            return True
                        started = datetime.now(UTC)
                        outcome = await self._handle(message, session.connection)
                        if outcome is None and (outcome := aborted(session)) is not None:
                            pump.handled, pump.failed = pump.handled - 1, pump.failed + 1
                            log.warning("Queue %s: message %s: %s", pump.name, message.id, outcome)
                        handled = outcome is None
                        if outcome is not None:
                            raise _Rollback
                        await self._audit_in(session, [message], {message.id: started})
                except _Rollback:
                    moved = 0
        except SETUP_ERRORS:
            moved = 0
            raise
        except Exception as exc:  # the handler had the message, yet its transaction did not commit
            moved = 0
            if message is None or not handled:
                raise
            pump.handled -= 1
            if not self._not_committed([message], exc):
                raise
            return True  # the handler's work could not commit: a failed delivery, not an outage
        finally:  # also after a return inside the transaction, once it committed
            self._reporter.count("moved_to_error", pump.queue, moved)
        if message is not None:
            if outcome is None:
                pump.failures.forget(message.id)
                self._reporter.settled(pump.queue, 1, 0)
            else:
                pump.failures.record(message.id, outcome)
                self._reporter.settled(pump.queue, 0, 1)
        return True

    async def receive_batch(self, wanted: int, batch_handler: BatchHandler) -> int:
        """Receive up to ``wanted`` messages and run ``batch_handler`` on them in one transaction.

        The batch commits or rolls back whole: the handler's writes and the receive of every
        message. A failed batch of several messages says nothing of which one is at fault, so
        its messages come back one at a time (they are the oldest in the queue): the good ones
        pass alone, and only a message failing on its own counts towards ``max_deliveries``,
        after which it is moved to the error queue instead of being handed out again.
        """
        pump = self.pump
        if self._isolating:
            wanted = 1
        received = ops.Taken()
        batch: list[ReceivedMessage] = []
        outcome: BaseException | None = None
        handled = False  # the batch handler returned normally, its transaction still whole
        moved = 0  # moved to the error queue in this transaction: counted once it commits
        try:
            async with pump.pool.session() as session:
                try:
                    async with session.transaction(begun_by_first_statement=True):
                        received = await ops.drive(
                            ops.receive(pump.dialect, pump.queue, pump.error_queue, wanted), session.execute
                        )
                        self._reporter.count("received", pump.queue, len(received))
                        moved = received.moved_to_error
                        for message in received:
                            if await self._dead_letter_if_exhausted(session, message):
                                moved += 1
                            else:
                                batch.append(message)
                        if batch:
                            for message in batch:
                                self._note_ttbr(message)
                            started = datetime.now(UTC)
                            try:
                                with processing(
                                    lambda: pump.dialect.format_address(pump.queue), batch, database=pump.dialect.name
                                ):
                                    await batch_handler(batch, session.connection)
                            except BaseException as exc:  # the batch's failure rolls it back; the pump goes on
                                handler_failure(exc)
                                outcome = exc
                                raise _Rollback from exc
                            finally:
                                self._reporter.handler_time(pump.queue, (datetime.now(UTC) - started).total_seconds())
                            outcome = aborted(session)
                            handled = outcome is None
                            if outcome is not None:
                                raise _Rollback
                            await self._audit_in(session, batch, dict.fromkeys((m.id for m in batch), started))
                except _Rollback:
                    moved = 0
        except SETUP_ERRORS:
            raise
        except Exception as exc:  # the handler had the batch, yet its transaction did not commit
            if not handled or not self._not_committed(batch, exc):
                raise
            return len(received)  # the handler's work could not commit: a failed delivery, not an outage
        self._reporter.count("moved_to_error", pump.queue, moved)
        if self._isolating:
            self._isolating -= 1
        self._reporter.settled(pump.queue, *((len(batch), 0) if outcome is None else (0, len(batch))))
        if outcome is None:
            pump.handled += len(batch)
            for message in received:  # handled, or moved to the error queue: either way done
                pump.failures.forget(message.id)
        else:
            pump.failed += len(batch)
            log.warning(
                "Queue %s: batch handler failed for %d message(s): %s: %s",
                pump.name,
                len(batch),
                type(outcome).__name__,
                storable_text(error_text(outcome), defaults.MAX_FAILURE_TEXT),
            )
            if len(batch) > 1:
                self._isolating = len(batch)  # the next receives take these messages one by one
            else:
                for message in batch:
                    pump.failures.record(message.id, outcome)
        return len(received)

    def _not_committed(self, messages: list[ReceivedMessage], exc: Exception) -> bool:
        """Native mode: the handler had ``messages`` and returned normally, but their transaction did not
        commit -- the server ended the session under it (a handler slower than
        ``idle_in_transaction_session_timeout``, a restart) or the commit failed. Nothing it did was
        kept, so it is a failed delivery, counted as a raising handler's is: a message whose handling
        always outlasts the session reaches the error queue after ``max_deliveries`` instead of
        coming back for ever. Several messages are then received one at a time, as after a failed batch.

        True when the failure is the work's own (:class:`TransactionAbortedError`: it could not
        commit), which the loop goes on from; False when the database failed, which it backs off from."""
        pump = self.pump
        pump.failed += len(messages)
        self._reporter.settled(pump.queue, 0, len(messages))
        log.warning(
            "Queue %s: the transaction of %d handled message(s) did not commit, so they count as failed: %s",
            pump.name,
            len(messages),
            storable_text(error_text(exc), defaults.MAX_FAILURE_TEXT),
        )
        if len(messages) > 1:
            self._isolating = len(messages)
        else:
            for message in messages:
                pump.failures.record(message.id, exc)
        return isinstance(exc, TransactionAbortedError)

    async def _dead_letter_if_exhausted(self, session: Session, message: ReceivedMessage) -> bool:
        """In a native receive transaction: move a message that failed ``max_deliveries`` times to the error
        queue (with its last failure) instead of handing it out again; whether it was moved (the caller
        counts it once the transaction commits: a rolled-back move is made again, and counted then)."""
        pump = self.pump
        count, last_error = pump.failures.get(message.id)
        if count < pump.max_deliveries:
            return False
        log.error(
            "Queue %s: message %s failed %d times; moving it to %s",
            pump.name,
            message.id,
            count,
            pump.dialect.qualified_name(pump.error_queue),
        )
        await ops.drive(
            ops.move_to_error(pump.dialect, pump.queue, pump.error_queue, message, last_error), session.execute
        )
        return True

    async def _audit_in(
        self, session: Session, messages: list[ReceivedMessage], started: dict[uuid.UUID, datetime]
    ) -> None:
        """In a native receive transaction: the audit copies of the messages just handled, committed with it."""
        pump = self.pump
        if pump.audit_queue is not None:
            await ops.drive(ops.audit(pump.dialect, pump.queue, pump.audit_queue, messages, started), session.execute)


class _Rollback(Exception):  # noqa: N818  # a signal to roll back, not an error
    """Raised inside the receive transaction to roll it back after a handler failure."""
