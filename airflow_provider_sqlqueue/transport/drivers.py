"""Drivers: run operations' steps on real connections, inside transactions.

A *session* wraps one DB-API connection and knows how to begin/commit a transaction and execute a
:class:`~airflow_provider_sqlqueue.transport.operations.Step` on it. Sessions opened from a URI own
their connection (and close it); sessions over a caller's connection only borrow it. Either way a
transaction is opened only around an operation and always ended before control returns, so no
session is left ``idle in transaction`` between calls.
"""

from __future__ import annotations

import asyncio
import re
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager, contextmanager
from typing import Any, NoReturn, TypeVar
from urllib.parse import parse_qsl, unquote, urlsplit

from . import defaults
from .dialects import Dialect, get_dialect
from .dialects import sqlserver as tsql
from .errors import SqlQueueError, TransportMisconfiguredError, TransportUnavailableError
from .operations import Fetch, Operation, Step, drive, drive_async

T = TypeVar("T")


#: URI schemes of SQL Server, and which driver each one opens.
PYMSSQL_SCHEMES = ("mssql", "sqlserver", "mssql+pymssql")
PYODBC_SCHEMES = ("mssql+pyodbc",)


def _scheme(target: str) -> str:
    return target.split(":", 1)[0].lower() if "://" in target else ""


def _is_odbc_string(target: str) -> bool:
    """An ODBC connection string (``DRIVER={...};SERVER=...``) rather than a URI or libpq DSN."""
    return "://" not in target and ";" in target and re.search(r"(?i)(^|;)\s*(driver|dsn)\s*=", target) is not None


def dialect_for(target: object) -> Dialect:
    """Pick the dialect from a URI's scheme, an ODBC connection string or a connection object's driver."""
    if isinstance(target, str):
        scheme = _scheme(target)
        if scheme in ("postgresql", "postgres"):
            return get_dialect("postgres")
        if scheme in PYMSSQL_SCHEMES + PYODBC_SCHEMES or _is_odbc_string(target):
            return get_dialect("sqlserver")
        if "=" in target and "://" not in target:  # a libpq key=value DSN
            return get_dialect("postgres")
        raise ValueError(
            f"cannot tell the database from {scheme or 'this connection string'!r}; use a postgresql:// or "
            "mssql:// URI (mssql+pyodbc:// or an ODBC connection string for pyodbc)"
        )
    module = type(target).__module__.split(".", 1)[0]
    if module == "psycopg":
        return get_dialect("postgres")
    if module in ("pymssql", "pyodbc"):
        return get_dialect("sqlserver")
    raise TypeError(f"unsupported connection type {type(target).__module__}.{type(target).__qualname__}")


def open_session(target: Any) -> Session:
    """A blocking session: opened from a URI/connection string (owned) or over a DB-API connection (borrowed)."""
    dialect = dialect_for(target)
    if dialect.name == "postgres":
        return PsycopgSession.connect(target) if isinstance(target, str) else PsycopgSession(target)
    if not isinstance(target, str):
        session_type = PymssqlSession if type(target).__module__.startswith("pymssql") else PyodbcSession
        return session_type(target)
    if _scheme(target) in PYMSSQL_SCHEMES:
        return PymssqlSession.connect(target)
    return PyodbcSession.connect(target)


async def open_async_session(target: Any) -> AsyncSession:
    """The asyncio twin of :func:`open_session`: native for psycopg, a worker thread for SQL Server's drivers."""
    if dialect_for(target).name == "postgres":
        return await AsyncPsycopgSession.connect(target) if isinstance(target, str) else AsyncPsycopgSession(target)
    return await AsyncThreadSession.open(lambda: open_session(target))


def open_pool(target: str, max_size: int) -> AsyncSessionPool:
    """A pool of async sessions for a message pump on the database ``target`` names."""
    if dialect_for(target).name == "postgres":
        return AsyncPsycopgPool(target, max_size=max_size)
    return AsyncThreadPool(lambda: open_session(target), max_size=max_size)


