"""Receiving and settling under hostile handlers and input, each outcome counted on the real database.

Regression tests:

- a native handler that ended the receive's transaction itself (``ROLLBACK`` or ``COMMIT`` on the
  connection) was counted as handled; after a ROLLBACK the message came back at once, for ever;
- a native handler the server cut off (its session killed mid-handler, as
  ``idle_in_transaction_session_timeout`` does to a slow one) never had the delivery counted, so
  the message came back after every back-off and never reached the error queue;
- ``fail()`` given a message claimed from another queue of the schema moved that message to the
  wrong error queue, naming the wrong queue as where it failed;
- a run of lapsed claims whose messages expired cost a claim one statement per claim, and the
  live lapsed claim behind them was not handed out.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from airflow_provider_sqlqueue.transport import Message, MessagePump, QueueAddress
from airflow_provider_sqlqueue.transport.drivers import open_pool
from airflow_provider_sqlqueue.transport.errors import TransactionAbortedError
from airflow_provider_sqlqueue.transport.message import EXCEPTION_TYPE, FAILED_QUEUE

pytestmark = pytest.mark.postgres_only


async def pump_until(pump: MessagePump, done: Any, timeout: float = 60.0) -> None:
    """Run the pump until ``done()``; fail if it stops or takes longer than ``timeout``."""
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


async def run_native(
    uri: str, client: Any, queue: QueueAddress, schema: str, handler: Any, deliveries: int
) -> MessagePump:
    """A native pump on ``queue`` until its error queue holds one message and the queue is empty."""
    error = QueueAddress("error", schema)
    pool = open_pool(uri, max_size=2)
    await pool.open()
    try:
        pump = MessagePump(
            pool, queue, handler, transaction_mode="native", error_queue=error, max_deliveries=deliveries,
            peek_interval=0.05, max_backoff=0.2,
        )  # fmt: skip
        await pump_until(pump, lambda: client.depth(error) == 1 and client.depth(queue) == 0)
    finally:
        await pool.close()
    return pump


async def test_a_native_handler_that_ends_the_receive_transaction_itself_has_failed(
    backend, client, queue, schema, caplog
):
    client.send(queue, [Message("rolled back"), Message("fine")])
    attempts: dict[str, int] = {}

    async def handler(message, connection):
        attempts[message.text] = attempts.get(message.text, 0) + 1
        if message.text == "rolled back":
            await connection.execute("ROLLBACK")  # the mistake: the receive is undone, silently

    pump = await run_native(backend.uri, client, queue, schema, handler, deliveries=3)
    assert attempts == {"rolled back": 3, "fine": 1}  # three counted failures, then moved: never a hot loop
    assert pump.handled == 1 and pump.failed == 3
    [failed] = client.browse(QueueAddress("error", schema))
    assert failed.text == "rolled back"
    assert failed.headers[EXCEPTION_TYPE].endswith("TransactionAbortedError")
    # The handler's failure to commit is not the database's: the pump did not back off for it.
    assert not [r for r in caplog.records if "database error" in r.getMessage()]


def test_a_native_block_that_ends_the_transaction_itself_raises_and_keeps_the_message(client, queue):
    client.send(queue, Message("kept"))

    def roll_back() -> None:
        with client.receive_native(queue) as message:
            assert message is not None
            client.connection.execute("ROLLBACK")

    with pytest.raises(TransactionAbortedError, match="ended"):
        roll_back()
    assert [m.text for m in client.receive(queue)] == ["kept"]
    assert client.depth(queue) == 0


async def test_a_native_handler_cut_off_by_the_server_reaches_the_error_queue(backend, client, queue, schema, caplog):
    client.send(queue, [Message("slow"), Message("fine")])
    attempts: dict[str, int] = {}

    async def handler(message, connection):
        attempts[message.text] = attempts.get(message.text, 0) + 1
        if message.text == "slow":
            # Slower than the session may sit idle in a transaction: the server ends the session.
            await connection.execute("SET idle_in_transaction_session_timeout = '50ms'")
            await asyncio.sleep(0.5)

    pump = await run_native(backend.uri, client, queue, schema, handler, deliveries=2)
    assert attempts == {"slow": 2, "fine": 1}  # each cut-off delivery counted; then the error queue
    assert pump.handled == 1 and pump.failed == 2
    [failed] = client.browse(QueueAddress("error", schema))
    assert failed.text == "slow"
    assert failed.headers[EXCEPTION_TYPE].endswith("TransactionAbortedError")
    # The handler's failure to commit is not the database's: the pump did not back off for it.
    assert not [r for r in caplog.records if "database error" in r.getMessage()]


async def test_a_native_batch_cut_off_by_the_server_reaches_the_error_queue(backend, client, queue, schema):
    client.send(queue, [Message("slow"), Message("fine")])
    attempts: dict[str, int] = {}

    async def batch_handler(batch, connection):
        for message in batch:
            attempts[message.text] = attempts.get(message.text, 0) + 1
        if any(message.text == "slow" for message in batch):
            await connection.execute("SET idle_in_transaction_session_timeout = '50ms'")
            await asyncio.sleep(0.5)

    error = QueueAddress("error", schema)
    pool = open_pool(backend.uri, max_size=2)
    await pool.open()
    try:
        pump = MessagePump(
            pool, queue, None, batch_handler=batch_handler, transaction_mode="native", error_queue=error,
            max_deliveries=2, peek_interval=0.05, max_backoff=0.2,
        )  # fmt: skip
        await pump_until(pump, lambda: client.depth(error) == 1 and client.depth(queue) == 0)
    finally:
        await pool.close()
    assert attempts == {"slow": 2, "fine": 1}
    assert pump.handled == 1 and pump.failed == 2
    [failed] = client.browse(error)
    assert failed.text == "slow"


def test_fail_leaves_a_message_claimed_from_another_queue_alone(client, queue, schema):
    other = QueueAddress("invoices", schema)
    client.create_queue(other)
    client.send(queue, Message("an order"))
    [claimed] = client.claim(queue, lease=60)
    assert client.fail(other, claimed, "wrong queue") is False
    assert client.depth(QueueAddress("error", schema)) == 0
    assert client.in_flight(queue) == 1  # still claimed, by its holder, on its own queue
    assert client.fail(queue, claimed, "right queue") is True
    [failed] = client.browse(QueueAddress("error", schema))
    assert failed.text == "an order"
    assert failed.headers[FAILED_QUEUE] == client.canonical_address(queue)
    assert client.in_flight(queue) == 0


LAPSED_EXPIRED = 20_000


def test_a_run_of_expired_lapsed_claims_costs_a_claim_a_few_statements(
    backend, raw, client, queue, schema, monkeypatch
):
    # A fleet of consumers died holding claims; their messages' time to be received ran out meanwhile.
    # One live claim lapsed behind them.
    client.send(queue, Message("live"))
    [live] = client.claim(queue, lease=0.001)
    inflight = f'"{schema}".sqlqueue_inflight'
    raw.execute(
        f"INSERT INTO {inflight} (Token, Queue, Id, Expires, Headers, Body, Seq, Deliveries, LeaseUntil, Holder) "
        "SELECT gen_random_uuid(), c.Queue, gen_random_uuid(), (now() AT TIME ZONE 'UTC') - interval '1 hour', "
        "'{}', ''::bytea, c.Seq - g, 1, (now() AT TIME ZONE 'UTC') - interval '1 minute', 'gone' "
        f"FROM {inflight} AS c, generate_series(1, %s) AS g",
        (LAPSED_EXPIRED,),
    )
    statements: list[str] = []
    # A session of its own: its first look for lapsed claims covers every lease (a session that
    # looked a moment ago covers only leases ended since, and these were written already lapsed).
    other = backend.client(schema)
    execute = other.session.execute

    async def counting(step):
        statements.append(step.sql)
        return await execute(step)

    monkeypatch.setattr(other.session, "execute", counting)
    with other:
        got = other.claim(queue, 1)
    monkeypatch.undo()
    assert [m.id for m in got] == [live.id]  # handed out again: the expired claims ahead were no obstacle
    assert len(statements) <= 10, f"{len(statements)} statements for one claim behind {LAPSED_EXPIRED:,} expired"
    assert client.in_flight(queue) == 1  # the expired claims are gone, in bulk; the live one is held
    assert client.depth(queue) == 0
