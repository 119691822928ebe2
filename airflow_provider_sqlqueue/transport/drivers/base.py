"""What every driver module shares: the session interface, result fetching and error translation.

A *session* wraps one DB-API connection and knows how to begin/commit a transaction and execute a
:class:`~airflow_provider_sqlqueue.transport.operations.Step` on it, behind one asyncio interface
whether the driver blocks or not (:class:`Session`, :func:`finish`). Sessions opened from a URI own
their connection (and close it); sessions over a caller's connection only borrow it. Either way a
transaction is opened only around an operation and always ended before control returns, so no
session is left ``idle in transaction`` between calls.
"""

from __future__ import annotations

import asyncio
import inspect
import sys
from abc import ABC, abstractmethod
from collections.abc import Coroutine, Iterator
from contextlib import AbstractAsyncContextManager, contextmanager
from typing import Any, NoReturn, TypeVar

from ..dialects import Dialect
from ..errors import SqlQueueError
from ..operations.steps import Fetch, Operation, Step, drive, needs_no_transaction

T = TypeVar("T")

#: What errors outside any one statement (BEGIN, COMMIT, connecting) are reported against.
ANY_STEP = Step("", {}, Fetch.NONE, "the database")


def raise_translated(dialect: Dialect, exc: BaseException, step: Step) -> NoReturn:
    """Re-raise a driver error as the transport's error for it (keeping the driver's as its cause)."""
    # The target as people write it: the dialects double % in names for the drivers' placeholders.
    error = dialect.translate_error(exc, step.target.replace("%%", "%"))
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
    except Exception as exc:  # noqa: BLE001  # whatever a hook raised while connecting becomes the library's error
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


async def fetch(cursor: Any, step: Step) -> Any:
    """What ``step`` asks for from a cursor that has run it (an asyncio cursor, or a blocking one
    behind :class:`BlockingCursor`)."""
    if step.fetch in (Fetch.ALL, Fetch.ALL_UUID_TEXT):
        return await cursor.fetchall()
    if step.fetch is Fetch.ONE:
        return await cursor.fetchone()
    if step.fetch is Fetch.ROWCOUNT:
        return cursor.rowcount
    return None


def finish(coroutine: Coroutine[Any, Any, T]) -> T:
    """The result of a coroutine that never suspends: a call of the queue API over a blocking session.

    The API is written once, as coroutines (:class:`~..client.AsyncQueueClient`). Over a blocking
    session every ``await`` reaches code that does its I/O by blocking and returns, so the
    coroutine runs to its end on its first step, here, in the caller's thread; no event loop is
    involved. A coroutine that does suspend was given an asyncio session by mistake.
    """
    try:
        coroutine.send(None)
    except StopIteration as done:
        result: T = done.value
        return result
    coroutine.close()
    raise RuntimeError("a blocking call suspended: it was given an asyncio session")


@contextmanager
def blocking_context(manager: AbstractAsyncContextManager[T]) -> Iterator[T]:
    """An async context manager of a blocking session, entered and left in the caller's thread (:func:`finish`)."""
    value = finish(manager.__aenter__())
    try:
        yield value
    except BaseException:
        if not finish(manager.__aexit__(*sys.exc_info())):
            raise
    else:
        finish(manager.__aexit__(None, None, None))


class Session(ABC):
    """One connection, used by one caller at a time, behind one interface for every driver.

    The interface is asyncio's. An asyncio driver (psycopg's ``AsyncConnection``) suspends while
    the database works; a blocking one (psycopg's ``Connection``, pymssql, pyodbc) blocks inside
    the coroutine and never suspends, so its coroutines run to their end with :func:`finish`, and
    :class:`~.threads.ThreadSession` runs them on a thread for asyncio callers. Either way each
    operation is written and driven once.
    """

    def __init__(self, dialect: Dialect, connection: Any, owned: bool) -> None:
        self.dialect = dialect
        self.connection = connection
        self.owned = owned
        #: Set by :meth:`close`: the session's caller is done with it.
        self.closed = False

    @property
    def blocking(self) -> bool:
        """Whether the session blocks (and never suspends): what a blocking client requires."""
        return True

    @abstractmethod
    def transaction(self, *, begun_by_first_statement: bool = False) -> AbstractAsyncContextManager[None]:
        """Commit on success, roll back on error (inside an open transaction: join it, or a savepoint).

        ``begun_by_first_statement``: the block's first statement goes through :meth:`execute`
        before anything else touches the connection (a receive, before its message is handed out),
        so a driver may send BEGIN with that statement -- a round trip less per transaction, what
        a native-mode receive of one message costs most. Drivers that cannot ignore it.
        """

    @abstractmethod
    async def execute(self, step: Step) -> Any:
        """Run one step in the current transaction and return what it asks to fetch."""

    async def run(self, op: Operation[T]) -> T:
        """Run a whole operation in its own transaction.

        An operation of one statement needs no explicit transaction on an autocommit connection
        (the statement is atomic by itself), which saves the BEGIN and COMMIT round trips.
        """
        if needs_no_transaction(op) and self.autocommits():
            return await drive(op, self.execute)
        # Its first statement goes through execute() before anything else uses the connection, so a
        # driver may send BEGIN with it: a receive is then two round trips (BEGIN + DELETE, COMMIT).
        async with self.transaction(begun_by_first_statement=True):
            return await drive(op, self.execute)

    @abstractmethod
    def autocommits(self) -> bool:
        """Whether a statement run now commits by itself (autocommit and no transaction open)."""

    def transaction_failure(self) -> str | None:
        """Why the open transaction can no longer commit as one (None: it can): an error aborted it and
        its caller caught the error (committing would only roll it back), or the code inside ended it
        itself. None where the database does not keep such a state (SQL Server's COMMIT reports it)."""
        return None

    async def wait_for_notification(self, channels: list[str], timeout: float) -> list[str]:
        """Wait up to ``timeout`` for notifications on any of ``channels`` and return their payloads
        (none: the wait timed out); without notifications, just wait."""
        await asyncio.sleep(timeout)
        return []

    async def close(self) -> None:
        """Close the connection if this session opened it; the session is done with either way."""
        self.closed = True
        if self.owned:
            closed = self.connection.close()
            if inspect.isawaitable(closed):
                await closed


class SessionPool(ABC):
    """Hands out asyncio sessions; the message pump needs one per concurrent receive."""

    dialect: Dialect

    @abstractmethod
    def session(self) -> AbstractAsyncContextManager[Session]:
        """A session for exclusive use while the block runs."""

    async def listener(self) -> Session | None:
        """A session of the caller's own, outside the pool's slots, to wait for send notifications on
        for as long as the caller runs (it closes the session); None where the database has none.

        Outside the slots, so that a pump waiting for messages takes no session its receives need;
        of its own, because a connection that listens collects every notification until it waits
        again, which a pooled connection doing other work would keep in memory.
        """
        return None

    @abstractmethod
    async def open(self) -> None:
        """Prepare the pool (does not fail when the database is down: sessions will fail instead)."""

    @abstractmethod
    async def close(self) -> None:
        """Close every connection."""


async def close_quietly(closable: Session | Any) -> None:
    """Close a session, client or asyncio connection that may already be broken (best effort)."""
    try:
        await closable.close()
    except Exception:  # noqa: BLE001, S110  # the connection is already broken
        pass
