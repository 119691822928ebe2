"""Unit behaviour of :mod:`airflow_provider_sqlqueue.transport.health`, on a real PostgreSQL.

Each problem is made for real -- a session that pins the xmin horizon, delayed messages due long
ago that no mover moved, claims whose lease ran out, dead rows, a failed message -- and must show
in ``QueueClient.health`` with the figures the tables hold; a healthy queue shows none.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from airflow_provider_sqlqueue.transport import AsyncQueueClient, Message, QueueAddress, QueueClient, defaults
from airflow_provider_sqlqueue.transport.health import Problem, horizon_problem, problems, queue_problems
from airflow_provider_sqlqueue.transport.operations import Holder, Horizon, QueueStats

pytestmark = pytest.mark.postgres_only


@pytest.fixture
def pin(pg_uri: str) -> Iterator[psycopg.Connection[Any]]:
    """A session idle in a REPEATABLE READ transaction: what a forgotten report or pg_dump does to the horizon."""
    with psycopg.connect(pg_uri) as session:
        session.execute("SET application_name = 'nightly-report'")
        session.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        session.execute("SELECT count(*) FROM pg_class")  # takes the snapshot
        yield session
        session.rollback()


def concerns(found: list[Problem], queue: QueueAddress | None) -> set[str]:
    return {p.concern for p in found if p.queue == queue}


def test_a_healthy_queue_has_no_problem(client: QueueClient, queue: QueueAddress) -> None:
    client.send(queue, [Message(f"m{n}") for n in range(3)])
    health = client.health(queue)
    [stats] = health.queues
    assert (stats.waiting, stats.in_flight, stats.lapsed, stats.due_delayed, stats.overdue) == (3, 0, 0, 0, None)
    assert concerns(health.problems, queue) == set()
    assert health.checked_at.tzinfo is not None


def mine(horizon: Horizon | None, application: str) -> Holder:
    """The test's own holder among the oldest (another program may hold the horizon longer)."""
    assert horizon is not None
    [holder] = [h for h in horizon.holders if h.application == application]
    return holder


def test_the_session_pinning_the_horizon_is_named(client: QueueClient, queue: QueueAddress, pin: Any) -> None:
    pid = pin.info.backend_pid
    horizon = client.horizon()
    assert horizon is not None and horizon.complete  # the test's role is a superuser: every session is seen
    holder = mine(horizon, "nightly-report")
    assert (holder.holder, holder.state) == (f"pid {pid}", "idle in transaction")
    assert holder.since is not None and holder.xid_age is not None
    ages = [h.xid_age for h in horizon.holders]
    assert ages == sorted(ages, reverse=True) and len(ages) <= defaults.HORIZON_HOLDERS  # the oldest first
    now = datetime.now(UTC)
    held = holder.held_for(now)
    assert held is not None and held < timedelta(hours=1)
    # Held past the warning, the oldest holder is a problem, named with what to do.
    alone = Horizon((holder,), True)
    assert horizon_problem(alone, holder.since + defaults.HORIZON_WARNING - timedelta(seconds=1)) is None
    later = horizon_problem(alone, holder.since + defaults.HORIZON_WARNING + timedelta(seconds=1))
    assert later is not None and later.queue is None
    assert (
        f"pid {pid}" in later.message and "nightly-report" in later.message and "pg_terminate_backend" in later.message
    )


def test_nothing_holds_the_horizon_once_the_transaction_ends(client: QueueClient, pg_uri: str) -> None:
    with psycopg.connect(pg_uri) as session:
        session.execute("SET application_name = 'short-lived'")
        session.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        session.execute("SELECT 1")
        assert mine(client.horizon(), "short-lived").state == "idle in transaction"
        session.rollback()
        horizon = client.horizon()
        assert horizon is not None and "short-lived" not in [h.application for h in horizon.holders]


