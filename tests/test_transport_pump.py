"""The asyncio message pump on each real database: peek/receive modes, concurrency limit, failures, back-off."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from datetime import timedelta
from types import SimpleNamespace

import pytest

from airflow_provider_sqlqueue.transport import AsyncPsycopgPool, Message, MessagePump, QueueAddress
from airflow_provider_sqlqueue.transport.dialects import get_dialect
from airflow_provider_sqlqueue.transport.drivers import (
    PsycopgSession,
    SessionPool,
    ThreadSessionPool,
    finish,
    open_pool,
)

pytestmark = pytest.mark.every_dialect


class CountingPool(SessionPool):
    """A real pool that also counts which statements the pump ran, to observe its modes."""

    def __init__(self, inner: SessionPool) -> None:
        self.inner = inner
        self.dialect = inner.dialect
        self.statements: Counter[str] = Counter()

    async def open(self) -> None:
        await self.inner.open()

    async def close(self) -> None:
        await self.inner.close()

    def session(self):
        pool = self

        class _Counted:
            async def __aenter__(self):
                self._cm = pool.inner.session()
                session = await self._cm.__aenter__()
                original = session.execute

                async def execute(step):
                    pool.statements[step.sql.split()[0].upper()] += 1
                    return await original(step)

                session.execute = execute
                return session

            async def __aexit__(self, *exc):
                return await self._cm.__aexit__(*exc)

        return _Counted()


async def run_until(pump: MessagePump, done, timeout: float = 60.0) -> None:
    task = asyncio.create_task(pump.run())
    try:
        deadline = asyncio.get_running_loop().time() + timeout
        while not done():
            assert asyncio.get_running_loop().time() < deadline, "pump did not finish in time"
            assert not task.done(), f"pump stopped by itself: {task.exception() if task.done() else ''}"
            await asyncio.sleep(0.02)
    finally:
        pump.stop()
        await asyncio.wait_for(task, 30)


@pytest.mark.postgres_only
async def test_thread_offloaded_sessions_drive_the_pump(pg_uri, client, queue, schema):
    """The thread-per-connection pool SQL Server's blocking drivers use, here over blocking psycopg."""
    pool = ThreadSessionPool(
        lambda: finish(PsycopgSession.connect(pg_uri, blocking=True)), max_size=3, dialect=client.session.dialect
    )
    seen: Counter[str] = Counter()

    async def handler(message, connection):
        seen[message.text] += 1

    for n, mode in enumerate(("claim", "native", "none")):
        client.send(queue, [Message(f"{mode}-{i}") for i in range(20)])
        pump = MessagePump(
            pool,
            queue,
            handler,
            transaction_mode=mode,
            error_queue=QueueAddress("error", schema),
            max_concurrency=3,
            peek_interval=0.05,
        )
        await run_until(pump, lambda n=n: len(seen) == 20 * (n + 1), timeout=30)
    await pool.close()
    assert max(seen.values()) == 1 and pump.handled == 20
    assert client.depth(queue) == 0 and client.in_flight(queue) == 0


@pytest.fixture
async def pool(backend):
    p = open_pool(backend.uri, max_size=6)
    await p.open()
    yield p
    await p.close()


@pytest.mark.parametrize("batch", [None, 25], ids=["batch-of-concurrency", "batch-25"])
@pytest.mark.parametrize("mode", ["none", "native", "claim"])
async def test_pump_drains_with_at_most_max_concurrency_in_flight(pool, client, queue, schema, mode, batch):
    client.send(queue, [Message(str(i)) for i in range(150)])
    seen: Counter[str] = Counter()
    in_flight = 0
    peak = 0

    async def handler(message, connection):
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.002)
        seen[message.text] += 1
        in_flight -= 1

    pump = MessagePump(
        pool,
        queue,
        handler,
        transaction_mode=mode,
        error_queue=QueueAddress("error", schema),
        max_concurrency=3,
        receive_batch_size=batch,
        peek_interval=0.1,
    )
    await run_until(pump, lambda: len(seen) == 150)
    assert sorted(seen, key=int) == [str(i) for i in range(150)]
    assert max(seen.values()) == 1
    assert 1 < peak <= 3
    assert client.depth(queue) == 0 and client.in_flight(queue) == 0
    assert pump.handled == 150 and pump.failed == 0


