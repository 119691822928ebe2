"""The message pump: the peek/receive loop of NServiceBus's SQL transports, on asyncio.

The pump starts in *peek* mode: one cheap query estimates how many messages wait. When some do,
it switches to *receive* mode and runs up to ``max_concurrency`` receives at once, each handing
one message to the handler, for at most ``peek_batch_size`` messages. As soon as a receive finds
nothing (another consumer got there first) it stops starting receives and, once those in flight
are done, peeks again -- at once if the last peek found messages, after ``peek_interval`` if not.

Database errors never crash the loop: a circuit breaker logs, backs off exponentially (up to
``max_backoff``) and keeps retrying; after ``breaker_alarm`` of continuous failure it logs an error
every time it retries so monitoring can pick it up.

The ``native`` mode's receives, which run the handler inside the receive's transaction, are in
:mod:`.pump_native`; the checks of the pump's settings and of what a handler raised are in
:mod:`.pump_checks`. Their public names can be imported from here as well.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from . import defaults
from . import operations as ops
from .addressing import QueueAddress
from .arguments import default_holder, lease_ms, same_table
from .breaker import CircuitBreaker
from .client import Addressing
from .drivers import Session, SessionPool, close_quietly
from .errors import (
    ArgumentTypeError,
    InvalidArgumentError,
    NotAQueueError,
    PermissionDeniedError,
    QueueNotFoundError,
    TransportMisconfiguredError,
    TransportUnavailableError,
)
from .logs import logger
from .message import (
    TIME_TO_BE_RECEIVED,
    Failure,
    ReceivedMessage,
    TransactionMode,
    asynchronous,
    check_positive,
    coerce_ttbr,
    duration,
    error_text,
    flag,
    storable_text,
)
from .meter import Meter, Reporter
from .pump_checks import SETUP_ERRORS as SETUP_ERRORS
from .pump_checks import check_peek_interval as check_peek_interval
from .pump_checks import handler_failure as handler_failure
from .pump_checks import parse_timespan as parse_timespan
from .pump_native import BatchHandler as BatchHandler
from .pump_native import FailureCounter as FailureCounter
from .pump_native import NativeReceiver
from .pump_native import aborted as aborted
from .tracing import processing

log = logger("airflow_provider_sqlqueue.pump")

#: Handler of one message. The second argument is the receiving connection in ``native`` mode
#: (do your own SQL on it to commit atomically with the receive) and None otherwise. Raising marks
#: the message failed.
Handler = Callable[[ReceivedMessage, Any], Awaitable[None]]
#: A claimed batch and what its handlers did: the messages, each one's outcome, when each started.
_Batch = tuple[list[ReceivedMessage], list[BaseException | None], dict[uuid.UUID, datetime]]


class MessagePump:
    """Consume one queue with a handler until :meth:`stop` is called.

    ``max_deliveries`` bounds how often one message is handed to a failing handler before it is
    moved to the error queue (``native`` and ``claim`` modes; in ``none`` mode a failed message is
    copied to the error queue at once since it is already gone from the queue).

    With an ``audit_queue`` every message a handler processed is copied there with NServiceBus's
    processing headers: in the transaction of its ack (``claim``) or of its receive (``native``),
    so the copy exists exactly when the message is done; in ``none`` mode, where the receive has
    already committed, right after the handler, on a best-effort basis like the error copy.
    """

    def __init__(
        self,
        pool: SessionPool,
        queue: QueueAddress,
        handler: Handler | None,
        *,
        transaction_mode: TransactionMode | str = TransactionMode.CLAIM,
        error_queue: QueueAddress | None = None,
        max_concurrency: int = defaults.MAX_CONCURRENCY,
        peek_interval: float = defaults.PEEK_INTERVAL,
        peek_batch_size: int = defaults.PEEK_BATCH,
        receive_batch_size: int | None = None,
        lease: timedelta | float = defaults.LEASE,
        max_deliveries: int = defaults.MAX_DELIVERIES,
        smallest_ttbr: timedelta | float | None = None,
        max_backoff: float = defaults.MAX_BACKOFF_SECONDS,
        breaker_alarm: float = defaults.BREAKER_ALARM_SECONDS,
        batch_handler: BatchHandler | None = None,
        move_delayed: bool = True,
        audit_queue: QueueAddress | None = None,
        meter: Meter | None = None,
        wake_on_notify: bool = True,
    ) -> None:
        if (handler is None) == (batch_handler is None):
            raise InvalidArgumentError(
                "give a handler (one message at a time) or a batch_handler (native mode), "
                + ("not both" if handler is not None else "got neither")
            )
        if batch_handler is not None and TransactionMode(transaction_mode) is not TransactionMode.NATIVE:
            raise InvalidArgumentError(
                "batch_handler runs a batch inside its receive transaction: it needs transaction_mode='native'"
            )
        if not isinstance(pool, SessionPool):
            raise ArgumentTypeError(
                f"pool must be a session pool (AsyncPsycopgPool, drivers.open_pool), got {type(pool).__name__}"
            )
        for what, address in (("queue", queue), ("error_queue", error_queue), ("audit_queue", audit_queue)):
            if not (isinstance(address, QueueAddress) or (address is None and what != "queue")):
                raise ArgumentTypeError(f"{what} must be a QueueAddress, got {type(address).__name__}")
        for what, function in (("handler", handler), ("batch_handler", batch_handler)):
            if function is not None:
                asynchronous(what, function)
        check_positive("max_concurrency", max_concurrency)
        check_positive("peek_batch_size", peek_batch_size)
        check_positive("max_deliveries", max_deliveries)
        flag("move_delayed", move_delayed)
        flag("wake_on_notify", wake_on_notify)
        self._reporter = Reporter(meter)
        receive_batch_size = check_positive(
            "receive_batch_size", max_concurrency if receive_batch_size is None else receive_batch_size
        )
        peek_interval = duration("peek_interval", peek_interval, maximum=defaults.MAX_PEEK_INTERVAL).total_seconds()
        max_backoff = duration("max_backoff", max_backoff, maximum=defaults.MAX_BACKOFF_LIMIT).total_seconds()
        breaker_alarm = duration("breaker_alarm", breaker_alarm, maximum=defaults.BREAKER_ALARM_LIMIT).total_seconds()
        smallest_ttbr = coerce_ttbr(smallest_ttbr)
        self.pool = pool
        self.dialect = pool.dialect
        self.dialect.validate_address(queue)
        self.queue = queue
        # One rule with the clients: an error or audit queue named without a schema is in the queue's schema.
        addressing = Addressing(self.dialect, error_queue, audit_queue)
        self.error_queue = addressing.error_address(None, queue)
        if same_table(self.dialect, self.error_queue, queue):  # every failure would come back to the pump
            raise InvalidArgumentError(f"a pump on {queue} needs another error queue: pass error_queue=...")
        self.audit_queue = addressing.audit_address(queue)
        self.handler = handler
        self.batch_handler = batch_handler
        self.transaction_mode = TransactionMode(transaction_mode)
        self.max_concurrency = max_concurrency
        self.peek_interval = peek_interval
        self.peek_batch_size = peek_batch_size
        self.receive_batch_size = receive_batch_size
        self.lease = duration(
            "lease", lease, maximum=defaults.MAX_LEASE, minimum=defaults.MIN_RENEWED_LEASE
        )  # seconds too, as everywhere
        self.lease_ms = lease_ms(lease)
        self.holder = default_holder()
        self.max_deliveries = max_deliveries
        self.breaker = CircuitBreaker(min(peek_interval, 1.0), max_backoff, breaker_alarm)
        self.failures = FailureCounter()
        self.move_delayed = move_delayed
        self.wake_on_notify = wake_on_notify
        self.name = self.dialect.qualified_name(queue)
        self._channels = [self.dialect.notify_channel(queue)]
        #: Set when a send notification for the queue arrived, or this pump's delayed mover put
        #: messages into it: the idle wait ends at once. Cleared before each look at the queue.
        self._arrived = asyncio.Event()
        #: The claimed batch handled last, settled in the transaction of the next claim.
        self._unsettled: _Batch | None = None
        self.handled = 0
        self.failed = 0
        self._stop = asyncio.Event()
        #: Whether the last peek saw claims whose lease ran out: only then does a claim look for them.
        self._lapsed = True
        #: The ``native`` mode's receives (:mod:`.pump_native`), with the pump's settings and counts.
        self._native = NativeReceiver(self, self._reporter, self._handle, self._note_ttbr)
        # Warn about a short TTBR once: up front when the caller knows it, else on the first message showing it.
        self._ttbr_warned = smallest_ttbr is not None and peek_interval > smallest_ttbr.total_seconds()
        for warning in check_peek_interval(peek_interval, smallest_ttbr):
            log.warning("Queue %s: %s", self.name, warning)

    @property
    def meter(self) -> Meter:
        """Where the pump reports what it did (:mod:`.meter`): per message received, handled, failed,
        moved to the error queue, whose lease was lost, moved from the delayed table; handler times.
        What the meter raises is logged, never let into the loop."""
        return self._reporter.meter

    @meter.setter
    def meter(self, meter: Meter) -> None:
        self._reporter.meter = meter

    def stop(self) -> None:
        """Ask the loop to finish: no new receives start; handlers in flight complete."""
        self._stop.set()

    async def run(self) -> None:
        """Peek and receive until stopped. Returns once in-flight handlers are done."""
        log.info(
            "Queue %s: pump started (transaction_mode=%s, max_concurrency=%d, receive_batch_size=%d, "
            "peek_interval=%.3gs, peek_batch_size=%d)",
            self.name,
            self.transaction_mode.value,
            self.max_concurrency,
            self.receive_batch_size,
            self.peek_interval,
            self.peek_batch_size,
        )
        await self._check_setup()
        helpers = [asyncio.create_task(self._move_delayed())] if self.move_delayed else []
        if self.wake_on_notify:
            helpers.append(asyncio.create_task(self._listen()))
        try:
            await self._consume()
        finally:
            for helper in helpers:
                helper.cancel()
            await asyncio.gather(*helpers, return_exceptions=True)
        log.info("Queue %s: pump stopped (handled %d, failed %d)", self.name, self.handled, self.failed)

    async def _check_setup(self) -> None:
        """Refuse to start on what no retry can fix: a queue, error queue or audit queue that is
        missing or is no queue table, a claim store that is missing, a queue this role may not read.

        Once running, the pump rides such failures out with its back-off (a queue restored, a grant
        given back); at the start they are configuration mistakes, and a pump that retried them
        would look healthy while it never consumed. An outage here is left to the loop, which backs
        off until the database answers.
        """
        others = [self.error_queue] + ([self.audit_queue] if self.audit_queue is not None else [])
        claims = self.transaction_mode is TransactionMode.CLAIM
        try:
            async with self.pool.session() as session:
                await session.run(ops.checked(self.dialect, others, ops.peek(self.dialect, self.queue, claims)))
        except SETUP_ERRORS as exc:
            log.error("Queue %s: pump not started: %s", self.name, exc)
            raise
        except Exception as exc:  # noqa: BLE001  # an outage: the loop backs off and tries again
            log.warning(
                "Queue %s: could not look at the queue before starting (%s); retrying in the loop", self.name, exc
            )

    async def _move_delayed(self) -> None:
        """Move the queue's due delayed messages on while the pump runs, as an NServiceBus endpoint does.

        Looks every ``DELAYED_INTERVAL`` seconds, at once again after a full batch. A queue
        without a delayed table (``create_queue(..., delayed=False)``) is said once and left
        alone; other failures are retried, never stopping the pump, after a back-off of its own
        (the pump's settings): a mover retrying every second through an outage would open a
        connection a second -- taking a slot from others when the database has none free -- and
        log each failure.
        """
        delayed = self.queue.delayed()
        breaker = CircuitBreaker(defaults.DELAYED_INTERVAL, self.breaker.max_backoff, self.breaker.alarm_after)
        while not self._stop.is_set():
            try:
                async with self.pool.session() as session:
                    moved = await session.run(
                        ops.move_due(self.dialect, self.queue, delayed, self.error_queue, defaults.DELAYED_BATCH)
                    )
            except QueueNotFoundError:
                log.info("Queue %s: no delayed table %s, so no delayed messages to move", self.name, delayed)
                return
            except (PermissionDeniedError, NotAQueueError, InvalidArgumentError, TransportMisconfiguredError) as exc:
                log.error("Queue %s: not moving delayed messages (retrying cannot help): %s", self.name, exc)
                return
            except Exception as exc:  # noqa: BLE001  # an outage: back off, never stop the pump
                await self._sleep(breaker.failure(exc, f"{self.name} (moving due delayed messages)"))
                continue
            breaker.success()
            if moved:
                log.info("Queue %s: moved %d due delayed message(s) into place", self.name, moved)
                self._reporter.count("moved_due", self.queue, moved)
                self._arrived.set()
            if moved < defaults.DELAYED_BATCH:
                await self._sleep(defaults.DELAYED_INTERVAL)

    async def _consume(self) -> None:
        woken = False
        while not self._stop.is_set():
            self._arrived.clear()  # what arrived so far, the look below sees
            if woken:  # a send notification or the delayed mover said messages arrived: the peek would only agree
                budget = self.peek_batch_size
            else:
                pending = await self._peek()
                if pending is None:
                    continue
                if pending <= 0:
                    log.debug(
                        "Queue %s: peek found nothing; next peek in %.3gs at the latest", self.name, self.peek_interval
                    )
                    woken = await self._wait_for_messages()
                    continue
                budget = min(pending, self.peek_batch_size)
                log.debug("Queue %s: peek estimates %d waiting; receiving up to %d", self.name, pending, budget)
            woken = False
            received = await self._receive_mode(budget)
            if received:
                log.info(
                    "Queue %s: received %d message(s) (handled %d, failed %d so far)",
                    self.name,
                    received,
                    self.handled,
                    self.failed,
                )

    async def _peek(self) -> int | None:
        """How many messages seem to wait (claim mode: and whose claims lapsed); None after a failure, backed off."""
        try:
            async with self.pool.session() as session:
                if self.transaction_mode is TransactionMode.CLAIM:
                    pending, lapsed = await session.run(ops.peek_claims(self.dialect, self.queue, since_last=True))
                    self._lapsed = lapsed > 0
                    pending += lapsed
                else:
                    pending = await session.run(ops.peek(self.dialect, self.queue))
        except TransportMisconfiguredError as exc:  # retrying cannot fix the connection's settings
            log.error("Queue %s: pump stopped: %s", self.name, exc)
            raise
        except Exception as exc:  # noqa: BLE001  # any other database failure: back off, never crash the loop
            if isinstance(exc, QueueNotFoundError):
                log.error("Queue %s: %s", self.name, exc)
            await self._sleep(self.breaker.failure(exc, self.name))
            return None
        if pending <= 0:  # with messages waiting, only a receive that works shows the failures are over
            self.breaker.success()
        return int(pending)

    async def _wait_for_messages(self) -> bool:
        """After an empty peek, wait until the next look is worth making; True if something arrived.

        That is when a sender's notification for the queue arrives (PostgreSQL, ``send(...,
        notify=True)``, read by :meth:`_listen`), when this pump's delayed mover put messages into
        the queue, or when the peek interval is over -- the interval stays the fallback for senders
        that do not notify, for claims whose lease ran out and for a database without notifications.
        """
        arrived = asyncio.ensure_future(self._arrived.wait())
        stopped = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait([arrived, stopped], timeout=self.peek_interval, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in (arrived, stopped):
                waiting.cancel()
            await asyncio.gather(arrived, stopped, return_exceptions=True)
        return self._arrived.is_set()

    async def _listen(self) -> None:
        """Read the queue's send notifications for as long as the pump runs, on a connection of its own.

        Read all the time, busy or idle: a listening connection that nobody reads holds back the
        server's notification queue, which every notifying transaction of the cluster shares. Each
        notification ends the pump's idle wait and lowers the queue's head (:mod:`.heads`) to the
        lowest Seq it announces, so a message whose sender committed after newer ones were taken
        is found at once. A connection that fails or cannot be opened is logged and tried again
        after the longest back-off; meanwhile the pump peeks. Returns at once where the database
        has no notifications.
        """
        while not self._stop.is_set():
            try:
                listener = await self.pool.listener()
            except Exception as exc:  # noqa: BLE001  # peeking still works; try again later
                self._not_listening(exc)
                await self._sleep(defaults.MAX_BACKOFF_SECONDS)
                continue
            if listener is None:
                return
            try:
                await listener.wait_for_notification(self._channels, 0)  # LISTEN
                log.info(
                    "Queue %s: woken by send notifications (a peek every %.3gs at the latest)",
                    self.name,
                    self.peek_interval,
                )
                self._arrived.set()  # a message sent before the LISTEN woke no one: look once more
                while not self._stop.is_set():
                    self._announced(await listener.wait_for_notification(self._channels, self.peek_interval))
            except Exception as exc:  # noqa: BLE001
                self._not_listening(exc)
            finally:
                await close_quietly(listener)
            await self._sleep(defaults.MAX_BACKOFF_SECONDS)

    def _announced(self, payloads: list[str]) -> None:
        """Send notifications arrived: end the idle wait, and start the next scan at the lowest Seq announced.

        A payload that is not a Seq (a NOTIFY by hand on the channel) only wakes the pump.
        """
        if not payloads:
            return
        seqs = [int(payload) for payload in payloads if payload.isascii() and payload.isdigit() and len(payload) <= 19]
        head = self.dialect.head(self.queue)
        if seqs and head is not None:
            head.seen(min(seqs))
        self._arrived.set()

    def _not_listening(self, exc: BaseException) -> None:
        log.warning(
            "Queue %s: not waiting for send notifications (%s); peeking every %.3gs, listening again in %.0fs",
            self.name,
            exc,
            self.peek_interval,
            defaults.MAX_BACKOFF_SECONDS,
        )

    async def _sleep(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self._stop.wait(), timeout=seconds)
        except TimeoutError:
            pass

    async def _receive_mode(self, budget: int) -> int:
        """Receive and handle up to ``budget`` messages; stop when the queue runs dry.

        ``none`` and ``claim`` receive ``receive_batch_size`` messages per statement and run their
        handlers ``max_concurrency`` at a time; ``native`` keeps one transaction per message, since
        the handler's own writes commit with its receive.
        """
        if self.transaction_mode is TransactionMode.NATIVE and self.batch_handler is None:
            return await self._receive_singly(budget)
        received = 0
        try:
            while received < budget and not self._stop.is_set():
                wanted = min(self.receive_batch_size, budget - received)
                try:
                    got = await self._receive_batch(wanted)
                except Exception as exc:  # noqa: BLE001  # database failure mid-receive: the transaction rolled back
                    await self._settle_unsettled()  # what was handled is settled before the back-off
                    await self._sleep(self.breaker.failure(exc, self.name))
                    break
                self.breaker.success()
                received += got
                if got < wanted:
                    break
        finally:
            await self._settle_unsettled()
        return received

    async def _receive_batch(self, wanted: int) -> int:
        """One receive (none) or claim (claim) of up to ``wanted`` messages, handled; returns how many came."""
        if self.batch_handler is not None:
            return await self._native.receive_batch(wanted, self.batch_handler)
        async with self.pool.session() as session:
            if self.transaction_mode is TransactionMode.NONE:
                messages = await session.run(
                    ops.receive(self.dialect, self.queue, self.error_queue, wanted, atomic=False)
                )
            else:
                messages = await self._claim(session, wanted)
        self._reporter.taken(self.queue, messages)
        if not messages:
            return 0
        started: dict[uuid.UUID, datetime] = {}
        if self.transaction_mode is TransactionMode.NONE:
            outcomes = await self._handle_all(messages, started)
            self._reporter.settled(
                self.queue, sum(error is None for error in outcomes), sum(error is not None for error in outcomes)
            )
            for message, error in zip(messages, outcomes, strict=True):
                if error is not None:
                    await self._copy_to_error(message, error)
            await self._copy_to_audit(
                [m for m, error in zip(messages, outcomes, strict=True) if error is None], started
            )
            return len(messages)
        tokens = [message.claim_token for message in messages]
        renewing = asyncio.create_task(self._renew(tokens))
        try:
            outcomes = await self._handle_all(messages, started)
        finally:
            renewing.cancel()
        # Settled with the next claim, in its transaction; or alone when the loop ends (_receive_mode).
        self._unsettled = (messages, outcomes, started)
        return len(messages)

    async def _claim(self, session: Session, wanted: int) -> ops.Taken:
        """Claim up to ``wanted`` messages, settling the batch handled before in the same transaction."""
        claiming = ops.claim(
            self.dialect,
            self.queue,
            self.error_queue,
            wanted,
            self.lease_ms,
            self.max_deliveries,
            self.holder,
            reclaim=self._lapsed,
        )
        unsettled, self._unsettled = self._unsettled, None
        if unsettled is None:
            return await session.run(claiming)
        try:
            held, messages = await session.run(ops.settle_then_claim(self._settling(*unsettled), claiming))
        except Exception:
            # Neither happened: the batch is settled alone (by _receive_mode, once this session is
            # back in the pool -- its connection may be the failure), so it is not handed out again.
            self._unsettled = unsettled
            raise
        self._settled(unsettled[0], unsettled[1], held)
        return messages

    async def _handle_all(
        self, messages: list[ReceivedMessage], started: dict[uuid.UUID, datetime]
    ) -> list[BaseException | None]:
        """Run the handler on every message, at most ``max_concurrency`` at once; each one's failure or None.

        ``max_concurrency`` workers take the batch's messages in order, rather than a task per
        message: a batch of hundreds costs a few tasks, not hundreds. ``started`` gets when each
        message's handler began (by message id), for its audit copy.
        """
        outcomes: list[BaseException | None] = [None] * len(messages)
        next_index = iter(range(len(messages)))

        async def worker() -> None:
            for index in next_index:
                started[messages[index].id] = datetime.now(UTC)
                outcomes[index] = await self._handle(messages[index], None)

        workers = min(self.max_concurrency, len(messages))
        if workers == 1:
            await worker()
        else:
            await asyncio.gather(*(worker() for _ in range(workers)))
        return outcomes

    async def _copy_to_error(self, message: ReceivedMessage, error: BaseException) -> None:
        """A failed message of ``none`` mode is already gone from the queue: keep a copy in the error queue."""
        try:
            async with self.pool.session() as session:
                await session.run(ops.move_to_error(self.dialect, self.queue, self.error_queue, message, error))
        except Exception as exc:  # noqa: BLE001  # best effort: the failure is logged, the pump goes on
            log.error("Queue %s: could not copy failed message %s to the error queue: %s", self.name, message.id, exc)
        else:
            self._reporter.count("moved_to_error", self.queue, 1)

    async def _copy_to_audit(self, messages: list[ReceivedMessage], started: dict[uuid.UUID, datetime]) -> None:
        """``none`` mode: the processed messages are already gone from the queue; copy them to the audit queue."""
        if self.audit_queue is None or not messages:
            return
        try:
            async with self.pool.session() as session:
                await session.run(ops.audit(self.dialect, self.queue, self.audit_queue, messages, started))
        except Exception as exc:  # noqa: BLE001  # best effort: the failure is logged, the pump goes on
            log.error(
                "Queue %s: could not copy %d processed message(s) to the audit queue: %s", self.name, len(messages), exc
            )

    def _settling(
        self, messages: list[ReceivedMessage], outcomes: list[BaseException | None], started: dict[uuid.UUID, datetime]
    ) -> ops.Operation[set[uuid.UUID]]:
        """The settlement of a handled batch: the handled claims acknowledged in one statement (with
        their audit copies), each failed one given back with its failure."""
        done = [m.claim_token for m, error in zip(messages, outcomes, strict=True) if error is None and m.claim_token]
        failed = [
            (m.claim_token, Failure.of(error, self.name))
            for m, error in zip(messages, outcomes, strict=True)
            if error is not None and m.claim_token is not None
        ]
        return ops.settle(self.dialect, self.queue, done, failed, self.audit_queue, started)

    async def _settle_unsettled(self) -> None:
        """Settle the last handled batch on its own: the loop ends, no claim follows to carry it."""
        unsettled, self._unsettled = self._unsettled, None
        if unsettled is not None:
            await self._settle_alone(unsettled)

    async def _settle_alone(self, unsettled: _Batch) -> None:
        """Settle a handled batch in a transaction of its own.

        Once more on a new connection if the first was lost (a pooled connection the server closed
        while it sat idle, ``idle_session_timeout``): the handlers' work is done and must not be
        handed out again. Any other failure is logged, not raised: the batch's claims come back
        when their lease ends.
        """
        for attempt in (1, 2):
            try:
                async with self.pool.session() as session:
                    held = await session.run(self._settling(*unsettled))
            except TransportUnavailableError as exc:
                if attempt == 1:  # the pool closed that connection and its idle ones: the next is new
                    log.info("Queue %s: settling again on a new connection (%s)", self.name, exc)
                    continue
                failure: Exception = exc
            except Exception as exc:  # noqa: BLE001
                failure = exc
            else:
                self._settled(unsettled[0], unsettled[1], held)
                return
            log.warning(
                "Queue %s: could not settle %d message(s) (%s); they come back when their lease ends",
                self.name,
                len(unsettled[0]),
                failure,
            )
            return

    def _settled(
        self, messages: list[ReceivedMessage], outcomes: list[BaseException | None], held: set[uuid.UUID]
    ) -> None:
        """Report a settled batch: what was handled or failed, and whose lease ran out before it was settled."""
        lost = [message for message in messages if message.claim_token not in held]
        for message in lost:
            log.warning(
                "Queue %s: lease on message %s ran out before it was settled; it may be handled again",
                self.name,
                message.id,
            )
        settled = [error for message, error in zip(messages, outcomes, strict=True) if message.claim_token in held]
        self._reporter.settled(
            self.queue, sum(error is None for error in settled), sum(error is not None for error in settled)
        )
        if lost:
            self._reporter.count("leases_lost", self.queue, len(lost))

    async def _receive_singly(self, budget: int) -> int:
        """Run up to ``budget`` native receives, at most ``max_concurrency`` at once; stop at the first empty one."""
        slots = asyncio.Semaphore(self.max_concurrency)
        exhausted = asyncio.Event()
        tasks: list[asyncio.Task[bool]] = []

        async def one() -> bool:
            try:
                got = await self._native.receive()
            except Exception as exc:  # noqa: BLE001  # database failure mid-receive: the transaction rolled back
                exhausted.set()
                await self._sleep(self.breaker.failure(exc, self.name))
                return False
            finally:
                slots.release()
            self.breaker.success()
            if not got:
                exhausted.set()
            return got

        try:
            for _ in range(budget):
                await slots.acquire()
                if exhausted.is_set() or self._stop.is_set():
                    slots.release()
                    break
                tasks.append(asyncio.create_task(one()))
            return sum(await asyncio.gather(*tasks))
        finally:
            # When the pump's task is cancelled (while it waits for a slot, too), so is every receive
            # in flight, and each rolls back and gives its connection back before run() returns.
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def _note_ttbr(self, message: ReceivedMessage) -> None:
        if self._ttbr_warned:
            return
        ttbr = parse_timespan(message.headers.get(TIME_TO_BE_RECEIVED) or "")
        if ttbr is not None and ttbr.total_seconds() < self.peek_interval:
            self._ttbr_warned = True
            log.warning("Queue %s: %s", self.name, check_peek_interval(self.peek_interval, ttbr)[-1])

    async def _handle(self, message: ReceivedMessage, connection: Any) -> BaseException | None:
        self._note_ttbr(message)
        if self.handler is None:  # not reached: a pump with a batch handler handles whole batches
            raise ArgumentTypeError("this pump has a batch_handler")
        began = time.monotonic()
        try:
            with processing(lambda: self.dialect.format_address(self.queue), [message], database=self.dialect.name):
                await self.handler(message, connection)
        except BaseException as exc:  # noqa: BLE001  # the handler's failure is data for recoverability, not a pump crash
            self._reporter.handler_time(self.queue, time.monotonic() - began)
            handler_failure(exc)
            self.failed += 1
            log.warning(
                "Queue %s: handler failed for message %s: %s: %s",
                self.name,
                message.id,
                type(exc).__name__,
                storable_text(error_text(exc), defaults.MAX_FAILURE_TEXT),
            )
            return exc
        self._reporter.handler_time(self.queue, time.monotonic() - began)
        self.handled += 1
        return None

    async def _renew(self, tokens: list[Any]) -> None:
        """Renew a handler's claim every third of the lease while it runs, so a long handler keeps its message."""
        while True:
            await asyncio.sleep(defaults.renewal_interval(self.lease))
            try:
                async with self.pool.session() as session:
                    await session.run(ops.extend(self.dialect, self.queue, tokens, self.lease_ms))
            except Exception as exc:  # noqa: BLE001  # the next renewal may succeed; the handler goes on either way
                log.warning("Queue %s: could not renew a claim: %s", self.name, exc)