def test_a_prepared_transaction_holding_the_horizon_is_named(client: QueueClient, pg_uri: str, raw: Any) -> None:
    if int(raw.execute("SHOW max_prepared_transactions").fetchone()[0]) == 0:
        pytest.skip("the server allows no prepared transactions (max_prepared_transactions = 0)")
    with psycopg.connect(pg_uri) as session:
        session.execute("BEGIN")
        session.execute("SELECT txid_current()")
        session.execute("PREPARE TRANSACTION 'forgotten-2pc'")
        try:
            holder = mine(client.horizon(), "prepared transaction")
            assert (holder.holder, holder.state) == ("forgotten-2pc", "prepared")
        finally:
            session.execute("ROLLBACK PREPARED 'forgotten-2pc'")


def test_delayed_messages_no_mover_moved_are_a_problem(client: QueueClient, queue: QueueAddress, raw: Any) -> None:
    client.send(queue, [Message(f"later {n}") for n in range(4)], delay=timedelta(milliseconds=1))
    client.send(queue, Message("not yet"), delay=timedelta(hours=1))
    delayed = queue.delayed()
    raw.execute(
        f"UPDATE \"{delayed.schema}\".\"{delayed.table}\" SET Due = Due - interval '2 minutes' WHERE Due < now() + interval '1 minute'"
    )
    health = client.health(queue)
    [stats] = health.queues
    assert stats.due_delayed == 4 and stats.overdue is not None and stats.overdue >= timedelta(minutes=2)
    assert "overdue" in concerns(health.problems, queue)
    [message] = [p.message for p in health.problems if p.concern == "overdue"]
    assert "4 delayed message(s) due for 2 min" in message
    assert client.move_due(queue) == 4
    [moved] = client.health(queue).queues
    assert (moved.due_delayed, moved.overdue) == (0, None)  # the one due in an hour is not due


def test_a_queue_without_a_delayed_table_reports_none(client: QueueClient, schema: str) -> None:
    plain = QueueAddress("plain", schema)
    client.create_queue(plain, delayed=False)
    [stats] = client.health(plain).queues
    assert stats.due_delayed is None and stats.overdue is None


def test_lapsed_claims_and_failures_are_problems(client: QueueClient, queue: QueueAddress, schema: str) -> None:
    client.send(queue, [Message(f"m{n}") for n in range(3)])
    [failing] = client.claim(queue, 1)
    client.fail(queue, failing, ValueError("no price"))
    client.claim(queue, 2, lease=timedelta(milliseconds=1))
    time.sleep(0.05)
    error = QueueAddress("error", schema)
    health = client.health([queue, error])
    assert concerns(health.problems, queue) == {"lapsed"}
    assert concerns(health.problems, error) == {"failed"}
    assert [s.lapsed for s in health.queues if s.queue == queue] == [2]


def test_dead_rows_left_by_receives_are_counted(
    client: QueueClient, queue: QueueAddress, monkeypatch: pytest.MonkeyPatch
) -> None:
    client.send(queue, [Message(f"m{n}") for n in range(40)])
    for _ in range(4):
        client.receive(queue, 10)
    deadline = time.monotonic() + 30  # the receiving session reports its statistics within a second
    while (client.health(queue).queues[0].dead_rows or 0) < 40 and time.monotonic() < deadline:
        time.sleep(0.2)
    [stats] = client.health(queue).queues
    assert stats.dead_rows is not None and stats.dead_rows >= 40
    monkeypatch.setattr(defaults, "DEAD_ROWS_WARNING", 40)
    assert "dead_rows" in concerns(client.health(queue).problems, queue)


def test_the_asyncio_client_reports_the_same(pg_uri: str, queue: QueueAddress, pin: Any) -> None:
    import asyncio

    async def look() -> tuple[list[QueueStats], Horizon | None]:
        async with await AsyncQueueClient.connect(pg_uri) as client:
            health = await client.health(queue)
            return health.queues, health.horizon

    stats, horizon = asyncio.run(look())
    assert stats[0].queue == queue and mine(horizon, "nightly-report").state == "idle in transaction"


