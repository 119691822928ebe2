"""The queue API: one client per connection, blocking (:class:`QueueClient`) or asyncio (:class:`AsyncQueueClient`).

The API is written once, as :class:`AsyncQueueClient`'s coroutines; :class:`QueueClient` runs the
same coroutines over a blocking session, where they finish without suspending
(:func:`~.drivers.finish`), so the two clients cannot drift apart.

Queues are named by a string in the database's address syntax (``orders``, ``"sales"."orders"``,
``orders@[dbo]@[shop]``) or a :class:`~airflow_provider_sqlqueue.transport.addressing.QueueAddress`.
Each call runs in its own short transaction, except in a ``transaction()`` block, and
``receive_native``, which keeps the receive transaction open while the caller handles the message.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Mapping
from contextlib import AbstractContextManager, asynccontextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any, Concatenate, Literal, ParamSpec, TypeVar, Union, overload

from . import defaults
from . import operations as ops
from .addressing import QueueAddress, checked_text
from .arguments import (
    Token,
    as_messages,
    as_tokens,
    default_holder,
    delay_ms,
    error_seqs,
    label,
    lease_ms,
    lock_wait_span,
    locked_batch,
    one_or_many,
    place,
    received,
    same_table,
    started_times,
    transaction_id,
)
from .dialects import Dialect
from .drivers import Session, blocking_context, finish, open_session
from .errors import (
    CALL_ENDING,
    ArgumentTypeError,
    ClientClosedError,
    InvalidArgumentError,
    InvalidQueueNameError,
    LockTimeoutError,
    ObjectExistsError,
    SqlQueueError,
    one_line,
)
from .health import Health, Problem, nothing_read, problems
from .install import Installation, TableKind
from .locks import TaskLock, ThreadLock
from .logs import logger
from .message import (
    Failure,
    Message,
    ReceivedMessage,
    check_positive,
    delivery_delay,
    duration,
    flag,
    subscription_text,
    topic_names,
    uuid_value,
    whole_ms,
)
from .meter import Event, Meter, Reporter
from .tracing import processing

T = TypeVar("T")

log = logger("airflow_provider_sqlqueue.transport")

V = TypeVar("V")
#: Values by queue, the queues named by text, by address or both (a plain ``dict[str, ...]`` is one).
ByQueue = Union[Mapping[str, V], Mapping[QueueAddress, V], Mapping[str | QueueAddress, V]]  # noqa: UP007


class Addressing:
    """Resolves queue names to validated addresses of one dialect, with a client's error and audit queues.

    Clients are addressings over a connection; on its own it plans what an installer creates
    (:meth:`installation`) without connecting, for the scripts a DBA reviews.
    """

    def __init__(
        self,
        dialect: Dialect,
        error_queue: str | QueueAddress | None = None,
        audit_queue: str | QueueAddress | bool | None = None,
    ) -> None:
        self.dialect = dialect
        if error_queue is not None:
            self.address(error_queue)  # a name no table can have is refused now, not at the first failure
        if audit_queue is not None and not isinstance(audit_queue, bool):
            self.address(audit_queue)
        self.error_queue = error_queue
        self.audit_queue = audit_queue

    @property
    def copies_sends(self) -> bool:
        """Whether :meth:`send_copied` loads by COPY here (PostgreSQL), rather than :meth:`send`'s INSERTs."""
        return ops.copies_sends(self.dialect)

    def address(self, queue: str | QueueAddress) -> QueueAddress:
        dialect = self.dialect
        if isinstance(queue, QueueAddress):
            dialect.validate_address(queue)
            return queue
        if not isinstance(queue, str):
            raise ArgumentTypeError(f"queue must be a name or QueueAddress, got {type(queue).__name__}")
        return dialect.parse_address(queue)

    def canonical_address(self, queue: str | QueueAddress) -> str:
        """The queue's address as NServiceBus writes it (``orders@[dbo]``, ``orders@"public"``): for logs and payloads."""
        return self.dialect.format_address(self.address(queue))

    @property
    def database(self) -> str:
        """The kind of database the client talks to (``postgres`` or ``sqlserver``)."""
        return self.dialect.name

    def error_address(self, error_queue: str | QueueAddress | None, queue: QueueAddress | None = None) -> QueueAddress:
        """The error queue of ``queue``: ``error_queue``, else the client's, else ``error``.

        One rule everywhere: an error queue named without a schema lives in the queue's own schema
        (and catalog), where ``create_queue`` creates it.
        """
        address = self._error_of(error_queue, queue)
        if error_queue is not None and queue is not None and same_table(self.dialect, address, queue):
            # Its failures would come back to it for ever: refused when a call names it so. (The
            # client's error queue read with the client's rule has itself as error queue: draining
            # it is allowed, and a poison row met there stays where it is.)
            raise InvalidArgumentError(
                f"the error queue of {self.dialect.qualified_name(address)} cannot be that queue itself: "
                "name another error queue (error_queue=...)"
            )
        return address

    def _error_of(self, error_queue: str | QueueAddress | None, queue: QueueAddress | None) -> QueueAddress:
        chosen = error_queue if error_queue is not None else self.error_queue
        return self.beside(defaults.ERROR_QUEUE if chosen is None else chosen, queue)

    def beside(self, name: str | QueueAddress, queue: QueueAddress | None) -> QueueAddress:
        """``name`` as an address; named without a schema, in ``queue``'s schema (and catalog)."""
        address = self.address(name)
        if queue is None:
            return address
        queue = self.address(queue)
        return address if address.schema is not None else queue.sibling(address.table)

    def audit_address(self, queue: QueueAddress) -> QueueAddress | None:
        """Where processed messages of ``queue`` are copied: None when the client does not audit.

        ``audit_queue=True`` means ``audit``; like the error queue, an audit queue named without a
        schema lives in the queue's own schema, where ``create_queue`` creates it.
        """
        queue = self.address(queue)
        audit = self._audit_of(queue)
        if audit is not None and any(same_table(self.dialect, audit, t) for t in (queue, self._error_of(None, queue))):
            # Every acknowledgement would put its message back (or into the error queue) once more.
            raise InvalidArgumentError(
                f"the audit queue of {queue} cannot be {audit}: it is the queue or its error queue"
            )
        return audit

    def _audit_of(self, queue: QueueAddress) -> QueueAddress | None:
        chosen = self.audit_queue
        if chosen is None or chosen is False:
            return None
        return self.beside(defaults.AUDIT_QUEUE if chosen is True else chosen, queue)

    def subscription_table(self, table: str | QueueAddress | None = None) -> QueueAddress:
        """NServiceBus's subscription table: ``table``, else ``SubscriptionRouting`` in the default schema."""
        return self.address(defaults.SUBSCRIPTION_TABLE if table is None else table)

    def _subscription(
        self, queue: str | QueueAddress, topics: str | Iterable[str], endpoint: str | None
    ) -> tuple[QueueAddress, str, list[str]]:
        """A subscription's queue, endpoint and topics, checked as the subscription table stores them."""
        address = self.address(queue)
        subscription_text("queue address", self.dialect.format_address(address))
        endpoint = subscription_text("endpoint", address.table if endpoint is None else endpoint)
        return address, endpoint, topic_names(topics)

    def kind(self, address: QueueAddress) -> Literal["queue", "error", "audit"]:
        """``error`` or ``audit`` when the table is its schema's error or audit queue (as this addressing
        names them, or by NServiceBus's default names), else ``queue``: how a listing of every queue
        (the Queues page, the metrics) tells the error and audit queues apart."""
        address = self.address(address)
        if same_table(self.dialect, address, self._error_of(None, address)):
            return "error"
        if address == (self._audit_of(address) or address.sibling(defaults.AUDIT_QUEUE)):
            return "audit"
        return "queue"

    def _longest_delayed_name(self, address: QueueAddress) -> int:
        """The longest queue name, in the same schema, whose delayed table the database can name."""
        longest = 0
        for size in range(1, len(address.table.encode("utf-8")) + 1):
            try:
                self.dialect.validate_address(replace(address, table="q" * size).delayed())
            except InvalidQueueNameError:
                break
            longest = size
        return longest

    def installation(
        self,
        queue: str | QueueAddress,
        *,
        error_queue: str | QueueAddress | None = None,
        secondary: str | None = None,
        body_string: bool = False,
        delayed: bool = True,
        notify_on_insert: bool = False,
    ) -> Installation:
        """Every table ``create_queue`` makes for ``queue``, in the order it makes them; with
        ``notify_on_insert``, the insert trigger on the queue and its secondary (the tables an
        endpoint receives from), refused before anything is made where the database has no notifications."""
        address = self.address(queue)
        if address.table == self.dialect.inflight_table:
            raise InvalidQueueNameError(
                f"{address.table!r} is the name of each schema's claim store; name the queue otherwise"
            )
        flag("body_string", body_string)
        flag("delayed", delayed)
        notified = [address] if flag("notify_on_insert", notify_on_insert) else []
        error_address = self.error_address(error_queue, address)
        tables: list[tuple[TableKind, QueueAddress]] = [(TableKind.QUEUE, address), (TableKind.QUEUE, error_address)]
        audit_address = self._audit_of(address)
        if audit_address is not None and same_table(self.dialect, audit_address, address):
            audit_address = None  # the audit queue itself, made by an auditing client: one table
        if audit_address is not None:
            if same_table(self.dialect, audit_address, error_address):
                # What every acknowledgement would refuse later (audit_address()): refused before any table is made.
                raise InvalidArgumentError(
                    f"the audit queue of {address} cannot be {audit_address}: it is the queue or its error queue"
                )
            tables.append((TableKind.QUEUE, audit_address))
        if secondary is not None:
            instance = address.secondary(label("secondary", secondary))
            if any(same_table(self.dialect, instance, t) for t in (error_address, audit_address) if t is not None):
                # The instance receives from its own queue: failures or audited copies sent there come back to it.
                raise InvalidArgumentError(
                    f"the secondary queue {instance} of {address} cannot be its error or audit queue: name another"
                )
            tables.append((TableKind.QUEUE, instance))
            notified += [instance] if notified else []
        tables.append((TableKind.INFLIGHT, self.dialect.inflight_address(address)))
        if delayed:
            delayed_table = address.delayed()
            try:
                self.dialect.validate_address(delayed_table)
            except InvalidQueueNameError as exc:  # every queue made has all its tables, or none is made
                unit = "bytes" if self.dialect.name == "postgres" else "characters"
                raise InvalidQueueNameError(
                    f"queue name {address.table!r} leaves no room for its delayed-message table "
                    f"{delayed_table.table!r} ({exc}); a queue with a delayed table may have a name of at most "
                    f"{self._longest_delayed_name(address)} {unit}: choose a shorter name, or create it with "
                    "delayed=False"
                ) from None
            tables.append((TableKind.DELAYED, delayed_table))
        plan = Installation(self.dialect, tuple(tables), body_string)
        return plan.with_notify_on_insert(notified) if notified else plan


