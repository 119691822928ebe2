"""Unit behaviour of :mod:`airflow_provider_sqlqueue.transport.drivers.postgres`: psycopg connections as the transport needs them."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from psycopg.conninfo import make_conninfo

from airflow_provider_sqlqueue.transport import AsyncPsycopgPool, Message, QueueAddress, QueueClient
from airflow_provider_sqlqueue.transport.drivers import PsycopgSession, finish
from airflow_provider_sqlqueue.transport.errors import (
    InvalidArgumentError,
    TransportMisconfiguredError,
    TransportUnavailableError,
)


class TimedOut(Exception):
    """What :func:`interrupted_after` raises from its signal handler, as a task timeout does."""


@contextmanager
def interrupted_after(seconds: float) -> Iterator[None]:
    """Raise :class:`TimedOut` from a SIGALRM handler ``seconds`` into the block (expected inside it)."""

    def interrupt(signum: int, frame: Any) -> None:
        raise TimedOut

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, seconds)
        with pytest.raises(TimedOut):
            yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_connections_autocommit_and_bound_their_connect_wait(pg_uri: str) -> None:
    session = finish(PsycopgSession.connect(pg_uri, blocking=True))
    try:
        assert session.connection.autocommit
        assert session.connection.info.get_parameters()["connect_timeout"] == "10"
    finally:
        finish(session.close())


def test_a_refused_connection_never_quotes_the_password() -> None:
    with pytest.raises(TransportUnavailableError) as caught:
        finish(PsycopgSession.connect("postgresql://app:pw-never-shown@127.0.0.1:1/test", blocking=True))
    assert "pw-never-shown" not in str(caught.value) and caught.value.__context__ is None


def test_a_string_libpq_cannot_read_is_a_setting_to_fix() -> None:
    with pytest.raises(TransportMisconfiguredError):
        finish(PsycopgSession.connect("postgresql://app:secret@127.0.0.1/test?sslmode=bogus", blocking=True))


def test_an_owned_connection_the_server_dropped_is_opened_again(pg_uri: str, queue: QueueAddress, raw: Any) -> None:
    with QueueClient.connect(pg_uri) as client:
        client.send(queue, Message("x"))
        raw.execute("SELECT pg_terminate_backend(%s)", [client.connection.info.backend_pid])
        with pytest.raises(TransportUnavailableError):
            client.depth(queue)
        assert client.depth(queue) == 1


def test_a_connection_lost_inside_a_transaction_block_is_not_replaced_mid_block(
    pg_uri: str, queue: QueueAddress, raw: Any
) -> None:
    with QueueClient.connect(pg_uri) as client:
        with pytest.raises(TransportUnavailableError), client.transaction():  # noqa: PT012 - the block loses its connection between two sends
            client.send(queue, Message("first"))
            raw.execute("SELECT pg_terminate_backend(%s)", [client.connection.info.backend_pid])
            client.send(queue, Message("second"))  # would commit alone on a new connection
        assert client.depth(queue) == 0


def test_startup_settings_the_server_refuses_are_a_setting_to_fix(pg_uri: str, raw: Any) -> None:
    """No SQLSTATE comes back for these: the server's texts are recognised, as for an unknown role."""
    changes = [{"options": "-c search_path=public host=elsewhere"}]
    if raw.execute("SHOW ssl").fetchone()[0] == "off":
        changes.append({"sslmode": "require"})
    for change in changes:
        with pytest.raises(TransportMisconfiguredError, match="retrying will not help"):
            finish(PsycopgSession.connect(make_conninfo(pg_uri, **change), blocking=True))


@pytest.mark.parametrize("given", [{"autocommit": False}, {"row_factory": dict}, {"cursor_factory": object}])
async def test_connection_arguments_the_session_sets_itself_are_refused(pg_uri: str, given: dict[str, Any]) -> None:
    """A pool built with autocommit=False used to fail at its first session with a raw TypeError."""
    [name] = given
    with pytest.raises(InvalidArgumentError, match=f"{name} cannot be given"):
        AsyncPsycopgPool(pg_uri, 2, **given)
    with pytest.raises(InvalidArgumentError, match=f"{name} cannot be given"):
        await PsycopgSession.connect(pg_uri, **given)


