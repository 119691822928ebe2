"""The queue hook: the transport core behind an Airflow connection id.

One hook serves ``postgres``, ``mssql`` and ``odbc`` connections (as the postgres, microsoft-mssql
and odbc providers define them) and this provider's own ``sqlqueue`` type, whose ``dialect`` extra
says which database it is. Connection handling is the owning provider's: for PostgreSQL the
connection arguments come from :class:`~airflow.providers.postgres.hooks.postgres.PostgresHook`
(IAM tokens, ``options``, libpq extras), so a connection that works with ``PostgresHook`` works
here; SQL Server connections are opened by ``MsSqlHook`` (pymssql; also for ``sqlqueue``
connections with ``dialect=sqlserver``) or ``OdbcHook`` (pyodbc). The hook never builds SQL:
every call goes through the transport core.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from airflow.providers.postgres.hooks.postgres import PostgresHook
from airflow.sdk import BaseHook

from ..transport import (
    AsyncQueueClient,
    Failure,
    LeaseKeeper,
    Message,
    QueueAddress,
    QueueClient,
    ReceivedMessage,
    TransactionMode,
    defaults,
)
from ..transport.client import Addressing, Token, as_messages, as_tokens
from ..transport.dialects import get_dialect
from ..transport.drivers import PsycopgSession, Session, ThreadSession, finish, opening, session_over
from ..transport.errors import InvalidArgumentError, SqlQueueError, TransportMisconfiguredError
from ..transport.operations import ClaimInfo, ErrorGroup, FailedMessage, QueueStats, RetryPage

if TYPE_CHECKING:
    from airflow.providers.microsoft.mssql.hooks.mssql import MsSqlHook
    from airflow.providers.odbc.hooks.odbc import OdbcHook
    from airflow.sdk import Connection


def configured_conn_ids() -> list[str]:
    """The connection ids ``[sqlqueue] connections`` names: those the Queues page and the metrics look
    at besides the metadata database's (connections in the environment or a secrets backend cannot be listed)."""
    from airflow.sdk import conf

    text = conf.get("sqlqueue", "connections", fallback="") or ""
    return [name.strip() for name in text.split(",") if name.strip()]


#: Extras of a connection that configure the queue rather than the database driver.
QUEUE_EXTRAS = frozenset({"dialect", "error_queue", "audit_queue"})

#: Which dialect serves each connection type.
DIALECT_OF_CONN_TYPE = {"postgres": "postgres", "postgresql": "postgres", "mssql": "sqlserver", "odbc": "sqlserver"}


class UnsupportedConnectionError(SqlQueueError, ValueError):
    """The connection's type is not one a queue can live behind."""


class ConnectionNotDefinedError(TransportMisconfiguredError):
    """No Airflow connection has the id given: a setting to fix, never worth a retry."""


@contextmanager
def _defined(conn_id: object) -> Iterator[None]:
    """Around a lookup of ``conn_id``: Airflow's "not found" as the library's own, permanent, error."""
    from airflow.sdk.exceptions import AirflowNotFoundException

    missing = ConnectionNotDefinedError(
        f"no Airflow connection {conn_id!r:.200} is defined (environment, secrets backends, metadata database)"
    )
    if not isinstance(conn_id, str) or not conn_id:
        raise missing
    try:
        yield
    except AirflowNotFoundException:
        raise missing from None


def dialect_of(conn: Connection) -> str:
    """``postgres`` or ``sqlserver``, from the connection type (or the ``dialect`` extra of a sqlqueue connection)."""
    conn_type = (conn.conn_type or "").lower()
    if conn_type == SqlQueueHook.conn_type:
        name = str(conn.extra_dejson.get("dialect") or "postgres").lower()
        if name in ("postgres", "postgresql"):
            return "postgres"
        if name in ("sqlserver", "mssql"):
            return "sqlserver"
        raise UnsupportedConnectionError(
            f"connection {conn.conn_id!r}: extra 'dialect' is {name!r}; expected 'postgres' or 'sqlserver'"
        )
    try:
        return DIALECT_OF_CONN_TYPE[conn_type]
    except KeyError:
        raise UnsupportedConnectionError(
            f"connection {conn.conn_id!r} has type {conn.conn_type!r}; a queue needs a postgres, mssql, odbc "
            "or sqlqueue connection"
        ) from None