async def test_a_claim_batch_settles_each_message_by_its_own_outcome(pool, client, queue, raw, schema):
    """In one claimed batch, handled messages are acknowledged together and a failing one alone comes back."""
    client.send(queue, [Message(f"m{i}") for i in range(20)])
    attempts: Counter[str] = Counter()

    async def handler(message, connection):
        attempts[message.text] += 1
        if message.text == "m7" and attempts["m7"] == 1:
            raise ValueError("first attempt of m7 fails")

    pump = MessagePump(
        pool,
        queue,
        handler,
        transaction_mode="claim",
        error_queue=QueueAddress("error", schema),
        max_concurrency=4,
        receive_batch_size=20,
        peek_interval=0.05,
    )
    await run_until(pump, lambda: attempts["m7"] == 2 and client.in_flight(queue) == 0)
    assert attempts == Counter({f"m{i}": 2 if i == 7 else 1 for i in range(20)})
    assert pump.handled == 20 and pump.failed == 1
    assert client.depth(queue) == 0 and client.depth(QueueAddress("error", schema)) == 0


async def test_receive_batch_size_is_checked(pg_uri):
    never_used = open_pool(pg_uri, max_size=1)  # the pump is built, never run

    async def handler(message, connection):
        return None

    for size in (0, 100_001):
        with pytest.raises(ValueError, match="receive_batch_size must be"):
            MessagePump(never_used, QueueAddress("orders"), handler, receive_batch_size=size)
    await never_used.close()


async def test_pump_only_peeks_while_idle_and_picks_up_messages_sent_later(backend, client, queue, schema):
    pool = CountingPool(open_pool(backend.uri, max_size=3))
    await pool.open()
    got: list[str] = []

    async def handler(message, connection):
        got.append(message.text)

    pump = MessagePump(
        pool, queue, handler, transaction_mode="claim", error_queue=QueueAddress("error", schema), peek_interval=0.1
    )
    task = asyncio.create_task(pump.run())
    await asyncio.sleep(0.6)
    idle = dict(pool.statements)
    assert idle.get("SELECT", 0) >= 3  # peeks (plus the reclaimable count in claim mode)
    assert not {"DELETE", "WITH", "UPDATE", "DECLARE"} & idle.keys()  # no receive while peeks find nothing
    client.send(queue, [Message("late-1"), Message("late-2")])
    for _ in range(100):
        if len(got) == 2:
            break
        await asyncio.sleep(0.05)
    pump.stop()
    await asyncio.wait_for(task, 10)
    await pool.close()
    assert got == ["late-1", "late-2"]


@pytest.mark.parametrize("batch", [False, True], ids=["handler", "batch_handler"])
async def test_a_cancelled_native_pump_rolls_back_every_receive_in_flight_before_it_returns(
    pool, client, queue, schema, batch
):
    """Cancelling the pump's task (a service shutting down, a trigger cancelled) cancels the handlers
    in flight, also while the pump waits for a free slot, and their receives roll back before the
    task ends: none is left holding its message in an open transaction."""
    client.send(queue, [Message(str(n)) for n in range(5)])
    entered, cancelled = 0, 0

    async def wait_for_ever() -> None:
        nonlocal entered, cancelled
        entered += 1
        try:
            await asyncio.sleep(600)
        except asyncio.CancelledError:
            cancelled += 1
            raise

    async def handler(message, connection):
        await wait_for_ever()

    async def batch_handler(messages, connection):
        await wait_for_ever()

    pump = MessagePump(
        pool,
        queue,
        None if batch else handler,
        batch_handler=batch_handler if batch else None,
        transaction_mode="native",
        error_queue=QueueAddress("error", schema),
        max_concurrency=2,
        receive_batch_size=2 if batch else 1,
        peek_interval=0.05,
    )
    task = asyncio.create_task(pump.run())
    deadline = asyncio.get_running_loop().time() + 60  # a bound on the wait, not a speed claim
    while entered < (1 if batch else 2):
        assert asyncio.get_running_loop().time() < deadline and not task.done()
        await asyncio.sleep(0.02)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cancelled == entered
    got = client.receive(queue, 5)  # none is still locked by a receive left open
    assert sorted(m.text for m in got) == [str(n) for n in range(5)]