def test_a_native_receive_begun_with_its_statement_is_guarded_as_psycopgs_own_blocks(
    pg_uri: str, queue: QueueAddress, raw: Any
) -> None:
    """BEGIN travels with the receive (no block of psycopg's is open), and the block is still
    guarded as psycopg guards its own."""
    import psycopg

    with QueueClient.connect(pg_uri) as client:
        client.send(queue, [Message(str(n)) for n in range(5)])
        sent: list[str] = []
        client.connection.add_notice_handler(lambda notice: sent.append(notice.message_primary))
        # The handler may not end the transaction itself: psycopg refuses, and the message stays.
        for end in ("commit", "rollback"):
            with pytest.raises(psycopg.ProgrammingError, match="forbidden"), client.receive_native(queue) as message:  # noqa: PT012 - the handler's own call
                assert message is not None
                getattr(client.connection, end)()
        assert client.depth(queue) == 5
        # psycopg's quiet rollback of a block: no error, the message stays.
        with client.receive_native(queue) as message:
            assert message is not None
            raise psycopg.Rollback()
        assert client.depth(queue) == 5
        # A block opened inside, and a call inside, nest as savepoints; the whole commits once.
        with client.receive_native(queue) as message, client.connection.transaction():
            client.connection.execute("SELECT 1")
        assert client.depth(queue) == 4
        # Errors of the handler's own statements reach it as they are.
        with pytest.raises(psycopg.OperationalError), client.receive_native(queue) as message:  # noqa: PT012 - the connection dies in the handler
            raw.execute("SELECT pg_terminate_backend(%s)", [client.connection.info.backend_pid])
            client.connection.execute("SELECT 1")
        assert client.depth(queue) == 4
        assert sent == []  # no "there is already a transaction in progress", no "no transaction in progress"


@pytest.mark.parametrize(
    "again", ["ROLLBACK; BEGIN", "COMMIT; BEGIN", "ABORT; START TRANSACTION ISOLATION LEVEL SERIALIZABLE"]
)
def test_a_handler_that_ends_the_receive_and_begins_another_transaction_is_refused_at_commit(
    pg_uri: str, queue: QueueAddress, raw: Any, again: str
) -> None:
    """The block commits only the transaction it began: one the handler began in its place is rolled
    back, with its work, and the block says so -- not a silent commit of work whose message comes back."""
    import psycopg

    from airflow_provider_sqlqueue.transport.errors import TransactionAbortedError

    raw.execute(f'CREATE TABLE "{queue.schema}".work (body text)')
    with QueueClient.connect(pg_uri) as client:
        client.send(queue, Message("order-1"))
        with pytest.raises(TransactionAbortedError, match="began another"), client.receive_native(queue) as message:  # noqa: PT012 - the handler's own statements
            assert message is not None
            client.connection.execute(again)
            client.connection.execute(f'INSERT INTO "{queue.schema}".work VALUES (%s)', [message.text])
        assert raw.execute(f'SELECT count(*) FROM "{queue.schema}".work').fetchone()[0] == 0
        assert client.connection.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        expected = 0 if again.startswith("COMMIT") else 1  # what the handler's own COMMIT or ROLLBACK did
        assert client.depth(queue) == expected
        with client.receive_native(queue) as message:  # the session goes on as before
            assert (message is None) == (expected == 0)


def test_a_handler_that_ends_the_receive_is_told_what_became_of_it(pg_uri: str, queue: QueueAddress, raw: Any) -> None:
    from airflow_provider_sqlqueue.transport.errors import TransactionAbortedError

    with QueueClient.connect(pg_uri) as client:
        client.send(queue, [Message("a"), Message("b")])
        with (
            pytest.raises(TransactionAbortedError, match="committed or rolled back with it"),
            client.receive_native(queue),
        ):
            client.connection.execute("COMMIT")
        assert client.depth(queue) == 1  # the handler's COMMIT took the message
        with pytest.raises(TransactionAbortedError, match="its error was caught"), client.receive_native(queue):  # noqa: PT012
            try:
                client.connection.execute("SELECT 1/0")
            except Exception:  # swallowed, as the careless handler does
                pass
        assert client.depth(queue) == 1


def test_errors_of_the_callers_own_statements_in_a_block_are_its_own(
    pg_uri: str, queue: QueueAddress, raw: Any
) -> None:
    """A duplicate key in the caller's table is not a duplicate message, a table it misspelt is not a
    missing queue, its statement timeout is not the database being unavailable."""
    import psycopg

    raw.execute(
        f'CREATE TABLE "{queue.schema}".invoices (id int PRIMARY KEY); INSERT INTO "{queue.schema}".invoices VALUES (1)'
    )
    own = [
        (f'INSERT INTO "{queue.schema}".invoices VALUES (1)', psycopg.errors.UniqueViolation),
        (f'SELECT * FROM "{queue.schema}".invoicez', psycopg.errors.UndefinedTable),
        ("SET LOCAL statement_timeout = '50ms'; SELECT pg_sleep(1)", psycopg.errors.QueryCanceled),
    ]
    with QueueClient.connect(pg_uri) as client:
        client.send(queue, Message("m"))
        for sql, error in own:
            with pytest.raises(error), client.receive_native(queue):
                client.connection.execute(sql)
            with pytest.raises(error), client.transaction():  # noqa: PT012 - the caller's own statement after a send
                client.send(queue, Message("rolled back"))
                client.connection.execute(sql)
            assert client.depth(queue) == 1


