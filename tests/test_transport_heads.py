"""Unit behaviour of :mod:`airflow_provider_sqlqueue.transport.heads`: receives that skip the rows consumers already took.

The schedule of looking back is checked on a clock the test moves; on a real PostgreSQL, with the
xmin horizon pinned so that vacuum can remove nothing, a receive's scan is counted in buffers.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from airflow_provider_sqlqueue.transport import AsyncPsycopgPool, Message, QueueAddress, QueueClient, defaults, heads
from airflow_provider_sqlqueue.transport.heads import Head

pytestmark = pytest.mark.postgres_only


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [1000.0]
    monkeypatch.setattr(heads.time, "monotonic", lambda: now[0])
    return now


def test_scans_start_after_the_mark_and_look_back_on_schedule(clock: list[float]) -> None:
    head = Head()
    assert head.start() == 0  # a new head scans from the start
    head.taken([5, 6, 7])
    clock[0] += 0.1
    assert head.start() == 7
    clock[0] += defaults.HEAD_RECENT_WINDOW + defaults.HEAD_RECENT_RESCAN
    head.taken([8, 9])
    assert head.start() == 7  # the mark as it was a window ago: late commits of senders
    assert head.start() == 9
    clock[0] += defaults.HEAD_FULL_RESCAN
    assert head.start() == 0  # now and then from the start: anything else left behind


def test_a_live_row_seen_below_the_mark_and_a_rollback_bring_the_mark_back(clock: list[float]) -> None:
    head = Head()
    head.start()
    head.taken([10, 11])
    head.seen(4)  # a peek found a row that a rollback elsewhere put back
    assert head.start() == 3
    clock[0] += 1
    began = clock[0]
    clock[0] += 0.1
    head.taken([20, 21])
    clock[0] += defaults.HEAD_RECENT_WINDOW + 1  # a slow handler, then its transaction rolls back
    head.rolled_back(since=began)
    assert head.start() == 19  # the look back over the last window does not jump over them
    assert head.start() == 19


def test_a_queue_made_again_under_a_session_is_found_at_the_next_scan_from_the_start(clock: list[float]) -> None:
    head = Head()
    head.start()
    head.taken([5000])  # then the queue is dropped and made again: its Seq counts from 1
    clock[0] += defaults.HEAD_FULL_RESCAN
    assert head.start() == 0
    head.taken([1, 2])
    assert head.start() == 2  # not 5000: what follows is found at once


def test_after_an_idle_spell_the_look_back_starts_from_the_mark_of_then(clock: list[float]) -> None:
    head = Head()
    head.start()
    head.taken([100])
    clock[0] += 2.5 * defaults.HEAD_RECENT_WINDOW  # idle (less than a full rescan apart)
    head.taken([101])
    clock[0] += defaults.HEAD_RECENT_RESCAN
    assert head.start() == 100  # not 0: no walk from the start every quarter second after a pause


def test_a_rolled_back_native_receive_is_received_again_at_once(client: QueueClient, queue: QueueAddress) -> None:
    client.send(queue, [Message("first"), Message("second")])
    with pytest.raises(RuntimeError), client.receive_native(queue) as message:  # noqa: PT012 - the handler sees the message, then fails
        assert message is not None and message.text == "first"
        raise RuntimeError("the handler failed: the receive rolls back")
    with client.receive_native(queue) as again:
        assert again is not None and again.text == "first"


@pytest.fixture
def pinned(pg_uri: str) -> Iterator[None]:
    """A REPEATABLE READ snapshot held open: vacuum can remove no row deleted meanwhile."""
    with psycopg.connect(pg_uri) as pin:
        pin.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        pin.execute("SELECT 1")
        yield
        pin.execute("ROLLBACK")


def head_scan_buffers(raw: Any, queue: QueueAddress, after: int) -> int:
    """Buffers the head scan of a receive reads, starting after ``after``."""
    sql = (
        f'EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT Seq FROM "{queue.schema}"."{queue.table}" '
        "WHERE Seq > %s ORDER BY Seq LIMIT 10"
    )
    plan = raw.execute(sql, [after]).fetchone()[0]
    top = (plan if isinstance(plan, list) else json.loads(plan))[0]["Plan"]
    return int(top["Shared Hit Blocks"]) + int(top.get("Shared Read Blocks", 0))


def test_with_the_horizon_pinned_a_receive_reads_what_is_live_not_what_was_consumed(
    client: QueueClient, queue: QueueAddress, raw: Any, pinned: None
) -> None:
    for _ in range(20):
        client.send(queue, [Message("x" * 200) for _ in range(250)])
        assert len(client.receive(queue, 250)) == 250
    client.send(queue, [Message("live") for _ in range(10)])
    head = client.session.dialect.head(queue)
    assert head is not None and head.mark >= 5000
    from_start, from_head = head_scan_buffers(raw, queue, 0), head_scan_buffers(raw, queue, head.mark)
    assert from_head * 20 < from_start, (from_head, from_start)  # 5,000 dead rows walked, or none
    assert [m.text for m in client.receive(queue, 10)] == ["live"] * 10


def test_a_rollback_raised_as_psycopgs_own_puts_the_messages_back_at_once(
    client: QueueClient, queue: QueueAddress
) -> None:
    client.send(queue, [Message("first"), Message("second")])
    with client.transaction():
        assert [m.text for m in client.receive(queue, 1)] == ["first"]
        raise psycopg.Rollback  # psycopg rolls back and swallows it: the block ends normally
    assert [m.text for m in client.receive(queue, 1)] == ["first"]


def test_lapsed_claims_are_counted_whole_however_often_they_are_counted(
    client: QueueClient, queue: QueueAddress
) -> None:
    client.send(queue, [Message(str(i)) for i in range(5)])
    client.claim(queue, 5, lease=0.001)
    time.sleep(0.05)
    assert [client.lapsed_claims(queue) for _ in range(3)] == [5, 5, 5]
    assert [client.peek(queue, include_claims=True) for _ in range(3)] == [5, 5, 5]


async def test_a_pools_sessions_share_its_heads(pg_uri: str) -> None:
    pool = AsyncPsycopgPool(pg_uri, max_size=2)
    try:
        async with pool.session() as one, pool.session() as other:
            assert one.dialect is pool.dialect and other.dialect is pool.dialect
    finally:
        await pool.close()