class AsyncQueueClient(Addressing):
    """Queue operations over one connection, for asyncio callers (the message pump, Airflow's triggers).

    This is the one implementation of the queue API: :class:`QueueClient` runs these same
    coroutines over a blocking session, where they finish without suspending. ``connect(uri)``
    opens and owns a connection (psycopg's asyncio connection for PostgreSQL; SQL Server's drivers
    on a thread of their own); ``AsyncQueueClient(session)`` runs over a session the caller opened.
    Tasks sharing a client take turns on its connection (:class:`~.locks.TaskLock`).
    """

    def __init__(
        self,
        session: Session,
        error_queue: str | QueueAddress | None = None,
        audit_queue: str | QueueAddress | bool | None = None,
    ) -> None:
        super().__init__(session.dialect, error_queue, audit_queue)
        self.session = session
        self._lock: TaskLock | ThreadLock = TaskLock()
        self._reporter = Reporter()
        #: :meth:`transaction` blocks open, nested ones counted: where :meth:`lock` may run.
        self._blocks = 0
        #: The queues the open block has locked a batch of (:meth:`lock`), by :meth:`Dialect.name_key`.
        self._locked: set[tuple[str | None, str, str]] = set()

    @property
    def meter(self) -> Meter:
        """Where the client reports what it moved (:mod:`.meter`; by default nowhere).

        Counted when a call returns, so a :meth:`transaction` block that then rolls back has counted
        its calls all the same. What the meter raises is logged, never passed to the caller.
        """
        return self._reporter.meter

    @meter.setter
    def meter(self, meter: Meter) -> None:
        self._reporter.meter = meter

    def _counted(self, event: Event, queue: QueueAddress, n: int) -> None:
        self._reporter.count(event, queue, n)

    def _refuse_closed(self) -> None:
        """For calls that send no statement (nothing to send): a closed client is closed all the same."""
        if self.session.closed:
            raise ClientClosedError()

    async def _run(self, op: ops.Operation[T]) -> T:
        """Run an operation in its own transaction, or in the caller's (:meth:`transaction`), one caller at a time."""
        async with self._lock:
            self._refuse_closed()  # also inside a block whose code closed the client
            return await self.session.run(op)

    async def _in_batches(self, make: Callable[[], ops.Operation[int]], batch_size: int) -> int:
        """Run a batch operation, each batch its own transaction, until one comes back short; returns the total."""
        total = 0
        while True:
            count = await self._run(make())
            total += count
            if count < batch_size:
                return total

    @classmethod
    async def connect(
        cls,
        target: Any,
        error_queue: str | QueueAddress | None = None,
        audit_queue: str | QueueAddress | bool | None = None,
    ) -> AsyncQueueClient:
        """Open a client from a URI/DSN (owned connection) or wrap an existing DB-API connection (borrowed)."""
        session = await open_session(target, blocking=False)
        if session.blocking:  # a blocking psycopg connection would stall the event loop at every call
            raise ArgumentTypeError(
                "AsyncQueueClient needs psycopg's AsyncConnection; use QueueClient for a Connection"
            )
        return cls(session, error_queue, audit_queue)

    @property
    def connection(self) -> Any:
        """The DB-API connection (in :meth:`receive_native`, the one holding the receive transaction)."""
        return self.session.connection

    async def close(self) -> None:
        """Close the connection if the client opened it: after the calls of other callers (threads, tasks)
        that hold the connection, as every call takes its turn -- a native receive block another thread
        has open commits first, rather than losing its connection under it."""
        async with self._lock:
            await self.session.close()

    async def __aenter__(self) -> AsyncQueueClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        """Run the block's calls of this client in one transaction: all commit when it ends, none if it raises.

        What a caller needs when several calls must commit together (a Spark partition recorded in
        the write ledger with the messages it sends). Other callers of the client wait meanwhile.
        """
        self._refuse_closed()  # what any driver says after close(), before it touches the connection
        async with self._lock, self.session.transaction():
            self._blocks += 1
            try:
                yield
            finally:
                self._blocks -= 1
                if not self._blocks:
                    self._locked.clear()
            self._refuse_closed()  # close() inside the block: its transaction is rolled back, not committed

    def _in_block(self, call: str, *, outermost: bool = False) -> None:
        """Refuse ``call``, which works on the rows a :meth:`transaction` holds locked, outside such a
        block (its own transaction would end as it returns, and its locks with it) -- and, for a lock,
        in a nested block, a savepoint, whose row locks carry the savepoint's own id."""
        if not self._blocks or (outermost and self._blocks > 1):
            where = "outside a transaction block" if not self._blocks else "in a nested transaction block"
            block = "the outermost `with client.transaction():` block" if outermost else "the block that locked it"
            raise InvalidArgumentError(
                f"{call}() works on rows a transaction holds locked, called {where}: call it in {block}"
            )

    # -- installation ------------------------------------------------------------------------

    async def create_queue(
        self,
        queue: str | QueueAddress,
        *,
        error_queue: str | QueueAddress | None = None,
        secondary: str | None = None,
        body_string: bool = False,
        delayed: bool = True,
        notify_on_insert: bool = False,
    ) -> list[QueueAddress]:
        """Create the queue, its error queue, its audit queue (when the client audits), optionally its
        ``Endpoint.Machine`` secondary, the claim store, and (``delayed``) its delayed-message table
        ``<queue>.Delayed``, as an NServiceBus endpoint's installer does; ``notify_on_insert``: a trigger
        notifying the queue's listeners of every insert, whoever makes it (PostgreSQL). Idempotent,
        safe from several processes at once; needs CREATE on the schema. Returns the queue tables.
        """
        installation = self.installation(
            queue,
            error_queue=error_queue,
            secondary=secondary,
            body_string=body_string,
            delayed=delayed,
            notify_on_insert=notify_on_insert,
        )
        await self._install_plan(installation)
        return installation.queue_tables()

    async def _install_plan(self, plan: Installation) -> None:
        """Check every table of the plan, then create them: a refused plan creates nothing."""
        await self._run(plan.check())
        for make in plan.operations():
            await self._install(make)

    async def _install(self, make: Callable[[], ops.Operation[None]]) -> None:
        """Run an installer; run it once more if another installer, one that does not take the same
        lock, created the table or an index at the same moment: it then finds the table and checks it."""
        try:
            await self._run(make())
        except ObjectExistsError as exc:
            log.info("Another installer created an object at the same time (%s); checking what it created", exc)
            await self._run(make())

    async def drop_queue(self, queue: str | QueueAddress) -> None:
        """Drop the queue table and its delayed table; a missing table is left alone, a table that is no queue refused."""
        await self._run(ops.drop_queue(self.dialect, self.address(queue)))

    async def check_queue(self, queue: str | QueueAddress) -> None:
        """Raise QueueNotFoundError if the table is missing; log a warning if Index_Expires is."""
        await self._run(ops.check_queue(self.dialect, self.address(queue)))

    # -- sending -----------------------------------------------------------------------------

    async def send(
        self,
        queue: str | QueueAddress,
        messages: Message | Iterable[Message],
        *,
        notify: bool = False,
        delay: timedelta | float | None = None,
        due: datetime | None = None,
    ) -> int:
        """Send one message or many (in one transaction, batched into as few statements as possible).

        ``notify=True`` wakes receivers that listen for the queue (PostgreSQL LISTEN/NOTIFY) when
        the send commits, instead of leaving them to find the messages at their next peek.

        ``delay`` (a timedelta or seconds) or ``due`` (an aware datetime) stores the messages in
        the queue's delayed table (``<queue>.Delayed``) instead; they reach the queue when due,
        moved by :meth:`move_due` (which the pump runs) or by the NServiceBus endpoint owning the
        queue. Messages with a time-to-be-received cannot be delayed, as in NServiceBus.
        """
        batch = as_messages(messages)
        address = self.address(queue)
        flag("notify", notify)
        wait = delivery_delay(delay, due)
        if not batch:
            self._refuse_closed()
            return 0
        if wait is None:
            sent = await self._run(ops.send(self.dialect, address, batch, notify))
        else:
            sent = await self._run(ops.send_delayed(self.dialect, address, address.delayed(), batch, whole_ms(wait)))
        self._counted("sent", address, sent)
        return sent

    async def send_copied(self, queue: str | QueueAddress, messages: Message | Iterable[Message]) -> int:
        """:meth:`send` by PostgreSQL's COPY, for many messages at once (a Spark partition); messages with a
        time to be received, and SQL Server, take :meth:`send`'s INSERTs. No notification, no delay."""
        batch = as_messages(messages)
        address = self.address(queue)
        if not batch:
            self._refuse_closed()
            return 0
        sent = await self._run(ops.send_copied(self.dialect, address, batch))
        self._counted("sent", address, sent)
        return sent

    async def send_csv(self, queue: str | QueueAddress, chunks: Iterable[bytes]) -> int:
        """Load (Id, Headers, Body) rows a bulk loader wrote as CSV (Body as bytea hex) into ``queue`` by
        PostgreSQL's COPY; returns how many. The column types are checked (a bad row fails the load);
        the Headers text is the loader's to make an NServiceBus JSON object (else it is poison)."""
        address = self.address(queue)
        sent = await self._run(ops.send_csv(self.dialect, address, chunks))
        self._counted("sent", address, sent)
        return sent

    async def move_due(self, queue: str | QueueAddress, *, batch_size: int = defaults.DELAYED_BATCH) -> int:
        """Move every due message of the queue's delayed table on to its destination; returns how many.

        One transaction per ``batch_size`` messages; safe beside other movers (each message is moved
        once). Raises QueueNotFoundError when the queue has no delayed table.
        """
        address = self.address(queue)
        limit = check_positive("batch_size", batch_size)
        error = self.error_address(None, address)
        moved = await self._in_batches(
            partial(ops.move_due, self.dialect, address, address.delayed(), error, limit, every_due=True), batch_size
        )
        self._counted("moved_due", address, moved)
        return moved

    async def next_due(self, queue: str | QueueAddress) -> timedelta | None:
        """How long until the queue's earliest delayed message is due (negative: overdue); None when none waits."""
        wait_ms = await self._run(ops.next_due(self.dialect, self.address(queue).delayed()))
        return None if wait_ms is None else timedelta(milliseconds=wait_ms)

    async def wait_for_notifications(self, queues: Iterable[str | QueueAddress], timeout: float) -> bool:
        """Listen for the queues' send notifications and wait up to ``timeout`` seconds for one.

        Returns True when woken by a send, False on timeout or where the database has no
        notifications (then it just waits). Notifications that arrived meanwhile are all consumed,
        so a burst of sends wakes the caller once.
        """
        wait = duration("timeout", timeout, maximum=defaults.MAX_PEEK_INTERVAL, minimum=timedelta(0))
        if isinstance(queues, (str, bytes, Mapping)) or not isinstance(queues, Iterable):
            raise ArgumentTypeError(f"queues must be an iterable of queues, got {type(queues).__name__}")
        addresses = [self.address(queue) for queue in queues]
        for address in addresses:
            await self._run(ops.table_shape(self.dialect, address))
        channels = [self.dialect.notify_channel(address) for address in addresses]
        async with self._lock:
            return bool(await self.session.wait_for_notification(channels, wait.total_seconds()))

    # -- publish/subscribe -------------------------------------------------------------------

    async def create_subscription_table(self, table: str | QueueAddress | None = None) -> QueueAddress:
        """Create NServiceBus's subscription table (``SubscriptionRouting``) if missing; returns its address."""
        where = self.subscription_table(table)
        await self._install_plan(Installation(self.dialect, ((TableKind.SUBSCRIPTIONS, where),)))
        return where

    async def subscribe(
        self,
        queue: str | QueueAddress,
        topics: str | Iterable[str],
        *,
        endpoint: str | None = None,
        table: str | QueueAddress | None = None,
    ) -> None:
        """Have events published on ``topics`` delivered to ``queue``, as an NServiceBus subscriber does.

        ``endpoint`` names the subscriber (default: the queue's table name, an NServiceBus endpoint's
        name); one endpoint has one subscription per topic. Idempotent and safe concurrently.
        """
        address, endpoint, names = self._subscription(queue, topics, endpoint)
        await self._run(ops.subscribe(self.dialect, self.subscription_table(table), address, endpoint, names))

    async def unsubscribe(
        self,
        queue: str | QueueAddress,
        topics: str | Iterable[str],
        *,
        endpoint: str | None = None,
        table: str | QueueAddress | None = None,
    ) -> None:
        """End ``endpoint``'s subscriptions to ``topics`` (default endpoint: the queue's table name)."""
        address, endpoint, names = self._subscription(queue, topics, endpoint)
        where = self.subscription_table(table)
        await self._run(ops.checked(self.dialect, [address], ops.unsubscribe(self.dialect, where, endpoint, names)))

    async def subscribers(self, topics: str | Iterable[str], *, table: str | QueueAddress | None = None) -> list[str]:
        """The queue addresses (NServiceBus's form) subscribed to any of ``topics``."""
        return await self._run(ops.subscribers(self.dialect, self.subscription_table(table), topic_names(topics)))

    async def publish(
        self,
        topics: str | Iterable[str],
        messages: Message | Iterable[Message],
        *,
        table: str | QueueAddress | None = None,
        notify: bool = False,
        claims: ByQueue[Token | Iterable[Token]] | None = None,
        started: Mapping[uuid.UUID, datetime] | None = None,
    ) -> list[QueueAddress]:
        """Send ``messages`` to every queue subscribed to any of ``topics``, in one transaction.

        ``topics``: the event's type name, then the types it derives from (NServiceBus matches a
        subscription to any of them). Returns the queues reached (none when nobody subscribed).
        With ``claims`` ({queue: tokens}) the claims the event came from are acknowledged in the
        same transaction, as :meth:`forward` does for a send (``LeaseLostError``: nothing published).
        """
        batch, names, where = as_messages(messages), topic_names(topics), self.subscription_table(table)
        flag("notify", notify)
        started = started_times(started)
        if claims is None:
            reached = await self._run(ops.publish(self.dialect, where, names, batch, notify))
        else:
            settled, audit = self._claims(claims)
            reached = await self._run(
                ops.forward_published(self.dialect, settled, where, names, batch, notify, audit, started)
            )
            for address, tokens in settled:
                self._counted("handled", address, len(tokens))
        for address in reached:
            self._counted("sent", address, len(batch))
        return reached

    def _claims(
        self, claims: ByQueue[Token | Iterable[Token]]
    ) -> tuple[list[tuple[QueueAddress, list[uuid.UUID]]], dict[QueueAddress, QueueAddress]]:
        """Claims by queue address, and the audit queue of each queue that has one."""
        if not isinstance(claims, Mapping):
            raise ArgumentTypeError(f"claims must map queues to claim tokens, got {type(claims).__name__}")
        settled = [(self.address(queue), as_tokens(tokens)) for queue, tokens in claims.items()]
        audit = {address: where for address, _ in settled if (where := self.audit_address(address)) is not None}
        return settled, audit

    # -- receiving ---------------------------------------------------------------------------

    async def receive(
        self,
        queue: str | QueueAddress,
        max_messages: int = defaults.RECEIVE_BATCH,
        *,
        error_queue: str | QueueAddress | None = None,
    ) -> list[ReceivedMessage]:
        """Receive in ``none`` mode: the messages are gone from the queue when this returns (at-most-once)."""
        got = await self._run(self._receive_op(queue, max_messages, error_queue))
        self._reporter.taken(self.address(queue), got)
        return got

    def _receive_op(
        self,
        queue: str | QueueAddress,
        max_messages: int,
        error_queue: str | QueueAddress | None,
        *,
        atomic: bool = False,
    ) -> ops.Operation[ops.Taken]:
        check_positive("max_messages", max_messages)
        address = self.address(queue)
        return ops.receive(self.dialect, address, self.error_address(error_queue, address), max_messages, atomic=atomic)

    @asynccontextmanager
    async def receive_native(
        self, queue: str | QueueAddress, *, error_queue: str | QueueAddress | None = None
    ) -> AsyncIterator[ReceivedMessage | None]:
        """Receive in ``native`` mode: the block runs inside the receive transaction.

        Leaving the block normally commits the receive together with anything the block did on
        :attr:`connection` (and the message's audit copy, when the client audits); an exception
        rolls them all back and the message stays in the queue. Yields None when the queue is empty.
        The block runs in the message's ``process`` span, when tracing (:mod:`.tracing`).
        """
        receive = self._receive_op(queue, 1, error_queue, atomic=True)
        audit = self.audit_address(self.address(queue))  # refused before the handler runs, not after
        self._refuse_closed()
        async with self._lock, self.session.transaction(begun_by_first_statement=True):
            received = await ops.drive(receive, self.session.execute)
            self._reporter.taken(self.address(queue), received)
            started = datetime.now(UTC)
            with processing(
                lambda: self.dialect.format_address(self.address(queue)), received, database=self.dialect.name
            ):
                yield received[0] if received else None
            self._refuse_closed()
            if audit is not None and received:
                op = ops.audit(self.dialect, self.address(queue), audit, received, {received[0].id: started})
                await ops.drive(op, self.session.execute)

    async def claim(
        self,
        queue: str | QueueAddress,
        max_messages: int = defaults.RECEIVE_BATCH,
        *,
        lease: timedelta | float = defaults.LEASE,
        max_deliveries: int = defaults.MAX_DELIVERIES,
        error_queue: str | QueueAddress | None = None,
        holder: str | None = None,
    ) -> list[ReceivedMessage]:
        """Receive in ``claim`` mode: each message is leased to the caller until acked, nacked or the lease runs out.

        Renew the lease while working (:meth:`extend`, or :class:`~.lease.LeaseKeeper`); ``holder``
        says who holds the claims (default: this host and process).
        """
        holder = default_holder() if holder is None else holder
        got = await self._run(self._claim_op(queue, max_messages, lease, max_deliveries, error_queue, holder))
        self._reporter.taken(self.address(queue), got)
        return got

    async def reserve(
        self,
        queue: str | QueueAddress,
        max_messages: int = defaults.RECEIVE_BATCH,
        *,
        lease: timedelta | float = defaults.LEASE,
        max_deliveries: int = defaults.MAX_DELIVERIES,
        error_queue: str | QueueAddress | None = None,
    ) -> list[ReceivedMessage]:
        """Claim messages for someone else to :meth:`take` within ``lease``; counts no delivery.

        What a waiter that hands messages on uses (an Airflow trigger): if it dies before handing
        them over, they are back after one lease with no delivery spent. Reported as received when
        taken, not here; what it moved to the error queue, here.
        """
        got = await self._run(self._claim_op(queue, max_messages, lease, max_deliveries, error_queue, None))
        self._counted("moved_to_error", self.address(queue), got.moved_to_error)
        return got

    def _claim_op(
        self,
        queue: str | QueueAddress,
        max_messages: int,
        lease: timedelta | float,
        max_deliveries: int,
        error_queue: str | QueueAddress | None,
        holder: str | None,
        bodies: bool = True,
    ) -> ops.Operation[ops.Taken]:
        """A claim (``holder`` named) or a reservation (None); ``bodies`` False leaves them in the claim store."""
        check_positive("max_messages", max_messages)
        check_positive("max_deliveries", max_deliveries)
        address = self.address(queue)
        holder = None if holder is None else label("holder", holder)
        error = self.error_address(error_queue, address)
        return ops.claim(
            self.dialect, address, error, max_messages, lease_ms(lease), max_deliveries, holder, bodies=bodies
        )

    async def take(
        self,
        queue: str | QueueAddress,
        tokens: Token | Iterable[Token] | None = None,
        *,
        lease: timedelta | float = defaults.LEASE,
        holder: str | None = None,
        limit: int = defaults.ADOPT_LIMIT,
        error_queue: str | QueueAddress | None = None,
    ) -> list[ReceivedMessage]:
        """Take reserved messages: those of ``tokens``, or with None the queue's oldest reservations, up to ``limit``.

        Counts a delivery and gives each message a new token; reservations someone else took first
        are skipped, so a message has one owner.
        """
        check_positive("limit", limit)
        address = self.address(queue)
        holder = label("holder", default_holder() if holder is None else holder)
        chosen = None if tokens is None else as_tokens(tokens)
        error = self.error_address(error_queue, address)
        got = await self._run(ops.take(self.dialect, address, error, chosen, lease_ms(lease), holder, limit))
        self._reporter.taken(address, got)
        return got

    @overload
    async def ack(  # type: ignore[overload-overlap]  # str is Iterable too; this overload wins, as at run time
        self, queue: str | QueueAddress, tokens: Token, *, started: Mapping[uuid.UUID, datetime] | None = None
    ) -> bool: ...
    @overload
    async def ack(
        self,
        queue: str | QueueAddress,
        tokens: Iterable[Token],
        *,
        started: Mapping[uuid.UUID, datetime] | None = None,
    ) -> set[uuid.UUID]: ...
    async def ack(
        self,
        queue: str | QueueAddress,
        tokens: Token | Iterable[Token],
        *,
        started: Mapping[uuid.UUID, datetime] | None = None,
    ) -> bool | set[uuid.UUID]:
        """Acknowledge claims (one statement for any number).

        For one token: False means the lease ran out and someone else took the message. For many:
        the tokens that were still held. When the client audits, each acknowledged message is
        copied to the audit queue in the same transaction; ``started`` (message id -> time) says
        when its processing began, for the copy's ``NServiceBus.ProcessingStarted``.
        """
        address = self.address(queue)
        started = started_times(started)
        audit = self.audit_address(address)
        chosen = as_tokens(tokens)
        if audit is None:
            held = await self._run(ops.ack(self.dialect, address, chosen))
        else:
            held = await self._run(ops.ack_audited(self.dialect, address, chosen, audit, started or {}))
        self._counted("handled", address, len(held))
        self._counted("leases_lost", address, len(set(chosen)) - len(held))
        return one_or_many(tokens, held)

    @overload
    async def nack(  # type: ignore[overload-overlap]  # str is Iterable too; this overload wins, as at run time
        self,
        queue: str | QueueAddress,
        tokens: Token,
        *,
        error: BaseException | str | Failure | None = None,
        delay: timedelta | float = 0,
    ) -> bool: ...
    @overload
    async def nack(
        self,
        queue: str | QueueAddress,
        tokens: Iterable[Token],
        *,
        error: BaseException | str | Failure | None = None,
        delay: timedelta | float = 0,
    ) -> set[uuid.UUID]: ...
    async def nack(
        self,
        queue: str | QueueAddress,
        tokens: Token | Iterable[Token],
        *,
        error: BaseException | str | Failure | None = None,
        delay: timedelta | float = 0,
    ) -> bool | set[uuid.UUID]:
        """Give claims back: delivered again after ``delay``; ``error`` is what the error queue will say if they end there."""
        failure = None if error is None else Failure.of(error)
        address, chosen = self.address(queue), as_tokens(tokens)
        held = await self._run(ops.nack(self.dialect, address, chosen, failure, delay_ms(delay)))
        self._counted("failed", address, len(held))
        self._counted("leases_lost", address, len(set(chosen)) - len(held))
        return one_or_many(tokens, held)

    @overload
    async def extend(self, queue: str | QueueAddress, tokens: Token, lease: timedelta | float = ...) -> bool: ...  # type: ignore[overload-overlap]  # str is Iterable too; this overload wins, as at run time
    @overload
    async def extend(
        self, queue: str | QueueAddress, tokens: Iterable[Token], lease: timedelta | float = ...
    ) -> set[uuid.UUID]: ...
    async def extend(
        self, queue: str | QueueAddress, tokens: Token | Iterable[Token], lease: timedelta | float = defaults.LEASE
    ) -> bool | set[uuid.UUID]:
        """Renew claims for another ``lease``. False (or a missing token) means someone else has the message."""
        address, chosen = self.address(queue), as_tokens(tokens)
        held = await self._run(ops.extend(self.dialect, address, chosen, lease_ms(lease)))
        self._counted("leases_lost", address, len(set(chosen)) - len(held))
        return one_or_many(tokens, held)

    async def forward(
        self,
        claims: ByQueue[Token | Iterable[Token]],
        sends: ByQueue[Message | Iterable[Message]],
        *,
        notify: bool = False,
        started: Mapping[uuid.UUID, datetime] | None = None,
    ) -> int:
        """Acknowledge ``claims`` ({queue: tokens}) and send ``sends`` ({queue: messages}) in one transaction.

        Raises :class:`~.errors.LeaseLostError`, having sent and acknowledged nothing, when a claim
        is no longer held: the message may be with another consumer, whose result will be the one
        sent. Between stages in one database this makes the hand-off exactly-once. Returns how many
        messages were sent. Audit copies, when the client audits, are made as :meth:`ack` makes them.
        """
        if not isinstance(sends, Mapping):
            raise ArgumentTypeError(f"sends must map queues to messages, got {type(sends).__name__}")
        flag("notify", notify)
        started = started_times(started)
        settled, audit = self._claims(claims)
        batches = [(self.address(queue), as_messages(messages)) for queue, messages in sends.items()]
        sent = await self._run(ops.forward(self.dialect, settled, batches, notify, audit, started))
        for address, tokens in settled:
            self._counted("handled", address, len(tokens))
        for address, batch in batches:
            self._counted("sent", address, len(batch))
        return sent

    async def fail(
        self,
        queue: str | QueueAddress,
        message: ReceivedMessage,
        error: BaseException | str,
        *,
        error_queue: str | QueueAddress | None = None,
    ) -> bool:
        """Move a claimed message to the error queue now, with failure headers (no further deliveries).

        False when its claim is not held on ``queue``: the lease ran out and someone else has it, or
        the message was claimed from another queue (then nothing is moved).
        """
        if received("message", message).claim_token is None:
            raise InvalidArgumentError(
                "fail() takes a claimed message; use move_to_error() for one received in none mode"
            )
        address = self.address(queue)
        moved = await self._run(
            ops.fail_claim(self.dialect, address, self.error_address(error_queue, address), message, error)
        )
        self._counted("moved_to_error" if moved else "leases_lost", address, 1)
        return moved

    async def move_to_error(
        self,
        queue: str | QueueAddress,
        message: ReceivedMessage,
        error: BaseException | str | None,
        *,
        error_queue: str | QueueAddress | None = None,
    ) -> None:
        """Put a message received in ``none`` mode into the error queue with NServiceBus failure headers."""
        address = self.address(queue)
        received("message", message)
        error_address = self.error_address(error_queue, address)
        await self._run(ops.move_to_error(self.dialect, address, error_address, message, error))
        self._counted("moved_to_error", address, 1)

    async def retry_errors(
        self,
        error_queue: str | QueueAddress | None = None,
        *,
        queue: str | QueueAddress | None = None,
        limit: int = defaults.RETRY_LIMIT,
        seqs: Iterable[int] | None = None,
    ) -> int:
        """Send up to ``limit`` failed messages back to the queue they failed in; returns how many.

        Only ``queue``'s failures when given, only the messages at ``seqs`` (their place in the error
        queue, as :meth:`failed_messages` shows it) when given. The error queue is ``error_queue``,
        else the client's, else ``error`` -- in ``queue``'s schema when a queue is given. The error
        queue is read in bounded passes (:meth:`retry_errors_page`), each its own transaction, so a
        long error queue is never locked whole; messages that cannot be routed stay and are logged.
        """
        check_positive("limit", limit)
        retried, after = 0, 0
        while True:
            page = await self.retry_errors_page(error_queue, queue=queue, after=after, limit=limit - retried, seqs=seqs)
            retried += page.retried
            if page.done or retried >= limit:
                return retried
            after = page.after

    async def retry_errors_page(
        self,
        error_queue: str | QueueAddress | None = None,
        *,
        queue: str | QueueAddress | None = None,
        after: int = 0,
        limit: int = defaults.RETRY_LIMIT,
        seqs: Iterable[int] | None = None,
    ) -> ops.RetryPage:
        """One bounded pass of :meth:`retry_errors`: up to ``limit`` messages among the next
        ``defaults.ERROR_SCAN_ROWS`` rows after Seq ``after``; continue from the page's ``after``
        until it is ``done``. What a caller that must answer quickly (a web request) runs."""
        check_positive("limit", limit)
        place("after", after)
        only = self.address(queue) if queue is not None else None
        chosen = None if seqs is None else error_seqs(seqs)
        op = ops.retry_from_error(
            self.dialect,
            self.error_address(error_queue, only),
            limit=limit,
            after=after,
            scan=defaults.ERROR_SCAN_ROWS,
            only_queue=only,
            seqs=chosen,
        )
        page = await self._run(op)
        self._counted("retried", self.error_address(error_queue, only), page.retried)
        return page

    async def error_summary(
        self,
        error_queue: str | QueueAddress | None = None,
        *,
        queue: str | QueueAddress | None = None,
        limit: int = defaults.ERROR_SUMMARY_ROWS,
    ) -> list[ops.ErrorGroup]:
        """The newest ``limit`` failed messages grouped by source queue and exception type (headers only).

        The error queue is chosen as for :meth:`retry_errors`.
        """
        check_positive("limit", limit)
        near = self.address(queue) if queue is not None else None
        op = ops.error_summary(self.dialect, self.error_address(error_queue, near), limit)
        return await self._run(op if near is None else ops.checked(self.dialect, [near], op))

    async def failed_messages(
        self,
        error_queue: str | QueueAddress | None = None,
        *,
        queue: str | QueueAddress | None = None,
        before: int | None = None,
        limit: int = defaults.FAILED_PAGE,
        group: tuple[str, str] | None = None,
        preview: int = defaults.BODY_PREVIEW_BYTES,
    ) -> tuple[list[ops.FailedMessage], int | None]:
        """The newest ``limit`` messages of the error queue (below Seq ``before``), with their headers and the
        first ``preview`` bytes of their bodies; and the ``before`` of the next page (None: no more).

        ``group`` (source queue, exception type), as :meth:`error_summary` names groups, keeps that
        group's messages only; the error queue is chosen as for :meth:`retry_errors`.
        """
        check_positive("limit", limit)
        check_positive("preview", preview)
        if before is not None:
            place("before", before)
        if group is not None:
            if not (isinstance(group, tuple) and len(group) == 2):
                raise ArgumentTypeError(f"group must be a (source queue, exception type) pair, got {group!r:.80}")
            group = (label("group's source queue", group[0]), label("group's exception type", group[1]))
        near = self.address(queue) if queue is not None else None
        op = ops.failed_messages(
            self.dialect,
            self.error_address(error_queue, near),
            before=before,
            limit=limit,
            preview=preview,
            group=group,
            scan=defaults.ERROR_SCAN_ROWS,
        )
        return await self._run(op if near is None else ops.checked(self.dialect, [near], op))

    # -- inspection and maintenance ------------------------------------------------------------

    async def journey(
        self,
        message_or_trace: str | uuid.UUID,
        *,
        queues: str | QueueAddress | Iterable[str | QueueAddress] | None = None,
        scan: int = defaults.JOURNEY_SCAN,
        limit: int = defaults.JOURNEY_LIMIT,
        lock_wait: timedelta | float = defaults.WATCH_LOCK_TIMEOUT,
    ) -> ops.Journey:
        """Where a message went: the rows it left in ``queues`` (None: every queue the connection may
        read) and their schemas' claim stores -- audit copies, failures, claims, the row still waiting
        -- by its id; or, given a trace id (or a ``traceparent``), those of every message of the trace:
        a bounded scan of each table's newest ``scan`` rows' headers (:mod:`.operations.journey`).
        ``lock_wait``: how long the first locked table is waited for before it is left out (as in :meth:`health`)."""
        kind, key = ops.journey_key(message_or_trace)
        check_positive("scan", scan)
        check_positive("limit", limit)
        wait = lock_wait_span(lock_wait)
        addresses = await self.queues() if queues is None else self._addresses(queues)
        found = await ops.journey(
            self._run, self.dialect, kind, key, addresses, scan, limit, wait, survey=queues is None
        )
        hidden = None if queues is not None else await self._run(ops.unreadable_queues(self.dialect))
        return found if hidden is None else replace(found, unreadable=hidden[0])

    async def peek(self, queue: str | QueueAddress, *, include_claims: bool = False) -> int:
        """Cheap estimate of waiting messages (plus claims whose lease ran out, when asked)."""
        return await self._run(ops.peek(self.dialect, self.address(queue), flag("include_claims", include_claims)))

    async def depth(self, queue: str | QueueAddress) -> int:
        """Exact count of waiting messages (scans the table)."""
        return await self._run(ops.depth(self.dialect, self.address(queue)))

    async def browse(self, queue: str | QueueAddress, limit: int = defaults.BROWSE_LIMIT) -> list[ReceivedMessage]:
        """Waiting, unexpired messages in send order, without removing or locking them."""
        return (await self.browse_page(queue, limit)).messages

    async def browse_page(
        self,
        queue: str | QueueAddress,
        limit: int = defaults.BROWSE_LIMIT,
        *,
        after: int = 0,
        last: int = defaults.LAST_SEQ,
    ) -> ops.BrowsePage:
        """One page of :meth:`browse` over the rows with ``after`` < Seq <= ``last``; pass the page's
        ``after`` to read on. Bounds come from :meth:`seq_range`: a range read in parallel pages."""
        check_positive("limit", limit)
        op = ops.browse(self.dialect, self.address(queue), limit, place("after", after), place("last", last))
        return await self._run(op)

    async def browse_columns(
        self,
        queue: str | QueueAddress,
        limit: int = defaults.BROWSE_LIMIT,
        *,
        after: int = 0,
        last: int = defaults.LAST_SEQ,
        locked_by: int | None = None,
    ) -> ops.BrowseColumns:
        """:meth:`browse_page` as columns (ids as text, headers, bodies), with no message object per
        row: for a bulk reader such as a Spark partition, which builds its own columns from them.

        ``locked_by``: only the messages that transaction holds locked, the ``xid`` of a batch another
        session's :meth:`lock` took -- how that batch's readers read it, while its block is open (after,
        a page that finds nothing raises :class:`~.errors.InvalidArgumentError`). PostgreSQL only."""
        check_positive("limit", limit)
        xid = None if locked_by is None else transaction_id("locked_by", locked_by)
        op = ops.browse_columns(
            self.dialect, self.address(queue), limit, place("after", after), place("last", last), xid
        )
        return await self._run(op)

    async def seq_range(self, queue: str | QueueAddress) -> tuple[int, int] | None:
        """The lowest and highest Seq of the queue's rows (None when it is empty): where a reader of the
        whole queue starts and stops, so messages sent while it reads are left for the next read."""
        return await self._run(ops.seq_range(self.dialect, self.address(queue)))

    # -- claims found by holder ------------------------------------------------------------------
    #
    # A holder names a unit of work that may be retried (a Spark batch): its claims are taken once,
    # under that name, then read, renewed and settled by the name alone, from any process.

    async def held(
        self, queue: str | QueueAddress, holder: str, *, parts: int = defaults.HELD_PARTS, part: int = 0
    ) -> list[ReceivedMessage]:
        """The messages ``holder`` holds on the queue, in send order; with ``parts``, only the share
        ``part`` (Seq modulo ``parts``), so that many readers split them without overlap."""
        check_positive("parts", parts)
        if place("part", part) >= parts:
            raise InvalidArgumentError(f"part must be an integer from 0 to {parts - 1}, got {part!r}")
        return await self._run(ops.held(self.dialect, self.address(queue), label("holder", holder), parts, part))

    async def held_columns(
        self, queue: str | QueueAddress, holder: str, *, parts: int = defaults.HELD_PARTS, part: int = 0
    ) -> ops.HeldColumns:
        """:meth:`held` as columns (ids as text, headers, bodies, deliveries), with no message object
        per row: for a bulk reader such as a Spark partition."""
        check_positive("parts", parts)
        if place("part", part) >= parts:
            raise InvalidArgumentError(f"part must be an integer from 0 to {parts - 1}, got {part!r}")
        op = ops.held_columns(self.dialect, self.address(queue), label("holder", holder), parts, part)
        return await self._run(op)

    async def ack_held(self, queue: str | QueueAddress, holder: str) -> int:
        """Acknowledge every claim ``holder`` holds on the queue; returns how many."""
        address, holder = self.address(queue), label("holder", holder)
        audit_address = self.audit_address(address)
        if audit_address is None:
            return await self._run(ops.ack_held(self.dialect, address, holder))
        return await self._run(ops.ack_held_audited(self.dialect, address, holder, audit_address))

    async def hold(
        self,
        queue: str | QueueAddress,
        holder: str,
        max_messages: int,
        *,
        lease: timedelta | float = defaults.LEASE,
        max_deliveries: int = defaults.MAX_DELIVERIES,
    ) -> int:
        """Make ``holder`` hold up to ``max_messages`` claims, their bodies left in the claim store for a
        bulk reader (:meth:`held_columns`); returns how many it holds. A holder that holds claims keeps
        exactly those (renewed): a repeated read (a retried Spark batch) is the same read until settled."""
        check_positive("max_messages", max_messages, defaults.MAX_HELD)
        check_positive("max_deliveries", max_deliveries)
        address, holder, lease_in_ms = self.address(queue), label("holder", holder), lease_ms(lease)
        held = await self._run(ops.extend_held(self.dialect, address, holder, lease_in_ms))
        if held:
            return held
        while held < max_messages:
            step = min(max_messages - held, defaults.MAX_BATCH)
            got = await self._run(self._claim_op(queue, step, lease, max_deliveries, None, holder, bodies=False))
            self._reporter.taken(address, got)
            held += len(got)
            if len(got) < step:
                break
        return held

    async def extend_held(
        self, queue: str | QueueAddress, holder: str, lease: timedelta | float = defaults.LEASE
    ) -> int:
        """Renew every claim ``holder`` holds for another ``lease``, lapsed ones that nobody took
        over included; returns how many it still holds."""
        address, holder = self.address(queue), label("holder", holder)
        return await self._run(ops.extend_held(self.dialect, address, holder, lease_ms(lease)))

    async def nack_held(
        self,
        queue: str | QueueAddress,
        holder: str,
        *,
        error: BaseException | str | Failure | None = None,
        delay: timedelta | float = 0,
    ) -> int:
        """Give back every claim ``holder`` holds, delivered again after ``delay``; returns how many."""
        failure = None if error is None else Failure.of(error)
        address, holder = self.address(queue), label("holder", holder)
        return await self._run(ops.nack_held(self.dialect, address, holder, failure, delay_ms(delay)))

    # -- batches locked by a transaction ---------------------------------------------------------
    #
    # NServiceBus's native receive, for a batch that other sessions read (a Spark job's executors):
    # a transaction() block locks it, the readers read it meanwhile, and the block settles it.

    async def lock(
        self, queue: str | QueueAddress, max_messages: int, *, error_queue: str | QueueAddress | None = None
    ) -> ops.LockedBatch:
        """Lock up to ``max_messages`` of the queue's oldest unexpired messages in this client's open
        :meth:`transaction` block (the outermost), for other sessions to read while the block is open
        (:meth:`browse_columns` with ``locked_by=batch.xid``, ``after=batch.after``, ``last=batch.last``);
        settle them before it ends with :meth:`ack_locked` or :meth:`nack_locked`.

        Nothing is moved while they are held: locking 200,000 messages costs what locking their rows
        costs, where :meth:`hold` moves each into the claim store. What the claim store keeps and a
        lock gives up: a delivery count (``max_deliveries`` never applies), and settling from another
        process. If the block ends without an ack -- it raised, the process died, its connection was cut
        -- every message is back as it was, with no delivery counted. The open block keeps
        PostgreSQL's xmin horizon where it began, for every table of the database: vacuum removes no
        dead row until it ends. Rows other receivers hold are skipped; rows whose headers cannot be
        read are locked and named in ``poison``, for the settle to move to the error queue (which must
        exist). Other calls in the block must not receive from the queue: they would take the
        batch's own rows. PostgreSQL only (SQL Server's readers cannot tell one transaction's locks from another's).
        """
        check_positive("max_messages", max_messages, defaults.MAX_HELD)
        address = self.address(queue)
        op = ops.lock_batch(self.dialect, address, self.error_address(error_queue, address), max_messages)
        async with self._lock:
            self._refuse_closed()
            self._in_block("lock", outermost=True)
            if self.dialect.name_key(address) in self._locked:  # its readers would read both batches as one
                raise InvalidArgumentError(
                    f"this block has locked a batch of {self.dialect.qualified_name(address)} already: a block's "
                    "locks carry one id, so a second batch's readers would read the first's too; lock up to "
                    "max_messages at once, or one batch per block"
                )
            batch = await ops.drive(op, self.session.execute)  # in the block's transaction, not a savepoint of it
            self._locked.add(self.dialect.name_key(address))
        self._counted("received", address, batch.count - len(batch.poison))
        return batch

    async def ack_locked(
        self, queue: str | QueueAddress, batch: ops.LockedBatch, *, error_queue: str | QueueAddress | None = None
    ) -> int:
        """Acknowledge a batch :meth:`lock` locked, in the block that locked it: its messages deleted
        (copied to the audit queue when the client audits), its poison moved, unchanged, to the error
        queue, all committing when the block does. Rows sent into its Seq range since, or held by
        others, are not touched. Returns how many messages were acknowledged (one whose time to be
        received passed while held is deleted uncounted)."""
        address, batch = self.address(queue), locked_batch(batch)
        error, audit = self.error_address(error_queue, address), self.audit_address(address)
        async with self._lock:
            self._in_block("ack_locked")
            handled, moved = await self._run(ops.ack_locked(self.dialect, address, error, batch, audit))
        self._counted("handled", address, handled)
        self._counted("moved_to_error", address, moved)
        return handled

    async def nack_locked(
        self, queue: str | QueueAddress, batch: ops.LockedBatch, *, error_queue: str | QueueAddress | None = None
    ) -> int:
        """Give back a batch :meth:`lock` locked, in the block that locked it: its poison is moved to the
        error queue (committing with the block: end it normally), nothing else is touched, and the other
        messages are receivable again once the block ends, with no delivery counted. Returns how many."""
        address, batch = self.address(queue), locked_batch(batch)
        error = self.error_address(error_queue, address)
        async with self._lock:
            self._in_block("nack_locked")
            given_back, moved = await self._run(ops.nack_locked(self.dialect, address, error, batch))
        self._counted("failed", address, given_back)
        self._counted("moved_to_error", address, moved)
        return given_back

    # -- the write ledger ------------------------------------------------------------------------

    async def create_writes(self, ledger: str | QueueAddress) -> QueueAddress:
        """Create a write ledger (idempotent, safe concurrently; needs CREATE on the schema); returns its address."""
        address = self.address(ledger)
        await self._install_plan(Installation(self.dialect, ((TableKind.WRITES, address),)))
        return address

    async def record_write(self, ledger: str | QueueAddress, write: uuid.UUID, part: int) -> bool:
        """Record, in the caller's :meth:`transaction`, that partition ``part`` of ``write`` is being
        sent; False when it was sent before, so a re-run partition sends nothing."""
        write, part = uuid_value("write", write), place("part", part)
        return await self._run(ops.record_write(self.dialect, self.address(ledger), write, part))

    async def forget_write(self, ledger: str | QueueAddress, write: uuid.UUID) -> int:
        """Delete a finished write's ledger rows; returns how many."""
        return await self._run(ops.forget_write(self.dialect, self.address(ledger), uuid_value("write", write)))

    async def queues(self) -> list[QueueAddress]:
        """Every queue table of the connection's database that it may read, by schema and name.

        Tables an NServiceBus endpoint created count as well as this library's: a queue is a table
        with the columns NServiceBus reads. Error and audit queues are among them.
        """
        return (await self.queue_page(limit=defaults.MAX_BATCH)).queues

    async def queue_page(
        self, search: str = "", *, offset: int = 0, limit: int = defaults.QUEUES_PAGE
    ) -> ops.QueuePage:
        """A page of :meth:`queues`: those whose ``schema.table`` holds ``search`` (ignoring case), from
        the ``offset``-th on, with how many match in all; the database filters and pages."""
        search = checked_text("search", search, limit=defaults.MAX_LABEL, empty=True)
        check_positive("limit", limit)
        return await self._run(ops.list_queues(self.dialect, search, place("offset", offset), limit))

    async def error_queues(self) -> list[QueueAddress]:
        """Every error queue of the connection's database that it may read, in whichever schema: the
        tables :meth:`kind` calls ``error``, as :meth:`health` tells them apart.

        Where a look at failures starts when no queue is named: queues live in a schema of their
        own as often as in the default one, and each schema has its error queue beside its queues.
        """
        named = self._error_of(None, None).table  # the database narrows by name; kind() decides
        page = await self.queue_page(named, limit=defaults.MAX_BATCH)
        return [address for address in page.queues if self.kind(address) == "error"]

    async def queue_stats(
        self,
        queues: str | QueueAddress | Iterable[str | QueueAddress],
        *,
        expired_limit: int = defaults.EXPIRED_COUNT_LIMIT,
        lock_wait: timedelta | float = defaults.WATCH_LOCK_TIMEOUT,
    ) -> list[ops.QueueStats]:
        """Waiting (estimated), age of the oldest, expired (counted up to ``expired_limit``), in flight
        and lapsed, per queue: indexed reads whose cost does not grow with the queues' length.

        A table another session holds locked (a migration, ``VACUUM FULL``) is waited for at most
        ``lock_wait``, then :class:`~.errors.LockTimeoutError` names it: a watcher never hangs.
        On SQL Server the figures read past locked rows, and a table locked whole (a schema change) is
        waited for as the session's ``LOCK_TIMEOUT`` says: there a ``SET`` outlives the transaction, so
        ``lock_wait`` is not applied (the ``sqlqueue`` commands bound their session by ``--lock-timeout``)."""
        check_positive("expired_limit", expired_limit)
        wait = lock_wait_span(lock_wait)
        return await self._run(ops.queue_stats(self.dialect, self._addresses(queues), expired_limit, wait))

    def _addresses(self, queues: str | QueueAddress | Iterable[str | QueueAddress]) -> list[QueueAddress]:
        """One queue or many, as checked addresses."""
        if isinstance(queues, (str, QueueAddress)):
            return [self.address(queues)]
        if isinstance(queues, Iterable) and not isinstance(queues, (bytes, Mapping)):
            return [self.address(q) for q in queues]
        raise ArgumentTypeError(f"queues must be a queue or an iterable of queues, got {type(queues).__name__}")

    async def horizon(self) -> ops.Horizon | None:
        """What holds back vacuum in the database (PostgreSQL's xmin horizon): the sessions, prepared
        transactions or replication slots, oldest first, since when; None on SQL Server, which keeps no
        such horizon."""
        return await self._run(ops.horizon(self.dialect, defaults.HORIZON_HOLDERS))

    async def health(
        self,
        queues: str | QueueAddress | Iterable[str | QueueAddress] | None = None,
        *,
        expired_limit: int = defaults.EXPIRED_COUNT_LIMIT,
        report_unreadable: bool = False,
        lock_wait: timedelta | float = defaults.WATCH_LOCK_TIMEOUT,
    ) -> Health:
        """:meth:`queue_stats` of ``queues`` (None: every queue the connection may read) and the database's
        :meth:`horizon`, with what is wrong with them (:func:`~.health.problems`: a horizon held long,
        lapsed claims, due delayed messages no mover moved, dead rows piling up, failed messages in an
        error queue).

        Queues named are looked at with their error queues (as this client names them, in their
        schemas): a check of ``orders`` alone also finds the failed messages waiting there, as a
        ``failed`` problem of the error queue; its figures are not added to the queues'.

        ``report_unreadable``: a queue that cannot be measured -- dropped since it was listed, no
        longer a queue, its claim store or delayed table broken, no rights on it -- is reported as an
        ``unreadable`` problem and the others are measured, instead of the call failing: what a survey
        of many queues (a dashboard, a monitoring check) wants. A lost connection still fails it. A survey
        of every queue that finds none the connection may read is an ``unreadable`` problem of the database,
        naming the rights it lacks: nothing was looked at, which is no clean bill of health.

        ``lock_wait``: how long the first locked table is waited for, as in :meth:`queue_stats`; once
        one was found locked, the survey's other tables are waited for at most
        ``defaults.WATCH_LOCK_TIMEOUT_AFTER_ONE`` each.
        """
        check_positive("expired_limit", expired_limit)
        flag("report_unreadable", report_unreadable)
        wait = lock_wait_span(lock_wait)  # one wait per call: after a lock timed out, locked tables fail at once
        addresses = await self.queues() if queues is None else self._addresses(queues)
        stats: list[ops.QueueStats] = []
        unreadable: list[Problem] = []
        for address in addresses:  # one at a time: a queue that fails leaves the others measured
            try:
                stats += await self._run(ops.queue_stats(self.dialect, [address], expired_limit, wait))
            except LockTimeoutError as exc:  # a migration's lock: this queue waits, the others do not
                if not report_unreadable:
                    raise
                wait = min(wait, defaults.WATCH_LOCK_TIMEOUT_AFTER_ONE)
                unreadable.append(Problem("unreadable", address, f"cannot be measured now: {one_line(exc)}"))
            except CALL_ENDING:
                raise
            except SqlQueueError as exc:
                if not report_unreadable:
                    raise
                log.warning("Leaving %s out of the health figures: %s", self.dialect.qualified_name(address), exc)
                unreadable.append(Problem("unreadable", address, f"cannot be measured: {one_line(exc)}"))
        if queues is None and not addresses:  # a survey of nothing is no clean bill of health
            unreadable.append(nothing_read(await self._run(ops.unreadable_queues(self.dialect))))
        beside = [] if queues is None else await self._error_queue_stats(addresses, expired_limit, wait)
        horizon = await self.horizon()
        now = datetime.now(UTC)
        error_queues = {s.queue for s in stats + beside if self.kind(s.queue) == "error"}
        return Health(
            stats,
            horizon,
            now,
            problems(stats + beside, horizon, error_queues, now, self.canonical_address) + unreadable,
        )

    async def _error_queue_stats(
        self, queues: list[QueueAddress], expired_limit: int, lock_wait: timedelta
    ) -> list[ops.QueueStats]:
        """The figures of the error queues of ``queues`` that are not among them, each once: what
        :meth:`health` of named queues looks at for their failures. One that cannot be measured (not
        created yet, no rights, locked) is left out: the queues named are what the call is about."""
        found: list[ops.QueueStats] = []
        looked: list[QueueAddress] = list(queues)
        for queue in queues:
            error = self._error_of(None, queue)
            if any(same_table(self.dialect, error, other) for other in looked):
                continue
            looked.append(error)
            try:
                found += await self._run(ops.queue_stats(self.dialect, [error], expired_limit, lock_wait))
            except SqlQueueError as exc:
                if isinstance(exc, CALL_ENDING) and not isinstance(exc, LockTimeoutError):
                    raise
                log.info(
                    "Health of %s: its error queue cannot be looked at (%s)", self.dialect.qualified_name(queue), exc
                )
        return found

    async def claims(self, queue: str | QueueAddress, limit: int = defaults.CLAIMS_PAGE) -> list[ops.ClaimInfo]:
        """The queue's ``limit`` claims whose leases end first (lapsed first): who holds what, and for how long still."""
        check_positive("limit", limit)
        return await self._run(ops.claims(self.dialect, self.address(queue), limit))

    async def release_lapsed(self, queue: str | QueueAddress, *, batch_size: int = defaults.RELEASE_BATCH) -> int:
        """Give every lapsed claim of the queue back to the queue table (``batch_size`` per transaction); returns how many.

        Claim-mode receivers take lapsed claims again by themselves; given back, the messages reach
        every receiver, an NServiceBus endpoint too. They join the back of the queue with a fresh
        delivery count. Safe beside receivers: a claim renewed or settled meanwhile is not touched.
        """
        check_positive("batch_size", batch_size)
        address = self.address(queue)
        return await self._in_batches(partial(ops.release_lapsed, self.dialect, address, batch_size), batch_size)

    async def lapsed_claims(self, queue: str | QueueAddress) -> int:
        """Claims on ``queue`` whose lease ran out: their holders are gone or stuck, and the messages are receivable again."""
        return (await self._run(ops.peek_claims(self.dialect, self.address(queue))))[1]

    async def in_flight(self, queue: str | QueueAddress) -> int:
        """Claimed, unacknowledged messages of the queue."""
        return await self._run(ops.in_flight(self.dialect, self.address(queue)))

    async def purge_expired(self, queue: str | QueueAddress, batch_size: int = defaults.PURGE_BATCH) -> int:
        """Delete expired messages in batches of ``batch_size``, each in its own short transaction."""
        check_positive("batch_size", batch_size)
        address = self.address(queue)
        return await self._in_batches(partial(ops.purge_expired_batch, self.dialect, address, batch_size), batch_size)

    async def purge(self, queue: str | QueueAddress) -> int:
        """Delete every message in the queue; returns how many."""
        return await self._run(ops.purge_all(self.dialect, self.address(queue)))