def test_prepared_statements_forced_on_a_connection_still_receive_natively(pg_uri: str, queue: QueueAddress) -> None:
    """prepare_threshold=0 prepares every statement psycopg sends, which PostgreSQL refuses for text
    of several statements: BEGIN sent with the receive, COMMIT with its check."""
    import psycopg

    with psycopg.connect(pg_uri, autocommit=True, prepare_threshold=0) as connection:
        client = QueueClient.connect(connection)
        client.create_queue(QueueAddress("other", queue.schema))
        client.send(queue, [Message("a"), Message("b")])
        with client.receive_native(queue) as message:
            assert message is not None and message.text == "a"
        assert client.depth(queue) == 1
        assert client.queue_stats([queue])[0].waiting >= 0
        assert client.move_due(queue) == 0


def test_an_owned_connection_left_mid_command_by_an_interrupted_call_is_opened_again(
    pg_uri: str, queue: QueueAddress, raw: Any
) -> None:
    """An exception from a signal handler (a task timeout) can leave the connection waiting for a
    result nobody reads; the next call opens a new connection instead of failing for ever, and the
    old session's transaction (holding the received row) goes with it."""
    import psycopg

    with QueueClient.connect(pg_uri) as client:
        client.send(queue, [Message("a"), Message("b")])
        with psycopg.connect(pg_uri) as blocker:
            blocker.execute(f'LOCK TABLE "{queue.schema}"."orders" IN ACCESS EXCLUSIVE MODE')
            with interrupted_after(0.5), client.receive_native(queue):
                pass
            # Left waiting for the receive's result: every command on it would fail from here on.
            assert client.connection.info.transaction_status == psycopg.pq.TransactionStatus.ACTIVE
            stuck = client.connection.info.backend_pid
            blocker.rollback()
        with client.receive_native(queue) as message:
            assert message is not None
        assert client.connection.info.backend_pid != stuck
        assert client.depth(queue) == 1


def test_a_block_nested_in_the_callers_transaction_whose_code_ends_that_transaction_is_aborted(
    pg_uri: str, queue: QueueAddress, raw: Any
) -> None:
    """Inside the caller's transaction the block is a savepoint; ROLLBACK; BEGIN inside it takes the
    savepoint away: not "database unavailable, retry", but the transaction no longer whole."""
    import psycopg

    from airflow_provider_sqlqueue.transport.errors import TransactionAbortedError

    with psycopg.connect(pg_uri) as connection:  # not autocommit: the caller's transaction is open
        client = QueueClient.connect(connection)
        client.send(queue, Message("m"))
        connection.commit()
        connection.execute("SELECT 1")  # the caller's transaction
        with pytest.raises(TransactionAbortedError, match="savepoint"), client.receive_native(queue) as message:  # noqa: PT012
            assert message is not None
            connection.execute("ROLLBACK; BEGIN")
        connection.rollback()
        assert client.depth(queue) == 1