async def _fetch_async(cursor: Any, step: Step) -> Any:
    if step.fetch is Fetch.ALL:
        return await cursor.fetchall()
    if step.fetch is Fetch.ONE:
        return await cursor.fetchone()
    if step.fetch is Fetch.ROWCOUNT:
        return cursor.rowcount
    return None


def _fetch(cursor: Any, step: Step) -> Any:
    if step.fetch is Fetch.ALL:
        return cursor.fetchall()
    if step.fetch is Fetch.ONE:
        return cursor.fetchone()
    if step.fetch is Fetch.ROWCOUNT:
        return cursor.rowcount
    return None


class Session(ABC):
    """One connection, used by one caller at a time."""

    def __init__(self, dialect: Dialect, connection: Any, owned: bool) -> None:
        self.dialect = dialect
        self.connection = connection
        self.owned = owned

    @abstractmethod
    def transaction(self) -> Any:
        """Context manager: commit on success, roll back on error (savepoint inside a caller's transaction)."""

    @abstractmethod
    def execute(self, step: Step) -> Any:
        """Run one step in the current transaction and return what it asks to fetch."""

    def run(self, op: Operation[T], *, single_statement: bool = False) -> T:
        """Run a whole operation in its own transaction.

        An operation of one statement needs no explicit transaction on an autocommit connection
        (the statement is atomic by itself), which saves the BEGIN and COMMIT round trips.
        """
        if single_statement and self.autocommits():
            return drive(op, self.execute)
        with self.transaction():
            return drive(op, self.execute)

    @abstractmethod
    def autocommits(self) -> bool:
        """Whether a statement run now commits by itself (autocommit and no transaction open)."""

    def close(self) -> None:
        """Close the connection if this session opened it."""
        if self.owned:
            self.connection.close()


class AsyncSession(ABC):
    """One connection for asyncio callers."""

    def __init__(self, dialect: Dialect, connection: Any, owned: bool) -> None:
        self.dialect = dialect
        self.connection = connection
        self.owned = owned

    @abstractmethod
    def transaction(self) -> Any:
        """Async context manager: commit on success, roll back on error."""

    @abstractmethod
    async def execute(self, step: Step) -> Any:
        """Run one step in the current transaction and return what it asks to fetch."""

    async def run(self, op: Operation[T], *, single_statement: bool = False) -> T:
        """Run a whole operation in its own transaction (none for one statement, as :meth:`Session.run`)."""
        if single_statement and self.autocommits():
            return await drive_async(op, self.execute)
        async with self.transaction():
            return await drive_async(op, self.execute)

    @abstractmethod
    def autocommits(self) -> bool:
        """Whether a statement run now commits by itself (autocommit and no transaction open)."""

    async def wait_for_notification(self, channels: list[str], timeout: float) -> bool:
        """Wait up to ``timeout`` for a notification on any of ``channels``; without notifications, just wait."""
        await asyncio.sleep(timeout)
        return False

    async def close(self) -> None:
        if self.owned:
            await self.connection.close()


# -- psycopg 3 -------------------------------------------------------------------------------


#: What errors outside any one statement (BEGIN, COMMIT) are reported against.
_ANY_STEP = Step("", (), Fetch.NONE, "the database")


def _raise_translated(dialect: Dialect, exc: BaseException, step: Step) -> NoReturn:
    """Re-raise a driver error as the transport's error for it (keeping the driver's as its cause)."""
    error = dialect.translate_error(exc, step.target)
    if error is None:
        raise exc
    raise error from exc


#: Statements whose parameters are larger than this are not inlined to travel with BEGIN.
_FUSE_LIMIT = 64 * 1024


