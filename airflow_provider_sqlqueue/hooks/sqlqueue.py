"""The queue hook: an Airflow connection id turned into queue clients.

One hook serves ``postgres``, ``mssql`` and ``odbc`` connections (as the postgres, microsoft-mssql
and odbc providers define them) and this provider's own ``sqlqueue`` type, whose ``dialect`` extra
says which database it is. The hook owns the connection settings and hands out clients
(:meth:`SqlQueueHook.client`, :meth:`SqlQueueHook.async_client`); every queue operation is the
client's, so the Airflow layer has no second copy of the queue API. Connections are opened by the
owning provider's hook through its public ``get_conn``: ``PostgresHook`` (IAM tokens, ``options``,
libpq extras -- a connection that works with ``PostgresHook`` works here), ``MsSqlHook`` (pymssql;
also for ``sqlqueue`` connections with ``dialect=sqlserver``) or ``OdbcHook`` (pyodbc).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from airflow.providers.postgres.hooks.postgres import PostgresHook
from airflow.sdk import BaseHook

from ..metrics import StatsMeter
from ..transport import AsyncQueueClient, QueueClient, defaults
from ..transport.client import Addressing
from ..transport.dialects import get_dialect
from ..transport.drivers import PsycopgSession, Session, ThreadSession, driver_of, opening, session_over
from ..transport.drivers.sqlserver import DRIVER_EXTRAS
from ..transport.errors import SqlQueueError, TransportMisconfiguredError, one_line
from ..transport.meter import Meter

if TYPE_CHECKING:
    from airflow.sdk import Connection


def configured_conn_ids() -> list[str]:
    """The connection ids ``[sqlqueue] connections`` names: those the Queues page and the metrics look
    at besides the metadata database's (connections in the environment or a secrets backend cannot be listed)."""
    from airflow.sdk import conf

    text = conf.get("sqlqueue", "connections", fallback="") or ""
    return [name.strip() for name in text.split(",") if name.strip()]


#: Extras of a connection that configure the queue rather than the database driver.
QUEUE_EXTRAS = frozenset({"dialect", "error_queue", "audit_queue"})

#: The libpq settings a connection string for other processes carries (besides the connection's extras).
CONNINFO_KEYS = frozenset({"host", "port", "user", "dbname", "options", "connect_timeout"})

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
        name = str(_extras(conn).get("dialect") or "postgres").lower()
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


def _extras(conn: Connection) -> Mapping[str, Any]:
    """The connection's extra: a JSON object (anything else is refused, not misread)."""
    extra = conn.extra_dejson
    if not isinstance(extra, Mapping):
        raise UnsupportedConnectionError(
            f"connection {conn.conn_id!r}: its extra is JSON {type(extra).__name__}; it must be a JSON object"
        )
    return extra


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _checked_fields(conn: Connection) -> dict[str, Any]:
    """The connection's extras, after checking every field a driver reads: text a driver can send.

    libpq stops reading a value at a NUL, so ``host="db\x00x"`` would connect somewhere else with
    every later setting dropped; text that is not valid Unicode fails inside a driver, in errors
    that quote the whole connection string. Neither value is ever echoed (one may be the password).
    """
    extra = _extras(conn)
    fields = {"host": conn.host, "login": conn.login, "password": conn.password, "schema": conn.schema}
    fields |= {f"extra {key!r}": value for key, value in extra.items()}
    for name, value in fields.items():
        if not isinstance(value, str):
            continue
        if "\x00" in value:
            raise TransportMisconfiguredError(f"connection {conn.conn_id!r}: the {name} contains a NUL character")
        if not value.isascii() and not _encodes(value):  # raised here: the failed encoding quotes the value
            raise TransportMisconfiguredError(f"connection {conn.conn_id!r}: the {name} is not valid Unicode text")
        if (conn.conn_type or "").lower() == "odbc" and name in ("login", "password", "schema") and ";" in value:
            # OdbcHook writes these unquoted into the ODBC connection string, where ';' starts another attribute.
            raise TransportMisconfiguredError(
                f"connection {conn.conn_id!r}: the {name} contains ';', which the odbc provider does not quote"
            )
    return dict(extra)


def _without_queue_extras(conn: Connection) -> Connection:
    """The connection as the database driver's hook should see it: checked (:func:`_checked_fields`),
    no queue extras (a driver would refuse them as connection arguments), SQL Server's port when
    none is set, and the transport's connect timeout unless one is set."""
    from airflow.sdk import Connection as SdkConnection

    extra = {key: value for key, value in _checked_fields(conn).items() if key not in QUEUE_EXTRAS}
    if dialect_of(conn) == "postgres":  # a server that never answers is "unavailable", not a hang
        extra.setdefault("connect_timeout", defaults.CONNECT_TIMEOUT_SECONDS)
    elif (conn.conn_type or "").lower() != "odbc":  # pymssql waits 60 s for a login by default
        extra.setdefault("login_timeout", defaults.CONNECT_TIMEOUT_SECONDS)
    return SdkConnection(
        conn_id=conn.conn_id,
        conn_type=conn.conn_type,
        host=conn.host,
        schema=conn.schema,
        login=conn.login,
        password=conn.password,
        port=conn.port or (None if dialect_of(conn) == "postgres" else 1433),
        extra=json.dumps(extra),
    )


