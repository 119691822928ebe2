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

from airflow_provider_sqlqueue.transport import AsyncQueueClient, Message, MessagePump, QueueAddress, QueueClient
from airflow_provider_sqlqueue.transport.defaults import MAX_FAILURE_TEXT
from airflow_provider_sqlqueue.transport.drivers import open_pool
from airflow_provider_sqlqueue.transport.errors import (
    ClientClosedError,
    TransactionAbortedError,
    TransportMisconfiguredError,
    TransportUnavailableError,
)
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


# -- every call after a caught error, and close(), inside a block ----------------------------------

#: Calls of the client a block's code may make after it caught a database error: each is refused
#: with the documented error before anything is sent, never "current transaction is aborted".
AFTER_A_CAUGHT_ERROR = {
    "send": lambda c, q: c.send(q, Message("late")),
    "receive": lambda c, q: c.receive(q),
    "claim": lambda c, q: c.claim(q),
    "depth": lambda c, q: c.depth(q),
    "browse": lambda c, q: c.browse(q),
    "queue_stats": lambda c, q: c.queue_stats(q),
    "purge": lambda c, q: c.purge(q),
    "nested": lambda c, q: c.transaction().__enter__(),
}


def call_after_a_caught_error(user, block, call, queue) -> None:
    with block:
        try:
            user.connection.execute("SELECT 1 / 0")
        except psycopg.Error:
            pass
        AFTER_A_CAUGHT_ERROR[call](user, queue)


@pytest.mark.parametrize("call", sorted(AFTER_A_CAUGHT_ERROR))
@pytest.mark.parametrize("block", ["transaction", "receive_native", "borrowed"])
def test_a_call_after_a_caught_database_error_in_a_block_is_transaction_aborted(
    backend, client, queue, call, block, caplog
):
    client.send(queue, Message("kept"))
    borrowed = psycopg.connect(backend.uri) if block == "borrowed" else None  # not autocommit: its own transaction
    user = client if borrowed is None else type(client).connect(borrowed)
    opened = {"receive_native": client.receive_native(queue), "transaction": client.transaction()}.get(block)
    with caplog.at_level("WARNING"), pytest.raises(TransactionAbortedError, match="error was caught") as caught:
        call_after_a_caught_error(user, opened or user.transaction(), call, queue)
    if borrowed is not None:
        borrowed.close()
    assert "current transaction is aborted" not in str(caught.value)
    assert not [r for r in caplog.records if r.name.startswith("psycopg")]  # no ignored rollback logged
    assert [m.text for m in client.browse(queue)] == ["kept"]  # nothing of the block committed


async def send_after_a_caught_error(client, queue) -> None:
    async with client.receive_native(queue):
        try:
            await client.connection.execute("SELECT 1 / 0")
        except psycopg.Error:
            pass
        await client.send(queue, Message("late"))


async def test_an_async_call_after_a_caught_database_error_in_a_block_is_transaction_aborted(backend, queue):
    async with await AsyncQueueClient.connect(backend.uri) as client:
        await client.send(queue, Message("kept"))
        with pytest.raises(TransactionAbortedError, match="error was caught"):
            await send_after_a_caught_error(client, queue)
        assert [m.text for m in await client.browse(queue)] == ["kept"]


def close_inside(client, close, block, queue, *, then_send: bool) -> None:
    """Send in ``block``, then ``close`` (the client or the connection under it), then maybe send again."""
    with client.receive_native(queue) if block == "receive_native" else client.transaction():
        client.send(queue, Message("inside"))
        close()
        if then_send:
            client.send(queue, Message("late"))


@pytest.mark.parametrize("then_send", [False, True], ids=["", "then-send"])
@pytest.mark.parametrize("owned", [True, False], ids=["owned", "borrowed"])
@pytest.mark.parametrize("block", ["transaction", "receive_native"])
def test_close_inside_a_block_says_closed_and_rolls_the_block_back(backend, client, queue, block, owned, then_send):
    client.send(queue, Message("kept"))
    borrowed = None if owned else psycopg.connect(backend.uri, autocommit=True)
    closing = QueueClient.connect(backend.uri if borrowed is None else borrowed)
    with pytest.raises(ClientClosedError, match="closed") as caught:
        close_inside(closing, closing.close, block, queue, then_send=then_send)
    if borrowed is not None:
        borrowed.close()
    assert not isinstance(caught.value, TransportUnavailableError)  # not "retry": it is closed
    assert [m.text for m in client.browse(queue)] == ["kept"]  # the receive and the send were undone


@pytest.mark.parametrize("then_send", [False, True], ids=["", "then-send"])
@pytest.mark.parametrize("autocommit", [True, False], ids=["autocommit", "in-transaction"])
@pytest.mark.parametrize("block", ["transaction", "receive_native"])
def test_a_lent_connection_closed_inside_a_block_is_misconfigured_not_unavailable(
    backend, client, queue, block, autocommit, then_send
):
    client.send(queue, Message("kept"))
    connection = psycopg.connect(backend.uri, autocommit=autocommit)
    borrowing = QueueClient.connect(connection)
    with pytest.raises(TransportMisconfiguredError, match="connection given to the client is closed"):
        close_inside(borrowing, connection.close, block, queue, then_send=then_send)
    assert [m.text for m in client.browse(queue)] == ["kept"]
