"""Unit behaviour of :mod:`airflow_provider_sqlqueue.transport.drivers.threads`: blocking drivers behind asyncio."""

from __future__ import annotations

import asyncio
import threading

import pytest

from airflow_provider_sqlqueue.transport import AsyncQueueClient, Message, QueueAddress
from airflow_provider_sqlqueue.transport.drivers import ThreadSession, ThreadSessionPool, finish, open_session


async def test_a_thread_session_runs_every_call_on_its_own_thread(pg_uri: str, queue: QueueAddress) -> None:
    threads: set[str] = set()

    def factory():  # type: ignore[no-untyped-def]
        threads.add(threading.current_thread().name)
        return finish(open_session(pg_uri, blocking=True))

    session = await ThreadSession.open(factory)
    async with AsyncQueueClient(session) as client:
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.001)

        ticker = asyncio.create_task(tick())
        await client.send(queue, [Message(str(i)) for i in range(200)])
        assert [m.text for m in await client.receive(queue, 200)] == [str(i) for i in range(200)]
        ticker.cancel()
    assert threads and all(name.startswith("sqlqueue-db") for name in threads)
    assert ticks > 0  # the event loop ran while the driver worked


async def test_a_thread_session_pool_hands_out_at_most_its_size(pg_uri: str) -> None:
    pool = ThreadSessionPool(lambda: finish(open_session(pg_uri, blocking=True)), max_size=2)
    await pool.open()
    try:
        held = 0
        most = 0

        async def use() -> None:
            nonlocal held, most
            async with pool.session():
                held += 1
                most = max(most, held)
                await asyncio.sleep(0.05)
                held -= 1

        await asyncio.gather(*(use() for _ in range(6)))
        assert most == 2
    finally:
        await pool.close()


async def close_inside_a_block(client: AsyncQueueClient, queue: QueueAddress) -> None:
    async with client.transaction():
        await client.send(queue, Message("inside"))
        await client.close()


async def test_a_closed_thread_session_says_closed_not_what_its_executor_says(pg_uri: str, queue: QueueAddress) -> None:
    """Calls after close(), and a block whose code closed the client, end with ClientClosedError (they
    raised the executor's RuntimeError "cannot schedule new futures after shutdown")."""
    from airflow_provider_sqlqueue.transport import ClientClosedError, QueueClient

    for attempt in ("after", "inside"):
        client = AsyncQueueClient(await ThreadSession.open(lambda: finish(open_session(pg_uri, blocking=True))))
        if attempt == "inside":
            with pytest.raises(ClientClosedError):
                await close_inside_a_block(client, queue)
        else:
            await client.close()
            with pytest.raises(ClientClosedError):
                await client.depth(queue)
        with pytest.raises(ClientClosedError):
            await client.send(queue, Message("after"))
        with pytest.raises(ClientClosedError):
            await close_inside_a_block(client, queue)
    with QueueClient.connect(pg_uri) as reader:
        assert reader.depth(queue) == 0  # the block's send went with its connection