async def test_claim_pump_redelivers_failures_then_dead_letters(pool, client, queue, raw, schema):
    client.send(queue, [Message("flaky"), Message("broken")])
    calls: Counter[str] = Counter()

    async def handler(message, connection):
        calls[message.text] += 1
        if message.text == "broken" or (message.text == "flaky" and calls["flaky"] == 1):
            raise RuntimeError(f"{message.text} failed")

    pump = MessagePump(
        pool,
        queue,
        handler,
        transaction_mode="claim",
        error_queue=QueueAddress("error", schema),
        max_deliveries=2,
        peek_interval=0.05,
    )
    error_count = lambda: raw.execute(f'SELECT count(*) FROM "{schema}"."error"').fetchone()[0]  # noqa: E731
    await run_until(pump, lambda: error_count() == 1 and calls["flaky"] == 2)
    assert calls == {"flaky": 2, "broken": 2}
    assert client.in_flight(queue) == 0 and client.depth(queue) == 0
    assert "broken failed" in raw.execute(f'SELECT headers FROM "{schema}"."error"').fetchone()[0]


async def test_none_pump_copies_failed_message_to_error_queue(pool, client, queue, raw, schema):
    client.send(queue, Message("lost?"))

    async def handler(message, connection):
        raise KeyError("missing")

    pump = MessagePump(
        pool, queue, handler, transaction_mode="none", error_queue=QueueAddress("error", schema), peek_interval=0.05
    )
    error_count = lambda: raw.execute(f'SELECT count(*) FROM "{schema}"."error"').fetchone()[0]  # noqa: E731
    await run_until(pump, lambda: error_count() == 1)
    assert pump.failed == 1 and client.depth(queue) == 0


async def test_competing_pumps_deliver_exactly_once(backend, client, queue, schema):
    client.send(queue, [Message(str(i)) for i in range(400)])
    seen: Counter[str] = Counter()

    async def handler(message, connection):
        seen[message.text] += 1

    pools = [open_pool(backend.uri, max_size=3) for _ in range(4)]
    for p in pools:
        await p.open()
    pumps = [
        MessagePump(
            p,
            queue,
            handler,
            transaction_mode="claim",
            error_queue=QueueAddress("error", schema),
            max_concurrency=2,
            peek_interval=0.05,
        )
        for p in pools
    ]
    tasks = [asyncio.create_task(p.run()) for p in pumps]
    for _ in range(600):
        if len(seen) == 400:
            break
        await asyncio.sleep(0.05)
    for p in pumps:
        p.stop()
    await asyncio.wait_for(asyncio.gather(*tasks), 30)
    for p in pools:
        await p.close()
    assert len(seen) == 400 and max(seen.values()) == 1
    assert sum(p.handled for p in pumps) == 400
    assert sum(1 for p in pumps if p.handled) >= 2


async def test_unreachable_database_backs_off_and_never_crashes(caplog):
    pool = AsyncPsycopgPool("postgresql://postgres@127.0.0.1:1/test?connect_timeout=1", max_size=1, min_size=0)
    await pool.open()

    async def handler(message, connection):
        raise AssertionError("no message can arrive")

    pump = MessagePump(pool, QueueAddress("orders"), handler, peek_interval=0.1, max_backoff=0.8)
    with caplog.at_level(logging.WARNING, logger="airflow_provider_sqlqueue.pump"):
        task = asyncio.create_task(pump.run())
        await asyncio.sleep(2.5)
        assert not task.done(), "the pump must keep running through database errors"
        pump.stop()
        await asyncio.wait_for(task, 10)
    await pool.close()
    errors = [r.getMessage() for r in caplog.records if "database error" in r.getMessage()]
    moves = [text for text in errors if "moving due delayed messages" in text]  # the delayed mover's own loop
    attempts = [text for text in errors if text not in moves]
    assert 2 <= len(attempts) <= 8, "backed off exponentially instead of spinning"
    assert 1 <= len(moves) <= 8, "the delayed mover backed off too"
    assert "retrying in 0.8s" in caplog.text  # reached the cap


