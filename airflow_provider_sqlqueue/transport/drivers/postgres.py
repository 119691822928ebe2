"""PostgreSQL through psycopg 3: one session for blocking and asyncio connections, and the pump's pool."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, NoReturn
from urllib.parse import unquote

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import TransactionStatus
from psycopg.types.string import TextLoader

from .. import defaults
from ..dialects import Dialect, get_dialect
from ..dialects.postgres import (
    CLIENT_ENCODING_SQL,
    NOT_THE_SAME_TRANSACTION,
    TRANSACTION_STARTED_SQL,
    check_started_sql,
    the_works_failure,
    transaction_characteristics_sql,
)
from ..errors import (
    ArgumentTypeError,
    ClientClosedError,
    InvalidArgumentError,
    SqlQueueError,
    TransactionAbortedError,
    TransportMisconfiguredError,
    TransportUnavailableError,
)
from ..logs import logger
from ..message import check_positive
from ..operations.steps import Fetch, Operation, Step
from .base import (
    ANY_STEP,
    Session,
    SessionPool,
    T,
    close_quietly,
    fetch,
    raise_translated,
    translated,
)
from .psycopg_access import Async, Blocking, own_cursor, refuse_in_aborted, refuse_unusable, typed_nulls

#: A placeholder psycopg binds in binary format, ``%(name)b``.
_BINARY_PLACEHOLDER = re.compile(r"%\(\w+\)b")
#: Statements whose parameters are larger than this are not inlined to travel with BEGIN.
_FUSE_LIMIT = 64 * 1024


log = logger("airflow_provider_sqlqueue.transport")

#: What running a statement can raise: the server's errors, and psycopg's refusal to encode text
#: that is not valid Unicode (a lone surrogate) -- both become the transport's own errors.
STATEMENT_ERRORS = (psycopg.Error, UnicodeEncodeError)


def refuse_aborted(session: Session) -> None:
    """Raise instead of committing a transaction that is no longer whole: one an error aborted
    (PostgreSQL answers its COMMIT with a silent ROLLBACK, which a caller would take for success),
    or one the code inside ended itself (its COMMIT would find no transaction, and say nothing)."""
    failure = session.transaction_failure()
    if failure is not None:
        raise TransactionAbortedError(failure)


#: Why a block's transaction cannot commit as one, by the connection's state inside the block.
_BROKEN = {
    TransactionStatus.INERROR: (
        "a statement inside the transaction failed and its error was caught: PostgreSQL aborted the "
        "transaction, so nothing done in it, the receive included, can commit; it is rolled back (let "
        "database errors propagate, or put the statement in a savepoint: connection.transaction())"
    ),
    TransactionStatus.IDLE: (
        "the code inside ended the transaction itself (COMMIT or ROLLBACK on the connection): what it did "
        "up to there, the receive included, was committed or rolled back with it, and what it did after "
        "ran on its own; leave ending the transaction to the block"
    ),
}

#: Why a block begun with its first statement cannot commit: the transaction open at its end is another.
_ANOTHER_TRANSACTION = (
    "the code inside ended the transaction and began another (COMMIT or ROLLBACK, then BEGIN): what it did "
    "up to there (a receive included) was committed or rolled back with the first, and the transaction "
    "open now, which is not the block's, is rolled back; leave ending the transaction to the block"
)


def transaction_broken(connection: Any) -> str | None:
    """Inside a transaction block: why the transaction can no longer commit as one (None: it can).
    INERROR: an error aborted it. IDLE: the code inside sent COMMIT or ROLLBACK itself, so the
    block's own COMMIT would find no transaction -- and PostgreSQL would only warn."""
    return _BROKEN.get(connection.info.transaction_status)


#: What opening a connection can raise: the driver's errors, and Python's refusal to encode a
#: connection string that is not valid Unicode.
CONNECT_ERRORS = (psycopg.Error, UnicodeError)


def connect_error(exc: BaseException, conninfo: str) -> SqlQueueError:
    """The transport's error for a failed connection attempt, its text free of the password.

    Callers raise it *after* their ``except`` block, so that the driver's exception (which quotes
    the whole connection string, password and all) is not even kept as its context.
    """
    error: SqlQueueError | None
    if isinstance(exc, UnicodeError):
        error = TransportMisconfiguredError("the connection string is not valid Unicode text; fix the connection")
    elif isinstance(exc, psycopg.ProgrammingError):  # libpq refused the string itself: no server was reached
        error = TransportMisconfiguredError(f"the connection string cannot be used: {exc}; fix the connection")
    else:
        error = get_dialect("postgres").translate_error(exc, "the database")
        if error is None:  # not reached: every psycopg error has a translation
            error = TransportUnavailableError(f"database unavailable: {exc}")
    error.args = (redact(str(error), conninfo),)
    return error


