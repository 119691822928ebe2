"""Regression tests for defects found by adversarial testing of the transport core, one per defect."""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections import Counter
from datetime import timedelta

import pytest
from psycopg.conninfo import make_conninfo

from airflow_provider_sqlqueue.transport import (
    AsyncPsycopgPool,
    DuplicateMessageError,
    InvalidHeadersError,
    Message,
    MessagePump,
    QueueAddress,
    QueueClient,
    SqlQueueError,
    TransactionAbortedError,
    TransportMisconfiguredError,
    TransportUnavailableError,
    defaults,
)

pytestmark = pytest.mark.every_dialect


def test_poison_row_in_a_queue_that_is_its_own_error_queue_does_not_loop(backend, raw, schema):
    """D1: receiving from the error queue met its own poison row again and again inside one transaction."""
    with QueueClient.connect(backend.uri) as client:
        error = QueueAddress("error", schema)
        client.create_queue(QueueAddress("orders", schema))
        backend.nservicebus_send(raw, schema, "error", uuid.uuid4(), "not json", b"poison")
        client.send(error, Message("after the poison"))
        started = time.monotonic()
        assert [m.text for m in client.receive(error, 5)] == ["after the poison"]  # never blocked by it
        assert client.depth(error) == 1  # the poison row went to the back once, unchanged
        client.send(error, Message("claimed after the poison"))
        assert [m.text for m in client.claim(error, 5)] == ["claimed after the poison"]
        for take in (client.receive, client.claim):
            assert take(error, 5) == []  # only the poison row is left: the call returns
            assert client.depth(error) == 1
        assert time.monotonic() - started < 5


def test_claim_drops_a_run_of_expired_rows_and_returns_the_live_message_in_one_call(client, queue):
    """D3: claim mode stalled one expired row per call."""
    client.send(queue, [Message(f"stale {n}", time_to_be_received=0.001) for n in range(10)])
    time.sleep(0.05)
    client.send(queue, Message("live"))
    [message] = client.claim(queue, 1)
    assert message.text == "live"
    assert client.depth(queue) == 0


def test_a_token_settles_only_in_its_own_queue(client, queue, schema):
    """D10: ack("other_queue", token) used to remove a claim of another queue."""
    other = QueueAddress("other", schema)
    client.create_queue(other)
    client.send(queue, Message("m"))
    [claimed] = client.claim(queue)
    assert client.ack(other, claimed.claim_token) is False
    assert client.nack(other, claimed.claim_token) is False
    assert client.extend(other, claimed.claim_token) is False
    assert client.ack(queue, claimed.claim_token) is True


def test_one_client_shared_by_threads_loses_nothing(backend, client, queue):
    """D2: concurrent use of one client interleaved transactions and lost sent messages."""
    senders, per_sender, received = 4, 250, []
    errors: list[BaseException] = []
    lock = threading.Lock()
    done_sending = threading.Event()

    def send(n: int) -> None:
        try:
            for i in range(per_sender):
                client.send(queue, Message(f"{n}-{i}"))
        except BaseException as exc:  # recorded: the assertion below names it
            errors.append(exc)

    def receive() -> None:
        try:
            while True:
                got = client.receive(queue, 7)
                with lock:
                    received.extend(m.text for m in got)
                if not got and done_sending.is_set():
                    return
        except BaseException as exc:
            errors.append(exc)

    receivers = [threading.Thread(target=receive) for _ in range(2)]
    sending = [threading.Thread(target=send, args=(n,)) for n in range(senders)]
    for thread in [*receivers, *sending]:
        thread.start()
    for thread in sending:
        thread.join()
    done_sending.set()
    for thread in receivers:
        thread.join()
    assert not errors
    counts = Counter(received)
    assert len(counts) == senders * per_sender and max(counts.values()) == 1
    assert client.depth(queue) == 0


