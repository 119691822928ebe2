"""Drivers: run operations' steps on real connections, one module per database (as ``dialects``).

- :mod:`.base`: the session interface, result fetching, error translation;
- :mod:`.postgres`: psycopg 3, blocking and asyncio, and the pump's pool;
- :mod:`.sqlserver`: pymssql and pyodbc (blocking);
- :mod:`.threads`: blocking sessions driven from asyncio on a thread of their own.

This module picks the database and driver from a URI, a connection string or a DB-API connection.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import psycopg

from ..dialects import Dialect, get_dialect
from ..errors import ArgumentTypeError, InvalidArgumentError
from .base import Session, SessionPool, blocking_context, close_quietly, finish, opening
from .postgres import AsyncPsycopgPool, PsycopgSession
from .sqlserver import PYMSSQL_SCHEMES, PYODBC_SCHEMES, PymssqlSession, PyodbcSession, is_odbc_string
from .threads import ThreadSession, ThreadSessionPool

__all__ = [
    "AsyncPsycopgPool",
    "PsycopgSession",
    "PymssqlSession",
    "PyodbcSession",
    "Session",
    "SessionPool",
    "ThreadSession",
    "ThreadSessionPool",
    "blocking_context",
    "close_quietly",
    "dialect_for",
    "driver_of",
    "finish",
    "open_pool",
    "open_session",
    "opening",
    "session_over",
]


def _scheme(target: str) -> str:
    return target.split(":", 1)[0].lower() if "://" in target else ""


def dialect_for(target: object) -> Dialect:
    """Pick the dialect from a URI's scheme, an ODBC connection string or a connection object's driver."""
    if isinstance(target, str):
        scheme = _scheme(target)
        if scheme in ("postgresql", "postgres"):
            return get_dialect("postgres")
        if scheme in PYMSSQL_SCHEMES + PYODBC_SCHEMES or is_odbc_string(target):
            return get_dialect("sqlserver")
        if "=" in target and "://" not in target:  # a libpq key=value DSN
            return get_dialect("postgres")
        raise InvalidArgumentError(
            f"cannot tell the database from {scheme or 'this connection string'!r}; use a postgresql:// or "
            "mssql:// URI (mssql+pyodbc:// or an ODBC connection string for pyodbc)"
        )
    driver = driver_of(target)
    if driver == "psycopg":
        return get_dialect("postgres")
    if driver in ("pymssql", "pyodbc"):
        return get_dialect("sqlserver")
    raise ArgumentTypeError(f"unsupported connection type {type(target).__module__}.{type(target).__qualname__}")


def driver_of(target: object) -> str | None:
    """The driver (psycopg, pymssql, pyodbc) whose connection ``target`` is, a subclass included
    wherever it is defined; None for anything else. A cursor is refused by name: it runs
    statements, but has no transactions of its own to begin and end, and belongs to a connection."""
    if isinstance(target, (psycopg.Connection, psycopg.AsyncConnection)):
        return "psycopg"
    for cls in type(target).__mro__:
        driver = cls.__module__.split(".", 1)[0]
        if driver in ("psycopg", "pymssql", "pyodbc"):
            if "cursor" in cls.__name__.lower():
                raise ArgumentTypeError(
                    f"a {driver} cursor was given where a connection belongs: pass its connection "
                    "(cursor.connection), which the client runs its own cursors and transactions on"
                )
            return driver if driver != "psycopg" else None  # psycopg's other objects are no connection
    return None


async def open_session(target: Any, *, blocking: bool) -> Session:
    """A session opened from a URI/connection string (owned) or over a DB-API connection (borrowed).

    ``blocking``: for :class:`~..client.QueueClient`, whose calls block the caller's thread; else
    for asyncio callers: native for psycopg, a worker thread for SQL Server's drivers.
    """
    dialect = dialect_for(target)
    if dialect.name != "postgres" and not blocking:
        return await ThreadSession.open(lambda: finish(open_session(target, blocking=True)))
    if not isinstance(target, str):
        return session_over(target, owned=False)
    if dialect.name == "postgres":
        return await PsycopgSession.connect(target, blocking=blocking)
    if _scheme(target) in PYMSSQL_SCHEMES:
        return PymssqlSession.connect(target)
    return PyodbcSession.connect(target)


def session_over(connection: Any, *, owned: bool, reopen: Callable[[], Awaitable[Any]] | None = None) -> Session:
    """A session over a DB-API connection from psycopg, pymssql or pyodbc.

    ``owned``: the connection was opened for the transport alone (e.g. by an Airflow hook), which
    closes it with the session; it is switched to autocommit, since the transport opens and ends
    its own transactions. A borrowed connection is the caller's: it must already autocommit, and
    is refused if it does not (see the SQL Server sessions). ``reopen`` opens a psycopg connection
    again when the server dropped it.
    """
    dialect = dialect_for(connection)
    module = driver_of(connection)
    if dialect.name == "postgres":
        if owned:
            connection.autocommit = True
        return PsycopgSession(connection, owned=owned, reopen=reopen)
    if module == "pymssql":
        if owned:
            connection.autocommit(True)
        return PymssqlSession(connection, owned=owned)
    if owned:
        connection.autocommit = True
    return PyodbcSession(connection, owned=owned)


def open_pool(target: str, max_size: int) -> SessionPool:
    """A pool of asyncio sessions for a message pump on the database ``target`` names."""
    if dialect_for(target).name == "postgres":
        return AsyncPsycopgPool(target, max_size=max_size)
    return ThreadSessionPool(lambda: finish(open_session(target, blocking=True)), max_size=max_size)