def _driver_hook(conn: Connection) -> Any:
    """The owning provider's hook over ``conn`` minus the queue extras: postgres, microsoft-mssql
    (pymssql) or, for ``odbc`` connections, odbc (pyodbc).

    The connection goes in through DbApiHook's ``connection`` argument; OdbcHook drops that
    argument and looks the id up again, so there its public ``connection`` property is overridden.
    The SQL Server providers are imported here, when such a connection is used: pyodbc needs
    unixODBC's system library, which a host serving only PostgreSQL queues need not have.
    """
    bare = _without_queue_extras(conn)
    if dialect_of(conn) == "postgres":
        if "cursor" in bare.extra_dejson:
            raise UnsupportedConnectionError(
                f"connection {conn.conn_id!r}: the 'cursor' extra changes row types; remove it for queues"
            )
        return PostgresHook(postgres_conn_id=conn.conn_id, connection=bare)
    odbc = (conn.conn_type or "").lower() == "odbc"
    try:
        if not odbc:
            from airflow.providers.microsoft.mssql.hooks.mssql import MsSqlHook

            return MsSqlHook(mssql_conn_id=conn.conn_id, connection=bare)
        from airflow.providers.odbc.hooks.odbc import OdbcHook
    except ImportError as exc:
        extra = DRIVER_EXTRAS["pyodbc" if odbc else "pymssql"]
        system = " and unixODBC's libodbc (e.g. apt-get install unixodbc)" if odbc else ""
        raise UnsupportedConnectionError(
            f"connection {conn.conn_id!r} is of type {extra}, whose provider and driver cannot be loaded here "
            f"({one_line(exc)}): install the package's {extra!r} extra "
            f"(pip install 'airflow-provider-sqlqueue[{extra}]'){system}"
        ) from None

    class _OdbcHook(OdbcHook):
        @property  # type: ignore[misc]  # read-only here: nothing sets it
        def connection(self) -> Any:
            return bare

    return _OdbcHook(odbc_conn_id=conn.conn_id)


def _open_connection(conn: Connection) -> Any:
    """A new DB-API connection, opened by the provider's hook (failures as the transport's errors)."""
    hook = _driver_hook(conn)
    try:
        with opening(get_dialect(dialect_of(conn)), f"connection {conn.conn_id!r}"):
            connection = hook.get_conn()
    except SqlQueueError:
        raise
    except Exception as exc:  # noqa: BLE001  # the driver's errors were translated: what is left is the provider refusing the settings
        text = one_line(exc).replace(conn.password, "***") if conn.password else one_line(exc)
        error = TransportMisconfiguredError(
            f"connection {conn.conn_id!r}: {type(hook).__name__} cannot open it with its settings: "
            f"{type(exc).__name__}: {text}"
        )
    else:
        if dialect_of(conn) == "postgres" and driver_of(connection) != "psycopg":
            connection.close()
            raise UnsupportedConnectionError(
                f"connection {conn.conn_id!r}: the postgres provider opened a {type(connection).__module__} "
                "connection; queues need psycopg 3 (which the provider uses with SQLAlchemy 2)"
            )
        return connection
    raise error  # outside the except block: the provider's exception, which may quote settings, is not kept


def _open_session(conn: Connection) -> Session:
    """A blocking session owning a new connection (so switched to autocommit and closed with it).

    A PostgreSQL connection the server drops is opened again through the provider, as the
    transport's own connections are.
    """

    async def reopen() -> Any:  # called from the blocking session: it never suspends
        return session_over(_open_connection(conn), owned=True).connection

    return session_over(_open_connection(conn), owned=True, reopen=reopen)