@pytest.mark.postgres_only
def test_a_server_that_never_answers_is_unavailable_after_the_connect_timeout(pg_uri):
    """D6: with no connect_timeout in the URI, connecting to a silent socket blocked for minutes."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # the kernel accepts the TCP connection; nobody ever answers
        port = silent.getsockname()[1]
        started = time.monotonic()
        with pytest.raises(TransportUnavailableError):
            QueueClient.connect(f"postgresql://postgres@127.0.0.1:{port}/test")
        assert time.monotonic() - started < 3 * defaults.CONNECT_TIMEOUT_SECONDS


@pytest.mark.postgres_only
def test_a_failed_commit_leaves_the_session_usable(client, queue, raw, schema):
    """D7: a COMMIT that failed left the connection in an aborted transaction."""
    raw.execute(
        f'CREATE FUNCTION "{schema}".refuse() RETURNS trigger LANGUAGE plpgsql AS '
        "$$ BEGIN RAISE EXCEPTION 'refused at commit'; END $$"
    )
    raw.execute(
        f'CREATE CONSTRAINT TRIGGER refuse AFTER INSERT ON "{schema}"."orders" DEFERRABLE INITIALLY DEFERRED '
        f'FOR EACH ROW EXECUTE FUNCTION "{schema}".refuse()'
    )
    with pytest.raises(Exception, match="refused at commit"):
        client.send(queue, [Message("a"), Message("b")])  # two messages: BEGIN ... COMMIT
    from psycopg.pq import TransactionStatus

    assert client.session.connection.info.transaction_status == TransactionStatus.IDLE
    raw.execute(f'DROP TRIGGER refuse ON "{schema}"."orders"')
    assert client.send(queue, [Message("c"), Message("d")]) == 2
    assert [m.text for m in client.receive(queue, 5)] == ["c", "d"]  # a and b were rolled back


@pytest.mark.postgres_only
@pytest.mark.parametrize("change", [{"user": "no_such_role"}, {"dbname": "no_such_database"}])
def test_unknown_role_or_database_is_a_configuration_error_not_retry_later(pg_uri, change):
    """D8: these were TransportUnavailableError, so triggers and pumps retried them forever."""
    uri = make_conninfo(pg_uri, **change)
    with pytest.raises(TransportMisconfiguredError, match="retrying will not help") as caught:
        QueueClient.connect(uri)
    assert not isinstance(caught.value, TransportUnavailableError)


@pytest.mark.postgres_only
def test_a_role_that_may_not_log_in_is_a_configuration_error_not_retry_later(pg_uri, raw):
    role = f"nologin_{uuid.uuid4().hex[:8]}"
    raw.execute(f'CREATE ROLE "{role}" NOLOGIN')
    try:
        with pytest.raises(TransportMisconfiguredError, match="retrying will not help"):
            QueueClient.connect(make_conninfo(pg_uri, user=role))
    finally:
        raw.execute(f'DROP ROLE "{role}"')


@pytest.mark.parametrize(
    ("lease", "error"),
    [
        (0, ValueError),
        ("5", TypeError),
        (True, TypeError),
        (float("nan"), ValueError),
        (float("inf"), ValueError),
        (timedelta(days=10**6), ValueError),
        (-1, ValueError),
    ],
)
def test_bad_leases_are_refused_before_anything_is_sent(client, queue, lease, error):
    """D13: lease=0 became 1 ms; text, booleans and absurd spans were accepted."""
    client.send(queue, Message("m"))
    with pytest.raises(error, match="lease"):
        client.claim(queue, lease=lease)
    with pytest.raises(error, match="lease"):
        client.reserve(queue, lease=lease)
    assert client.depth(queue) == 1 and client.in_flight(queue) == 0


def test_time_to_be_received_is_bounded_to_what_nservicebus_can_read():
    """D12: a TTBR of 10,000 years stored an Expires no client could read."""
    with pytest.raises(ValueError, match="at most"):
        Message("m", time_to_be_received=timedelta(days=365 * 10_000))
    with pytest.raises(ValueError, match="finite"):
        Message("m", time_to_be_received=float("nan"))
    with pytest.raises(ValueError, match="at most"):
        Message("m", time_to_be_received=1e15)
    assert Message("m", time_to_be_received=defaults.MAX_TIME_TO_BE_RECEIVED).time_to_be_received


@pytest.mark.postgres_only
@pytest.mark.parametrize("interval", [float("nan"), 0, -1, float("inf"), "1"])
def test_pump_refuses_a_peek_interval_it_could_not_honour(pg_uri, interval):
    """D14: peek_interval=nan was accepted and the pump stopped peeking."""
    pool = AsyncPsycopgPool(pg_uri, max_size=1)

    async def handler(message, connection):
        return None

    with pytest.raises((ValueError, TypeError), match="peek_interval"):
        MessagePump(pool, QueueAddress("orders"), handler, peek_interval=interval)


def test_retry_errors_skips_rows_it_cannot_route_and_retries_the_rest(client, queue, raw, schema, backend):
    """D4: one error row naming a dropped queue, a.b.c or another dialect's address made retry_errors fail whole."""
    import json

    error = QueueAddress("error", schema)
    for failed_q in ('gone@"' + schema + '"', "a.b.c", "orders@[dbo]@[MyDb]"):
        headers = {"NServiceBus.FailedQ": failed_q, "NServiceBus.MessageId": str(uuid.uuid4())}
        backend.nservicebus_send(raw, schema, "error", uuid.uuid4(), json.dumps(headers), b"unroutable")
    client.send(queue, Message("routable"))
    [message] = client.receive(queue)
    client.move_to_error(queue, message, ValueError("boom"))
    assert client.retry_errors(error) == 1
    assert client.retry_errors(error, queue=queue) == 0  # already moved
    assert [m.text for m in client.receive(queue)] == ["routable"]
    assert client.depth(error) == 3  # the unroutable rows stay