class _PostgresConnector(PostgresHook):
    """PostgresHook's connection handling, stopping short of connecting.

    ``get_conn`` assembles the psycopg arguments (IAM token, options, extras) and hands them to
    ``_create_connection``; returning them instead lets the queue open the connection itself:
    autocommit (nothing left ``idle in transaction``) and, in the triggerer, asynchronously.
    """

    ignored_extra_options = PostgresHook.ignored_extra_options | QUEUE_EXTRAS

    def _create_connection(self, conn_args: dict[str, Any]) -> Any:
        return conn_args

    def connect_kwargs(self) -> dict[str, Any]:
        kwargs = dict(self.get_conn())  # type: ignore[call-overload]
        if "row_factory" in kwargs or "cursor_factory" in kwargs:
            raise UnsupportedConnectionError(
                f"connection {self.postgres_conn_id!r}: the 'cursor' extra changes row types; remove it for queues"
            )
        return {key: value for key, value in kwargs.items() if value is not None}


def _without_queue_extras(conn: Connection) -> Connection:
    """The connection as the database driver's hook should see it: no queue extras, a port set."""
    from airflow.sdk import Connection as SdkConnection

    extra = {key: value for key, value in conn.extra_dejson.items() if key not in QUEUE_EXTRAS}
    return SdkConnection(
        conn_id=conn.conn_id,
        conn_type=conn.conn_type,
        host=conn.host,
        schema=conn.schema,
        login=conn.login,
        password=conn.password,
        port=conn.port or 1433,
        extra=json.dumps(extra),
    )


def _sqlserver_hook(conn: Connection) -> MsSqlHook | OdbcHook:
    """The microsoft-mssql provider's hook (pymssql) or, for ``odbc`` connections, the odbc provider's (pyodbc).

    Imported here, when a SQL Server connection is used: pyodbc needs unixODBC's system library,
    which a host serving only PostgreSQL queues need not have.
    """
    odbc = (conn.conn_type or "").lower() == "odbc"
    try:
        if odbc:
            from airflow.providers.odbc.hooks.odbc import OdbcHook
        else:
            from airflow.providers.microsoft.mssql.hooks.mssql import MsSqlHook
    except ImportError as exc:
        library = "pyodbc (and unixODBC's libodbc, e.g. apt-get install unixodbc)" if odbc else "pymssql"
        raise UnsupportedConnectionError(
            f"connection {conn.conn_id!r} needs {library}, which cannot be loaded here: {exc}"
        ) from None
    hook: MsSqlHook | OdbcHook = OdbcHook(odbc_conn_id=conn.conn_id) if odbc else MsSqlHook(mssql_conn_id=conn.conn_id)
    hook._connection = _without_queue_extras(conn)  # noqa: SLF001  # the connection already looked up, minus queue extras
    return hook


