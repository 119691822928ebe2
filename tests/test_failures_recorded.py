"""A failure is always recorded: whatever a handler's exception holds, whatever it swallowed.

Regression tests: an exception whose text had a lone surrogate, NUL or megabytes blocked a native
queue for good, cost a claim a whole lease and lost a message in ``none`` mode; a native handler
that caught a database error was counted as handled while PostgreSQL rolled its work back, and the
message came back hundreds of times a second without ever reaching the error queue.
"""

from __future__ import annotations

import asyncio
import os

import psycopg
import pytest

from airflow_provider_sqlqueue.transport import Message, MessagePump, QueueAddress
from airflow_provider_sqlqueue.transport.defaults import MAX_FAILURE_TEXT
from airflow_provider_sqlqueue.transport.drivers import open_pool
from airflow_provider_sqlqueue.transport.errors import TransactionAbortedError
from airflow_provider_sqlqueue.transport.message import EXCEPTION_MESSAGE, EXCEPTION_TYPE

pytestmark = pytest.mark.postgres_only


LONE = os.fsdecode(b"\xff")  # a lone surrogate, as a file name that is not UTF-8 decodes


class Hostile(Exception):
    """Text no header column can hold as it is: a lone surrogate, NUL, escape codes, 2 MB."""

    def __str__(self) -> str:
        return "bad " + LONE + " byte, NUL \x00, \x1b[31m red " + "x" * 2_000_000


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text for you")


async def pump_until(pump: MessagePump, done, timeout: float = 60.0) -> None:
    task = asyncio.create_task(pump.run())
    try:
        deadline = asyncio.get_running_loop().time() + timeout
        while not done():
            assert asyncio.get_running_loop().time() < deadline, "the pump did not get there in time"
            assert not task.done(), f"the pump stopped: {task.exception()}"
            await asyncio.sleep(0.05)
    finally:
        pump.stop()
        await asyncio.wait_for(task, 30)


@pytest.mark.parametrize("mode", ["none", "native", "claim"])
@pytest.mark.parametrize("failure", [Hostile, Unprintable], ids=["hostile-text", "unprintable"])
async def test_a_failure_with_any_text_reaches_the_error_queue(backend, client, queue, schema, mode, failure):
    client.send(queue, [Message("doomed"), Message("fine")])
    handled: list[str] = []

    async def handler(message, connection):
        if message.text == "doomed":
            raise failure()
        handled.append(message.text)

    error = QueueAddress("error", schema)
    pool = open_pool(backend.uri, max_size=2)
    await pool.open()
    try:
        pump = MessagePump(
            pool, queue, handler, transaction_mode=mode, error_queue=error, max_deliveries=2, peek_interval=0.05,
            lease=1.0,
        )  # fmt: skip
        await pump_until(
            pump, lambda: client.depth(error) == 1 and handled == ["fine"] and client.in_flight(queue) == 0
        )
    finally:
        await pool.close()
    assert client.depth(queue) == 0
    [failed] = client.browse(error)
    assert failed.text == "doomed"
    text = failed.headers[EXCEPTION_MESSAGE] or ""
    assert failed.headers[EXCEPTION_TYPE].endswith(failure.__qualname__)
    if failure is Hostile:
        assert text.startswith("bad \\udcff byte, NUL \\x00")  # escaped, readable, not dropped
        assert len(text) < MAX_FAILURE_TEXT + 100 and text.endswith("characters cut)")
    else:
        assert "cannot be read" in text


async def test_a_native_handler_that_swallows_a_database_error_has_failed(backend, client, queue, schema):
    client.send(queue, Message("swallowed"))
    attempts = 0

    async def handler(message, connection):
        nonlocal attempts
        attempts += 1
        try:
            await connection.execute("SELECT 1 / 0")
        except psycopg.Error:
            pass  # the mistake: the transaction is aborted, and the handler returns as if all went well

    error = QueueAddress("error", schema)
    pool = open_pool(backend.uri, max_size=2)
    await pool.open()
    try:
        pump = MessagePump(
            pool, queue, handler, transaction_mode="native", error_queue=error, max_deliveries=3, peek_interval=0.05
        )
        await pump_until(pump, lambda: client.depth(error) == 1)
    finally:
        await pool.close()
    assert attempts == 3  # counted as failed deliveries, then moved: never a loop, never "handled"
    assert pump.handled == 0 and pump.failed == 3
    [failed] = client.browse(error)
    assert "TransactionAbortedError" in failed.headers[EXCEPTION_TYPE]
    assert client.depth(queue) == 0


def test_a_native_block_that_swallows_a_database_error_raises_and_keeps_the_message(client, queue):
    client.send(queue, Message("kept"))

    def swallow() -> None:
        with client.receive_native(queue) as message:
            assert message is not None
            try:
                client.connection.execute("SELECT 1 / 0")
            except psycopg.Error:
                pass

    with pytest.raises(TransactionAbortedError, match="rolled"):
        swallow()
    assert [m.text for m in client.receive(queue)] == ["kept"]  # the receive was rolled back with the rest
