"""The message pump's checks: its settings, and what a handler raised."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from airflow_provider_sqlqueue.transport.pump_checks import check_peek_interval, handler_failure, parse_timespan


def test_peek_interval_warnings():
    assert check_peek_interval(1.0) == []
    assert "below 0.1s" in check_peek_interval(0.05)[0]
    assert "above 10.0s" in check_peek_interval(11)[0]
    assert "time-to-be-received" in check_peek_interval(5, timedelta(seconds=2))[0]


def test_parse_timespan():
    assert parse_timespan("00:05:00") == timedelta(minutes=5)
    assert parse_timespan("1.02:03:04.5000000") == timedelta(days=1, hours=2, minutes=3, seconds=4, milliseconds=500)
    assert parse_timespan("garbage") is None


async def test_what_a_handler_raised_fails_the_delivery_unless_it_stops_the_process() -> None:
    handler_failure(ValueError("bad message"))  # the message's failure: returns
    handler_failure(asyncio.CancelledError())  # a wait of the handler's own was cancelled, not this task
    for stop in (KeyboardInterrupt(), SystemExit(1), GeneratorExit()):
        with pytest.raises(type(stop)):
            handler_failure(stop)
    raised: list[BaseException] = []

    async def being_cancelled() -> None:
        task = asyncio.current_task()
        assert task is not None
        task.cancel()  # the pump's own task is being cancelled: its handler's CancelledError stops it
        try:
            handler_failure(asyncio.CancelledError())
        except asyncio.CancelledError as exc:
            raised.append(exc)
            raise

    with pytest.raises(asyncio.CancelledError):
        await asyncio.create_task(being_cancelled())
    assert len(raised) == 1