async def test_pump_warns_when_a_message_ttbr_is_shorter_than_peek_interval(pool, client, queue, schema, caplog):
    client.send(queue, Message("hurry", time_to_be_received=timedelta(seconds=2)))
    done = asyncio.Event()

    async def handler(message, connection):
        done.set()

    pump = MessagePump(pool, queue, handler, error_queue=QueueAddress("error", schema), peek_interval=3)
    with caplog.at_level(logging.WARNING, logger="airflow_provider_sqlqueue.pump"):
        await run_until(pump, done.is_set)
    assert "longer than the queue's time-to-be-received 0:00:02" in caplog.text


def test_a_batch_handler_needs_native_mode_and_no_single_handler():
    never_used = SimpleNamespace(dialect=get_dialect("postgres"))

    async def batch_handler(messages, connection):
        return None

    with pytest.raises(ValueError, match="needs transaction_mode='native'"):
        MessagePump(never_used, QueueAddress("orders"), None, batch_handler=batch_handler, transaction_mode="claim")
    with pytest.raises(ValueError, match="not both"):
        MessagePump(never_used, QueueAddress("orders"), lambda m, c: None, batch_handler=batch_handler)
    with pytest.raises(ValueError, match="got neither"):
        MessagePump(never_used, QueueAddress("orders"), None)


def test_the_names_of_the_pumps_checks_and_native_receives_are_still_the_pump_modules():
    """The checks and the native receives have modules of their own; what was public in the pump's still is."""
    from airflow_provider_sqlqueue import transport
    from airflow_provider_sqlqueue.transport import pump, pump_checks, pump_native

    for name in ("parse_timespan", "check_peek_interval", "handler_failure", "SETUP_ERRORS"):
        assert getattr(pump, name) is getattr(pump_checks, name), name
    for name in ("BatchHandler", "FailureCounter", "aborted"):
        assert getattr(pump, name) is getattr(pump_native, name), name
    assert transport.MessagePump is pump.MessagePump


@pytest.fixture
async def recorder(pg_uri):
    """A pool of two sessions and a handler that records each message's text (``got``)."""
    pool = open_pool(pg_uri, max_size=2)
    await pool.open()
    got: list[str] = []

    async def handler(message, connection):
        got.append(message.text)

    yield SimpleNamespace(pool=pool, got=got, handler=handler)
    await pool.close()


def listeners(admin_uri: str, channel: str) -> int:
    """Backends of this database that LISTEN on ``channel`` (pg_listening_channels is per session,
    so each backend is asked through pg_stat_activity's view of LISTEN statements instead)."""
    import psycopg

    with psycopg.connect(admin_uri, autocommit=True) as admin:
        row = admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query LIKE %s",
            (f'LISTEN "{channel}"%',),
        ).fetchone()
    assert row is not None
    return int(row[0])


async def until_listening(pg_uri: str, channel: str) -> None:
    """Wait until a session LISTENs on ``channel`` (the pump's first empty peek opened its listener)."""
    for _ in range(1200):
        if listeners(pg_uri, channel):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"nobody listens on {channel} after a minute")


@pytest.mark.postgres_only
@pytest.mark.parametrize("mode", ["none", "native", "claim"])
async def test_an_idle_pump_wakes_on_a_send_notification_not_its_peek_interval(pg_uri, client, queue, schema, mode):
    """With a peek every 10 minutes, only the notification can bring the message in within the test."""
    pool = open_pool(pg_uri, max_size=1)  # the listener is not one of the pool's sessions: one is enough
    await pool.open()
    got: list[str] = []

    async def handler(message, connection):
        got.append(message.text)

    pump = MessagePump(
        pool, queue, handler, transaction_mode=mode, error_queue=QueueAddress("error", schema), peek_interval=600
    )
    channel = pump.dialect.notify_channel(queue)
    task = asyncio.create_task(pump.run())
    try:
        await until_listening(pg_uri, channel)
        for n in range(3):  # the pump is waiting: each notified send ends the wait
            client.send(queue, Message(f"notified-{n}"), notify=True)
            for _ in range(1200):
                if len(got) == n + 1:
                    break
                assert not task.done(), f"the pump stopped by itself: {task.exception() if task.done() else ''}"
                await asyncio.sleep(0.05)
        assert got == ["notified-0", "notified-1", "notified-2"]
    finally:
        pump.stop()
        await asyncio.wait_for(task, 30)  # stop ends the wait at once, not after 10 minutes
        await pool.close()
    assert listeners(pg_uri, channel) == 0  # the listening connection closed with the pump
    assert client.depth(queue) == 0 and client.in_flight(queue) == 0


