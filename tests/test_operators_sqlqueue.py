"""Operators and the sensor through real Airflow (``dag.test()``) on a real PostgreSQL."""

from __future__ import annotations

import json
import time
from datetime import datetime

import pytest

from airflow_provider_sqlqueue.transport import Message, QueueAddress, QueueClient
from airflow_provider_sqlqueue.transport.message import wire_timestamp
from demo.services import airflow_connection

from .conftest import load_dag

pytestmark = pytest.mark.usefixtures("conn_id")


def xcom(run, task_id):
    [ti] = [ti for ti in run.get_task_instances() if ti.task_id == task_id]
    return ti.xcom_pull(task_ids=task_id)


def states(run) -> dict[str, str]:
    return {ti.task_id: ti.state for ti in run.get_task_instances()}


def test_create_and_send(schema, raw, client):
    run = load_dag("sqlqueue_install_and_send").test()
    assert run.state == "success", states(run)
    tables = {
        r[0] for r in raw.execute("SELECT table_name FROM information_schema.tables WHERE table_schema = %s", [schema])
    }
    assert {"orders", "error", "orders.worker1", "sqlqueue_inflight", "orders.Delayed"} <= tables
    rows = raw.execute(f'SELECT id, headers, body, expires FROM "{schema}".orders ORDER BY seq').fetchall()
    assert len(rows) == 6
    delayed = raw.execute(
        f"""SELECT body, EXTRACT(EPOCH FROM Due - (now() AT TIME ZONE 'UTC')::timestamptz) FROM "{schema}"."orders.Delayed" """
    ).fetchall()
    due_in = {bytes(body): seconds for body, seconds in delayed}
    assert 3500 < due_in[b"reminder"] <= 3600
    assert due_in[b"new year"] > 365 * 24 * 3600  # the templated due time, as a delay from the send
    by_body = {bytes(r[2]): (str(r[0]), json.loads(r[1]), r[3]) for r in rows}
    order_id, headers, expires = by_body[b'{"order":1}']
    assert headers["NServiceBus.ContentType"] == "application/json"
    assert headers["NServiceBus.EnclosedMessageTypes"] == "Shop.OrderPlaced"
    assert headers["NServiceBus.MessageId"] == order_id and expires is None
    assert {b"order-2", b"order-3", b"order-4", b"order-5"} <= set(by_body)
    assert by_body[b"order-2"][1]["NServiceBus.ContentType"] == "text/plain"
    assert by_body[b"\x00\xff"][2] is not None  # TTBR gives an Expires
    assert "NServiceBus.ContentType" not in by_body[b"\x00\xff"][1]

    # Running the DAG again is safe: creation is idempotent; 6 more messages arrive.
    assert load_dag("sqlqueue_install_and_send").test().state == "success"
    assert client.depth(QueueAddress("orders", schema)) == 12

    time.sleep(0.1)
    purge = load_dag("sqlqueue_purge_expired").test()
    assert purge.state == "success" and xcom(purge, "purge") == 2
    assert raw.execute(f'SELECT count(*) FROM "{schema}".orders').fetchone()[0] == 10


def test_queues_subscribe_in_setup_and_a_publish_reaches_both(schema, client):
    run = load_dag("sqlqueue_publish").test()
    assert run.state == "success", states(run)
    assert sorted(xcom(run, "publish")) == sorted(
        client.canonical_address(QueueAddress(name, schema)) for name in ("billing", "shipping")
    )
    for name in ("billing", "shipping"):
        [event] = client.receive(QueueAddress(name, schema))
        assert json.loads(event.body) == {"order": 9}
        assert event.headers["NServiceBus.MessageIntent"] == "Publish"
        assert event.headers["NServiceBus.EnclosedMessageTypes"] == "Shop.OrderPlaced;Shop.IEvent"


@pytest.mark.parametrize("deferrable", [True, False], ids=["deferrable", "poke"])
def test_sensor_receives_acks_and_hands_messages_downstream(deferrable, client, queue, schema, raw):
    client.send(
        queue, [Message(json.dumps({"n": n}), {"NServiceBus.ContentType": "application/json"}) for n in range(5)]
    )
    run = load_dag(f"sqlqueue_consume_{'deferrable' if deferrable else 'poke'}").test()
    assert run.state == "success", states(run)
    messages = xcom(run, "wait")
    assert [m["body"] for m in messages] == [{"n": 0}, {"n": 1}, {"n": 2}]
    assert all(m["claim_token"] and m["deliveries"] == 1 and m["body_encoding"] == "json" for m in messages)
    assert messages[0]["queue"] == f'orders@"{schema}"'
    assert xcom(run, "handle") == [{"n": 0}, {"n": 1}, {"n": 2}]
    assert xcom(run, "ack") == {"acknowledged": 3, "expired": 0}
    assert client.depth(queue) == 2 and client.in_flight(queue) == 0