@pytest.mark.postgres_only
def test_claim_moves_a_null_headers_row_to_the_error_queue(client, queue, raw, schema):
    """D5: a hand-made table allowing NULL headers blocked every claim with a NotNullViolation."""
    raw.execute(f'ALTER TABLE "{schema}"."orders" ALTER COLUMN Headers DROP NOT NULL')
    raw.execute(f'INSERT INTO "{schema}"."orders" (Id, Headers, Body) VALUES (%s, NULL, %s)', (uuid.uuid4(), b"x"))
    client.send(queue, Message("after"))
    assert [m.text for m in client.claim(queue, 2)] == ["after"]
    assert client.depth(QueueAddress("error", schema)) == 1


@pytest.mark.postgres_only
def test_quoted_mixed_case_columns_are_not_a_queue_table(client, raw, schema):
    """D9: check_queue approved "Id", "Seq"... and receive then failed with UndefinedColumn."""
    raw.execute(
        f'CREATE TABLE "{schema}"."lookalike" ("Id" uuid PRIMARY KEY, "Expires" timestamp, "Headers" text NOT NULL, '
        '"Body" bytea, "Seq" serial)'
    )
    with pytest.raises(
        SqlQueueError, match=r"not a queue table as NServiceBus defines it.*lacks column.*body.*quoted names"
    ):
        client.check_queue(QueueAddress("lookalike", schema))


