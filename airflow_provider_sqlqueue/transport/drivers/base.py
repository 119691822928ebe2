"""What every driver module shares: the session interfaces, result fetching and error translation.

A *session* wraps one DB-API connection and knows how to begin/commit a transaction and execute a
:class:`~airflow_provider_sqlqueue.transport.operations.Step` on it. Sessions opened from a URI own
their connection (and close it); sessions over a caller's connection only borrow it. Either way a
transaction is opened only around an operation and always ended before control returns, so no
session is left ``idle in transaction`` between calls.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NoReturn, TypeVar

from ..dialects import Dialect
from ..errors import SqlQueueError
from ..operations import Fetch, Operation, Step, drive, drive_async, needs_no_transaction

T = TypeVar("T")

#: What errors outside any one statement (BEGIN, COMMIT, connecting) are reported against.
ANY_STEP = Step("", {}, Fetch.NONE, "the database")


def raise_translated(dialect: Dialect, exc: BaseException, step: Step) -> NoReturn:
    """Re-raise a driver error as the transport's error for it (keeping the driver's as its cause)."""
    error = dialect.translate_error(exc, step.target)
    if error is None:
        raise exc
    raise error from exc


@contextmanager
def opening(dialect: Dialect, what: str) -> Iterator[None]:
    """Translate any driver error raised while a connection is opened outside the transport (e.g. by
    an Airflow hook), reported against ``what``; the transport's own errors pass unchanged."""
    try:
        yield
    except SqlQueueError:
        raise
    except Exception as exc:
        raise_translated(dialect, exc, Step("", {}, Fetch.NONE, what))


@contextmanager
def translated(
    dialect: Dialect, errors: type[BaseException] | tuple[type[BaseException], ...], step: Step = ANY_STEP
) -> Iterator[None]:
    """Turn the driver's ``errors`` raised inside the block into the transport's errors (:meth:`Dialect.translate_error`)."""
    try:
        yield
    except errors as exc:
        raise_translated(dialect, exc, step)


async def fetch_async(cursor: Any, step: Step) -> Any:
    if step.fetch is Fetch.ALL:
        return await cursor.fetchall()
    if step.fetch is Fetch.ONE:
        return await cursor.fetchone()
    if step.fetch is Fetch.ROWCOUNT:
        return cursor.rowcount
    return None


def fetch(cursor: Any, step: Step) -> Any:
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
        """Run a whole operation in its own transaction.

        An operation of one statement needs no explicit transaction on an autocommit connection
        (the statement is atomic by itself), which saves the BEGIN and COMMIT round trips.
        """
        if needs_no_transaction(op) and self.autocommits():
            return drive(op, self.execute)
        with self.transaction():
            return drive(op, self.execute)

    @abstractmethod
    def autocommits(self) -> bool:
        """Whether a statement run now commits by itself (autocommit and no transaction open)."""

    def transaction_failed(self) -> bool:
        """Whether the open transaction can no longer commit as one: an error aborted it and its caller
        caught the error (committing would only roll it back), or the code inside ended it itself.
        False where the database does not keep such a state (SQL Server's COMMIT reports it instead)."""
        return False

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
        """Run a whole operation in its own transaction (none for one statement, as :meth:`Session.run`)."""
        if needs_no_transaction(op) and self.autocommits():
            return await drive_async(op, self.execute)
        async with self.transaction():
            return await drive_async(op, self.execute)

    @abstractmethod
    def autocommits(self) -> bool:
        """Whether a statement run now commits by itself (autocommit and no transaction open)."""

    def transaction_failed(self) -> bool:
        """As :meth:`Session.transaction_failed`."""
        return False

    async def wait_for_notification(self, channels: list[str], timeout: float) -> bool:
        """Wait up to ``timeout`` for a notification on any of ``channels``; without notifications, just wait."""
        await asyncio.sleep(timeout)
        return False

    async def close(self) -> None:
        if self.owned:
            await self.connection.close()


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


async def close_quietly(closable: AsyncSession | Any) -> None:
    """Close an async session or client whose connection may already be broken (best effort)."""
    try:
        await closable.close()
    except Exception:  # the connection is already broken
        pass
