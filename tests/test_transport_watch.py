"""Unit behaviour of :mod:`airflow_provider_sqlqueue.transport.watch`: one poller per database peeks for every waiter."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from airflow_provider_sqlqueue.transport import AsyncQueueClient, Message, QueueAddress, QueueClient
from airflow_provider_sqlqueue.transport.errors import QueueNotFoundError
from airflow_provider_sqlqueue.transport.watch import IDLE_GRACE_SECONDS, LENT_CLIENTS, Poller, shared_poller


async def test_waiters_on_several_queues_share_one_poller_and_wake_when_theirs_fills(
    pg_uri: str, client: QueueClient, queue: QueueAddress, schema: str
) -> None:
    other = QueueAddress("invoices", schema)
    client.create_queue(other)
    opened: list[AsyncQueueClient] = []

    async def open_client() -> AsyncQueueClient:
        opened.append(await AsyncQueueClient.connect(pg_uri))
        return opened[-1]

    poller = shared_poller(("watch-test", pg_uri), lambda: Poller(open_client, interval=0.05, listen=False))
    assert shared_poller(("watch-test", pg_uri), lambda: Poller(open_client, interval=9, listen=False)) is poller
    first = asyncio.create_task(poller.wait(str(queue), include_claims=False))
    second = asyncio.create_task(poller.wait(str(other), include_claims=False))
    await asyncio.sleep(0.3)
    assert not first.done() and not second.done()
    await asyncio.to_thread(client.send, other, Message("for the second waiter"))
    await asyncio.wait_for(second, 10)
    assert not first.done() and len(opened) == 1  # one connection peeks every queue
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first


async def test_a_waiter_on_a_missing_queue_gets_the_error(pg_uri: str, schema: str) -> None:
    async def open_client() -> AsyncQueueClient:
        return await AsyncQueueClient.connect(pg_uri)

    poller = Poller(open_client, interval=0.05, listen=False)
    with pytest.raises(QueueNotFoundError):
        await asyncio.wait_for(poller.wait(f'nowhere@"{schema}"', include_claims=False), 10)


async def test_woken_waiters_receive_on_clients_the_poller_lends_and_keeps(
    pg_uri: str, client: QueueClient, queue: QueueAddress
) -> None:
    """A woken sensor receives at once on a kept connection instead of opening one; a client an
    error left behind is closed, never lent again; the poller closes what it kept when it stops."""
    opened: list[AsyncQueueClient] = []

    async def open_client() -> AsyncQueueClient:
        opened.append(await AsyncQueueClient.connect(pg_uri))
        return opened[-1]

    poller = Poller(open_client, interval=0.05, listen=False)
    received: list[str] = []
    for n in range(3):
        await asyncio.to_thread(client.send, queue, Message(f"m{n}"))
        await asyncio.wait_for(poller.wait(str(queue), include_claims=False), 10)
        async with poller.client() as lent:
            received += [m.text for m in await lent.receive(queue, 10)]
    assert received == ["m0", "m1", "m2"]
    assert len(opened) == 2  # the poller's own connection and one lent three times
    failed = opened[1]
    borrowed: list[AsyncQueueClient] = []

    async def receive_from_nowhere() -> None:
        async with poller.client() as lent:
            borrowed.append(lent)
            await lent.receive(f"nowhere@{queue.schema}", 1)

    with pytest.raises(QueueNotFoundError):
        await receive_from_nowhere()
    assert borrowed == [failed] and failed.session.closed
    async with poller.client() as lent:
        assert lent is not failed
        kept = lent
    task = poller._task  # the poller's loop: it ends when no one has waited for a while
    assert task is not None
    await asyncio.wait_for(task, IDLE_GRACE_SECONDS + 10)
    assert kept.session.closed and opened[0].session.closed


def _terminate(pg_uri: str, pid: int) -> None:
    with psycopg.connect(pg_uri, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))


def _backend_pid(client: AsyncQueueClient) -> int:
    return int(client.session.connection.info.backend_pid)


async def test_a_waiter_is_woken_after_the_pollers_listening_connection_was_cut(
    pg_uri: str, client: QueueClient, queue: QueueAddress
) -> None:
    """The poller's connection killed while it listens: the poller reconnects and the waiter it had
    is still woken by the next send, not left waiting on a loop that ended."""
    opened: list[AsyncQueueClient] = []

    async def open_client() -> AsyncQueueClient:
        opened.append(await AsyncQueueClient.connect(pg_uri))
        return opened[-1]

    poller = Poller(open_client, interval=30, listen=True)  # only a notification can wake it in time
    waiting = asyncio.create_task(poller.wait(str(queue), include_claims=False))
    while not opened:
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)  # listening
    await asyncio.to_thread(_terminate, pg_uri, _backend_pid(opened[0]))
    await asyncio.sleep(2.5)  # the poller's back-off after the cut (1 s at a 30 s interval's base)
    await asyncio.to_thread(client.send, queue, Message("after the cut"), notify=True)
    await asyncio.wait_for(waiting, 20)
    assert len(opened) == 2


async def test_a_burst_of_woken_waiters_takes_turns_on_the_lent_clients(
    pg_uri: str, client: QueueClient, queue: QueueAddress
) -> None:
    """Thirty woken waiters receive on at most LENT_CLIENTS connections; a kept client the server
    cut while it waited is replaced before it is lent, so the borrower never sees the cut."""
    opened: list[AsyncQueueClient] = []

    async def open_client() -> AsyncQueueClient:
        opened.append(await AsyncQueueClient.connect(pg_uri))
        return opened[-1]

    poller = Poller(open_client, interval=0.05, listen=False)
    lent_at_once = 0
    lent = 0

    async def waiter() -> list[str]:
        nonlocal lent, lent_at_once
        await poller.wait(str(queue), include_claims=False)
        async with poller.client() as borrowed:
            lent += 1
            lent_at_once = max(lent_at_once, lent)
            received = [m.text for m in await borrowed.receive(queue, 1)]
            await asyncio.sleep(0.01)
            lent -= 1
        return received

    waiters = [asyncio.create_task(waiter()) for _ in range(30)]
    await asyncio.sleep(0.3)
    await asyncio.to_thread(client.send, queue, [Message(f"m{n}") for n in range(30)])
    received = [text for got in await asyncio.wait_for(asyncio.gather(*waiters), 60) for text in got]
    assert sorted(received) == sorted(f"m{n}" for n in range(30))  # each once
    assert lent_at_once == LENT_CLIENTS
    assert len(opened) <= 1 + LENT_CLIENTS  # the poller's own and the lent ones, not one per waiter
    kept = list(poller._idle_clients)  # the clients the poller keeps for the next waiters
    assert kept
    for each in kept:
        await asyncio.to_thread(_terminate, pg_uri, _backend_pid(each))
    await asyncio.to_thread(client.send, queue, Message("after the kept ones were cut"))
    await asyncio.wait_for(poller.wait(str(queue), include_claims=False), 10)
    async with poller.client() as borrowed:
        assert borrowed not in kept
        assert [m.text for m in await borrowed.receive(queue, 1)] == ["after the kept ones were cut"]