def test_odd_inputs_get_the_librarys_own_errors_before_anything_is_sent(client, queue):
    """D11: these reached the driver and came back as raw UnicodeEncodeError, UniqueViolation, ProgrammingError..."""
    with pytest.raises(InvalidHeadersError, match="not valid Unicode"):
        Message("m", {"note": "half a pair \ud800"})
    with pytest.raises(ValueError, match="at most"):
        Message("m", time_to_be_received=timedelta.max)
    with pytest.raises(ValueError, match="at most 100,000"):
        client.claim(queue, 2**63)
    client.send(queue, Message("m"))
    [claimed] = client.claim(queue)
    with pytest.raises(TypeError, match="exception, a text or a Failure"):
        client.nack(queue, claimed.claim_token, error={"why": "structured"})
    assert client.ack(queue, claimed.claim_token) is True
    again = Message("first")
    client.send(queue, again)
    with pytest.raises(DuplicateMessageError, match="already in"):
        client.send(queue, Message("second", id=again.id))
    assert [m.text for m in client.receive(queue, 5)] == ["first"]


@pytest.mark.postgres_only
async def test_pumps_are_back_soon_after_a_storm_of_killed_sessions(pg_uri, client, queue, raw):
    """D16: killed connections stayed in the pool and its reconnect back-off kept pumps idle 9-30 s."""
    import asyncio

    pool = AsyncPsycopgPool(pg_uri, max_size=4, application_name="sqlqueue-d16")
    await pool.open()
    handled: list[str] = []

    async def handler(message, connection):
        handled.append(message.text)

    pumps = [MessagePump(pool, queue, handler, max_concurrency=2, peek_interval=0.1) for _ in range(2)]
    tasks = [asyncio.create_task(pump.run()) for pump in pumps]
    try:
        await asyncio.to_thread(client.send, queue, [Message(f"before {n}") for n in range(20)])
        while len(handled) < 20:
            await asyncio.sleep(0.05)
        storm_ends = time.monotonic() + 5
        killed = 0
        while time.monotonic() < storm_ends:  # every session of the pool is killed as soon as it appears
            rows = raw.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'sqlqueue-d16'"
            ).fetchall()
            killed += len(rows)
            await asyncio.sleep(0.05)
        answered = time.monotonic()
        await asyncio.to_thread(client.send, queue, Message("after"))
        while "after" not in handled:
            await asyncio.sleep(0.02)
        recovery = time.monotonic() - answered
    finally:
        for pump in pumps:
            pump.stop()
        await asyncio.wait_for(asyncio.gather(*tasks), 30)
        await pool.close()
    print(f"killed {killed} sessions; first message after the storm handled {recovery:.2f}s after it ended")
    assert killed > 0
    assert recovery < 5  # the pumps' own back-off after 5 s of failures; the pool adds none
    assert sorted(handled) == sorted([f"before {n}" for n in range(20)] + ["after"])


@pytest.mark.postgres_only
def test_a_native_handler_outliving_the_idle_transaction_timeout_gets_a_clear_error(pg_uri, queue, schema):
    """D11: the server's IdleInTransactionSessionTimeout came back raw from receive_native."""
    uri = make_conninfo(pg_uri, options="-c idle_in_transaction_session_timeout=200")
    with QueueClient.connect(uri) as client:
        client.send(queue, Message("slow work"))
        with (
            pytest.raises(TransactionAbortedError, match="idle_in_transaction_session_timeout"),
            client.receive_native(queue) as message,
        ):
            time.sleep(0.6)  # the handler takes longer than the server allows an idle transaction
        assert message is not None
    with QueueClient.connect(pg_uri) as check:
        assert [m.text for m in check.receive(queue)] == ["slow work"]  # rolled back: still queued


@pytest.mark.postgres_only
def test_a_borrowed_connection_in_the_callers_transaction_makes_calls_part_of_it(pg_uri, queue):
    """D15: what README promises for a borrowed connection inside the caller's transaction."""
    import psycopg

    with QueueClient.connect(pg_uri) as owner:
        owner.send(queue, Message("m"))
        with psycopg.connect(pg_uri) as connection:  # not autocommit: the caller's transaction
            borrowed = QueueClient.connect(connection)
            with connection.transaction(force_rollback=True):
                assert [m.text for m in borrowed.receive(queue)] == ["m"]
                borrowed.send(queue, Message("sent inside"))
                assert owner.depth(queue) == 1  # nothing committed yet: the owner still sees "m" only
            assert [m.text for m in owner.browse(queue)] == ["m"]  # rolled back: received one is back, send undone
            with connection.transaction():
                borrowed.send(queue, Message("committed"))
            assert [m.text for m in owner.browse(queue)] == ["m", "committed"]