class PsycopgSession(Session):
    """A blocking psycopg 3 connection."""

    def __init__(self, connection: Any, owned: bool = False) -> None:
        super().__init__(get_dialect("postgres"), connection, owned)

    @classmethod
    def connect(cls, conninfo: str, **kwargs: Any) -> PsycopgSession:
        """Open an autocommit connection: outside an operation's transaction nothing stays open."""
        import psycopg

        try:
            connection = psycopg.connect(conninfo, autocommit=True, **with_connect_timeout(conninfo, kwargs))
        except psycopg.Error as exc:
            _raise_translated(get_dialect("postgres"), exc, _ANY_STEP)
        return cls(connection, owned=True)

    def autocommits(self) -> bool:
        return _psycopg_autocommits(self.connection)

    def run(self, op: Operation[T], *, single_statement: bool = False) -> T:
        """Run an operation in one transaction, with BEGIN sent together with its first statement.

        A receive is BEGIN, DELETE ... RETURNING, COMMIT; sent one by one that is three round
        trips, and on a fast network the round trips are the cost. BEGIN travels in the first
        statement's message (its parameters inlined by psycopg's own client-side quoting), which
        leaves two.
        """
        if not self.autocommits():
            return super().run(op, single_statement=single_statement)
        if single_statement:
            return drive(op, self.execute)
        began = False

        def execute(step: Step) -> Any:
            nonlocal began
            if began:
                return self.execute(step)
            began = True
            return self._begin_with(step)

        try:
            result = drive(op, execute)
            if began:
                self._command("COMMIT")
        except BaseException:
            # Also after a failed COMMIT: the session must not stay in an aborted transaction.
            if began:
                self._command("ROLLBACK", quietly=True)
            raise
        return result

    def _begin_with(self, step: Step) -> Any:
        import psycopg

        if not _fusable(step):
            self._command("BEGIN")
            return self.execute(step)
        try:
            text = psycopg.ClientCursor(self.connection).mogrify(step.sql, step.params)
            with self.connection.cursor() as cursor:
                cursor.execute("BEGIN; " + text)  # no parameters: one simple-protocol message
                cursor.nextset()
                return _fetch(cursor, step)
        except psycopg.Error as exc:
            _raise_translated(self.dialect, exc, step)

    def _command(self, command: str, quietly: bool = False) -> None:
        """BEGIN, COMMIT or ROLLBACK; ``quietly`` for a ROLLBACK on a connection that may be gone."""
        import psycopg

        try:
            self.connection.execute(command)
        except psycopg.Error as exc:
            if not quietly:  # a broken connection's transaction is rolled back by the server anyway
                _raise_translated(self.dialect, exc, _ANY_STEP)

    @contextmanager
    def transaction(self) -> Iterator[None]:
        import psycopg

        try:
            with self.connection.transaction():
                yield
        except psycopg.Error as exc:  # e.g. the COMMIT of a connection the server just closed
            _raise_translated(self.dialect, exc, _ANY_STEP)

    def execute(self, step: Step) -> Any:
        import psycopg

        try:
            with self.connection.cursor() as cursor:
                cursor.execute(step.sql, step.params)
                return _fetch(cursor, step)
        except psycopg.Error as exc:
            _raise_translated(self.dialect, exc, step)


