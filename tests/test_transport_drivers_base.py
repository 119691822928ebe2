"""Unit behaviour of :mod:`airflow_provider_sqlqueue.transport.drivers.base`: running the one API without an event loop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from airflow_provider_sqlqueue.transport.drivers import blocking_context, finish


def test_finish_returns_what_a_coroutine_that_never_suspends_returns() -> None:
    async def add(a: int, b: int) -> int:
        return a + b

    assert finish(add(2, 3)) == 5


def test_finish_refuses_a_coroutine_that_suspends() -> None:
    async def waits() -> None:
        await asyncio.sleep(0)

    with pytest.raises(RuntimeError, match="asyncio session"):
        finish(waits())


def test_blocking_context_enters_and_leaves_in_the_callers_thread() -> None:
    seen: list[str] = []

    @asynccontextmanager
    async def block() -> AsyncIterator[str]:
        seen.append("enter")
        try:
            yield "inside"
        except ValueError:
            seen.append("rolled back")
            raise
        seen.append("committed")

    with blocking_context(block()) as value:
        assert value == "inside"
    with pytest.raises(ValueError, match="boom"), blocking_context(block()):
        raise ValueError("boom")
    assert seen == ["enter", "committed", "enter", "rolled back"]