def test_retry_errors_matches_failedq_as_nservicebus_writes_it(client, queue, raw, schema, backend):
    """NServiceBus writes FailedQ with the catalog (orders@[dbo]@[MyDb]); retry by the plain name still matches it."""
    import json

    if backend.name == "sqlserver":
        database = raw.execute("SELECT DB_NAME()").fetchone()[0]
        failed_q = f"orders@[{schema}]@[{database.upper()}]"  # the catalog as a connection string may spell it
    else:
        failed_q = f'orders@"{schema}"'
    headers = {"NServiceBus.FailedQ": failed_q, "NServiceBus.MessageId": str(uuid.uuid4())}
    backend.nservicebus_send(raw, schema, "error", uuid.uuid4(), json.dumps(headers), b"from NServiceBus")
    assert client.retry_errors(QueueAddress("error", schema), queue=QueueAddress("orders", schema)) == 1
    assert [m.body for m in client.receive(queue)] == [b"from NServiceBus"]


@pytest.mark.sqlserver_only
def test_a_claim_is_one_queue_however_its_address_is_written(client, queue, raw, schema):
    """The claim key leaves out the catalog: claimed through orders@[s]@[Db], acked through orders@[s]."""
    database = raw.execute("SELECT DB_NAME()").fetchone()[0]
    client.send(queue, Message("x"))
    [claim] = client.claim(QueueAddress("orders", schema, database))
    assert client.in_flight(QueueAddress("orders", schema)) == 1
    assert client.ack(QueueAddress("orders", schema), claim.claim_token) is True


@pytest.mark.sqlserver_only
def test_an_older_nservicebus_table_without_recoverable_and_with_varchar_headers(client, raw, schema, caplog):
    """NServiceBus reads and writes such tables; non-ASCII headers must survive the varchar column."""
    import logging

    raw.execute(
        f"CREATE TABLE [{schema}].[legacy] (Id uniqueidentifier NOT NULL, CorrelationId varchar(255), "
        "ReplyToAddress varchar(255), Expires datetime, Headers varchar(max) NOT NULL, Body varbinary(max), "
        "RowVersion bigint IDENTITY(1,1) NOT NULL)"
    )
    queue = QueueAddress("legacy", schema)
    with caplog.at_level(logging.WARNING, logger="airflow_provider_sqlqueue"):
        client.send(queue, [Message(b"a", {"city": "Zürich 東京"}), Message(b'{"ascii":1}')])
    assert "varchar Headers column" in caplog.text
    received = client.receive(queue, 10)
    assert [(m.headers.get("city"), m.body) for m in received] == [
        ("Zürich 東京", b"a"),
        (None, b'{"ascii":1}'),
    ]


@pytest.mark.postgres_only
def test_an_error_leaves_out_where_the_server_pointed_into_the_librarys_statement(pg_uri, schema, raw):
    """The server's ``LINE 1: SELECT ...`` and its caret quote the library's own SQL: no help to the
    reader of the error, and lines of their own where an error must be one line."""
    with QueueClient.connect(pg_uri) as client:
        client.create_queue(QueueAddress("orders", schema))
        raw.execute(f'DROP TABLE "{schema}".sqlqueue_inflight')  # a claim store of the wrong shape
        raw.execute(f'CREATE TABLE "{schema}".sqlqueue_inflight (x int)')
        with pytest.raises(SqlQueueError) as refused:
            client.queue_stats(QueueAddress("orders", schema))
    assert "does not exist" in str(refused.value)
    assert "LINE 1" not in str(refused.value) and "\n" not in str(refused.value).strip()