class SqlQueueHook(BaseHook):
    """Queue clients for an Airflow connection: ``with hook.client() as client: client.send(...)``.

    :param sqlqueue_conn_id: a ``postgres``, ``mssql``, ``odbc`` or ``sqlqueue`` connection.
    :param error_queue: where poison and failed messages go; defaults to the connection's
        ``error_queue`` extra, else ``error``. Named without a schema, it is in the queue's schema.
    :param audit_queue: where acknowledged messages are copied (NServiceBus's audit queue);
        defaults to the connection's ``audit_queue`` extra. ``True`` means ``audit``; None or
        ``False`` (and no extra): no audit copies. Named without a schema, it is in the queue's schema.
    :param connection: the Airflow connection itself, when the caller has it (no lookup then).
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

    @property
    def connection(self) -> Connection:
        """The Airflow connection, looked up once (:class:`ConnectionNotDefinedError` when there is none)."""
        if self._connection is None:
            with _defined(self.sqlqueue_conn_id):
                self._connection = self.get_connection(self.sqlqueue_conn_id)
        return self._connection

    async def aconnection(self) -> Connection:
        """The connection, looked up on a worker thread so the event loop is not blocked (for triggers).

        Airflow's blocking lookup, not its asynchronous one (``aget_connection``): ``airflow dags
        test`` runs a deferred task's trigger in its own process over comms that answer only
        blocking requests, where the asynchronous lookup's request to Airflow's API fails and is
        taken for "no such connection" -- a connection made with ``airflow connections add`` was
        reported missing there, though a triggerer finds it. The blocking lookup asks the same
        places in the same order (environment, secrets backends, Airflow's API) in both.
        """
        if self._connection is None:
            with _defined(self.sqlqueue_conn_id):
                self._connection = await asyncio.to_thread(self.get_connection, self.sqlqueue_conn_id)
        return self._connection

    @property
    def dialect_name(self) -> str:
        return dialect_of(self.connection)

    @property
    def error_queue(self) -> str | None:
        """The configured error queue, or None for the core's rule (``error`` in the queue's schema).

        An empty extra is the connection form's "not set"; an empty name given to the hook is refused
        by the clients, as any name no table can have.
        """
        if self._error_queue is not None:
            return self._error_queue
        return _extras(self.connection).get("error_queue") or None

    @property
    def audit_queue(self) -> str | bool | None:
        """The audit queue: the hook's, else the connection's ``audit_queue`` extra (None: no auditing)."""
        chosen = self._audit_queue if self._audit_queue is not None else _extras(self.connection).get("audit_queue")
        if chosen is None or isinstance(chosen, (bool, str)):
            return chosen or None
        raise UnsupportedConnectionError(
            f"connection {self.sqlqueue_conn_id!r}: extra 'audit_queue' is {chosen!r}; expected a queue name or true"
        )

    def client(self) -> QueueClient:
        """A blocking client on a new autocommit connection of its own; ``with hook.client() as client:``
        closes it at the end of the block."""
        conn = self.connection
        self._check_queues(conn)
        client = QueueClient(_open_session(conn), self.error_queue, self.audit_queue)
        client.meter = self.meter()
        return client

    def _check_queues(self, conn: Connection) -> None:
        """Refuse error and audit queue names no table can have before any connection is opened."""
        Addressing(get_dialect(dialect_of(conn)), self.error_queue, self.audit_queue)

    def get_conn(self) -> QueueClient:
        """Airflow's name for :meth:`client`."""
        return self.client()

    async def async_client(self) -> AsyncQueueClient:
        """A new asyncio client (for triggers): ``async with await hook.async_client() as client:``.

        PostgreSQL connections are asyncio-native, opened with the settings the postgres provider
        resolves (so an IAM token is fetched as for a blocking connection); SQL Server's drivers
        block, so their connection lives on a worker thread and the event loop only awaits it.
        """
        conn = await self.aconnection()
        self._check_queues(conn)
        if dialect_of(conn) == "postgres":
            session: Session = await PsycopgSession.connect(await asyncio.to_thread(self.conninfo))
        else:
            session = await ThreadSession.open(lambda: _open_session(conn))
        client = AsyncQueueClient(session, self.error_queue, self.audit_queue)
        client.meter = self.meter()
        return client

    def meter(self) -> Meter:
        """What the hook's clients report their events to: Airflow's metrics, tagged with the connection id
        (:class:`~airflow_provider_sqlqueue.metrics.StatsMeter`); give it to a ``MessagePump`` as well."""
        return StatsMeter(self.sqlqueue_conn_id)

    def conninfo(self) -> str:
        """A connection string for processes outside Airflow, such as Spark executors (it holds the password).

        ``QueueClient.connect`` accepts it: a libpq string for PostgreSQL (the settings of a
        connection the postgres provider opened), ``mssql://...`` for pymssql connections, an ODBC
        connection string for odbc ones.
        """
        conn = self.connection
        if dialect_of(conn) == "postgres":
            from psycopg.conninfo import make_conninfo

            connection = _open_connection(conn)
            try:
                # What the connection was opened with, not what libpq filled in (hostaddr pins an
                # address DNS may move; newer libpq's defaults such as sslcertmode an older one refuses).
                chosen = CONNINFO_KEYS | set(_extras(conn))  # a queue extra is no libpq setting: never in `used`
                used = connection.info.get_parameters()
                settings = {key: used[key] for key in chosen if key in used}
                if "," in (conn.host or ""):
                    # Several hosts (a primary and its standbys, with target_session_attrs): every one, as
                    # configured. libpq names only the host this connection reached, and a client that
                    # reopens its connection after a failover must try the others.
                    settings["host"] = conn.host
                return make_conninfo("", password=connection.info.password, **settings)
            finally:
                connection.close()
        hook = _driver_hook(conn)
        if (conn.conn_type or "").lower() == "odbc":
            text = str(hook.odbc_connection_string)
            if not text.upper().startswith(("DRIVER=", "DSN=")):
                raise UnsupportedConnectionError(
                    f"connection {conn.conn_id!r} names no ODBC driver or DSN the odbc provider passes on (the "
                    "'driver' extra counts only with [providers.odbc] allow_driver_in_extra = True)"
                )
            return text
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