@pytest.mark.parametrize("autocommit", [True, False])
@pytest.mark.parametrize("block", ["receive_native", "transaction"])
@pytest.mark.parametrize(
    ("wrong", "said"),
    [
        ("ROLLBACK; BEGIN", "began another"),
        ("22012", "could not commit"),  # division by zero: the SQLSTATE a check could fail with
        ("40001", "could not commit"),  # serialization failure: a conflict lost, not an outage
        ("40P01", "could not commit"),  # deadlock
        ("55P03", "could not commit"),  # lock timeout, naming no table of the library's
        ("53200", "database unavailable"),  # out of memory: the database's trouble, not the message's
    ],
    ids=["code-begins-another", "division-by-zero", "serialization", "deadlock", "lock-timeout", "out-of-memory"],
)
def test_every_outermost_block_commits_only_its_own_transaction_and_says_why_not(
    pg_uri: str, queue: QueueAddress, raw: Any, autocommit: bool, block: str, wrong: str, said: str
) -> None:
    """A block the library begins -- on a connection in autocommit or not, a native receive or a
    caller's transaction() -- refuses to commit a transaction the code inside began in its place.
    A deferred trigger of the caller's that fails at COMMIT is the work's failure, neither another
    transaction nor an outage: the error says which, and the receive (or send) is rolled back with
    the work."""
    import psycopg

    from airflow_provider_sqlqueue.transport.errors import TransactionAbortedError

    expected = TransportUnavailableError if said == "database unavailable" else TransactionAbortedError
    work = f'"{queue.schema}".work'
    raw.execute(f"CREATE TABLE {work} (body text)")
    raw.execute(
        f'CREATE FUNCTION "{queue.schema}".refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN '
        "IF NEW.body <> 'after' THEN RAISE EXCEPTION 'refused at COMMIT' USING ERRCODE = NEW.body; END IF; "
        "RETURN NULL; END $$"
    )
    raw.execute(
        f"CREATE CONSTRAINT TRIGGER refuse AFTER INSERT ON {work} DEFERRABLE INITIALLY DEFERRED "
        f'FOR EACH ROW EXECUTE FUNCTION "{queue.schema}".refuse()'
    )
    with psycopg.connect(pg_uri, autocommit=autocommit) as connection:
        client = QueueClient.connect(connection)
        client.send(queue, Message("m"))
        if not autocommit:
            connection.commit()
        opened = client.receive_native(queue) if block == "receive_native" else client.transaction()
        begins_another = " " in wrong
        with pytest.raises(expected, match=said) as refused, opened:  # noqa: PT012
            client.send(queue, Message("sent in the block"))
            if begins_another:
                connection.execute(wrong)
            connection.execute(f"INSERT INTO {work} VALUES (%s)", ["after" if begins_another else wrong])
        if not begins_another:
            assert "refused at COMMIT" in str(refused.value)
            assert isinstance(refused.value.__cause__, psycopg.Error) and refused.value.__cause__.sqlstate == wrong
        if not autocommit:
            connection.rollback()
        assert raw.execute(f"SELECT count(*) FROM {work}").fetchone()[0] == 0
        assert client.depth(queue) == 1  # the receive, or the send, rolled back
        with client.transaction():  # and the next block commits as usual
            client.send(queue, Message("next"))
        if not autocommit:
            connection.commit()
        assert client.depth(queue) == 2


@pytest.mark.parametrize("level", ["SERIALIZABLE", "REPEATABLE_READ", "READ_UNCOMMITTED"])
def test_a_borrowed_connection_in_autocommit_keeps_its_transaction_characteristics_in_every_block(
    pg_uri: str, queue: QueueAddress, level: str
) -> None:
    """psycopg's own blocks begin with the connection's isolation level (and read only, deferrable):
    so do the library's, or a borrowed connection set to SERIALIZABLE would run write skews it rules out."""
    import psycopg

    show = "SELECT current_setting('transaction_isolation'), current_setting('transaction_read_only')"
    expected = (level.replace("_", " ").lower(), "off")
    with psycopg.connect(pg_uri, autocommit=True) as connection:
        connection.isolation_level = psycopg.IsolationLevel[level]
        connection.read_only = False
        client = QueueClient.connect(connection)
        client.send(queue, Message("m"))
        with client.receive_native(queue) as message:
            assert message is not None
            assert connection.execute(show).fetchone() == expected
        with client.transaction():
            assert connection.execute(show).fetchone() == expected
        connection.read_only = True
        connection.deferrable = True
        client.send(queue, Message("an operation of the library's own keeps the session's defaults"))
        with client.transaction():
            assert connection.execute(show).fetchone() == (expected[0], "on")
            assert connection.execute("SHOW transaction_deferrable").fetchone() == ("on",)


def test_a_block_whose_code_resets_every_setting_commits(pg_uri: str, queue: QueueAddress) -> None:
    """The block knows its transaction by when it started, which no statement changes: RESET ALL inside
    is no reason to roll back."""
    with QueueClient.connect(pg_uri) as client:
        client.send(queue, [Message("a"), Message("b")])
        with client.receive_native(queue) as message:
            assert message is not None
            client.connection.execute("RESET ALL")
        assert client.depth(queue) == 1


def test_a_statement_an_interrupted_call_left_running_is_cancelled(pg_uri: str, queue: QueueAddress, raw: Any) -> None:
    """A receive interrupted while it waits for a lock (a task timeout) must not go on to take a message
    for nobody once the lock is released: the statement is cancelled when the wait is interrupted."""
    import time

    import psycopg

    with QueueClient.connect(pg_uri) as client:
        client.send(queue, [Message("a"), Message("b"), Message("c")])
        with psycopg.connect(pg_uri) as blocker:
            blocker.execute(f'LOCK TABLE "{queue.schema}"."orders" IN ACCESS EXCLUSIVE MODE')
            with interrupted_after(0.5):
                client.receive(queue, 1)
            pid = client.connection.info.backend_pid
            deadline = time.monotonic() + 60  # a bound on the wait, not a speed claim
            while raw.execute("SELECT state FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone() == ("active",):
                assert time.monotonic() < deadline, "the interrupted receive is still waiting for the lock"
                time.sleep(0.05)
            blocker.rollback()
        got = client.receive(queue, 3)  # on a new connection: the interrupted one took none of them
        assert sorted(m.text for m in got) == ["a", "b", "c"]
