"""SQL Server through pymssql and pyodbc: how each driver is given the dialect's text, and the sessions."""

from __future__ import annotations

import importlib
import re
import uuid
from abc import abstractmethod
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from ..dialects import get_dialect
from ..dialects import sqlserver as tsql
from ..errors import TransactionAbortedError, TransportMisconfiguredError, one_line
from ..operations.steps import Fetch, Step
from .base import Session, finish, translated

#: URI schemes of SQL Server, and which driver each one opens.
PYMSSQL_SCHEMES = ("mssql", "sqlserver", "mssql+pymssql")
PYODBC_SCHEMES = ("mssql+pyodbc",)


#: The package extra that installs each SQL Server driver (pyproject.toml's optional dependencies).
DRIVER_EXTRAS = {"pymssql": "mssql", "pyodbc": "odbc"}


def import_driver(name: str) -> Any:
    """Import SQL Server driver ``name``, or say which extra of this package installs it.

    The drivers are extras: a host that serves only PostgreSQL queues has neither. pyodbc also
    needs unixODBC's system library, which its import reports missing as an ImportError too.
    """
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        system = " and unixODBC's libodbc (e.g. apt-get install unixodbc)" if name == "pyodbc" else ""
        raise TransportMisconfiguredError(
            f"{name} cannot be loaded here ({one_line(exc)}): SQL Server through {name} needs the package's "
            f"{DRIVER_EXTRAS[name]!r} extra (pip install 'airflow-provider-sqlqueue[{DRIVER_EXTRAS[name]}]'){system}"
        ) from None


def is_odbc_string(target: str) -> bool:
    """An ODBC connection string (``DRIVER={...};SERVER=...``) rather than a URI or libpq DSN."""
    return "://" not in target and ";" in target and re.search(r"(?i)(^|;)\s*(driver|dsn)\s*=", target) is not None


#: A placeholder: ``%(name)s`` (what the dialects write), ``%s`` (positional, for plain SQL), or ``%%``.
_PLACEHOLDER = re.compile(r"%(?:\((\w+)\))?(.)", re.DOTALL)

#: Statement parameters: named (the dialects' statements) or positional (plain SQL in ``%s`` style).
Params = Mapping[str, Any] | Sequence[Any]


def placeholders(sql: str, marker: Callable[[str | None], str]) -> str:
    """Rewrite placeholders with ``marker(name)`` (``None`` for a positional ``%s``) and ``%%`` as ``%``."""

    def replace(match: re.Match[str]) -> str:
        name, kind = match.group(1), match.group(2)
        if kind == "s":
            return marker(name)
        if kind == "%" and name is None:
            return "%"
        raise ValueError(f"stray % in statement: {sql[:80]!r}")

    return _PLACEHOLDER.sub(replace, sql)


def _bind(sql: str, params: Params, render: Callable[[Any], str]) -> str:
    """``sql`` with each placeholder replaced by ``render(value)``; every value used, none missing."""
    if isinstance(params, Mapping):
        unused = set(params)

        def named(name: str | None) -> str:
            if name is None or name not in params:
                raise ValueError(f"no value for placeholder {name or '%s'!r} in {sql[:80]!r}")
            unused.discard(name)
            return render(params[name])

        text = placeholders(sql, named)
        if unused:
            raise ValueError(f"parameters {sorted(unused)} have no placeholder in {sql[:80]!r}")
        return text
    values = iter(params)

    def positional(name: str | None) -> str:
        value = next(values, _NO_MORE)
        if name is not None or value is _NO_MORE:
            raise ValueError(f"fewer parameters than placeholders in {sql[:80]!r}")
        return render(value)

    text = placeholders(sql, positional)
    if next(values, _NO_MORE) is not _NO_MORE:
        raise ValueError(f"more parameters than placeholders in {sql[:80]!r}")
    return text


_NO_MORE = object()


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
                return None if step.fetch is Fetch.ONE else []
        rows = [tuple(row) for row in cursor.fetchall()]
        result = (rows[0] if rows else None) if step.fetch is Fetch.ONE else rows
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


def pymssql_text(sql: str, params: Params) -> str:
    """Dialect text with every value inlined (:func:`pymssql_literal`): exactly what goes to the server."""
    return _bind(sql, params, pymssql_literal)


def execute_pymssql(cursor: Any, sql: str, params: Params) -> None:
    """Run dialect text on a pymssql cursor (values inlined by :func:`pymssql_text`)."""
    cursor.execute(pymssql_text(sql, params))


def pyodbc_statement(sql: str, params: Params) -> tuple[str, tuple[Any, ...]]:
    """Dialect text as pyodbc sends it: ``?`` markers, and the values the ODBC driver binds to them.

    A name used twice binds its value twice. uniqueidentifier values travel as text (every ODBC
    driver converts that); bytes bind as varbinary and str as nvarchar.
    """
    values: list[Any] = []

    def marker(value: Any) -> str:
        values.append(str(value) if isinstance(value, uuid.UUID) else value)
        return "?"

    text = _bind(sql, params, marker)
    return text, tuple(values)


def execute_pyodbc(cursor: Any, sql: str, params: Params) -> None:
    """Run dialect text on a pyodbc cursor with ``?`` parameters bound by the ODBC driver."""
    cursor.execute(*pyodbc_statement(sql, params))


