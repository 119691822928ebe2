"""SQL Server connections through the Airflow layer: mssql (pymssql), odbc (pyodbc) and sqlqueue ones.

Without a server, what is proven is the wiring: each connection type is opened by its provider's
hook with the real driver (FreeTDS under pyodbc), queue extras never reach the driver, failures
come back as the transport's errors, and the trigger keeps retrying from its worker thread. With
``SQLQUEUE_MSSQL_URI`` set, the same connections also carry messages end to end.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from urllib.parse import urlsplit

import pytest

from airflow_provider_sqlqueue.hooks.sqlqueue import SqlQueueHook
from airflow_provider_sqlqueue.transport import Message, QueueClient, TransportUnavailableError
from airflow_provider_sqlqueue.transport.drivers import dialect_for
from airflow_provider_sqlqueue.triggers.sqlqueue import SqlQueueTrigger

from .conftest import MSSQL_SKIP_REASON

#: One connection per way a SQL Server can be named: (conn_type, extra).
KINDS = {
    "mssql": ("mssql", {"error_queue": "failed@[dbo]"}),
    "odbc": ("odbc", {"driver": "FreeTDS", "error_queue": "failed@[dbo]", "TDS_Version": "7.4"}),
    "sqlqueue": ("sqlqueue", {"dialect": "sqlserver", "error_queue": "failed@[dbo]"}),
}


def set_connection(
    monkeypatch, conn_id: str, kind: str, host: str, port: int, login: str, password: str, schema: str
) -> None:
    conn_type, extra = KINDS[kind]
    # The odbc provider takes the driver from extras only when allowed to (as a deployment would).
    monkeypatch.setenv("AIRFLOW__PROVIDERS_ODBC__ALLOW_DRIVER_IN_EXTRA", "True")
    monkeypatch.setenv(
        f"AIRFLOW_CONN_{conn_id.upper()}",
        json.dumps(
            {
                "conn_type": conn_type,
                "host": host,
                "port": port,
                "login": login,
                "password": password,
                "schema": schema,
                "extra": extra,
            }
        ),
    )


@pytest.mark.parametrize("kind", KINDS)
def test_unreachable_server_is_a_clear_transport_error(airflow_db, monkeypatch, kind):
    set_connection(monkeypatch, "down", kind, "127.0.0.1", 1, "sa", "secret", "queues")
    hook = SqlQueueHook("down")
    assert hook.dialect_name == "sqlserver" and hook.error_queue == "failed@[dbo]"
    with pytest.raises(TransportUnavailableError, match=r"(?s)connection 'down'.*Unable to connect"):
        hook.client()
    ok, text = hook.test_connection()
    assert not ok and "Unable to connect" in text


@pytest.mark.parametrize("kind", KINDS)
def test_conninfo_is_something_the_transport_can_open(airflow_db, monkeypatch, kind):
    # The odbc provider writes the password unquoted into its string: a ';' in it is refused (test_hooks_sqlqueue.py).
    password = "p@ss:word" if kind == "odbc" else "p@ss;word"
    set_connection(monkeypatch, "spark_side", kind, "db.example", 1444, "app", password, "queues")
    conninfo = SqlQueueHook("spark_side").conninfo()
    assert dialect_for(conninfo).name == "sqlserver"
    if kind == "odbc":
        assert conninfo.startswith("DRIVER={FreeTDS};SERVER=db.example;DATABASE=queues;UID=app;")
        assert "PORT=1444;" in conninfo
        assert "error_queue" not in conninfo and "TDS_Version=7.4" in conninfo
    else:
        parts = urlsplit(conninfo)
        assert (parts.scheme, parts.hostname, parts.port, parts.path) == ("mssql", "db.example", 1444, "/queues")


async def test_trigger_on_unreachable_sql_server_backs_off_from_its_thread(airflow_db, monkeypatch, caplog):
    set_connection(monkeypatch, "down", "mssql", "127.0.0.1", 1, "sa", "secret", "queues")
    trigger = SqlQueueTrigger(sqlqueue_conn_id="down", queue_name="orders", peek_interval=0.1)
    caplog.set_level(logging.WARNING)
    events = trigger.run()
    waiter = asyncio.create_task(anext(events))
    ticks = 0
    while ticks < 25:  # the event loop stays responsive while the driver fails on its thread
        await asyncio.sleep(0.1)
        ticks += 1
    assert not waiter.done()
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    await events.aclose()
    retries = [r for r in caplog.records if "database error" in r.getMessage()]
    assert len(retries) >= 2 and "retrying in" in retries[-1].getMessage()


@pytest.fixture
def mssql(monkeypatch) -> dict[str, object]:
    uri = os.environ.get("SQLQUEUE_MSSQL_URI")
    if not uri:
        pytest.skip(MSSQL_SKIP_REASON)
    parts = urlsplit(uri)
    return {
        "host": parts.hostname,
        "port": parts.port or 1433,
        "login": parts.username or "",
        "password": parts.password or "",
        "schema": parts.path.lstrip("/"),
    }


@pytest.mark.parametrize("kind", KINDS)
async def test_sql_server_connection_carries_messages_end_to_end(airflow_db, monkeypatch, mssql, kind):
    set_connection(monkeypatch, "mssql_queues", kind, **mssql)
    hook = SqlQueueHook("mssql_queues")
    queue = f"airflow_{kind}@[dbo]"
    with hook.client() as client:
        client.create_queue(queue, error_queue="failed@[dbo]")
    try:
        with hook.client() as client:
            client.send(queue, [Message("one"), Message("two")])
            assert client.peek(queue) == 2
        trigger = SqlQueueTrigger(sqlqueue_conn_id="mssql_queues", queue_name=queue, max_messages=5, peek_interval=0.1)
        events = trigger.run()
        event = await asyncio.wait_for(anext(events), 30)
        await events.aclose()
        assert [m["body"] for m in event.payload["messages"]] == ["one", "two"]
        async with await hook.async_client() as aclient:
            assert len(await aclient.ack(queue, [m["claim_token"] for m in event.payload["messages"]])) == 2
            assert await aclient.depth(queue) == 0 and await aclient.in_flight(queue) == 0
        with QueueClient.connect(hook.conninfo()) as client:
            assert client.depth(queue) == 0
    finally:
        with hook.client() as client:
            client.drop_queue(queue)
