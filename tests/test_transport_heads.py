"""Unit behaviour of :mod:`airflow_provider_sqlqueue.transport.heads`: receives that skip the rows consumers already took.

The schedule of looking back is checked on a clock the test moves; on a real PostgreSQL, with the
xmin horizon pinned so that vacuum can remove nothing, a receive's scan is counted in buffers.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from airflow_provider_sqlqueue.transport import Message, QueueAddress, QueueClient, defaults, heads
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
    head.ended(committed=True, outermost=True)
    head.seen(4)  # a peek found a row that a rollback elsewhere put back
    assert head.start() == 3
    head.taken([20, 21])
    head.ended(committed=False, outermost=False)  # a savepoint rolled back: 20 and 21 are waiting again
    assert head.start() == 19
    head.taken([30])
    head.ended(committed=True, outermost=True)
    head.ended(committed=False, outermost=True)  # nothing taken since the commit: the mark stays
    assert head.start() == 30


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