def test_findings_come_database_first_then_in_the_order_of_the_queues() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    one, two = QueueAddress("one", "s"), QueueAddress("two", "s")
    held = Horizon((Holder("pid 7", "report", "idle in transaction", now - timedelta(hours=3), 12),), True)
    stats = [
        QueueStats(one, 0, None, 0, 0, 1),
        QueueStats(two, 5, None, 0, 0, 0, due_delayed=3, overdue=timedelta(minutes=5)),
    ]
    found = problems(stats, held, set(), now, named)
    assert [(p.concern, p.queue) for p in found] == [("horizon", None), ("lapsed", one), ("overdue", two)]
    assert "for 3 h" in found[0].message
    # A slot has no start: judged by the transactions it holds back.
    slot = Holder("standby_1", "replication slot", "replication slot", None, defaults.HORIZON_WARNING_XIDS)
    assert horizon_problem(Horizon((slot,), True), now) is not None
    young = Holder("standby_1", "replication slot", "replication slot", None, 10)
    assert horizon_problem(Horizon((young,), True), now) is None
    assert horizon_problem(Horizon((), False), now) is None
    assert queue_problems(QueueStats(one, 9, None, 0, None, None), is_error_queue=False, named=named) == []


def named(queue: QueueAddress) -> str:
    """An address as the commands take it (what a client's canonical_address gives)."""
    return f'{queue.table}@"{queue.schema}"'


def test_each_problem_that_can_be_set_right_names_its_command_and_the_pages_action() -> None:
    """A finding says what to run, the queue written so the command can be pasted, and what to press."""
    queue, error = QueueAddress("orders", "shop"), QueueAddress("error", "shop")
    stats = [
        QueueStats(queue, 0, None, 0, 0, 2, due_delayed=1, overdue=timedelta(minutes=5), last_vacuum=None),
        QueueStats(error, 3, None, 0, None, None),
    ]
    found = {p.concern: p.message for p in problems(stats, None, {error}, datetime.now(UTC), named)}
    assert "`sqlqueue release-lapsed 'orders@\"shop\"'`" in found["lapsed"] and "Give back" in found["lapsed"]
    assert "`sqlqueue move-due 'orders@\"shop\"'`" in found["overdue"] and "Move due" in found["overdue"]
    assert "`sqlqueue errors --error-queue 'error@\"shop\"'`" in found["failed"]
    assert "`sqlqueue retry --error-queue 'error@\"shop\"'`" in found["failed"] and "Retry" in found["failed"]


def test_a_role_without_pg_read_all_stats_is_told_what_it_cannot_see(pg_uri: str, raw: Any, pin: Any) -> None:
    import uuid

    from psycopg import sql
    from psycopg.conninfo import make_conninfo

    role = f"health_nobody_{uuid.uuid4().hex[:8]}"
    raw.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    try:
        with QueueClient.connect(make_conninfo(pg_uri, user=role)) as client:
            horizon = client.horizon()
        # The pinning session is another role's: its snapshot's age shows, not its state or start, and
        # the answer says the view is partial; judged by its age in transactions, as a slot is.
        assert horizon is not None and not horizon.complete
        holder = mine(horizon, "nightly-report")
        assert holder.since is None and holder.xid_age is not None
    finally:
        raw.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_a_session_idle_after_a_write_holds_the_horizon_and_other_databases_do_not(
    client: QueueClient, pg_uri: str
) -> None:
    from psycopg.conninfo import make_conninfo

    with psycopg.connect(pg_uri) as writer, psycopg.connect(make_conninfo(pg_uri, dbname="postgres")) as elsewhere:
        writer.execute("SET application_name = 'wrote-then-idle'")
        writer.execute("SELECT txid_current()")  # a transaction id of its own, no snapshot once the statement ends
        elsewhere.execute("SET application_name = 'another-database'")
        elsewhere.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        elsewhere.execute("SELECT 1")  # a snapshot, but of another database: vacuum here does not wait for it
        horizon = client.horizon()
        assert mine(horizon, "wrote-then-idle").state == "idle in transaction"
        assert "another-database" not in [h.application for h in horizon.holders]  # type: ignore[union-attr]
        writer.rollback()
        elsewhere.rollback()


