"""The library's own way onto a psycopg connection, whoever set it up and however.

Its statements run on cursors of its own (:func:`own_cursor`: tuple rows, psycopg's default
adapters), whatever ``row_factory``, ``cursor_factory`` or loaders a borrowed connection carries;
blocking and asyncio connections behind one asyncio interface (:class:`Blocking`, :class:`Async`);
parameters as the server must read them whatever the session's settings (:func:`typed_nulls`); and
the states it refuses before sending anything (:func:`refuse_in_aborted`, :func:`refuse_unusable`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import psycopg
from psycopg import postgres
from psycopg.adapt import AdaptersMap
from psycopg.pq import PipelineStatus, TransactionStatus
from psycopg.rows import tuple_row

from .. import defaults
from ..errors import TransactionAbortedError, TransportMisconfiguredError
from ..logs import logger

log = logger("airflow_provider_sqlqueue.transport")

#: Why nothing more can run in the connection's transaction: an error aborted it earlier.
_ABORTED_BEFORE = (
    "a statement earlier in the connection's transaction failed and its error was caught: PostgreSQL aborted "
    "the transaction, so nothing more runs in it and nothing done in it can commit; roll it back and start "
    "again (let database errors propagate, or put the statement in a savepoint: connection.transaction())"
)


def refuse_in_aborted(connection: Any) -> None:
    """Raise before sending anything into a transaction an error aborted. PostgreSQL would refuse the
    statement ("current transaction is aborted"), and a savepoint opened for it fails too, so that
    psycopg logs the failed rollback of a savepoint it never made; the caller's mistake is the caught
    error, said once, in the library's words."""
    if connection.info.transaction_status == TransactionStatus.INERROR:
        raise TransactionAbortedError(_ABORTED_BEFORE)


@contextmanager
def _cancelled_if_interrupted(connection: Any) -> Iterator[None]:
    """Cancel the statement a blocking wait leaves running when something other than the database
    interrupts it: an exception from a signal handler (a task timeout) ends the wait, not the
    statement -- a receive waiting for a lock would go on to take its message for nobody. psycopg
    does this itself for KeyboardInterrupt. The connection is then replaced by the next call."""
    try:
        yield
    except psycopg.Error:
        raise
    except BaseException:
        if not connection.closed and connection.info.transaction_status == TransactionStatus.ACTIVE:
            try:
                connection.cancel_safe(timeout=defaults.CANCEL_TIMEOUT_SECONDS)
            except Exception as exc:  # noqa: BLE001  # the interruption is what the caller must see
                log.warning("Could not cancel the statement an interrupted call left running: %s", exc)
        raise


class BlockingCursor:
    """A blocking psycopg cursor behind the asyncio cursor's interface (see :class:`Blocking`)."""

    def __init__(self, cursor: Any) -> None:
        self._cursor = cursor

    @property
    def rowcount(self) -> int:
        return int(self._cursor.rowcount)

    def nextset(self) -> bool | None:
        return self._cursor.nextset()  # type: ignore[no-any-return]

    async def execute(
        self, query: str, params: Any = None, *, prepare: bool | None = None, binary: bool | None = None
    ) -> None:
        with _cancelled_if_interrupted(self._cursor.connection):
            self._cursor.execute(query, params, prepare=prepare, binary=binary)

    async def fetchall(self) -> list[Any]:
        return self._cursor.fetchall()  # type: ignore[no-any-return]

    async def fetchone(self) -> Any:
        return self._cursor.fetchone()

    @property
    def adapters(self) -> Any:
        return self._cursor.adapters

    @asynccontextmanager
    async def copy(self, statement: str) -> AsyncIterator[BlockingCopy]:
        with self._cursor.copy(statement) as copy:
            yield BlockingCopy(copy)


class BlockingCopy:
    """A blocking psycopg ``Copy`` behind the asyncio ``AsyncCopy``'s interface."""

    def __init__(self, copy: Any) -> None:
        self._copy = copy

    def set_types(self, types: list[str]) -> None:
        self._copy.set_types(types)

    async def write_row(self, row: Any) -> None:
        self._copy.write_row(row)

    async def write(self, chunk: Any) -> None:
        self._copy.write(chunk)


#: psycopg's default adapters, as no caller changed them: what the library's cursors dump its
#: parameters and load its rows with.
_ADAPTERS = AdaptersMap(types=postgres.types)
postgres.register_default_adapters(_ADAPTERS)


def own_cursor(cls: Any, connection: Any) -> Any:
    """A cursor of psycopg's class ``cls`` on ``connection`` that reads rows as tuples with psycopg's
    default adapters, whatever ``cursor_factory``, ``row_factory`` and adapters (a uuid read as
    text, bytea as str) a borrowed connection was given: the library's statements and the rows they
    read do not depend on how the caller set the connection up. (A cursor copies its connection's
    adapters when made; psycopg has no argument to give it others. The version is locked.)"""
    cursor = cls(connection, row_factory=tuple_row)
    cursor._adapters = AdaptersMap(_ADAPTERS)
    return cursor


class Blocking:
    """A blocking psycopg connection behind psycopg's asyncio interface: each coroutine blocks and
    returns without suspending, so one :class:`PsycopgSession` serves blocking and asyncio callers.
    Its cursors are the library's own (:func:`own_cursor`)."""

    def __init__(self, connection: Any) -> None:
        self._connection = connection

    async def execute(self, query: str, *, prepare: bool | None = None) -> None:
        async with self.cursor() as cursor:
            await cursor.execute(query, prepare=prepare)

    @asynccontextmanager
    async def cursor(self) -> AsyncIterator[BlockingCursor]:
        with own_cursor(psycopg.Cursor, self._connection) as cursor:
            yield BlockingCursor(cursor)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        with self._connection.transaction():
            yield


class Async:
    """An asyncio psycopg connection with the library's own cursors (see :class:`Blocking`)."""

    def __init__(self, connection: Any) -> None:
        self._connection = connection

    async def execute(self, query: str, *, prepare: bool | None = None) -> None:
        async with self.cursor() as cursor:
            await cursor.execute(query, prepare=prepare)

    def cursor(self) -> Any:
        return own_cursor(psycopg.AsyncCursor, self._connection)

    def transaction(self) -> Any:
        return self._connection.transaction()


def typed_nulls(params: Mapping[str, Any]) -> Mapping[str, Any]:
    """Parameters with each list of only None (a batch of messages none of which expires) given as
    NULL. psycopg cannot type such a list and sends it as the text ``{NULL,...}``, which a session
    with ``array_nulls = off`` reads as the string NULL. A NULL array is the same to the statements
    that take lists: ``unnest`` pads it with NULLs to the longest array beside it, and ``= ANY``
    matches nothing in it."""
    if not any(isinstance(value, list) for value in params.values()):
        return params
    return {
        name: None if isinstance(value, list) and value and all(v is None for v in value) else value
        for name, value in params.items()
    }


def refuse_unusable(connection: Any) -> None:
    """Refuse, before anything is sent, a connection in a mode the library's statements cannot run
    in: a pipeline (psycopg's ``connection.pipeline()`` block), where a statement of several
    commands, as the library's BEGIN travels, is refused and errors surface at a later sync."""
    if connection.info.pipeline_status != PipelineStatus.OFF:
        raise TransportMisconfiguredError(
            "the connection given is in pipeline mode (inside connection.pipeline()): the library's statements "
            "cannot run in a pipeline; call the client outside the pipeline block"
        )