class SqlQueueHook(BaseHook):
    """Create, send to, receive from and maintain queue tables through an Airflow connection.

    :param sqlqueue_conn_id: a ``postgres``, ``mssql``, ``odbc`` or ``sqlqueue`` connection.
    :param error_queue: where poison and failed messages go; defaults to the connection's
        ``error_queue`` extra, else ``error``. Named without a schema, it is in the queue's schema.
    :param audit_queue: where acknowledged messages are copied (NServiceBus's audit queue);
        defaults to the connection's ``audit_queue`` extra. ``True`` means ``audit``; None or
        ``False`` (and no extra): no audit copies. Named without a schema, it is in the queue's schema.
    """

    conn_name_attr = "sqlqueue_conn_id"
    default_conn_name = "sqlqueue_default"
    conn_type = "sqlqueue"
    hook_name = "SQL Queue"

    def __init__(
        self,
        sqlqueue_conn_id: str = default_conn_name,
        *,
        error_queue: str | None = None,
        audit_queue: str | bool | None = None,
        connection: Connection | None = None,
    ) -> None:
        super().__init__()
        self.sqlqueue_conn_id = sqlqueue_conn_id
        self._error_queue = error_queue
        self._audit_queue = audit_queue
        self._connection = connection

    # -- connection --------------------------------------------------------------------------

    @property
    def connection(self) -> Connection:
        """The Airflow connection, looked up once (:class:`ConnectionNotDefinedError` when there is none)."""
        if self._connection is None:
            with _defined(self.sqlqueue_conn_id):
                self._connection = self.get_connection(self.sqlqueue_conn_id)
        return self._connection

    async def aconnection(self) -> Connection:
        """The connection, looked up without blocking the event loop (for triggers)."""
        if self._connection is None:
            with _defined(self.sqlqueue_conn_id):
                self._connection = await self.aget_connection(self.sqlqueue_conn_id)
        return self._connection

    @property
    def dialect_name(self) -> str:
        return dialect_of(self.connection)

    @property
    def error_queue(self) -> str | None:
        """The configured error queue, or None for the core's rule (``error`` in the queue's schema)."""
        return self._error_queue or self.connection.extra_dejson.get("error_queue") or None

    @property
    def audit_queue(self) -> str | bool | None:
        """The audit queue: the hook's, else the connection's ``audit_queue`` extra (None: no auditing)."""
        chosen = self._audit_queue if self._audit_queue is not None else self.connection.extra_dejson.get("audit_queue")
        if chosen is None or isinstance(chosen, (bool, str)):
            return chosen or None
        raise UnsupportedConnectionError(
            f"connection {self.sqlqueue_conn_id!r}: extra 'audit_queue' is {chosen!r}; expected a queue name or true"
        )

    def _postgres_kwargs(self, conn: Connection) -> dict[str, Any]:
        return _PostgresConnector(postgres_conn_id=conn.conn_id, connection=conn).connect_kwargs()

    def _open_session(self, conn: Connection) -> Session:
        """A blocking session on a new autocommit connection, opened by the owning provider's hook."""
        if dialect_of(conn) == "postgres":
            return finish(PsycopgSession.connect("", blocking=True, **self._postgres_kwargs(conn)))
        return session_over(_sqlserver_hook(conn).get_conn(), owned=True)

    def _connect(self, conn: Connection) -> Session:
        with opening(get_dialect(dialect_of(conn)), f"connection {conn.conn_id!r}"):
            return self._open_session(conn)

    def get_conn(self) -> QueueClient:
        """A new blocking client on its own autocommit connection; close it (or use :meth:`client`)."""
        return QueueClient(self._connect(self.connection), self.error_queue, self.audit_queue)

    @contextmanager
    def client(self) -> Iterator[QueueClient]:
        """A blocking client for the duration of a ``with`` block."""
        client = self.get_conn()
        try:
            yield client
        finally:
            client.close()

    async def get_async_client(self) -> AsyncQueueClient:
        """A new asyncio client (for triggers); close it with ``await client.close()``.

        PostgreSQL connections are asyncio-native; SQL Server's drivers block, so their connection
        lives on a worker thread and the triggerer's event loop only awaits it.
        """
        conn = await self.aconnection()
        if dialect_of(conn) == "postgres":
            kwargs = await asyncio.to_thread(self._postgres_kwargs, conn)  # may fetch an IAM token
            session: Session = await PsycopgSession.connect("", **kwargs)
        else:
            session = await ThreadSession.open(lambda: self._connect(conn))
        return AsyncQueueClient(session, self.error_queue, self.audit_queue)

    def conninfo(self) -> str:
        """A connection string for processes outside Airflow, such as Spark executors (it holds the password).

        ``QueueClient.connect`` accepts it: a libpq string for PostgreSQL, ``mssql://...`` for
        pymssql connections, an ODBC connection string for odbc ones.
        """
        conn = self.connection
        if dialect_of(conn) == "postgres":
            from psycopg.conninfo import make_conninfo

            return make_conninfo("", **{key: str(value) for key, value in self._postgres_kwargs(conn).items()})
        hook = _sqlserver_hook(conn)
        if (conn.conn_type or "").lower() == "odbc":
            return str(hook.odbc_connection_string)
        login, password = quote(conn.login or "", safe=""), quote(conn.password or "", safe="")
        database = quote(conn.schema or "", safe="")
        return f"mssql://{login}:{password}@{conn.host or 'localhost'}:{conn.port or 1433}/{database}"

    def test_connection(self) -> tuple[bool, str]:
        """Used by the UI's Test button: can the database be reached with these settings?"""
        try:
            with self.client() as client:
                return True, f"Connected ({client.database})"
        except (SqlQueueError, ValueError) as exc:
            return False, str(exc)

    # -- queue operations --------------------------------------------------------------------

    def create_queue(
        self,
        queue_name: str,
        *,
        error_queue: str | None = None,
        secondary: str | None = None,
        body_string: bool = False,
        delayed: bool = True,
    ) -> list[str]:
        """Create the queue, its error queue, optional secondary queue and (``delayed``) its delayed-message
        table (idempotent); returns the queue tables' addresses."""
        with self.client() as client:
            created = client.create_queue(
                queue_name, error_queue=error_queue, secondary=secondary, body_string=body_string, delayed=delayed
            )
            return [client.canonical_address(address) for address in created]

    def drop_queue(self, queue_name: str) -> None:
        with self.client() as client:
            client.drop_queue(queue_name)

    def check_queue(self, queue_name: str) -> None:
        """Raise QueueNotFoundError when the table is missing (with the name the database was asked for)."""
        with self.client() as client:
            client.check_queue(queue_name)

    def send(
        self,
        queue_name: str,
        messages: Message | Iterable[Message],
        *,
        notify: bool = False,
        delay: timedelta | float | None = None,
        due: datetime | None = None,
    ) -> list[str]:
        """Send one message or many in one transaction; returns their ids.

        ``notify=True`` wakes sensors and triggers waiting with ``wake_on_notify`` at once (PostgreSQL).
        ``delay`` (timedelta or seconds) or ``due`` (aware datetime) holds the messages in the queue's
        delayed table until then (:meth:`~.QueueClient.send`); :meth:`move_due` or a pump moves them.
        """
        batch = as_messages(messages)
        with self.client() as client:
            client.send(queue_name, batch, notify=notify, delay=delay, due=due)
        return [str(message.id) for message in batch]

    def subscribe(
        self,
        queue_name: str,
        topics: str | Iterable[str],
        *,
        endpoint: str | None = None,
        subscription_table: str | None = None,
    ) -> None:
        """Subscribe the queue to events published on ``topics`` (creating the subscription table if missing).

        The table is NServiceBus's ``SubscriptionRouting`` in the connection's default schema unless
        ``subscription_table`` names another: an NServiceBus endpoint publishing through the same
        table reaches this queue too, and the other way round.
        """
        with self.client() as client:
            client.create_subscription_table(subscription_table)
            client.subscribe(queue_name, topics, endpoint=endpoint, table=subscription_table)

    def unsubscribe(
        self,
        queue_name: str,
        topics: str | Iterable[str],
        *,
        endpoint: str | None = None,
        subscription_table: str | None = None,
    ) -> None:
        with self.client() as client:
            client.unsubscribe(queue_name, topics, endpoint=endpoint, table=subscription_table)

    def publish(
        self,
        topics: str | Iterable[str],
        messages: Message | Iterable[Message],
        *,
        notify: bool = False,
        subscription_table: str | None = None,
        claims: Mapping[str, Iterable[Token]] | None = None,
        started: Mapping[uuid.UUID, datetime] | None = None,
    ) -> list[str]:
        """Send the messages to every queue subscribed to any of ``topics``, in one transaction; returns those queues.

        With ``claims`` the claims the event came from are acknowledged in the same transaction.
        """
        with self.client() as client:
            reached = client.publish(
                topics, messages, notify=notify, table=subscription_table, claims=claims, started=started
            )
            return [client.canonical_address(address) for address in reached]

    def move_due(self, queue_name: str, *, batch_size: int = defaults.DELAYED_BATCH) -> int:
        """Move the queue's due delayed messages into place; returns how many moved."""
        with self.client() as client:
            return client.move_due(queue_name, batch_size=batch_size)

    def receive(
        self,
        queue_name: str,
        max_messages: int = defaults.RECEIVE_BATCH,
        *,
        transaction_mode: TransactionMode | str = TransactionMode.CLAIM,
        lease: timedelta | float = defaults.LEASE,
        max_deliveries: int = defaults.MAX_DELIVERIES,
        error_queue: str | None = None,
        holder: str | None = None,
    ) -> list[ReceivedMessage]:
        """Receive in ``claim`` mode (ack later; renew long work) or ``none`` mode (gone at once).

        ``native`` needs :meth:`receive_native`.
        """
        with self.client() as client:
            return _receive(
                client,
                queue_name,
                max_messages,
                TransactionMode(transaction_mode),
                lease,
                max_deliveries,
                error_queue,
                holder,
            )

    def receive_dicts(
        self,
        queue_name: str,
        max_messages: int = defaults.RECEIVE_BATCH,
        *,
        transaction_mode: TransactionMode | str = TransactionMode.CLAIM,
        lease: timedelta | float = defaults.LEASE,
        max_deliveries: int = defaults.MAX_DELIVERIES,
        error_queue: str | None = None,
        holder: str | None = None,
    ) -> list[dict[str, Any]]:
        """:meth:`receive`, returning the JSON-safe dicts that XCom and trigger events carry."""
        received = self.receive(
            queue_name,
            max_messages,
            transaction_mode=transaction_mode,
            lease=lease,
            max_deliveries=max_deliveries,
            error_queue=error_queue,
            holder=holder,
        )
        return [message.to_dict(self.canonical_address(queue_name)) for message in received]

    def canonical_address(self, queue_name: str) -> str:
        """The queue's address as NServiceBus writes it, which settling the messages later needs."""
        return Addressing(get_dialect(self.dialect_name)).canonical_address(queue_name)

    def take_dicts(
        self,
        queue_name: str,
        tokens: Iterable[Token] | None = None,
        *,
        lease: timedelta | float = defaults.LEASE,
        holder: str | None = None,
        limit: int = defaults.ADOPT_LIMIT,
    ) -> list[dict[str, Any]]:
        """Take reserved messages (those of ``tokens``, or the queue's oldest reservations) as dicts with new tokens."""
        with self.client() as client:
            taken = client.take(queue_name, tokens, lease=lease, holder=holder, limit=limit)
            return _as_dicts(client, queue_name, taken)

    @contextmanager
    def receive_native(
        self, queue_name: str, *, error_queue: str | None = None
    ) -> Iterator[tuple[ReceivedMessage | None, Any]]:
        """Receive one message in ``native`` mode: yields ``(message or None, DB-API connection)``.

        SQL run on the connection inside the block commits together with the receive; an
        exception rolls both back and the message stays queued.
        """
        with self.client() as client, client.receive_native(queue_name, error_queue=error_queue) as message:
            yield message, client.connection

    def ack(
        self, queue_name: str, tokens: Iterable[Token], *, started: Mapping[uuid.UUID, datetime] | None = None
    ) -> int:
        """Acknowledge claims in one statement; returns how many were still held (the rest may come again).

        With an audit queue each acknowledged message is copied there in the same transaction;
        ``started`` (message id -> time) says when its processing began.
        """
        with self.client() as client:
            return len(client.ack(queue_name, as_tokens(tokens), started=started))

    def nack(
        self,
        queue_name: str,
        tokens: Iterable[Token],
        *,
        error: BaseException | str | Failure | None = None,
        delay: timedelta | float = 0,
    ) -> int:
        """Give claims back for redelivery after ``delay``, recording why; returns how many were still held."""
        with self.client() as client:
            return len(client.nack(queue_name, as_tokens(tokens), error=error, delay=delay))

    def forward(
        self,
        claims: Mapping[str, Iterable[Token]],
        sends: Mapping[str, Iterable[Message]],
        *,
        notify: bool = False,
        started: Mapping[uuid.UUID, datetime] | None = None,
    ) -> int:
        """Acknowledge ``claims`` and send ``sends`` in one transaction (see ``QueueClient.forward``); returns how many were sent."""
        with self.client() as client:
            return client.forward(
                claims,
                sends,
                notify=notify,
                started=started,
            )

    def extend(self, queue_name: str, tokens: Iterable[Token], lease: timedelta | float = defaults.LEASE) -> int:
        """Renew claims for another ``lease`` in one statement; returns how many were still held."""
        with self.client() as client:
            return len(client.extend(queue_name, as_tokens(tokens), lease))

    def keep_claims(self, claims: Mapping[str, Iterable[Token]], lease: timedelta = defaults.LEASE) -> LeaseKeeper:
        """A :class:`~airflow_provider_sqlqueue.transport.lease.LeaseKeeper` renewing ``claims`` on connections of this hook."""
        return LeaseKeeper(self.get_conn, {queue: list(tokens) for queue, tokens in claims.items()}, lease)

    def peek(self, queue_name: str, *, include_claims: bool = False) -> int:
        with self.client() as client:
            return client.peek(queue_name, include_claims=include_claims)

    def depth(self, queue_name: str) -> int:
        with self.client() as client:
            return client.depth(queue_name)

    def browse(self, queue_name: str, limit: int = defaults.BROWSE_LIMIT) -> list[ReceivedMessage]:
        """Waiting, unexpired messages in send order, left in the queue (for reports and inspection)."""
        with self.client() as client:
            return client.browse(queue_name, limit)

    def in_flight(self, queue_name: str) -> int:
        with self.client() as client:
            return client.in_flight(queue_name)

    def purge_expired(self, queue_name: str, batch_size: int = defaults.PURGE_BATCH) -> int:
        with self.client() as client:
            return client.purge_expired(queue_name, batch_size)

    def purge(self, queue_name: str) -> int:
        with self.client() as client:
            return client.purge(queue_name)

    def move_to_error(
        self,
        queue_name: str,
        message: ReceivedMessage,
        error: BaseException | str | None,
        *,
        error_queue: str | None = None,
    ) -> None:
        with self.client() as client:
            client.move_to_error(queue_name, message, error, error_queue=error_queue)

    def retry_errors(
        self,
        error_queue: str | None = None,
        *,
        queue_name: str | None = None,
        limit: int = defaults.RETRY_LIMIT,
        seqs: Iterable[int] | None = None,
    ) -> int:
        """Send up to ``limit`` error queue messages back to the queue they failed in (only ``queue_name``'s,
        or only those at ``seqs``, when given)."""
        with self.client() as client:
            return client.retry_errors(error_queue, queue=queue_name, limit=limit, seqs=seqs)

    def retry_errors_page(
        self,
        error_queue: str | None = None,
        *,
        queue_name: str | None = None,
        after: int = 0,
        limit: int = defaults.RETRY_LIMIT,
        seqs: Iterable[int] | None = None,
    ) -> RetryPage:
        """One bounded pass of :meth:`retry_errors` (see ``QueueClient.retry_errors_page``)."""
        with self.client() as client:
            return client.retry_errors_page(error_queue, queue=queue_name, after=after, limit=limit, seqs=seqs)

    def error_summary(
        self, error_queue: str | None = None, *, queue_name: str | None = None, limit: int = defaults.ERROR_SUMMARY_ROWS
    ) -> list[ErrorGroup]:
        """The newest ``limit`` error messages by source queue and exception type (headers only; see ``QueueClient.error_summary``)."""
        with self.client() as client:
            return client.error_summary(error_queue, queue=queue_name, limit=limit)

    def failed_messages(
        self,
        error_queue: str | None = None,
        *,
        before: int | None = None,
        limit: int = defaults.FAILED_PAGE,
        group: tuple[str, str] | None = None,
    ) -> tuple[list[FailedMessage], int | None]:
        """A page of the error queue, newest first, with body previews; and the ``before`` of the next page."""
        with self.client() as client:
            return client.failed_messages(error_queue, before=before, limit=limit, group=group)

    def queues(self) -> list[QueueAddress]:
        """Every queue table the connection may read (``QueueClient.queues``)."""
        with self.client() as client:
            return client.queues()

    def queue_stats(self, queue_names: Iterable[str | QueueAddress]) -> list[QueueStats]:
        """Waiting, oldest message, expired, in flight and lapsed per queue, from indexes (``QueueClient.queue_stats``)."""
        with self.client() as client:
            return client.queue_stats(queue_names)

    def claims(self, queue_name: str, limit: int = defaults.CLAIMS_PAGE) -> list[ClaimInfo]:
        """The queue's claims whose leases end first, without their tokens."""
        with self.client() as client:
            return client.claims(queue_name, limit)

    def release_lapsed(self, queue_name: str) -> int:
        """Give the queue's lapsed claims back to the queue table, where every receiver finds them; returns how many."""
        with self.client() as client:
            return client.release_lapsed(queue_name)


def _receive(
    client: QueueClient,
    queue_name: str,
    max_messages: int,
    transaction_mode: TransactionMode,
    lease: timedelta | float,
    max_deliveries: int,
    error_queue: str | None,
    holder: str | None,
) -> list[ReceivedMessage]:
    if transaction_mode is TransactionMode.CLAIM:
        return client.claim(
            queue_name, max_messages, lease=lease, max_deliveries=max_deliveries, error_queue=error_queue, holder=holder
        )
    if transaction_mode is TransactionMode.NONE:
        return client.receive(queue_name, max_messages, error_queue=error_queue)
    raise InvalidArgumentError("native mode keeps a transaction open around the handler: use receive_native()")


def _as_dicts(client: QueueClient, queue_name: str, messages: list[ReceivedMessage]) -> list[dict[str, Any]]:
    """Messages as XCom dicts, each naming its queue by the canonical address (what settling needs)."""
    address = client.canonical_address(queue_name)
    return [message.to_dict(address) for message in messages]