def test_a_survey_reports_a_queue_it_cannot_measure_and_measures_the_rest(
    client: QueueClient, queue: QueueAddress, schema: str, raw: Any
) -> None:
    from airflow_provider_sqlqueue.transport import NotAQueueError, SqlQueueError

    broken = QueueAddress("broken", schema)
    client.create_queue(broken)
    raw.execute(f'DROP TABLE "{schema}"."broken.Delayed"')
    raw.execute(f'CREATE TABLE "{schema}"."broken.Delayed" (Headers text, Body bytea, Due text)')
    raw.execute(f"INSERT INTO \"{schema}\".\"broken.Delayed\" VALUES ('{{}}', '', 'soon')")
    with pytest.raises(SqlQueueError):  # named on its own, it is the caller's error
        client.health(broken)
    client.send(queue, Message("fine"))
    health = client.health([broken, queue], report_unreadable=True)
    assert [s.queue for s in health.queues] == [queue] and health.queues[0].waiting == 1
    [problem] = [p for p in health.problems if p.queue == broken]
    assert problem.concern == "unreadable" and problem.message.startswith("cannot be measured: ")
    gone = QueueAddress("gone", schema)
    client.create_queue(gone)
    client.drop_queue(gone)  # dropped between a listing and its measuring
    assert [p.concern for p in client.health([gone], report_unreadable=True).problems] == ["unreadable"]
    store = QueueAddress("sqlqueue_inflight", schema)  # the claim store named as a queue
    with pytest.raises(NotAQueueError):
        client.health(store)
    assert [p.concern for p in client.health(store, report_unreadable=True).problems] == ["unreadable"]


def test_a_role_that_may_only_read_can_watch_and_hides_nothing_from_receivers(
    pg_uri: str, client: QueueClient, queue: QueueAddress, schema: str, raw: Any
) -> None:
    import uuid

    from psycopg import sql
    from psycopg.conninfo import make_conninfo

    role = f"health_watcher_{uuid.uuid4().hex[:8]}"
    raw.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    raw.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(sql.Identifier(schema), sql.Identifier(role)))
    raw.execute(
        sql.SQL("GRANT SELECT ON ALL TABLES IN SCHEMA {} TO {}").format(sql.Identifier(schema), sql.Identifier(role))
    )
    client.send(queue, [Message("one"), Message("two")])
    try:
        with QueueClient.connect(make_conninfo(pg_uri, user=role)) as watcher, watcher.transaction():
            [stats] = watcher.health(queue).queues
            assert (stats.waiting, stats.in_flight, stats.due_delayed) == (2, 0, 0)
            assert len(client.receive(queue, 2)) == 2  # the watcher's open transaction locks no message
    finally:
        raw.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        raw.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_a_table_locked_by_a_migration_is_waited_for_boundedly(
    client: QueueClient, queue: QueueAddress, schema: str, pg_uri: str
) -> None:
    from airflow_provider_sqlqueue.transport import LockTimeoutError

    other = QueueAddress("other", schema)
    client.create_queue(other)
    with psycopg.connect(pg_uri) as migration:
        migration.execute(f'LOCK TABLE "{schema}"."orders" IN ACCESS EXCLUSIVE MODE')  # as VACUUM FULL or ALTER would
        began = time.monotonic()
        with pytest.raises(LockTimeoutError, match="locked by another session"):
            client.health(queue)
        health = client.health([queue, other], report_unreadable=True)
        waited = time.monotonic() - began
        migration.rollback()
    assert [s.queue for s in health.queues] == [other]  # the other queue is measured
    assert [(p.queue, p.concern) for p in health.problems if p.queue is not None] == [(queue, "unreadable")]
    assert waited < 600  # bounded (5 s each), where it used to wait for the lock however long it was held
    assert client.health(queue).queues[0].queue == queue  # the same client works on once the lock is gone


