"""Unit behaviour of :mod:`airflow_provider_sqlqueue.transport.watch`: one poller per database peeks for every waiter."""

from __future__ import annotations

import asyncio

import pytest

from airflow_provider_sqlqueue.transport import AsyncQueueClient, Message, QueueAddress, QueueClient
from airflow_provider_sqlqueue.transport.errors import QueueNotFoundError
from airflow_provider_sqlqueue.transport.watch import IDLE_GRACE_SECONDS, Poller, shared_poller


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

    async def receive_from_nowhere() -> None:
        async with poller.client() as lent:
            assert lent is failed
            await lent.receive(f"nowhere@{queue.schema}", 1)

    with pytest.raises(QueueNotFoundError):
        await receive_from_nowhere()
    assert failed.session.closed
    async with poller.client() as lent:
        assert lent is not failed
        kept = lent
    task = poller._task  # the poller's loop: it ends when no one has waited for a while
    assert task is not None
    await asyncio.wait_for(task, IDLE_GRACE_SECONDS + 10)
    assert kept.session.closed and opened[0].session.closed