def test_an_audit_queue_on_the_connection_gets_a_copy_of_each_acknowledged_message(
    client, queue, schema, raw, pg_uri, monkeypatch
):
    """The connection's ``audit_queue`` extra: the ack task copies what it acknowledges, processing headers and all."""
    monkeypatch.setenv("AIRFLOW_CONN_SQLQUEUE_TEST", airflow_connection(pg_uri, audit_queue=True))
    with QueueClient.connect(pg_uri, audit_queue=True) as installer:
        installer.create_queue(queue)  # adds the audit queue beside it
    client.send(
        queue, [Message(json.dumps({"n": n}), {"NServiceBus.ContentType": "application/json"}) for n in range(5)]
    )
    run = load_dag("sqlqueue_consume_deferrable").test()
    assert run.state == "success", states(run)
    assert xcom(run, "ack") == {"acknowledged": 3, "expired": 0}
    received = {m["id"]: m for m in xcom(run, "wait")}
    rows = raw.execute(f'SELECT Headers, Body FROM "{schema}".audit').fetchall()
    copies = {
        json.loads(headers)["NServiceBus.MessageId"]: (json.loads(headers), bytes(body)) for headers, body in rows
    }
    assert set(copies) == set(received) and len(rows) == 3
    for message_id, (headers, body) in copies.items():
        assert json.loads(body) == received[message_id]["body"]
        assert headers["NServiceBus.ProcessingEndpoint"] == "orders"
        started = datetime.fromisoformat(received[message_id]["received_at"])
        assert headers["NServiceBus.ProcessingStarted"] == wire_timestamp(started)
        assert headers["NServiceBus.ProcessingEnded"] >= headers["NServiceBus.ProcessingStarted"]


def test_deferrable_sensor_defers_then_resumes_when_a_message_arrives(client, queue, schema):
    """The queue is empty when the sensor runs, so it defers; a message sent later wakes the trigger."""
    import threading

    def send_later():
        time.sleep(2.0)
        client.send(queue, Message("late"))

    sender = threading.Thread(target=send_later)
    sender.start()
    try:
        run = load_dag("sqlqueue_consume_deferrable").test()
    finally:
        sender.join()
    assert run.state == "success", states(run)
    [wait] = [ti for ti in run.get_task_instances() if ti.task_id == "wait"]
    assert wait.next_method is None and wait.try_number == 1
    assert [m["body"] for m in xcom(run, "wait")] == ["late"]
    assert client.depth(queue) == 0 and client.in_flight(queue) == 0


def test_failed_downstream_gives_the_message_back_then_error_queue(client, queue, schema, raw, monkeypatch):
    client.send(queue, Message("fragile"))
    monkeypatch.setenv("SQLQUEUE_TEST_FAIL", "1")
    dag = load_dag("sqlqueue_consume_failing")
    first = dag.test()
    assert first.state == "failed" and states(first)["nack"] == "success" and states(first)["ack"] == "upstream_failed"
    assert client.peek(queue, include_claims=True) == 1  # given back at once (receivable again), not lost
    second = dag.test()
    assert second.state == "failed" and xcom(second, "wait")[0]["deliveries"] == 2
    # Third delivery exceeds max_deliveries=2: the message goes to the error queue, nothing to sense.
    assert client.claim(queue, max_deliveries=2) == []
    [(headers,)] = raw.execute(f'SELECT headers FROM "{schema}".error').fetchall()
    assert json.loads(headers)["NServiceBus.FailedQ"] == f'orders@"{schema}"'

    # The operator puts it back; a healthy run then handles it.
    retry = load_dag("sqlqueue_retry_errors").test()
    assert retry.state == "success" and xcom(retry, "retry") == 1
    monkeypatch.setenv("SQLQUEUE_TEST_FAIL", "0")
    healed = dag.test()
    assert healed.state == "success" and [m["body"] for m in xcom(healed, "wait")] == ["fragile"]
    assert client.depth(queue) == 0 and client.in_flight(queue) == 0
    assert raw.execute(f'SELECT count(*) FROM "{schema}".error').fetchone()[0] == 0


def test_failed_downstream_without_nack_redelivers_after_the_lease(client, queue, monkeypatch):
    client.send(queue, Message("slow to fail"))
    monkeypatch.setenv("SQLQUEUE_TEST_FAIL", "1")
    dag = load_dag("sqlqueue_consume_failing_no_nack")
    first = dag.test()
    assert first.state == "failed"
    assert client.depth(queue) == 0 and client.in_flight(queue) == 1  # still leased to the failed run
    monkeypatch.setenv("SQLQUEUE_TEST_FAIL", "0")
    second = dag.test()  # peeks until the 1 s lease runs out, then claims it again
    assert second.state == "success"
    [message] = xcom(second, "wait")
    assert message["body"] == "slow to fail" and message["deliveries"] == 2
    assert client.depth(queue) == 0 and client.in_flight(queue) == 0
