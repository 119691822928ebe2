"""Drivers: run operations' steps on real connections, inside transactions.

A *session* wraps one DB-API connection and knows how to begin/commit a transaction and execute a
:class:`~airflow_provider_sqlqueue.transport.operations.Step` on it. Sessions opened from a URI own
their connection (and close it); sessions over a caller's connection only borrow it. Either way a
transaction is opened only around an operation and always ended before control returns, so no
session is left ``idle in transaction`` between calls.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any, TypeVar

from .dialects import Dialect, get_dialect
from .operations import Fetch, Operation, Step, drive, drive_async

T = TypeVar("T")


def dialect_for(target: object) -> Dialect:
    """Pick the dialect from a URI's scheme or a connection object's driver module."""
    if isinstance(target, str):
        scheme = target.split(":", 1)[0].lower() if "://" in target else ""
        if scheme in ("postgresql", "postgres"):
            return get_dialect("postgres")
        if "=" in target and "://" not in target:  # a libpq key=value DSN
            return get_dialect("postgres")
        raise ValueError(
            f"cannot tell the database from {scheme or 'this connection string'!r}; use a postgresql:// URI"
        )
    module = type(target).__module__.split(".", 1)[0]
    if module == "psycopg":
        return get_dialect("postgres")
    raise TypeError(f"unsupported connection type {type(target).__module__}.{type(target).__qualname__}")


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

    def run(self, op: Operation[T]) -> T:
        """Run a whole operation in its own transaction."""
        with self.transaction():
            return drive(op, self.execute)

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

    async def run(self, op: Operation[T]) -> T:
        async with self.transaction():
            return await drive_async(op, self.execute)

    async def close(self) -> None:
        if self.owned:
            await self.connection.close()


# -- psycopg 3 -------------------------------------------------------------------------------


def _translated(dialect: Dialect, exc: BaseException, step: Step) -> BaseException:
    return dialect.translate_error(exc, step.target) or exc


class PsycopgSession(Session):
    """A blocking psycopg 3 connection."""

    def __init__(self, connection: Any, owned: bool = False) -> None:
        super().__init__(get_dialect("postgres"), connection, owned)

    @classmethod
    def connect(cls, conninfo: str, **kwargs: Any) -> PsycopgSession:
        """Open an autocommit connection: outside an operation's transaction nothing stays open."""
        import psycopg

        try:
            connection = psycopg.connect(conninfo, autocommit=True, **kwargs)
        except psycopg.Error as exc:
            raise get_dialect("postgres").translate_error(exc, "the database") or exc from exc
        return cls(connection, owned=True)

    @contextmanager
    def transaction(self) -> Iterator[None]:
        with self.connection.transaction():
            yield

    def execute(self, step: Step) -> Any:
        import psycopg

        try:
            with self.connection.cursor() as cursor:
                cursor.execute(step.sql, step.params)
                return _fetch(cursor, step)
        except psycopg.Error as exc:
            error = _translated(self.dialect, exc, step)
            if error is exc:
                raise
            raise error from exc


class AsyncPsycopgSession(AsyncSession):
    """An asyncio psycopg 3 connection."""

    def __init__(self, connection: Any, owned: bool = False) -> None:
        super().__init__(get_dialect("postgres"), connection, owned)

    @classmethod
    async def connect(cls, conninfo: str, **kwargs: Any) -> AsyncPsycopgSession:
        import psycopg

        try:
            connection = await psycopg.AsyncConnection.connect(conninfo, autocommit=True, **kwargs)
        except psycopg.Error as exc:
            raise get_dialect("postgres").translate_error(exc, "the database") or exc from exc
        return cls(connection, owned=True)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        async with self.connection.transaction():
            yield

    async def execute(self, step: Step) -> Any:
        import psycopg

        try:
            async with self.connection.cursor() as cursor:
                await cursor.execute(step.sql, step.params)
                return await _fetch_async(cursor, step)
        except psycopg.Error as exc:
            error = _translated(self.dialect, exc, step)
            if error is exc:
                raise
            raise error from exc


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
    """A psycopg_pool pool of autocommit connections, each checked before it is handed out.

    Checking on checkout is what lets a pump recover by itself after the database restarted or
    killed its sessions: a dead connection is replaced instead of failing the next receive.
    """

    def __init__(self, conninfo: str, max_size: int, min_size: int = 1, **kwargs: Any) -> None:
        from psycopg_pool import AsyncConnectionPool

        self.dialect = get_dialect("postgres")
        self._pool = AsyncConnectionPool(
            conninfo,
            min_size=min(min_size, max_size),
            max_size=max_size,
            kwargs={"autocommit": True, **kwargs},
            check=AsyncConnectionPool.check_connection,
            open=False,
            name="sqlqueue",
        )

    async def open(self) -> None:
        await self._pool.open(wait=False)

    async def close(self) -> None:
        await self._pool.close()

    @asynccontextmanager
    async def session(self) -> AsyncIterator[AsyncSession]:
        import psycopg
        from psycopg_pool import PoolTimeout

        try:
            async with self._pool.connection() as connection:
                yield AsyncPsycopgSession(connection)
        except (PoolTimeout, psycopg.OperationalError) as exc:
            raise self.dialect.translate_error(psycopg.OperationalError(str(exc)), "the database") or exc from exc
