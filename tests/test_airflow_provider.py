"""Provider registration and the hook: what Airflow sees, and clear errors for bad connections."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import airflow
import jsonschema
import pytest

from airflow_provider_sqlqueue.get_provider_info import get_provider_info
from airflow_provider_sqlqueue.hooks.sqlqueue import SqlQueueHook, UnsupportedConnectionError
from airflow_provider_sqlqueue.transport import Message, QueueNotFoundError

from .conftest import airflow_connection


def test_provider_info_matches_airflows_schema():
    schema = json.loads((Path(airflow.__file__).parent / "provider_info.schema.json").read_text())
    info = get_provider_info()
    jsonschema.validate(info, schema)
    assert info["queues"] == ["airflow_provider_sqlqueue.queues.sqlqueue.SqlQueueMessageQueueProvider"]


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ("list", "airflow-provider-sqlqueue"),
        ("hooks", "airflow_provider_sqlqueue.hooks.sqlqueue.SqlQueueHook"),
        ("triggers", "airflow_provider_sqlqueue.triggers.sqlqueue"),
        ("widgets", "extra__sqlqueue__error_queue"),
        ("queues", "SqlQueueMessageQueueProvider"),
    ],
)
def test_airflow_cli_lists_the_provider(command, expected):
    result = subprocess.run(
        [sys.executable, "-m", "airflow", "providers", command, "--output", "json"],
        capture_output=True,
        text=True,
        timeout=120,
        env=os.environ,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert expected in result.stdout


def test_message_queue_provider_is_registered():
    from airflow.providers_manager import ProvidersManager

    manager = ProvidersManager()
    manager.initialize_providers_queues()
    assert "airflow_provider_sqlqueue.queues.sqlqueue.SqlQueueMessageQueueProvider" in manager.queue_class_names


def test_hook_round_trip_on_a_postgres_connection(conn_id, client, queue, schema):
    hook = SqlQueueHook(conn_id, error_queue=f'error@"{schema}"')
    name = f'orders@"{schema}"'
    assert hook.dialect_name == "postgres"
    assert hook.test_connection() == (True, "Connected (postgres)")
    ids = hook.send(name, [Message("a"), Message("b"), Message("c")])
    assert hook.peek(name) == 3 and hook.depth(name) == 3
    [claimed] = hook.receive(name, transaction_mode="claim")
    assert str(claimed.id) == ids[0] and hook.in_flight(name) == 1
    assert hook.nack(name, [claimed.claim_token], error="try later") == 1
    [again] = hook.receive(name, transaction_mode="claim")
    assert again.id == claimed.id and again.deliveries == 2
    assert (
        hook.extend(name, [again.claim_token, uuid.uuid4()], lease=60) == 1
    )  # one statement; the stranger is not held
    assert hook.ack(name, [again.claim_token]) == 1 and hook.in_flight(name) == 0
    [gone] = hook.receive(name, transaction_mode="none")
    assert gone.text == "b"
    hook.move_to_error(name, gone, "bad order")
    assert hook.retry_errors(queue_name=name) == 1
    with hook.receive_native(name) as (message, connection):
        connection.execute(f'CREATE TABLE "{schema}".handled (body text)')
        connection.execute(f'INSERT INTO "{schema}".handled VALUES (%s)', [message.text])
    assert hook.depth(name) == 1  # c was received natively; b is back from the error queue
    with pytest.raises(RuntimeError), hook.receive_native(name) as (message, connection):
        raise RuntimeError("handler failed: the receive rolls back")
    assert hook.depth(name) == 1
    assert hook.purge(name) == 1


def test_sqlqueue_connection_type_and_queue_extras(airflow_db, pg_uri, schema, client, queue, monkeypatch):
    """Queue options in extras configure the hook and are never handed to the driver as libpq options."""
    conn = json.loads(airflow_connection(pg_uri, dialect="postgres", error_queue=f'error@"{schema}"'))
    conn["conn_type"] = "sqlqueue"
    monkeypatch.setenv("AIRFLOW_CONN_QUEUES", json.dumps(conn))
    hook = SqlQueueHook("queues")
    assert hook.dialect_name == "postgres" and hook.error_queue == f'error@"{schema}"'
    hook.send(f'orders@"{schema}"', Message("x"))
    assert client.depth(queue) == 1


def test_wrong_connection_type_is_a_clear_error(airflow_db, monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_WEB", json.dumps({"conn_type": "http", "host": "example.com"}))
    with pytest.raises(UnsupportedConnectionError, match="has type 'http'; a queue needs a postgres, mssql, odbc"):
        SqlQueueHook("web").send("orders", Message("x"))
    monkeypatch.setenv("AIRFLOW_CONN_ODD", json.dumps({"conn_type": "sqlqueue", "extra": {"dialect": "oracle"}}))
    with pytest.raises(UnsupportedConnectionError, match="extra 'dialect' is 'oracle'"):
        SqlQueueHook("odd").depth("orders")


def test_missing_queue_is_a_clear_error(conn_id, schema):
    with pytest.raises(QueueNotFoundError, match="nowhere"):
        SqlQueueHook(conn_id).send(f'nowhere@"{schema}"', Message("x"))


def test_unreachable_database_is_a_clear_error(airflow_db, monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_DOWN", airflow_connection("postgresql://postgres@127.0.0.1:1/test"))
    ok, text = SqlQueueHook("down").test_connection()
    assert not ok and "127.0.0.1" in text
