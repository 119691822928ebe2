"""A consumer process killed with SIGKILL between receive and settle: what each mode promises, counted."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time

import pytest

from airflow_provider_sqlqueue.transport import Message, QueueAddress, QueueClient

pytestmark = pytest.mark.every_dialect


def hold(uri: str, schema: str, mode: str, holding: multiprocessing.synchronize.Event) -> None:
    """Take one message and stop dead inside the 'handler' until killed."""
    queue = QueueAddress("orders", schema)
    with QueueClient.connect(uri, error_queue=QueueAddress("error", schema)) as client:
        if mode == "native":
            with client.receive_native(queue) as message:
                assert message is not None
                holding.set()
                time.sleep(600)
        elif mode == "claim":
            assert client.claim(queue, lease=1.0)
            holding.set()
            time.sleep(600)
        else:
            assert client.receive(queue)
            holding.set()
            time.sleep(600)


def kill_holder(uri: str, schema: str, mode: str) -> None:
    ctx = multiprocessing.get_context("spawn")
    holding = ctx.Event()
    process = ctx.Process(target=hold, args=(uri, schema, mode, holding))
    process.start()
    assert holding.wait(60), "the consumer never took the message"
    os.kill(process.pid, signal.SIGKILL)
    process.join(30)
    assert process.exitcode == -signal.SIGKILL


class _NotYet(Exception):
    """A receive that found fewer messages than wanted, rolled back."""


def _all_or_none(client: QueueClient, queue: QueueAddress, wanted: int) -> list:
    try:
        with client.transaction():
            got = client.receive(queue, wanted + 3)
            if len(got) < wanted:
                raise _NotYet
            return got
    except _NotYet:
        return []


def wait_for(receive, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = receive()
        if got:
            return got
        time.sleep(0.1)
    return []


def test_native_mode_kill_rolls_back_and_the_message_is_delivered_once(backend, client, queue):
    sent = Message("important")
    client.send(queue, [sent, Message("next")])
    kill_holder(backend.uri, queue.schema, "native")
    # The dead backend's transaction is rolled back by the server: the row is back, in order. Until
    # the server has seen the client die, its row is still locked and a receive would take only
    # "next": such a receive is rolled back and tried again.
    got = wait_for(lambda: _all_or_none(client, queue, 2))
    assert [m.id for m in got][:1] == [sent.id]
    assert [m.text for m in got] == ["important", "next"]
    assert client.depth(queue) == 0


def test_claim_mode_kill_redelivers_after_the_lease(backend, client, queue):
    sent = Message("leased")
    client.send(queue, sent)
    kill_holder(backend.uri, queue.schema, "claim")
    assert client.claim(queue) == []  # still leased to the dead consumer
    assert client.in_flight(queue) == 1
    [again] = wait_for(lambda: client.claim(queue))
    assert (again.id, again.deliveries) == (sent.id, 2)
    assert client.ack(queue, again.claim_token)
    assert client.depth(queue) == 0 and client.in_flight(queue) == 0


def test_none_mode_kill_loses_exactly_the_message_in_the_handler(backend, client, queue):
    client.send(queue, [Message("in the handler"), Message("untouched")])
    kill_holder(backend.uri, queue.schema, "none")
    survivors = [m.text for m in client.receive(queue, 10)]
    assert survivors == ["untouched"]  # at-most-once: the one being handled is gone, nothing else


@pytest.mark.parametrize("mode", ["native", "claim"])
@pytest.mark.postgres_only
def test_killed_consumer_leaves_no_session_idle_in_transaction(backend, client, queue, raw, mode):
    client.send(queue, Message("m"))
    kill_holder(backend.uri, queue.schema, mode)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        stuck = raw.execute(  # the killed consumer's sessions: their last statement named the test's schema
            "SELECT count(*) FROM pg_stat_activity WHERE state LIKE 'idle in transaction%%' "
            "AND datname = current_database() AND strpos(query, %s) > 0",
            (queue.schema,),
        ).fetchone()[0]
        if stuck == 0:
            break
        time.sleep(0.1)
    assert stuck == 0
