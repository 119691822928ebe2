"""Unit behaviour of :mod:`airflow_provider_sqlqueue.transport.watch`: one poller per database peeks for every waiter."""

from __future__ import annotations

import asyncio

import pytest

from airflow_provider_sqlqueue.transport import AsyncQueueClient, Message, QueueAddress, QueueClient
from airflow_provider_sqlqueue.transport.errors import QueueNotFoundError
from airflow_provider_sqlqueue.transport.watch import Poller, shared_poller


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