#: Why a transaction a call inside failed cannot commit (SQL Server has no savepoint that survives XACT_ABORT).
_DOOMED = (
    "a call inside the transaction failed, and SQL Server cannot undo part of a transaction: "
    "the whole transaction was rolled back"
)


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
        self._doomed = False
        if not owned:
            self._check_borrowed()
        finish(self.execute(Step(tsql.SESSION_SETUP, {}, Fetch.NONE, "the database")))

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
        row = finish(self.execute(Step(tsql.OPEN_TRANSACTIONS, {}, Fetch.ONE, "the database")))
        if row and row[0]:
            raise TransportMisconfiguredError(
                f"the {self.driver} connection given has {row[0]} transaction(s) open: commit or roll back first; "
                "the transport runs its own transactions and would otherwise join (and on an error roll back) yours"
            )

    @abstractmethod
    def _execute(self, cursor: Any, sql: str, params: Params) -> None:
        """Execute one dialect statement with the driver's parameter style."""

    def autocommits(self) -> bool:
        return self._depth == 0  # the connection is kept in autocommit mode; _depth counts open transactions

    @abstractmethod
    def _driver_errors(self) -> tuple[type[BaseException], ...]:
        """The driver's exception classes, which :meth:`execute` translates."""

    @asynccontextmanager
    async def transaction(self, *, begun_by_first_statement: bool = False) -> AsyncIterator[None]:
        # begun_by_first_statement: BEGIN TRANSACTION is not sent apart here anyway (it joins the
        # batch of the first statement), so there is nothing to save.
        if self._depth:
            # An inner block joins the outer transaction. SQL Server has no savepoint that survives
            # XACT_ABORT, so an inner block that raises dooms the whole transaction: nothing more
            # runs in it, and the outer block rolls back (as PostgreSQL's savepoint would undo the
            # inner part, here the whole must go).
            self._depth += 1
            try:
                yield
            except BaseException:
                self._doomed = True
                raise
            finally:
                self._depth -= 1
            return
        await self.execute(Step(self.dialect.begin_sql, {}, Fetch.NONE, "the database"))
        self._depth, self._doomed = 1, False
        try:
            yield
            if self._doomed:
                raise TransactionAbortedError(_DOOMED)
        except BaseException:
            self._depth, self._doomed = 0, False
            try:
                await self.execute(Step(self.dialect.rollback_sql, {}, Fetch.NONE, "the database"))
            except Exception:  # noqa: BLE001, S110  # the connection may be gone; the server rolls back then
                pass
            raise
        self._depth = 0
        await self.execute(Step(self.dialect.commit_sql, {}, Fetch.NONE, "the database"))

    def transaction_failure(self) -> str | None:
        return _DOOMED if self._doomed else None

    async def execute(self, step: Step) -> Any:
        """Run the step by blocking on the driver (the coroutine never suspends: see :class:`~.base.Session`)."""
        if self._doomed and step.sql != self.dialect.rollback_sql:
            raise TransactionAbortedError("an earlier call in this transaction failed: it can only be rolled back")
        with translated(self.dialect, self._driver_errors(), step):
            cursor = self.connection.cursor()
            try:
                self._execute(cursor, step.sql, step.params)
                return _fetch_results(cursor, step)
            finally:
                cursor.close()


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

    def _driver_errors(self) -> tuple[type[BaseException], ...]:
        import pymssql
        from pymssql import _mssql

        return (pymssql.Error, _mssql.MSSQLException)

    @classmethod
    def connect(cls, uri: str, **kwargs: Any) -> PymssqlSession:
        """Open ``mssql://user:password@host:port/database?login_timeout=10`` in autocommit mode."""
        pymssql = import_driver("pymssql")

        parts = urlsplit(uri)
        options: dict[str, Any] = {"login_timeout": 10, **dict(parse_qsl(parts.query)), **kwargs}
        for key in ("login_timeout", "timeout"):
            if key in options:
                options[key] = int(options[key])
        with translated(get_dialect("sqlserver"), pymssql.Error):
            connection = pymssql.connect(
                server=parts.hostname or "localhost",
                port=str(parts.port or 1433),
                user=unquote(parts.username or ""),
                password=unquote(parts.password or ""),
                database=unquote(parts.path.lstrip("/")),
                autocommit=True,
                **options,
            )
        return cls(connection, owned=True)

    def _execute(self, cursor: Any, sql: str, params: Params) -> None:
        execute_pymssql(cursor, sql, params)


class PyodbcSession(_SqlServerSession):
    """A pyodbc connection (the odbc provider's driver), e.g. with FreeTDS or Microsoft's ODBC driver."""

    driver = "pyodbc"
    _autocommit_hint = "connection.autocommit = True"

    def _driver_autocommits(self) -> bool:
        return bool(self.connection.autocommit)

    def _driver_errors(self) -> tuple[type[BaseException], ...]:
        import pyodbc

        return (pyodbc.Error,)

    @classmethod
    def connect(cls, target: str, **kwargs: Any) -> PyodbcSession:
        """Open an ODBC connection string, or ``mssql+pyodbc://user:password@host:port/db?driver=FreeTDS``."""
        pyodbc = import_driver("pyodbc")

        connection_string = target if is_odbc_string(target) else odbc_connection_string(target)
        with translated(get_dialect("sqlserver"), pyodbc.Error):
            connection = pyodbc.connect(connection_string, autocommit=True, **kwargs)
        return cls(connection, owned=True)

    def _execute(self, cursor: Any, sql: str, params: Params) -> None:
        execute_pyodbc(cursor, sql, params)


def _odbc_value(value: str) -> str:
    """An ODBC connection-string value, braced when it holds characters that end or open one."""
    return "{" + value.replace("}", "}}") + "}" if any(c in value for c in ";{}=") or value != value.strip() else value


def odbc_connection_string(uri: str) -> str:
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