P = ParamSpec("P")


def _blocking(
    call: Callable[Concatenate[AsyncQueueClient, P], Coroutine[Any, Any, T]],
) -> Callable[Concatenate[QueueClient, P], T]:
    """``call`` of :class:`AsyncQueueClient` as a method of :class:`QueueClient`: the same coroutine,
    over the client's blocking session, run to its end in the caller's thread (:func:`finish`)."""

    @functools.wraps(call)
    def method(self: QueueClient, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return finish(call(self._calls, *args, **kwargs))

    return method


class QueueClient(Addressing):
    """Blocking queue operations over one connection (psycopg 3 for PostgreSQL, pymssql or pyodbc for SQL Server).

    ``QueueClient.connect(uri)`` opens and owns an autocommit connection (``postgresql://``,
    ``mssql://`` for pymssql, ``mssql+pyodbc://`` or an ODBC connection string for pyodbc);
    ``QueueClient.connect(connection)`` borrows a DB-API connection of one of those drivers. Use it
    as a context manager to close what it owns.

    Each method is :class:`AsyncQueueClient`'s, run over a blocking session: one implementation,
    the same checks and results. A client may be shared by threads: its calls take turns on its
    one connection (a :meth:`receive_native` or :meth:`transaction` block holds it until the block
    ends). For calls in parallel, give each thread a client of its own.
    """

    def __init__(
        self,
        session: Session,
        error_queue: str | QueueAddress | None = None,
        audit_queue: str | QueueAddress | bool | None = None,
    ) -> None:
        if not session.blocking:
            raise ArgumentTypeError("QueueClient needs a blocking session; use AsyncQueueClient with an asyncio one")
        super().__init__(session.dialect, error_queue, audit_queue)
        self.session = session
        self._calls = AsyncQueueClient(session, error_queue, audit_queue)
        self._calls._lock = ThreadLock()  # noqa: SLF001  # private to this module's own classes

    @classmethod
    def connect(
        cls,
        target: Any,
        error_queue: str | QueueAddress | None = None,
        audit_queue: str | QueueAddress | bool | None = None,
    ) -> QueueClient:
        """Open a client from a URI/DSN (owned connection) or wrap an existing DB-API connection (borrowed)."""
        return cls(finish(open_session(target, blocking=True)), error_queue, audit_queue)

    @property
    def connection(self) -> Any:
        """The DB-API connection (in :meth:`receive_native`, the one holding the receive transaction)."""
        return self.session.connection

    @property
    def meter(self) -> Meter:
        """Where the client reports what it moved (see :attr:`AsyncQueueClient.meter`)."""
        return self._calls.meter

    @meter.setter
    def meter(self, meter: Meter) -> None:
        self._calls.meter = meter

    def __enter__(self) -> QueueClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def transaction(self) -> AbstractContextManager[None]:
        """As :meth:`AsyncQueueClient.transaction`: the block's calls of this client commit together."""
        return blocking_context(self._calls.transaction())

    def receive_native(
        self, queue: str | QueueAddress, *, error_queue: str | QueueAddress | None = None
    ) -> AbstractContextManager[ReceivedMessage | None]:
        """As :meth:`AsyncQueueClient.receive_native`: the block runs inside the receive transaction."""
        return blocking_context(self._calls.receive_native(queue, error_queue=error_queue))

    close = _blocking(AsyncQueueClient.close)
    create_queue = _blocking(AsyncQueueClient.create_queue)
    drop_queue = _blocking(AsyncQueueClient.drop_queue)
    check_queue = _blocking(AsyncQueueClient.check_queue)
    send = _blocking(AsyncQueueClient.send)
    send_copied = _blocking(AsyncQueueClient.send_copied)
    send_csv = _blocking(AsyncQueueClient.send_csv)
    move_due = _blocking(AsyncQueueClient.move_due)
    next_due = _blocking(AsyncQueueClient.next_due)
    create_subscription_table = _blocking(AsyncQueueClient.create_subscription_table)
    subscribe = _blocking(AsyncQueueClient.subscribe)
    unsubscribe = _blocking(AsyncQueueClient.unsubscribe)
    subscribers = _blocking(AsyncQueueClient.subscribers)
    publish = _blocking(AsyncQueueClient.publish)
    receive = _blocking(AsyncQueueClient.receive)
    claim = _blocking(AsyncQueueClient.claim)
    reserve = _blocking(AsyncQueueClient.reserve)
    take = _blocking(AsyncQueueClient.take)
    ack = _blocking(AsyncQueueClient.ack)
    nack = _blocking(AsyncQueueClient.nack)
    extend = _blocking(AsyncQueueClient.extend)
    forward = _blocking(AsyncQueueClient.forward)
    fail = _blocking(AsyncQueueClient.fail)
    move_to_error = _blocking(AsyncQueueClient.move_to_error)
    retry_errors = _blocking(AsyncQueueClient.retry_errors)
    retry_errors_page = _blocking(AsyncQueueClient.retry_errors_page)
    error_summary = _blocking(AsyncQueueClient.error_summary)
    failed_messages = _blocking(AsyncQueueClient.failed_messages)
    journey = _blocking(AsyncQueueClient.journey)
    peek = _blocking(AsyncQueueClient.peek)
    depth = _blocking(AsyncQueueClient.depth)
    browse = _blocking(AsyncQueueClient.browse)
    browse_page = _blocking(AsyncQueueClient.browse_page)
    browse_columns = _blocking(AsyncQueueClient.browse_columns)
    seq_range = _blocking(AsyncQueueClient.seq_range)
    held = _blocking(AsyncQueueClient.held)
    held_columns = _blocking(AsyncQueueClient.held_columns)
    ack_held = _blocking(AsyncQueueClient.ack_held)
    extend_held = _blocking(AsyncQueueClient.extend_held)
    hold = _blocking(AsyncQueueClient.hold)
    nack_held = _blocking(AsyncQueueClient.nack_held)
    lock = _blocking(AsyncQueueClient.lock)
    ack_locked = _blocking(AsyncQueueClient.ack_locked)
    nack_locked = _blocking(AsyncQueueClient.nack_locked)
    create_writes = _blocking(AsyncQueueClient.create_writes)
    record_write = _blocking(AsyncQueueClient.record_write)
    forget_write = _blocking(AsyncQueueClient.forget_write)
    queues = _blocking(AsyncQueueClient.queues)
    queue_page = _blocking(AsyncQueueClient.queue_page)
    error_queues = _blocking(AsyncQueueClient.error_queues)
    queue_stats = _blocking(AsyncQueueClient.queue_stats)
    horizon = _blocking(AsyncQueueClient.horizon)
    health = _blocking(AsyncQueueClient.health)
    claims = _blocking(AsyncQueueClient.claims)
    release_lapsed = _blocking(AsyncQueueClient.release_lapsed)
    lapsed_claims = _blocking(AsyncQueueClient.lapsed_claims)
    in_flight = _blocking(AsyncQueueClient.in_flight)
    purge_expired = _blocking(AsyncQueueClient.purge_expired)
    purge = _blocking(AsyncQueueClient.purge)