@pytest.mark.postgres_only
async def test_a_pump_whose_listening_connection_is_killed_peeks_on_and_listens_again(
    pg_uri, client, queue, schema, caplog, recorder
):
    import psycopg

    pump = MessagePump(
        recorder.pool, queue, recorder.handler, error_queue=QueueAddress("error", schema), peek_interval=0.2
    )
    channel = pump.dialect.notify_channel(queue)
    with caplog.at_level(logging.WARNING, logger="airflow_provider_sqlqueue.pump"):
        task = asyncio.create_task(pump.run())
        try:
            await until_listening(pg_uri, channel)
            with psycopg.connect(pg_uri, autocommit=True) as admin:
                admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE %s",
                    (f'LISTEN "{channel}"%',),
                )
            client.send(queue, Message("after the kill"))  # no notification: the peek brings it in
            await until(lambda: recorder.got == ["after the kill"], task)
        finally:
            pump.stop()
            await asyncio.wait_for(task, 30)
    assert "not waiting for send notifications" in caplog.text
    assert pg_uri not in caplog.text  # the warning names the failure, never the connection string


@pytest.mark.postgres_only
async def test_due_delayed_messages_end_the_pumps_wait(client, queue, schema, recorder):
    """The pump's own delayed mover wakes its consumer: a due message does not wait out the peek interval."""
    client.send(queue, Message("later"), delay=timedelta(seconds=2))
    pump = MessagePump(
        recorder.pool,
        queue,
        recorder.handler,
        error_queue=QueueAddress("error", schema),
        peek_interval=600,
        wake_on_notify=False,  # only the mover can end the wait
    )
    await run_until(pump, lambda: recorder.got == ["later"], timeout=120)


@pytest.mark.postgres_only
async def test_a_notified_message_committed_after_newer_ones_were_taken_is_not_left_for_the_peek(
    pg_uri, client, queue, schema, recorder
):
    """The notification names the lowest Seq sent: the woken pump looks below what it already took."""
    from airflow_provider_sqlqueue.transport import QueueClient

    got = recorder.got
    pump = MessagePump(
        recorder.pool, queue, recorder.handler, error_queue=QueueAddress("error", schema), peek_interval=600
    )
    task = asyncio.create_task(pump.run())
    try:
        await until_listening(pg_uri, pump.dialect.notify_channel(queue))
        with QueueClient.connect(pg_uri) as late:
            with late.transaction():
                late.send(queue, Message("late"), notify=True)  # gets the lower Seq, commits last
                client.send(queue, Message("early"), notify=True)
                await until(lambda: got == ["early"], task)
            await until(lambda: got == ["early", "late"], task)  # not 10 minutes later
    finally:
        pump.stop()
        await asyncio.wait_for(task, 30)


async def until(done, task: asyncio.Task, seconds: float = 60) -> None:
    for _ in range(int(seconds / 0.05)):
        if done():
            return
        assert not task.done(), f"the pump stopped by itself: {task.exception() if task.done() else ''}"
        await asyncio.sleep(0.05)
    raise AssertionError("not within a minute")