def with_connect_timeout(conninfo: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Connection arguments with ``connect_timeout`` set unless the caller set it.

    libpq waits for a server that accepts the TCP connection but never answers as long as the
    operating system lets it (minutes); a bounded wait makes such a database "unavailable".
    """
    from psycopg.conninfo import conninfo_to_dict

    if "connect_timeout" in kwargs or "connect_timeout" in conninfo_to_dict(conninfo):
        return kwargs
    return {**kwargs, "connect_timeout": defaults.CONNECT_TIMEOUT_SECONDS}


def _psycopg_autocommits(connection: Any) -> bool:
    """An autocommit psycopg connection with no transaction open (sync or async alike)."""
    from psycopg.pq import TransactionStatus

    return bool(connection.autocommit) and connection.info.transaction_status == TransactionStatus.IDLE


def _fusable(step: Step) -> bool:
    """Whether a statement's parameters are worth inlining to send it with BEGIN: small scalars only.

    Large values would travel as escaped text, and arrays (batched sends) go faster in binary.
    """
    if "%b" in step.sql:
        return False
    size = 0
    for param in step.params:
        if isinstance(param, (list, tuple)):
            return False
        size += len(param) if isinstance(param, (bytes, str)) else 16
    return size <= _FUSE_LIMIT


class AsyncPsycopgSession(AsyncSession):
    """An asyncio psycopg 3 connection."""

    def __init__(self, connection: Any, owned: bool = False) -> None:
        super().__init__(get_dialect("postgres"), connection, owned)
        self._listening: set[str] = set()

    @classmethod
    async def connect(cls, conninfo: str, **kwargs: Any) -> AsyncPsycopgSession:
        import psycopg

        try:
            connection = await psycopg.AsyncConnection.connect(
                conninfo, autocommit=True, **with_connect_timeout(conninfo, kwargs)
            )
        except psycopg.Error as exc:
            _raise_translated(get_dialect("postgres"), exc, _ANY_STEP)
        return cls(connection, owned=True)

    def autocommits(self) -> bool:
        return _psycopg_autocommits(self.connection)

    async def wait_for_notification(self, channels: list[str], timeout: float) -> bool:
        """LISTEN on first use of each channel, then wait for a NOTIFY; a burst already received wakes once.

        Notifications that arrive while the connection runs other statements are kept by psycopg
        and end the next wait at once.
        """
        import psycopg

        try:
            for channel in channels:
                if channel not in self._listening:
                    await self.connection.execute(self.dialect.listen(channel))
                    self._listening.add(channel)
            woken = False
            async for _ in self.connection.notifies(timeout=timeout, stop_after=1):
                woken = True
            if woken:
                async for _ in self.connection.notifies(timeout=0):
                    pass
            return woken
        except psycopg.Error as exc:
            _raise_translated(self.dialect, exc, _ANY_STEP)

    async def run(self, op: Operation[T], *, single_statement: bool = False) -> T:
        """As :meth:`PsycopgSession.run`: BEGIN travels with the first statement."""
        if not self.autocommits():
            return await super().run(op, single_statement=single_statement)
        if single_statement:
            return await drive_async(op, self.execute)
        began = False

        async def execute(step: Step) -> Any:
            nonlocal began
            if began:
                return await self.execute(step)
            began = True
            return await self._begin_with(step)

        try:
            result = await drive_async(op, execute)
            if began:
                await self._command("COMMIT")
        except BaseException:
            # Also after a failed COMMIT: the session must not stay in an aborted transaction.
            if began:
                await self._command("ROLLBACK", quietly=True)
            raise
        return result

    async def _begin_with(self, step: Step) -> Any:
        import psycopg

        if not _fusable(step):
            await self._command("BEGIN")
            return await self.execute(step)
        try:
            text = psycopg.AsyncClientCursor(self.connection).mogrify(step.sql, step.params)
            async with self.connection.cursor() as cursor:
                await cursor.execute("BEGIN; " + text)
                cursor.nextset()
                return await _fetch_async(cursor, step)
        except psycopg.Error as exc:
            _raise_translated(self.dialect, exc, step)

    async def _command(self, command: str, quietly: bool = False) -> None:
        """As :meth:`PsycopgSession._command`."""
        import psycopg

        try:
            await self.connection.execute(command)
        except psycopg.Error as exc:
            if not quietly:
                _raise_translated(self.dialect, exc, _ANY_STEP)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        import psycopg

        try:
            async with self.connection.transaction():
                yield
        except psycopg.Error as exc:
            _raise_translated(self.dialect, exc, _ANY_STEP)

    async def execute(self, step: Step) -> Any:
        import psycopg

        try:
            async with self.connection.cursor() as cursor:
                await cursor.execute(step.sql, step.params)
                return await _fetch_async(cursor, step)
        except psycopg.Error as exc:
            _raise_translated(self.dialect, exc, step)


class AsyncSessionPool(ABC):
    """Hands out async sessions; the message pump needs one per concurrent receive."""

    dialect: Dialect

    @abstractmethod
    def session(self) -> Any:
        """Async context manager yielding an :class:`AsyncSession` for exclusive use."""

    @abstractmethod
    async def open(self) -> None:
        """Prepare the pool (does not fail when the database is down: sessions will fail instead)."""

    @abstractmethod
    async def close(self) -> None:
        """Close every connection."""


class AsyncPsycopgPool(AsyncSessionPool):
    """Up to ``max_size`` autocommit psycopg connections for asyncio callers, reopened as soon as they fail.

    A connection that fails (the server restarted, ``pg_terminate_backend`` killed its session) is
    closed, and so is every idle one: they were most likely cut by the same event. The next session
    opens a new connection at once, so a pump is back at full speed as soon as the database
    answers again, with no reconnection back-off of the pool's own between it and the database --
    the pump's circuit breaker already paces retries while the database is down.

    :param min_size: connections opened by :meth:`open` (best effort: a database that is down
        does not fail it).
    """

    def __init__(self, conninfo: str, max_size: int, min_size: int = 1, **kwargs: Any) -> None:
        if max_size < 1:
            raise ValueError(f"max_size must be at least 1, got {max_size}")
        self.dialect = get_dialect("postgres")
        self._conninfo = conninfo
        self._kwargs = kwargs
        self._min_size = min(min_size, max_size)
        self._slots = asyncio.Semaphore(max_size)
        self._idle: list[Any] = []
        self._closed = False

    async def _connect(self) -> Any:
        return (await AsyncPsycopgSession.connect(self._conninfo, **self._kwargs)).connection

    async def open(self) -> None:
        for _ in range(self._min_size - len(self._idle)):
            try:
                self._idle.append(await self._connect())
            except TransportUnavailableError:
                return

    async def close(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for connection in idle:
            await close_quietly(connection)

    @asynccontextmanager
    async def session(self) -> AsyncIterator[AsyncSession]:
        if self._closed:
            raise TransportUnavailableError("the session pool is closed")
        async with self._slots:
            connection = self._idle.pop() if self._idle else await self._connect()
            cut = False
            try:
                yield AsyncPsycopgSession(connection)
            except TransportUnavailableError:
                cut = True
                idle, self._idle = self._idle, []  # cut by the same event, most likely
                for other in idle:
                    await close_quietly(other)
                raise
            finally:
                if cut or self._closed or connection.broken or not _psycopg_autocommits(connection):
                    await close_quietly(connection)
                else:
                    self._idle.append(connection)


# -- SQL Server: pymssql and pyodbc ------------------------------------------------------------

_PLACEHOLDER = re.compile(r"%(.)", re.DOTALL)


def _placeholders(sql: str, marker: Callable[[], str]) -> str:
    """Rewrite the dialect's ``%s`` placeholders with ``marker()`` and its ``%%`` as ``%``."""

    def replace(match: re.Match[str]) -> str:
        if match.group(1) == "s":
            return marker()
        if match.group(1) == "%":
            return "%"
        raise ValueError(f"stray % in statement: {sql[:80]!r}")

    return _PLACEHOLDER.sub(replace, sql)


def _fetch_results(cursor: Any, step: Step) -> Any:
    """Read what a step asks for from a T-SQL batch, then drain its remaining results.

    A batch such as claim's (DECLARE; DELETE ... OUTPUT INTO; INSERT ... OUTPUT) reports row counts
    before its result set, and some drivers surface those as results of their own: rows come from
    the first result that has columns, a row count from the last statement that reported one.
    """
    if step.fetch is Fetch.NONE:
        result = None
    elif step.fetch is Fetch.ROWCOUNT:
        result = cursor.rowcount
        while cursor.nextset():
            if cursor.rowcount is not None and cursor.rowcount >= 0:
                result = cursor.rowcount
        return result
    else:
        while cursor.description is None:
            if not cursor.nextset():
                return [] if step.fetch is Fetch.ALL else None
        rows = [tuple(row) for row in cursor.fetchall()]
        result = rows if step.fetch is Fetch.ALL else (rows[0] if rows else None)
    while cursor.nextset():
        pass
    return result


def pymssql_literal(value: Any) -> str:
    """One value as pymssql sends it, except bytes, which are always a binary literal.

    pymssql itself renders bytes that happen to be ASCII as a varchar literal ('{"a":1}'), and
    SQL Server refuses to convert varchar to varbinary implicitly (error 257): every body must
    travel as ``0x...`` (``0x`` when empty), whatever its bytes.
    """
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "0x" + bytes(value).hex()
    from pymssql._mssql import quote_simple_value

    return str(quote_simple_value(value).decode("utf-8"))


def pymssql_text(sql: str, params: tuple[Any, ...]) -> str:
    """Dialect text with every value inlined (:func:`pymssql_literal`): exactly what goes to the server."""
    values = iter(params)

    def quoted() -> str:
        value = next(values, _NO_MORE)
        if value is _NO_MORE:
            raise ValueError(f"fewer parameters than placeholders in {sql[:80]!r}")
        return pymssql_literal(value)

    text = _placeholders(sql, quoted)
    if next(values, _NO_MORE) is not _NO_MORE:
        raise ValueError(f"more parameters than placeholders in {sql[:80]!r}")
    return text


_NO_MORE = object()


def execute_pymssql(cursor: Any, sql: str, params: tuple[Any, ...]) -> None:
    """Run dialect text on a pymssql cursor (values inlined by :func:`pymssql_text`)."""
    cursor.execute(pymssql_text(sql, params))


def pyodbc_statement(sql: str, params: tuple[Any, ...]) -> tuple[str, tuple[Any, ...]]:
    """Dialect text as pyodbc sends it: ``?`` markers, and the values the ODBC driver binds to them.

    uniqueidentifier values travel as text (every ODBC driver converts that); bytes bind as
    varbinary and str as nvarchar.
    """
    values = tuple(str(value) if type(value).__name__ == "UUID" else value for value in params)
    return _placeholders(sql, lambda: "?"), values


def execute_pyodbc(cursor: Any, sql: str, params: tuple[Any, ...]) -> None:
    """Run dialect text on a pyodbc cursor with ``?`` parameters bound by the ODBC driver."""
    cursor.execute(*pyodbc_statement(sql, params))


class _SqlServerSession(Session):
    """One SQL Server connection kept in autocommit mode; transactions are explicit T-SQL.

    Keeping the driver in autocommit means no transaction is open between operations (none left
    holding locks or deleted rows), and both drivers behave the same. A transaction opened inside
    another joins it: with XACT_ABORT ON an error dooms the whole transaction anyway, so an inner
    savepoint could not keep the outer one alive.
    """

    driver: str
    _autocommit_hint: str

    def __init__(self, connection: Any, owned: bool = False) -> None:
        super().__init__(get_dialect("sqlserver"), connection, owned)
        self._depth = 0
        if not owned:
            self._check_borrowed()
        self.execute(Step(tsql.SESSION_SETUP, (), Fetch.NONE, "the database"))

    @abstractmethod
    def _driver_autocommits(self) -> bool:
        """Whether the driver connection is in autocommit mode."""

    def _check_borrowed(self) -> None:
        """Refuse a caller's connection that is not in autocommit mode or has a transaction open.

        Sessions run single statements without a transaction and end every transaction they
        open; on a connection whose driver keeps a transaction open (pymssql does from connect
        unless ``autocommit=True``) nothing would ever commit, and with XACT_ABORT an error would
        roll back the caller's own work too.
        """
        if not self._driver_autocommits():
            raise TransportMisconfiguredError(
                f"the {self.driver} connection given is not in autocommit mode: open it with autocommit=True "
                f"or switch it ({self._autocommit_hint}) before handing it to the transport, which opens and ends "
                "its own transactions"
            )
        row = self.execute(Step(tsql.OPEN_TRANSACTIONS, (), Fetch.ONE, "the database"))
        if row and row[0]:
            raise TransportMisconfiguredError(
                f"the {self.driver} connection given has {row[0]} transaction(s) open: commit or roll back first; "
                "the transport runs its own transactions and would otherwise join (and on an error roll back) yours"
            )

    @abstractmethod
    def _execute(self, cursor: Any, sql: str, params: tuple[Any, ...]) -> None:
        """Execute one dialect statement with the driver's parameter style."""

    def autocommits(self) -> bool:
        return self._depth == 0  # the connection is kept in autocommit mode; _depth counts open transactions

    def _driver_error(self, exc: BaseException) -> bool:
        return type(exc).__module__.split(".", 1)[0] == self.driver

    @contextmanager
    def transaction(self) -> Iterator[None]:
        if self._depth:
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
            return
        self.execute(Step(tsql.BEGIN_TRANSACTION, (), Fetch.NONE, "the database"))
        self._depth = 1
        try:
            yield
        except BaseException:
            self._depth = 0
            try:
                self.execute(Step(tsql.ROLLBACK_TRANSACTION, (), Fetch.NONE, "the database"))
            except Exception:  # the connection may be gone; the server rolls back then
                pass
            raise
        self._depth = 0
        self.execute(Step(tsql.COMMIT_TRANSACTION, (), Fetch.NONE, "the database"))

    def execute(self, step: Step) -> Any:
        try:
            cursor = self.connection.cursor()
            try:
                self._execute(cursor, step.sql, step.params)
                return _fetch_results(cursor, step)
            finally:
                cursor.close()
        except Exception as exc:
            if not self._driver_error(exc):
                raise
            _raise_translated(self.dialect, exc, step)


class PymssqlSession(_SqlServerSession):
    """A pymssql connection (the microsoft-mssql provider's driver).

    pymssql binds parameters on the client by quoting them into the text; it is given text with
    every value already quoted by pymssql's own quoting, so that a ``%`` in a quoted table name
    is never mistaken for a placeholder.
    """

    driver = "pymssql"
    _autocommit_hint = "connection.autocommit(True)"

    def _driver_autocommits(self) -> bool:
        return bool(self.connection.autocommit_state)

    @classmethod
    def connect(cls, uri: str, **kwargs: Any) -> PymssqlSession:
        """Open ``mssql://user:password@host:port/database?login_timeout=10`` in autocommit mode."""
        import pymssql

        parts = urlsplit(uri)
        options: dict[str, Any] = {"login_timeout": 10, **dict(parse_qsl(parts.query)), **kwargs}
        for key in ("login_timeout", "timeout"):
            if key in options:
                options[key] = int(options[key])
        try:
            connection = pymssql.connect(
                server=parts.hostname or "localhost",
                port=str(parts.port or 1433),
                user=unquote(parts.username or ""),
                password=unquote(parts.password or ""),
                database=unquote(parts.path.lstrip("/")),
                autocommit=True,
                **options,
            )
        except pymssql.Error as exc:
            _raise_translated(get_dialect("sqlserver"), exc, _ANY_STEP)
        return cls(connection, owned=True)

    def _execute(self, cursor: Any, sql: str, params: tuple[Any, ...]) -> None:
        execute_pymssql(cursor, sql, params)


class PyodbcSession(_SqlServerSession):
    """A pyodbc connection (the odbc provider's driver), e.g. with FreeTDS or Microsoft's ODBC driver."""

    driver = "pyodbc"
    _autocommit_hint = "connection.autocommit = True"

    def _driver_autocommits(self) -> bool:
        return bool(self.connection.autocommit)

    @classmethod
    def connect(cls, target: str, **kwargs: Any) -> PyodbcSession:
        """Open an ODBC connection string, or ``mssql+pyodbc://user:password@host:port/db?driver=FreeTDS``."""
        import pyodbc

        connection_string = target if _is_odbc_string(target) else _odbc_string(target)
        try:
            connection = pyodbc.connect(connection_string, autocommit=True, **kwargs)
        except pyodbc.Error as exc:
            _raise_translated(get_dialect("sqlserver"), exc, _ANY_STEP)
        return cls(connection, owned=True)

    def _execute(self, cursor: Any, sql: str, params: tuple[Any, ...]) -> None:
        execute_pyodbc(cursor, sql, params)


def _odbc_value(value: str) -> str:
    """An ODBC connection-string value, braced when it holds characters that end or open one."""
    return "{" + value.replace("}", "}}") + "}" if any(c in value for c in ";{}=") or value != value.strip() else value


def _odbc_string(uri: str) -> str:
    """An ODBC connection string from ``mssql+pyodbc://user:password@host:port/database?driver=...&Key=value``."""
    parts = urlsplit(uri)
    query = dict(parse_qsl(parts.query))
    driver = query.pop("driver", "FreeTDS")
    pairs = {
        "DRIVER": "{" + driver + "}",
        "SERVER": f"{parts.hostname or 'localhost'},{parts.port or 1433}",
        "DATABASE": unquote(parts.path.lstrip("/")),
        "UID": unquote(parts.username or ""),
        "PWD": unquote(parts.password or ""),
        **query,
    }
    return ";".join(
        f"{key}={value if key == 'DRIVER' else _odbc_value(value)}" for key, value in pairs.items() if value != ""
    )


class AsyncThreadSession(AsyncSession):
    """A blocking session driven from asyncio on a thread of its own.

    pymssql and pyodbc have no asyncio interface; running every call of one connection on one
    dedicated thread keeps the event loop (the triggerer's) free and the connection single-threaded.
    """

    def __init__(self, session: Session, executor: ThreadPoolExecutor) -> None:
        super().__init__(session.dialect, session.connection, session.owned)
        self._session = session
        self._executor = executor

    @classmethod
    async def open(cls, factory: Callable[[], Session]) -> AsyncThreadSession:
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlqueue-db")
        try:
            session = await asyncio.get_running_loop().run_in_executor(executor, factory)
        except BaseException:
            executor.shutdown(wait=False)
            raise
        return cls(session, executor)

    async def _call(self, function: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, function, *args)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        manager = self._session.transaction()
        await self._call(manager.__enter__)
        try:
            yield
        except BaseException as exc:
            await self._call(manager.__exit__, type(exc), exc, exc.__traceback__)
            raise
        await self._call(manager.__exit__, None, None, None)

    def autocommits(self) -> bool:
        return self._session.autocommits()

    async def execute(self, step: Step) -> Any:
        return await self._call(self._session.execute, step)

    async def close(self) -> None:
        try:
            await self._call(self._session.close)
        finally:
            self._executor.shutdown(wait=False)


class AsyncThreadPool(AsyncSessionPool):
    """Up to ``max_size`` thread-backed sessions, opened on demand and reused.

    A session whose connection failed is closed instead of being handed out again, so a pump
    recovers by itself once the database is back.
    """

    def __init__(self, factory: Callable[[], Session], max_size: int, dialect: Dialect | None = None) -> None:
        self.dialect = dialect or get_dialect("sqlserver")
        self._factory = factory
        self._slots = asyncio.Semaphore(max_size)
        self._idle: list[AsyncThreadSession] = []

    async def open(self) -> None:
        """Nothing to do: connections open when first needed."""

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for session in idle:
            await close_quietly(session)

    @asynccontextmanager
    async def session(self) -> AsyncIterator[AsyncSession]:
        async with self._slots:
            session = self._idle.pop() if self._idle else await AsyncThreadSession.open(self._factory)
            try:
                yield session
            except SqlQueueError as exc:  # a queue error leaves the connection usable, unless it is the cause
                if isinstance(exc, TransportUnavailableError):
                    await close_quietly(session)
                else:
                    self._idle.append(session)
                raise
            except BaseException:
                await close_quietly(session)
                raise
            self._idle.append(session)


async def close_quietly(closable: AsyncSession | Any) -> None:
    """Close an async session or client whose connection may already be broken (best effort)."""
    try:
        await closable.close()
    except Exception:  # the connection is already broken
        pass
