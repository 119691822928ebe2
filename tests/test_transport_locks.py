"""Unit behaviour of :mod:`airflow_provider_sqlqueue.transport.locks`: one client's calls take turns."""

from __future__ import annotations

import asyncio
import threading

from airflow_provider_sqlqueue.transport.locks import TaskLock, ThreadLock


async def test_a_task_lock_lets_its_holder_in_again_and_keeps_other_tasks_out() -> None:
    lock, order = TaskLock(), []

    async def other() -> None:
        async with lock:
            order.append("other")

    async with lock, lock:  # re-entered by the task that holds it
        waiting = asyncio.create_task(other())
        await asyncio.sleep(0.05)
        order.append("holder")
    await waiting
    assert order == ["holder", "other"]


async def test_a_thread_lock_lets_its_thread_in_again_and_keeps_other_threads_out() -> None:
    lock, order = ThreadLock(), []
    entered = threading.Event()

    def other() -> None:
        async def enter() -> None:
            entered.set()
            async with lock:
                order.append("other")

        asyncio.run(enter())

    async with lock, lock:  # re-entered by the thread that holds it
        thread = threading.Thread(target=other)
        thread.start()
        assert entered.wait(10)
        await asyncio.sleep(0.05)
        order.append("holder")
    thread.join(10)
    assert order == ["holder", "other"]
