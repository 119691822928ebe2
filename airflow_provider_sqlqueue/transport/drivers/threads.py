"""Blocking sessions driven from asyncio: one dedicated thread per connection (SQL Server's drivers)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any

from ..dialects import Dialect, get_dialect
from ..errors import ClientClosedError, SqlQueueError, TransportUnavailableError
from ..operations.steps import Step
from .base import Session, SessionPool, T, close_quietly, finish


class ThreadSession(Session):
    """A blocking session driven from asyncio on a thread of its own.

    pymssql and pyodbc have no asyncio interface; running every call of one connection on one
    dedicated thread keeps the event loop (the triggerer's) free and the connection single-threaded.
    The blocking session's coroutines never suspend, so each runs whole on that thread (:func:`finish`).
    """

    def __init__(self, session: Session, executor: ThreadPoolExecutor) -> None:
        super().__init__(session.dialect, session.connection, session.owned)
        self._session = session
        self._executor = executor

    @property
    def blocking(self) -> bool:
        return False

    @classmethod
    async def open(cls, factory: Callable[[], Session]) -> ThreadSession:
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlqueue-db")
        try:
            session = await asyncio.get_running_loop().run_in_executor(executor, factory)
        except BaseException:
            executor.shutdown(wait=False)
            raise
        return cls(session, executor)

    async def _call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, finish, coroutine)

    @asynccontextmanager
    async def transaction(self, *, begun_by_first_statement: bool = False) -> AsyncIterator[None]:
        if self.closed:
            raise ClientClosedError()
        manager = self._session.transaction(begun_by_first_statement=begun_by_first_statement)
        await self._call(manager.__aenter__())
        try:
            yield
            if self.closed:  # closed inside the block: its transaction went with the connection
                raise ClientClosedError()
        except BaseException as exc:
            if not self.closed:  # else the thread is gone, and nothing is left to roll back
                await self._call(manager.__aexit__(type(exc), exc, exc.__traceback__))
            raise
        await self._call(manager.__aexit__(None, None, None))

    def autocommits(self) -> bool:
        return self._session.autocommits()

    async def execute(self, step: Step) -> Any:
        if self.closed:  # its thread is gone: said as for any closed client, not as the executor says it
            raise ClientClosedError()
        return await self._call(self._session.execute(step))

    async def close(self) -> None:
        self.closed = True
        try:
            await self._call(self._session.close())
        finally:
            self._executor.shutdown(wait=False)


class ThreadSessionPool(SessionPool):
    """Up to ``max_size`` thread-backed sessions, opened on demand and reused.

    A session whose connection failed is closed instead of being handed out again, so a pump
    recovers by itself once the database is back.
    """

    def __init__(self, factory: Callable[[], Session], max_size: int, dialect: Dialect | None = None) -> None:
        self.dialect = dialect or get_dialect("sqlserver")
        self._factory = factory
        self._slots = asyncio.Semaphore(max_size)
        self._idle: list[ThreadSession] = []

    async def open(self) -> None:
        """Nothing to do: connections open when first needed."""

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for session in idle:
            await close_quietly(session)

    @asynccontextmanager
    async def session(self) -> AsyncIterator[Session]:
        async with self._slots:
            session = self._idle.pop() if self._idle else await ThreadSession.open(self._factory)
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