def test_a_survey_waits_for_one_lock_not_one_per_queue(client: QueueClient, schema: str, pg_uri: str) -> None:
    queues = [QueueAddress(f"q{n}", schema) for n in range(20)]
    for queue in queues:
        client.create_queue(queue, delayed=False)
    with psycopg.connect(pg_uri) as migration:
        migration.execute(f'LOCK TABLE "{schema}"."sqlqueue_inflight" IN ACCESS EXCLUSIVE MODE')  # every queue's claims
        began = time.monotonic()
        health = client.health(queues, report_unreadable=True)
        waited = time.monotonic() - began
        migration.rollback()
    assert [p.concern for p in health.problems if p.queue is not None] == ["unreadable"] * 20
    assert all("locked by another session" in p.message and "\n" not in p.message for p in health.problems)
    # One 5 s wait, then 50 ms each: far below the 100 s that twenty full waits took (a bound load cannot reach).
    assert waited < 60


def test_lock_wait_sets_how_long_the_figures_wait_for_a_locked_table(
    client: QueueClient, queue: QueueAddress, schema: str, pg_uri: str
) -> None:
    from airflow_provider_sqlqueue.transport import LockTimeoutError

    client.send(queue, Message("one"))
    with psycopg.connect(pg_uri) as migration:
        migration.execute(f'LOCK TABLE "{schema}"."orders" IN ACCESS EXCLUSIVE MODE')
        with pytest.raises(LockTimeoutError, match="locked by another session"):
            client.queue_stats(queue, lock_wait=timedelta(milliseconds=200))
        # Longer than the default wait: the lock goes 7 s in (after the default 5 s would have given
        # up) and the figures come, because the call was told to wait up to a minute.
        release = threading.Timer(7, migration.rollback)
        release.start()
        try:
            [stats] = client.queue_stats(queue, lock_wait=60)
            health = client.health(queue, lock_wait=timedelta(minutes=1))
        finally:
            release.join()
    assert stats.waiting == 1 and [s.queue for s in health.queues] == [queue]


@pytest.mark.parametrize("lock_wait", [0, -1, float("nan"), timedelta(days=30), "5", True])
def test_lock_wait_is_a_duration_either_database_can_hold(client: QueueClient, queue: QueueAddress, lock_wait) -> None:
    from airflow_provider_sqlqueue.transport import SqlQueueError

    with pytest.raises(SqlQueueError, match="lock_wait"):
        client.queue_stats(queue, lock_wait=lock_wait)
    with pytest.raises(SqlQueueError, match="lock_wait"):
        client.health(queue, lock_wait=lock_wait)


def test_figures_read_in_the_callers_transaction_leave_its_lock_waits_as_they_were(
    client: QueueClient, queue: QueueAddress, schema: str, pg_uri: str
) -> None:
    error = QueueAddress("error", schema)
    with psycopg.connect(pg_uri) as other:
        other.execute(f'LOCK TABLE "{schema}"."error" IN ACCESS EXCLUSIVE MODE')
        release = threading.Timer(3, other.rollback)
        release.start()
        try:
            with client.transaction():
                client.queue_stats(queue, lock_wait=0.05)  # its own bound, for its own statements only
                client.send(error, Message("waits for the lock, as the caller's transaction would"))
        finally:
            release.join()
    assert client.depth(error) == 1


def test_a_locked_claim_store_is_named_as_the_table_locked(
    client: QueueClient, queue: QueueAddress, schema: str, pg_uri: str
) -> None:
    from airflow_provider_sqlqueue.transport import LockTimeoutError

    with psycopg.connect(pg_uri) as migration:
        migration.execute(f'LOCK TABLE "{schema}"."sqlqueue_inflight" IN ACCESS EXCLUSIVE MODE')
        with pytest.raises(LockTimeoutError, match=f'^"{schema}"."sqlqueue_inflight" is locked'):
            client.queue_stats(queue, lock_wait=0.2)


