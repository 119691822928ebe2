"""Regression tests for what a black-box attack on the public API found, one test per finding.

Bodies and ids that are not valid, a handler raising ``CancelledError`` or another
``BaseException``, a client whose session the server killed, connection strings that are not
valid Unicode, hold NUL, carry startup options the server refuses or name a missing ODBC driver,
a Spark ``writeId`` that is not text, and ``sqlqueue subscribe`` given a misspelt table.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import psycopg
import pytest

from airflow_provider_sqlqueue.transport import (
    InvalidArgumentError,
    Message,
    MessagePump,
    QueueAddress,
    QueueClient,
    SqlQueueError,
    TransportMisconfiguredError,
    TransportUnavailableError,
)
from airflow_provider_sqlqueue.transport.drivers import open_pool

pytestmark = pytest.mark.postgres_only

PASSWORD = "Att4ck-S3cret"
LONE = os.fsdecode(b"\xff")


def test_a_body_or_an_id_no_message_can_hold_is_the_librarys_error() -> None:
    with pytest.raises(InvalidArgumentError, match="not valid Unicode"):
        Message("bad " + LONE)
    for bad in ("not-a-uuid", "", LONE):
        with pytest.raises(InvalidArgumentError, match="not a UUID"):
            Message("x", id=bad)
    with pytest.raises(SqlQueueError, match="UUID"):
        Message("x", id=5)  # type: ignore[arg-type]


class Fatal(BaseException):
    """Not an Exception: what a handler may raise without meaning to stop the process."""


@pytest.mark.parametrize("raised", [asyncio.CancelledError, Fatal], ids=["cancelled", "base-exception"])
@pytest.mark.parametrize("mode", ["none", "claim", "native"])
async def test_a_handler_raising_a_base_exception_fails_its_message_not_the_pump(
    backend, client, queue, schema, mode, raised
):
    client.send(queue, [Message("poison"), Message("innocent")])
    handled: list[str] = []

    async def handler(message, connection):
        if message.text == "poison":
            raise raised("from inside the handler")
        handled.append(message.text)

    error = QueueAddress("error", schema)
    pool = open_pool(backend.uri, max_size=2)
    await pool.open()
    pump = MessagePump(
        pool, queue, handler, transaction_mode=mode, error_queue=error, max_deliveries=1, peek_interval=0.05, lease=1.0
    )
    task = asyncio.create_task(pump.run())
    try:
        for _ in range(600):
            if handled == ["innocent"] and client.depth(error) == 1 and client.inflight(queue) == 0:
                break
            assert not task.done(), "the pump stopped by itself"
            await asyncio.sleep(0.05)
    finally:
        pump.stop()
        await asyncio.wait_for(task, 30)
        await pool.close()
    assert handled == ["innocent"]
    assert [m.text for m in client.browse(error)] == ["poison"]  # not lost, in any mode
    assert client.depth(queue) == 0


def test_an_owned_client_opens_a_new_connection_after_the_server_killed_its_session(pg_uri, queue) -> None:
    with QueueClient.connect(pg_uri) as client, psycopg.connect(pg_uri, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (client.connection.info.backend_pid,))
        with pytest.raises(TransportUnavailableError):
            client.send(queue, Message("met the loss"))
        assert client.send(queue, Message("the retry")) == 1  # "retry" must be able to succeed
        assert [m.text for m in client.receive(queue, 5)] == ["the retry"]


@pytest.mark.parametrize(
    "uri",
    [
        f"postgresql://postgres:{PASSWORD}@127.0.0.1:5432/test{LONE}",
        f"postgresql://postgres:{PASSWORD}\x00@127.0.0.1:5432/test",
        f"postgresql://postgres:{PASSWORD}@127.0.0.1:5432/test?options=-c%20statement_timeout%3Dabc",
        f"postgresql://postgres:{PASSWORD}@127.0.0.1:5432/test?options=-c%20TimeZone%3DNot/AZone",
        f"postgresql://postgres:{PASSWORD}@127.0.0.1:5432/test?connect_timeout=abc",
        f"postgresql://postgres:{PASSWORD}@127.0.0.1:5432/test?nosuchopt=1",
        f"postgresql://postgres:{PASSWORD}@[::1/test",
        f"mssql+pyodbc://sa:{PASSWORD}@127.0.0.1:1/test?driver=NoSuchDriver",
        f"DRIVER={{NoSuchDriver}};SERVER=127.0.0.1;UID=sa;PWD={PASSWORD}",
    ],
)
def test_a_connection_no_retry_can_fix_is_misconfigured_and_keeps_its_password(uri: str) -> None:
    with pytest.raises(TransportMisconfiguredError) as raised:
        QueueClient.connect(uri)
    chain, error = [], raised.value
    while error is not None:  # the whole chain, as an error tracker walks it
        chain.append(repr(error) + str(error))
        error = error.__cause__ or error.__context__
    assert PASSWORD not in "".join(chain)


def test_a_spark_write_id_that_is_not_text_is_refused() -> None:
    from airflow_provider_sqlqueue import spark

    for bad in (LONE, "\x00"):
        with pytest.raises(spark.InvalidOptionError, match="writeId"):
            spark.Options.parse({"url": "postgresql://postgres@127.0.0.1/test", "queue": "orders", "writeId": bad})


def test_sqlqueue_subscribe_refuses_a_misspelt_subscription_table(pg_uri, client, queue, schema, raw) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "airflow_provider_sqlqueue.cli", "subscribe", f'orders@"{schema}"', "Shop.Placed",
         "--subscription-table", f'SubscriptonRouting@"{schema}"', "--conn", pg_uri],
        capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": os.getcwd()},
    )  # fmt: skip
    assert run.returncode == 1 and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert "SubscriptonRouting" not in {row[0] for row in raw.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (schema,)
    ).fetchall()}  # fmt: skip