def checked_conninfo(conninfo: str) -> str:
    """Refuse, before libpq reads it, a connection string no server could be reached with."""
    if not isinstance(conninfo, str):
        raise ArgumentTypeError(f"a connection string must be text, got {type(conninfo).__name__}")
    if "\x00" in conninfo:
        raise TransportMisconfiguredError("the connection string contains a NUL character; fix the connection")
    return conninfo


def redact(text: str, conninfo: str) -> str:
    """``text`` with the password of ``conninfo`` (a URI or key=value string, as written or decoded) masked."""
    secrets = set(re.findall(r"://[^/@:]*:([^@/]*)@", conninfo))
    secrets |= {value.strip("'") for value in re.findall(r"password\s*=\s*('(?:[^'\\]|\\.)*'|\S+)", conninfo)}
    for secret in sorted(secrets | {unquote(s) for s in secrets}, key=len, reverse=True):
        if secret:
            text = text.replace(secret, "****")
    return text


#: psycopg connection arguments the session sets itself: it commits by itself outside an
#: operation's transaction, and reads rows as tuples through its own cursors.
_SESSION_OWNED = ("autocommit", "row_factory", "cursor_factory", "context")


def checked_connect_options(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Refuse connection arguments the session sets itself, before a connection is opened."""
    owned = sorted(set(kwargs) & set(_SESSION_OWNED))
    if owned:
        raise InvalidArgumentError(
            f"{', '.join(owned)} cannot be given: the session sets it itself (autocommit outside its "
            "transactions, rows as tuples); give libpq settings such as connect_timeout or application_name"
        )
    return kwargs


def with_connect_timeout(conninfo: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Connection arguments with ``connect_timeout`` set unless the caller set it.

    libpq waits for a server that accepts the TCP connection but never answers as long as the
    operating system lets it (minutes); a bounded wait makes such a database "unavailable".
    """
    if "connect_timeout" in kwargs or "connect_timeout" in conninfo_to_dict(conninfo):
        return kwargs
    return {**kwargs, "connect_timeout": defaults.CONNECT_TIMEOUT_SECONDS}


def _psycopg_autocommits(connection: Any) -> bool:
    """An autocommit psycopg connection with no transaction open (sync or async alike)."""
    return bool(connection.autocommit) and connection.info.transaction_status == TransactionStatus.IDLE


def _fusable(step: Step) -> bool:
    """Whether a statement's parameters are worth inlining to send it with BEGIN: small scalars only.

    Large values would travel as escaped text, and arrays (batched sends) go faster in binary; a
    COPY cannot travel with anything (psycopg runs it only through ``copy()``).
    """
    if step.fetch in (Fetch.COPY, Fetch.LOAD) or _BINARY_PLACEHOLDER.search(step.sql):
        return False
    size = 0
    for param in step.params.values():
        if isinstance(param, (list, tuple)):
            return False
        size += len(param) if isinstance(param, (bytes, str)) else 16
    return size <= _FUSE_LIMIT


class PsycopgSession(Session):
    """A psycopg 3 connection: a blocking ``Connection`` or an asyncio ``AsyncConnection``.

    The session is written once against psycopg's asyncio interface; a blocking connection is
    reached through :class:`~.psycopg_access.Blocking`, whose coroutines never suspend (see :class:`~.base.Session`).
    """

    def __init__(
        self,
        connection: Any,
        owned: bool = False,
        reopen: Callable[[], Awaitable[Any]] | None = None,
        dialect: Dialect | None = None,
    ) -> None:
        # A pool's sessions share the pool's dialect: what one learns of a table (its layout, its
        # head) serves the others, and their rollbacks reach the heads the pool's receives use.
        super().__init__(dialect or get_dialect("postgres"), connection, owned)
        self._listening: set[str] = set()
        self._reopen = reopen
        #: Transaction blocks open on this session (a connection lost inside one is not replaced).
        self._blocks = 0
        #: A transaction block whose BEGIN waits for its first statement (see :meth:`transaction`).
        self._begin_pending = False
        #: Whether that block checks, before it commits, that the transaction is still the one it began
        #: (:func:`~..dialects.postgres.check_started_sql`), and when that one started.
        self._checked, self._started = False, 0
        #: An operation is running (:meth:`run`): its block runs no code but its own statements, so its
        #: transaction needs no check -- nothing inside can end it and begin another.
        self._running_op = False

    @property
    def blocking(self) -> bool:
        return not isinstance(self.connection, psycopg.AsyncConnection)

    @property
    def _db(self) -> Any:
        """The connection behind psycopg's asyncio interface."""
        return Blocking(self.connection) if self.blocking else Async(self.connection)

    async def _revive(self) -> None:
        """Open again an owned connection the server dropped: the call that met the loss said "retry"
        (TransportUnavailableError), and the retry must be able to succeed. A new connection listens afresh."""
        if self.closed:  # closed by its caller, not lost: nothing is opened again
            raise ClientClosedError()
        refuse_unusable(self.connection)
        await self._in_utf8()
        # A command still in progress between calls: a call was interrupted while it waited for the server
        # (a signal handler's exception, a task timeout). The connection refuses every command until that
        # one's result is read; the server session may hold a transaction and its locks meanwhile.
        stuck = not self.connection.closed and self.connection.info.transaction_status == TransactionStatus.ACTIVE
        if stuck and not self._blocks and self._reopen is not None:
            log.warning("The database connection was left in the middle of an interrupted command; opening a new one")
            await close_quietly(self.connection)
        elif stuck and not self._blocks:
            raise TransportMisconfiguredError(
                "the connection given to the client is still in the middle of a command an interrupted call "
                "left: close it and give the client a new connection"
            )
        self._refuse_lent_closed()
        lost = self.connection.closed or self.connection.broken or stuck
        if lost and self._blocks:
            # Inside a transaction block the transaction died with its connection: a new connection
            # would commit the block's later calls on their own. The block must fail and start again.
            raise TransportUnavailableError(
                "the database connection was lost inside a transaction: the transaction is gone; run it again"
            )
        if self._reopen is not None and lost:
            log.info("The database connection was lost; opening a new one")
            self.connection = await self._reopen()
            self._listening.clear()
            await self._in_utf8()

    def _refuse_lent_closed(self) -> None:
        """Raise when the caller closed the connection it lent -- before a call, or inside a block,
        whose transaction went with it: no retry can succeed (a broken one, cut by the server or the
        network, is reported as unavailable by the statement that meets it)."""
        if self._reopen is None and self.connection.closed and not self.connection.broken:
            raise TransportMisconfiguredError(
                "the connection given to the client is closed: give the client an open connection"
            )

    @classmethod
    async def connect(cls, conninfo: str, *, blocking: bool = False, **kwargs: Any) -> PsycopgSession:
        """Open an autocommit connection (outside an operation's transaction nothing stays open):
        a blocking one, or an asyncio one."""
        try:
            target, options = (
                checked_conninfo(conninfo),
                with_connect_timeout(conninfo, checked_connect_options(kwargs)),
            )
            connection: Any
            if blocking:
                connection = psycopg.connect(target, autocommit=True, **options)
            else:
                connection = await psycopg.AsyncConnection.connect(target, autocommit=True, **options)
        except CONNECT_ERRORS as exc:
            error = connect_error(exc, conninfo)
        else:

            async def reopen() -> Any:
                return (await cls.connect(conninfo, blocking=blocking, **kwargs)).connection

            session = cls(connection, owned=True, reopen=reopen)
            await session._in_utf8()  # also for the pool, whose sessions over it do not own it
            return session
        raise error

    async def _in_utf8(self) -> None:
        """Make sure text travels as UTF-8. A role's, a database's or the URI's ``client_encoding``
        may choose another: LATIN1 cannot carry most text a header holds, and with SQL_ASCII psycopg
        reads text as bytes. A connection the library opened is switched to UTF-8; a borrowed one
        is the caller's to set, and is refused, saying so, rather than failing on some text later."""
        if self.connection.closed or self.connection.info.encoding == "utf-8":
            return
        if not self.owned and self._reopen is None:
            raise TransportMisconfiguredError(
                f"the connection given uses client_encoding {self.connection.info.parameter_status('client_encoding')}: "
                "queue names, headers and failure text travel as UTF-8; give the client a connection with "
                "client_encoding UTF8 (connection.execute(\"SET client_encoding TO 'UTF8'\"))"
            )
        with translated(self.dialect, STATEMENT_ERRORS):
            await self._db.execute(CLIENT_ENCODING_SQL, prepare=False)

    def autocommits(self) -> bool:
        return not self._begin_pending and _psycopg_autocommits(self.connection)

    async def _begin_now(self) -> None:
        """Send a block's pending BEGIN before anything else opens a transaction on the connection:
        a block or an operation started inside it, before its first statement, is then nested in it."""
        if self._send_pending_begin():
            await self._begin_with(None)

    async def wait_for_notification(self, channels: list[str], timeout: float) -> list[str]:
        """LISTEN on first use of each channel, then wait for a NOTIFY; a burst already received is
        returned whole (the payloads).

        Notifications that arrive while the connection runs other statements are kept by psycopg
        and end the next wait at once. A blocking connection only waits.
        """
        if self.blocking:
            return await super().wait_for_notification(channels, timeout)
        await self._revive()
        with translated(self.dialect, psycopg.Error):
            for channel in channels:
                if channel not in self._listening:
                    await self._db.execute(self.dialect.listen_sql(channel))
                    self._listening.add(channel)
            payloads = [n.payload async for n in self.connection.notifies(timeout=timeout, stop_after=1)]
            if payloads:
                payloads += [n.payload async for n in self.connection.notifies(timeout=0)]
            return payloads

    async def run(self, op: Operation[T]) -> T:
        await self._revive()
        running, self._running_op = self._running_op, True
        try:
            return await super().run(op)
        finally:
            self._running_op = running

    async def _begin_with(self, step: Step | None) -> Any:
        """Send the pending BEGIN -- for a block that runs the caller's code (which it checks), with
        the connection's isolation level, read only and deferrable as psycopg's own BEGIN says them
        and the query of its transaction's start; with ``step`` when its parameters can be inlined --
        and return ``step``'s result. An operation's own short transaction keeps the session's
        defaults: a connection borrowed read only can still create a queue or move a failure."""
        texts = [self.dialect.begin_sql]
        if self._checked:  # a block of the caller's code: its transaction as the connection says
            connection = self.connection
            texts[0] += transaction_characteristics_sql(
                connection.isolation_level, connection.read_only, connection.deferrable
            )
            texts.append(TRANSACTION_STARTED_SQL)
        fused = step if step is not None and _fusable(step) else None
        with translated(self.dialect, STATEMENT_ERRORS, step or ANY_STEP):
            if fused is not None:
                client_cursor = psycopg.ClientCursor if self.blocking else psycopg.AsyncClientCursor
                texts.append(own_cursor(client_cursor, self.connection).mogrify(fused.sql, typed_nulls(fused.params)))
            async with self._db.cursor() as cursor:
                # No parameters and never prepared (prepare_threshold=0 would try): one simple-protocol message.
                await cursor.execute("; ".join(texts), prepare=False)
                if self._checked:
                    cursor.nextset()
                    self._started = int((await cursor.fetchone())[0])
                if fused is not None:
                    cursor.nextset()
                    return await fetch(cursor, fused)
        return None if step is None else await self.execute(step)

    async def _command(self, command: str, quietly: bool = False) -> None:
        """BEGIN, COMMIT or ROLLBACK (with what travels with them); ``quietly`` for a ROLLBACK on a
        connection that may be gone."""
        try:
            await self._db.execute(command, prepare=False)
        except psycopg.Error as exc:
            if not quietly:  # a broken connection's transaction is rolled back by the server anyway
                raise_translated(self.dialect, exc, ANY_STEP)

    async def _transaction_started(self) -> int:
        """When the open transaction started (see :meth:`_commit_checked`)."""
        with translated(self.dialect, STATEMENT_ERRORS):
            async with self._db.cursor() as cursor:
                await cursor.execute(TRANSACTION_STARTED_SQL, prepare=False)
                return int((await cursor.fetchone())[0])

    async def _commit_checked(self, started: int, *, commit: bool) -> None:
        """Commit only the transaction that started at ``started``: the check of
        :func:`check_started_sql` with COMMIT, in one message (without ``commit``, the check alone:
        psycopg's COMMIT follows). The code inside a block may have ended the block's transaction
        and begun another, which must not commit in its place."""
        check = check_started_sql(started)
        try:
            await self._db.execute(f"{check}; {self.dialect.commit_sql}" if commit else check, prepare=False)
        except psycopg.Error as exc:
            self._commit_failed(exc)

    def _commit_failed(self, exc: psycopg.Error) -> NoReturn:
        """Raise what a failed commit of a block that ran the caller's code means. The block's check
        failed: another transaction was open. The work itself could not commit -- a deferred
        constraint or trigger, a serialization failure or deadlock, a session the server ended for
        idling in the transaction (:func:`the_works_failure`) -- which the caller's code caused: the
        block's transaction was rolled back, with everything done in it. Anything else (a lost
        connection, a server out of memory or disk) is translated as anywhere: an outage."""
        if NOT_THE_SAME_TRANSACTION in (exc.diag.message_primary or ""):
            raise TransactionAbortedError(_ANOTHER_TRANSACTION) from None
        if not the_works_failure(exc.sqlstate):  # the connection, the server's resources: not the message's fault
            raise_translated(self.dialect, exc, ANY_STEP)
        error = self.dialect.translate_error(exc, ANY_STEP.target)
        if isinstance(error, TransactionAbortedError):  # with its own words (the session idled too long)
            raise error from exc
        raise TransactionAbortedError(
            f"the transaction could not commit and was rolled back, with everything done in it: {str(exc).strip()}"
        ) from exc

    @asynccontextmanager
    async def transaction(self, *, begun_by_first_statement: bool = False) -> AsyncIterator[None]:
        await self._revive()
        refuse_in_aborted(self.connection)
        if self.autocommits():
            async with self._own_transaction(begin_now=not begun_by_first_statement):
                yield
            return
        await self._begin_now()
        # Not in a transaction on a connection that is not in autocommit: psycopg's block begins one,
        # which runs the caller's code unless an operation opens it.
        checked = self.connection.info.transaction_status == TransactionStatus.IDLE and not self._running_op
        since, finished, committed = time.monotonic(), False, False
        raised: BaseException | None = None
        try:
            async with self._db.transaction():
                started = 0
                if checked:  # one round trip more (and one at the end): connections in autocommit save them
                    started = await self._transaction_started()
                self._blocks += 1
                try:
                    yield
                except BaseException as exc:
                    raised = exc
                    raise
                finally:
                    self._blocks -= 1
                self._refuse_lent_closed()
                refuse_aborted(self)
                if checked:
                    await self._commit_checked(started, commit=False)  # psycopg's COMMIT follows
                finished = True  # not reached when the block raised (psycopg's Rollback included)
            committed = finished  # and not when the commit itself failed
        except psycopg.Error as exc:
            if exc is raised:  # the code inside ran a statement of its own: its error is its own
                raise
            if finished and checked:  # psycopg's COMMIT of the caller's work
                self._commit_failed(exc)
            raise_translated(self.dialect, exc, ANY_STEP)  # BEGIN, SAVEPOINT, COMMIT, ROLLBACK
        finally:
            if not committed:
                self.dialect.rolled_back(since)

    @asynccontextmanager
    async def _own_transaction(self, *, begin_now: bool) -> AsyncIterator[None]:
        """The outermost transaction block of a connection in autocommit. Its BEGIN goes out at once
        with ``begin_now``, else with its first statement (as :meth:`run` sends it): two round trips
        for a native receive (BEGIN with the DELETE, then COMMIT) instead of three.

        What psycopg's own transaction block does, it does too: the code inside cannot call the
        connection's ``commit()`` or ``rollback()`` (psycopg refuses them while a block is open),
        errors of its own statements reach the caller as they are, and ``raise psycopg.Rollback()``
        rolls it back quietly. And where psycopg would commit whatever transaction is open at the
        end, this commits only the one it began (see :meth:`_commit_checked`): its BEGIN reads when
        its transaction started, and its COMMIT travels with a check of it.
        """
        since, begun = time.monotonic(), False
        try:
            self._blocks += 1
            self._begin_pending, self._checked = True, not self._running_op
            try:
                if begin_now:
                    await self._begin_now()
                yield
            finally:
                begun = self._end_pending()
            if begun:
                self._refuse_lent_closed()
                refuse_aborted(self)
                if self._checked:
                    await self._commit_checked(self._started, commit=True)
                else:
                    await self._command(self.dialect.commit_sql)
        except psycopg.Rollback as exc:
            await self._roll_back(begun, since)
            if exc.transaction is not None:  # aimed at a block of psycopg's own, further out
                raise
        except BaseException:
            # Also after a failed COMMIT: the session must not stay in an aborted transaction.
            await self._roll_back(begun, since)
            raise
        finally:
            self._blocks -= 1

    def _send_pending_begin(self) -> bool:
        """Mark the pending BEGIN as going out now; True when one was pending. While the block is
        open psycopg counts it as one of its own, which makes it refuse ``commit()`` and ``rollback()``
        on the connection and nest blocks inside it as savepoints, as in its own transaction blocks."""
        if not self._begin_pending:
            return False
        self._begin_pending = False
        # psycopg's count of its open blocks (the version is locked; a test checks the guard holds).
        self.connection._num_transactions += 1  # noqa: SLF001
        return True

    def _end_pending(self) -> bool:
        """End the block's claim on the connection; whether its BEGIN went out."""
        if self._begin_pending:
            self._begin_pending = False
            return False
        self.connection._num_transactions -= 1  # noqa: SLF001
        return True

    async def _roll_back(self, begun: bool, since: float) -> None:
        if begun:
            await self._command(self.dialect.rollback_sql, quietly=True)
        self.dialect.rolled_back(since)

    def transaction_failure(self) -> str | None:
        return transaction_broken(self.connection)

    async def execute(self, step: Step) -> Any:
        refuse_in_aborted(self.connection)
        if self._send_pending_begin():
            return await self._begin_with(step)
        with translated(self.dialect, STATEMENT_ERRORS, step):
            async with self._db.cursor() as cursor:
                if step.fetch in (Fetch.COPY, Fetch.LOAD):
                    return await _copy(cursor, step)
                text = step.fetch is Fetch.ALL_UUID_TEXT  # the server's text of a uuid, as it sends it
                if text:
                    cursor.adapters.register_loader("uuid", TextLoader)
                # Rows in binary, whose form no session setting changes: the text of a timestamp
                # follows DateStyle, which psycopg reads in ISO only, and an interval's IntervalStyle
                # (uuids, text, bytea and integers read as text are the same under every setting).
                await cursor.execute(step.sql, typed_nulls(step.params), binary=not text)
                return await fetch(cursor, step)


async def _copy(cursor: Any, step: Step) -> int:
    """Run a COPY ... FROM STDIN step: its rows in binary, typed as it says (:attr:`Fetch.COPY`), or
    its chunks as they are (:attr:`Fetch.LOAD`)."""
    # The dialect doubles % in names for psycopg's placeholders; a COPY has none, so psycopg sends
    # its text as it is and the names must be given back their single %.
    async with cursor.copy(step.sql.replace("%%", "%")) as copy:
        if step.fetch is Fetch.LOAD:
            for chunk in step.params["chunks"]:
                await copy.write(chunk)
        else:
            copy.set_types(list(step.params["types"]))
            for row in step.params["rows"]:
                await copy.write_row(row)
    return int(cursor.rowcount)


class AsyncPsycopgPool(SessionPool):
    """Up to ``max_size`` autocommit psycopg connections for asyncio callers, reopened as soon as they fail.

    A connection that fails (the server restarted, ``pg_terminate_backend`` killed its session) is
    closed, and so is every idle one: they were most likely cut by the same event. The next session
    opens a new connection at once, so a pump is back at full speed as soon as the database
    answers again, with no reconnection back-off of the pool's own between it and the database --
    the pump's circuit breaker already paces retries while the database is down.

    :param min_size: connections opened by :meth:`open` (best effort: a database that is down
        does not fail it).
    """

    def __init__(self, conninfo: str, max_size: int, min_size: int = defaults.POOL_MIN_SIZE, **kwargs: Any) -> None:
        check_positive("max_size", max_size)
        if isinstance(min_size, bool) or not isinstance(min_size, int):
            raise ArgumentTypeError(f"min_size must be a whole number, got {type(min_size).__name__} {min_size!r:.40}")
        if not 0 <= min_size <= max_size:
            raise InvalidArgumentError(f"min_size must be between 0 and max_size ({max_size}), got {min_size}")
        self.dialect = get_dialect("postgres")
        self._conninfo = checked_conninfo(conninfo)
        self._kwargs = checked_connect_options(kwargs)
        self._min_size = min_size
        self._slots = asyncio.Semaphore(max_size)
        self._idle: list[Any] = []
        self._closed = False

    async def _connect(self) -> Any:
        return (await PsycopgSession.connect(self._conninfo, **self._kwargs)).connection

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

    async def listener(self) -> Session | None:
        if self._closed:
            raise TransportUnavailableError("the session pool is closed")
        return await PsycopgSession.connect(self._conninfo, **self._kwargs)

    @asynccontextmanager
    async def session(self) -> AsyncIterator[Session]:
        if self._closed:
            raise TransportUnavailableError("the session pool is closed")
        async with self._slots:
            connection = self._idle.pop() if self._idle else await self._connect()
            cut = False
            try:
                yield PsycopgSession(connection, dialect=self.dialect)
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