@pytest.mark.postgres_only
async def test_a_claim_pump_settles_on_a_new_connection_when_the_server_closed_an_idle_one(
    pg_uri, client, queue, schema
):
    """Handlers outlast the server's idle_session_timeout: the pooled connection the ack would use is
    gone, yet each message is handled once and acknowledged, none redelivered or dead-lettered."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    short_idle = make_conninfo(**{**conninfo_to_dict(pg_uri), "options": "-c idle_session_timeout=500"})
    pool = open_pool(short_idle, max_size=2)
    await pool.open()
    handled: Counter[str] = Counter()

    async def handler(message, connection):
        handled[message.text] += 1
        await asyncio.sleep(1.5)  # the pool's idle connection is closed by the server meanwhile

    client.send(queue, [Message(f"m{n}") for n in range(3)])
    pump = MessagePump(
        pool,
        queue,
        handler,
        transaction_mode="claim",
        error_queue=QueueAddress("error", schema),
        lease=20,
        max_deliveries=2,
        move_delayed=False,
        wake_on_notify=False,
        peek_interval=0.2,
    )
    await run_until(pump, lambda: client.depth(queue) == 0 and client.in_flight(queue) == 0, timeout=120)
    await pool.close()
    assert handled == Counter({"m0": 1, "m1": 1, "m2": 1})
    assert client.depth(QueueAddress("error", schema)) == 0


@pytest.mark.postgres_only
async def test_a_busy_pump_keeps_reading_its_notifications(pg_uri, client, queue, schema):
    """A listener nobody reads holds back the cluster's notification queue (every notifying commit
    shares it); the pump reads its own even while its only handler is stuck."""
    import psycopg

    pool = open_pool(pg_uri, max_size=2)
    await pool.open()
    release = asyncio.Event()
    started = asyncio.Event()

    async def handler(message, connection):
        started.set()
        await release.wait()

    pump = MessagePump(pool, queue, handler, error_queue=QueueAddress("error", schema), peek_interval=0.2)
    channel = pump.dialect.notify_channel(queue)
    task = asyncio.create_task(pump.run())
    try:
        await until_listening(pg_uri, channel)
        client.send(queue, Message("stuck"), notify=True)
        await asyncio.wait_for(started.wait(), 60)
        with psycopg.connect(pg_uri, autocommit=True) as admin:
            admin.execute("SELECT pg_notify(%s, n::text) FROM generate_series(1, 200000) n", (channel,))
            assert admin.execute("SELECT pg_notification_queue_usage()").fetchone()[0] > 0
            await until(lambda: admin.execute("SELECT pg_notification_queue_usage()").fetchone()[0] == 0, task)
        assert not release.is_set()  # read while the handler is still busy
    finally:
        release.set()
        pump.stop()
        await asyncio.wait_for(task, 30)
        await pool.close()


@pytest.mark.postgres_only
async def test_a_receive_that_keeps_failing_backs_off_further_though_peeks_succeed(
    pg_uri, client, queue, schema, raw, caplog
):
    """Peeks see a message, every receive fails (a trigger refuses each delete from the queue): the
    back-off grows, as for any lasting failure, instead of retrying every second forever."""
    client.send(queue, Message("undeletable"))
    raw.execute(
        f'CREATE FUNCTION "{schema}".refuse() RETURNS trigger LANGUAGE plpgsql AS '
        "$$ BEGIN RAISE EXCEPTION 'deletes are refused here'; END $$"
    )
    raw.execute(f'CREATE TRIGGER refuse BEFORE DELETE ON "{schema}"."orders" EXECUTE FUNCTION "{schema}".refuse()')
    pool = open_pool(pg_uri, max_size=2)
    await pool.open()

    async def handler(message, connection):
        raise AssertionError("no receive succeeds")

    pump = MessagePump(
        pool, queue, handler, transaction_mode="none", error_queue=QueueAddress("error", schema), peek_interval=0.05
    )
    with caplog.at_level(logging.WARNING, logger="airflow_provider_sqlqueue.pump"):
        task = asyncio.create_task(pump.run())
        await asyncio.sleep(4)
        pump.stop()
        await asyncio.wait_for(task, 60)
    await pool.close()
    attempts = [r.getMessage() for r in caplog.records if "database error" in r.getMessage()]
    assert len(attempts) >= 2 and "attempt 1 failed" not in attempts[-1], attempts
    assert client.depth(queue) == 1  # nothing lost