def test_a_name_that_forges_log_lines_is_logged_escaped(
    client: QueueClient, schema: str, raw: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Whoever may create a table names it: a newline and a forged line, a terminal escape, a
    right-to-left override reach the log (and a check reading ``2>&1``) as escapes, on one line."""
    import logging

    forged = QueueAddress("x\nPROBLEM none: all good\x1b[2K\u202e", schema)
    client.create_queue(forged)
    raw.execute(f'DROP TABLE "{schema}".sqlqueue_inflight')  # its claim store broken: it cannot be measured
    raw.execute(f'CREATE TABLE "{schema}".sqlqueue_inflight (x int)')
    with caplog.at_level(logging.WARNING):
        found = client.health([forged], report_unreadable=True)
    assert concerns(found.problems, forged) == {"unreadable"}
    [line] = [logging.Formatter("%(message)s").format(r) for r in caplog.records if "Leaving" in r.getMessage()]
    assert "\n" not in line and "\x1b" not in line and "\u202e" not in line
    assert "x\\nPROBLEM none: all good\\x1b[2K\\u202e" in line


def test_a_queue_named_alone_is_looked_at_with_its_error_queue(
    client: QueueClient, queue: QueueAddress, schema: str, pg_uri: str, raw: Any
) -> None:
    """A check of one queue (``sqlqueue health orders``) also finds the failed messages waiting in its
    error queue; one it cannot look at (not created yet, locked) leaves the queue's check as it was."""
    client.send(queue, Message("m"))
    [failing] = client.claim(queue, 1)
    client.fail(queue, failing, ValueError("no price"))
    error = QueueAddress("error", schema)
    health = client.health([queue])
    assert [s.queue for s in health.queues] == [queue]
    assert concerns(health.problems, error) == {"failed"}
    assert concerns(client.health([queue, error]).problems, error) == {"failed"}  # looked at once
    with QueueClient.connect(pg_uri, error_queue="not_made_yet") as elsewhere:
        assert elsewhere.health([queue]).problems == []
    with psycopg.connect(pg_uri) as holder:
        holder.execute(f'LOCK TABLE "{schema}"."error" IN ACCESS EXCLUSIVE MODE')
        assert client.health([queue], lock_wait=0.2).problems == []


def test_a_survey_by_a_role_that_can_read_no_queue_says_so_and_what_it_lacks(
    pg_uri: str, raw: Any, queue: QueueAddress, schema: str
) -> None:
    import uuid

    from psycopg import sql
    from psycopg.conninfo import make_conninfo

    role = f"health_blind_{uuid.uuid4().hex[:8]}"
    raw.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    try:
        with QueueClient.connect(make_conninfo(pg_uri, user=role)) as client:
            health = client.health()  # every queue it may read: none
            assert client.queues() == [] and health.queues == []
            [problem] = [p for p in health.problems if p.concern == "unreadable"]
            assert problem.queue is None
            assert "could read no queue" in problem.message and "lacks SELECT" in problem.message
            assert "USAGE on the schemas of" in problem.message  # the test's schema is not its to use
            assert "sqlqueue grants" in problem.message
            raw.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(sql.Identifier(schema), sql.Identifier(role)))
            raw.execute(
                sql.SQL("GRANT SELECT ON ALL TABLES IN SCHEMA {} TO {}").format(
                    sql.Identifier(schema), sql.Identifier(role)
                )
            )
            readable = client.health()  # reading some, it surveys them, and no such problem is made up
            assert queue in [s.queue for s in readable.queues]
            assert not [p for p in readable.problems if p.queue is None and p.concern == "unreadable"]
    finally:
        raw.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        raw.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


async def test_the_asyncio_survey_by_a_role_that_can_read_no_queue_says_so(pg_uri: str, raw: Any, queue) -> None:
    import uuid

    from psycopg import sql
    from psycopg.conninfo import make_conninfo

    role = f"health_blind_{uuid.uuid4().hex[:8]}"
    raw.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    try:
        async with await AsyncQueueClient.connect(make_conninfo(pg_uri, user=role)) as client:
            health = await client.health()
        assert [p.concern for p in health.problems if p.queue is None and "could read no queue" in p.message] == [
            "unreadable"
        ]
    finally:
        raw.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
