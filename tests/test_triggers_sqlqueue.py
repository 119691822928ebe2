"""The triggers under asyncio as the triggerer runs them, and the AssetWatcher path through Airflow's own models."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest
from airflow.sdk.module_loading import import_string

from airflow_provider_sqlqueue.transport import Message
from airflow_provider_sqlqueue.triggers.sqlqueue import SqlQueueEventTrigger, SqlQueueTrigger

from .conftest import airflow_connection


def make_trigger(schema: str, cls=SqlQueueTrigger, **kwargs) -> SqlQueueTrigger:
    options = {
        "sqlqueue_conn_id": "sqlqueue_test",
        "queue_name": f'orders@"{schema}"',
        "error_queue": f'error@"{schema}"',
        "peek_interval": 0.1,
    }
    return cls(**{**options, **kwargs})


async def first_event(trigger, timeout: float = 20.0):
    events = trigger.run()
    try:
        return await asyncio.wait_for(anext(events), timeout)
    finally:
        await events.aclose()


def test_serialize_round_trip(schema):
    for cls in (SqlQueueTrigger, SqlQueueEventTrigger):
        trigger = make_trigger(schema, cls, max_messages=7, transaction_mode="none", lease=12.5, wake_on_notify=True)
        classpath, kwargs = trigger.serialize()
        json.dumps(kwargs)  # what the triggerer stores must be plain JSON
        rebuilt = import_string(classpath)(**kwargs)
        assert type(rebuilt) is cls and rebuilt.serialize() == (classpath, kwargs)


def test_native_mode_is_refused_with_a_reason(schema):
    with pytest.raises(ValueError, match="cannot span a trigger and a task"):
        make_trigger(schema, transaction_mode="native")


async def test_run_fires_once_messages_arrive_after_it_started(conn_id, client, queue, schema):
    trigger = make_trigger(schema, max_messages=3)
    waiter = asyncio.create_task(first_event(trigger))
    await asyncio.sleep(0.5)
    assert not waiter.done()  # empty queue: still peeking
    await asyncio.to_thread(client.send, queue, [Message(f"m{n}") for n in range(5)])
    event = await waiter
    assert event.payload["status"] == "success"
    messages = event.payload["messages"]
    assert [m["body"] for m in messages] == ["m0", "m1", "m2"]
    assert all(m["claim_token"] and m["queue"] == f'orders@"{schema}"' for m in messages)
    assert client.depth(queue) == 2 and client.in_flight(queue) == 3


async def test_none_mode_deletes_on_receipt(conn_id, client, queue, schema):
    client.send(queue, Message("x"))
    event = await first_event(make_trigger(schema, transaction_mode="none"))
    [message] = event.payload["messages"]
    assert message["body"] == "x" and message["claim_token"] is None
    assert client.depth(queue) == 0 and client.in_flight(queue) == 0


async def test_restart_neither_loses_nor_duplicates(conn_id, client, queue, schema):
    """A triggerer that dies after receiving (its event never stored) loses nothing: the lease brings the messages back.

    While the reservation holds, the restarted trigger does not see them again, so no message is
    handed out twice; each id is reserved once more only because its first event was lost, and the
    lost reservation spent none of the message's deliveries.
    """
    client.send(queue, [Message(f"m{n}") for n in range(4)])
    first = make_trigger(schema, max_messages=2, lease=1.5)
    lost = await first_event(first)  # the triggerer "dies" here: nobody stores this event
    lost_ids = {m["id"] for m in lost.payload["messages"]}

    classpath, kwargs = first.serialize()
    restarted = import_string(classpath)(**{**kwargs, "max_messages": 10, "lease": 60})
    second = await first_event(restarted)
    second_ids = {m["id"] for m in second.payload["messages"]}
    assert len(lost_ids) == 2 and len(second_ids) == 2 and not lost_ids & second_ids

    third = await first_event(import_string(classpath)(**{**kwargs, "max_messages": 10}))  # after the lease
    redelivered = third.payload["messages"]
    assert {m["id"] for m in redelivered} == lost_ids and all(m["deliveries"] == 0 for m in redelivered)
    assert client.depth(queue) == 0 and client.in_flight(queue) == 4


async def test_missing_queue_fires_an_error_event(conn_id, schema):
    event = await first_event(make_trigger(schema, queue_name=f'nowhere@"{schema}"'))
    assert event.payload["status"] == "error"
    assert "QueueNotFoundError" in event.payload["message"] and "nowhere" in event.payload["message"]


async def test_wrong_connection_type_fires_an_error_event(airflow_db, schema, monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_NOT_A_DB", json.dumps({"conn_type": "http", "host": "example.com"}))
    event = await first_event(make_trigger(schema, sqlqueue_conn_id="not_a_db"))
    assert event.payload["status"] == "error"
    assert "has type 'http'" in event.payload["message"] and "postgres, mssql, odbc" in event.payload["message"]


async def test_unreachable_database_is_retried_not_fatal(airflow_db, pg_uri, schema, monkeypatch, caplog):
    monkeypatch.setenv("AIRFLOW_CONN_DOWN", airflow_connection("postgresql://postgres@127.0.0.1:1/test"))
    trigger = make_trigger(schema, sqlqueue_conn_id="down")
    caplog.set_level(logging.WARNING)
    waiter = asyncio.create_task(first_event(trigger))
    await asyncio.sleep(2.5)
    assert not waiter.done()  # backing off and retrying, not failing the sensor
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    retries = [r for r in caplog.records if "database error" in r.getMessage()]
    assert len(retries) >= 2 and "retrying in" in retries[-1].getMessage()


async def test_unknown_database_fails_the_sensor_instead_of_retrying(airflow_db, pg_uri, schema, monkeypatch):
    """A connection to a database that does not exist is a configuration error: an error event, at once."""
    from psycopg.conninfo import make_conninfo

    monkeypatch.setenv("AIRFLOW_CONN_NO_DB", airflow_connection(make_conninfo(pg_uri, dbname="no_such_database")))
    event = await first_event(make_trigger(schema, sqlqueue_conn_id="no_db"), timeout=15)
    assert event.payload["status"] == "error"
    assert "TransportMisconfiguredError" in event.payload["message"] and "no_such_database" in event.payload["message"]


async def test_event_trigger_fires_one_event_per_message_and_keeps_running(conn_id, client, queue, schema):
    client.send(queue, [Message(f"m{n}") for n in range(3)])
    events = make_trigger(schema, SqlQueueEventTrigger, max_messages=2).run()
    try:
        payloads = [(await asyncio.wait_for(anext(events), 20)).payload for _ in range(3)]
        assert [p["body"] for p in payloads] == ["m0", "m1", "m2"]
        await asyncio.to_thread(client.send, queue, Message("later"))
        assert (await asyncio.wait_for(anext(events), 20)).payload["body"] == "later"
    finally:
        await events.aclose()
    assert client.in_flight(queue) == 4 and client.depth(queue) == 0


def test_message_queue_trigger_resolves_the_sqlqueue_scheme(schema):
    from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger

    trigger = MessageQueueTrigger(scheme="sqlqueue", sqlqueue_conn_id="sqlqueue_test", queue_name=f'orders@"{schema}"')
    classpath, kwargs = trigger.serialize()
    assert classpath == "airflow_provider_sqlqueue.triggers.sqlqueue.SqlQueueEventTrigger"
    assert kwargs["queue_name"] == f'orders@"{schema}"'


def sync_test_dags() -> None:
    """Write the test DAGs to the metadata database as the DAG processor would (creates watcher triggers)."""
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import BundleDagBag, sync_bag_to_db

    manager = DagBundlesManager()
    manager.sync_bundles_to_db()
    bundle = manager.get_bundle("dags-folder")
    bundle.initialize()
    bag = BundleDagBag(dag_folder=bundle.path, bundle_path=bundle.path, bundle_name=bundle.name)
    assert not bag.import_errors, bag.import_errors
    sync_bag_to_db(bag, bundle.name, bundle.version)


async def test_asset_watcher_starts_one_dag_run_per_message(conn_id, client, queue, schema):
    """Through Airflow's own models: watcher trigger row -> events -> asset events -> scheduler-created runs -> ack."""
    from airflow.jobs.job import Job
    from airflow.jobs.scheduler_job_runner import SchedulerJobRunner
    from airflow.models import DagModel, DagRun, Trigger
    from airflow.models.asset import AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    from airflow_provider_sqlqueue.operators.sqlqueue import AckMessagesOperator

    sync_test_dags()  # in the main thread: DAG parsing installs signal handlers
    with create_session() as session:
        asset = session.scalars(select(AssetModel).where(AssetModel.name == f"orders_{schema}")).one()
        [trigger_row] = asset.triggers
        trigger = import_string(trigger_row.classpath)(**trigger_row.kwargs)
        trigger_id = trigger_row.id
    assert isinstance(trigger, SqlQueueEventTrigger)

    await asyncio.to_thread(
        client.send,
        queue,
        [Message(json.dumps({"n": n}), {"NServiceBus.ContentType": "application/json"}) for n in range(3)],
    )
    scheduler = SchedulerJobRunner(Job())
    events = trigger.run()
    try:
        for _ in range(3):
            event = await asyncio.wait_for(anext(events), 20)
            with create_session() as session:  # what the triggerer does with an event, then a scheduler loop
                Trigger.submit_event(trigger_id, event, session=session)
            with create_session() as session:
                query, triggered = DagModel.dags_needing_dagruns(session)
                scheduler._create_dag_runs_asset_triggered(
                    dag_models=[d for d in query.all() if d.dag_id in triggered], session=session
                )
    finally:
        await events.aclose()

    with create_session() as session:
        runs = session.scalars(
            select(DagRun).where(DagRun.dag_id == f"sqlqueue_on_message_{schema}").order_by(DagRun.id)
        ).all()
        triggering = [[event.extra["payload"] for event in run.consumed_asset_events] for run in runs]
    assert [[payload["body"] for payload in payloads] for payloads in triggering] == [
        [{"n": 0}],
        [{"n": 1}],
        [{"n": 2}],
    ]
    assert client.in_flight(queue) == 3 and client.depth(queue) == 0  # leased to the runs until they ack

    # Each run's last task acknowledges the messages that triggered it (messages=None).
    ack = AckMessagesOperator(task_id="ack", sqlqueue_conn_id="sqlqueue_test", error_queue=f'error@"{schema}"')
    for payloads in triggering:
        context = {
            "triggering_asset_events": {asset.name: [type("Event", (), {"extra": {"payload": p}}) for p in payloads]}
        }
        assert await asyncio.to_thread(ack.execute, context) == {"acknowledged": 1, "expired": 0}
    assert client.in_flight(queue) == 0


async def test_many_triggers_share_one_peek_per_queue_and_each_message_fires_once(conn_id, client, schema):
    """40 deferred sensors on 4 queues: one connection, peeks per interval follow the queues, not the sensors."""
    from airflow_provider_sqlqueue.transport.watch import _pollers

    queues = [f'q{n}@"{schema}"' for n in range(4)]
    for queue in queues:
        await asyncio.to_thread(client.create_queue, client.session.dialect.parse_address(queue))
    triggers = [make_trigger(schema, queue_name=queue, max_messages=1) for queue in queues for _ in range(10)]
    waiters = [asyncio.create_task(first_event(trigger, timeout=60)) for trigger in triggers]
    await asyncio.sleep(1.0)
    [poller] = [p for p in _pollers.values() if set(queues) <= set(p.queues)]  # one, not one per trigger
    assert 4 <= poller.peeks <= 4 * (1.0 / 0.1 + 2)  # about one peek per queue per 0.1 s interval, for 40 triggers

    for queue in queues:  # 3 messages per queue for 10 waiting triggers
        await asyncio.to_thread(
            client.send, client.session.dialect.parse_address(queue), [Message(f"{queue}-{i}") for i in range(3)]
        )
    fired: list[str] = []
    while len(fired) < 12:
        done, _ = await asyncio.wait(
            [w for w in waiters if not w.done()], timeout=20, return_when=asyncio.FIRST_COMPLETED
        )
        assert done, "messages were not delivered"
        fired = [m["body"] for w in waiters if w.done() for m in w.result().payload["messages"]]
    await asyncio.sleep(0.5)
    fired = [m["body"] for w in waiters if w.done() for m in w.result().payload["messages"]]
    assert sorted(fired) == sorted(f"{queue}-{i}" for queue in queues for i in range(3))  # each once
    assert sum(w.done() for w in waiters) == 12  # the other 28 triggers keep waiting
    for w in waiters:
        w.cancel()
    await asyncio.gather(*waiters, return_exceptions=True)


async def test_notify_wakes_the_trigger_long_before_its_peek_interval(conn_id, client, queue, schema):
    trigger = make_trigger(schema, peek_interval=120.0, wake_on_notify=True)
    waiter = asyncio.create_task(first_event(trigger, timeout=60))
    await asyncio.sleep(0.5)  # the watcher has peeked once (empty) and listens
    await asyncio.to_thread(client.send, queue, Message("wake up"), notify=True)
    event = await asyncio.wait_for(waiter, 20)  # without the notification: 120 s
    assert [m["body"] for m in event.payload["messages"]] == ["wake up"]


LOOP_PROBE = r"""
import asyncio, json, sys, threading, time
import airflow.triggers.base  # what the triggerer has loaded before it creates triggers
from airflow._shared.module_loading import import_string  # what the triggerer uses

HEAVY = ("airflow_provider_sqlqueue.hooks", "airflow_provider_sqlqueue.transport.drivers", "psycopg",
         "airflow.providers.", "pymssql", "pyodbc")
# psycopg 3.3.0 (the declared floor) loads this 30-line module of its own at the first UUID it reads;
# later releases build it in. It costs microseconds, not the 0.5 s the heavy imports did.
LIGHT = ("psycopg_binary._uuid",)
loop_thread = threading.get_ident()
on_loop = []

class Watch:
    def find_spec(self, name, path=None, target=None):
        if threading.get_ident() == loop_thread and name.startswith(HEAVY) and name not in LIGHT:
            on_loop.append(name)
        return None

sys.meta_path.insert(0, Watch())

async def main(classpath, kwargs):
    worst = 0.0
    done = asyncio.Event()

    async def ticker():
        nonlocal worst
        while not done.is_set():
            before = time.perf_counter()
            await asyncio.sleep(0.005)
            worst = max(worst, time.perf_counter() - before - 0.005)

    tick = asyncio.create_task(ticker())
    await asyncio.sleep(0.05)
    trigger = import_string(classpath)(**kwargs)  # on the loop, as the triggerer does
    events = trigger.run()
    event = await asyncio.wait_for(anext(events), 60)
    await events.aclose()
    done.set()
    await tick
    print(json.dumps({"worst": worst, "body": event.payload.get("body"), "on_loop": on_loop}))

asyncio.run(main(sys.argv[1], json.loads(sys.argv[2])))
"""


def test_a_trigger_never_blocks_the_event_loop(conn_id, client, queue, schema, tmp_path):
    """From a fresh interpreter, as in a triggerer: importing, starting and receiving never stall the loop.

    The hook, the database providers and drivers load on a worker thread (checked by watching
    which imports run on the loop's thread), the connection lookup and PostgresHook's connection
    too; and a ticker task's worst lateness stays far from a stall.
    """
    import os
    import subprocess
    import sys

    client.send(queue, Message("wake up"))
    classpath, kwargs = make_trigger(schema, SqlQueueEventTrigger).serialize()
    probe = tmp_path / "probe.py"
    probe.write_text(LOOP_PROBE)
    done = subprocess.run(
        [sys.executable, str(probe), classpath, json.dumps(kwargs)],
        capture_output=True,
        text=True,
        timeout=120,
        env=os.environ.copy(),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["body"] == "wake up"
    print(f"worst event-loop lateness while importing, starting and receiving: {result['worst'] * 1000:.1f} ms")
    # What used to stall it: imports of the hook, drivers and providers on the loop (0.5-0.7 s).
    assert result["on_loop"] == []
    assert result["worst"] < 1.0  # a bound a loaded machine keeps; the imports above are the real check


def test_the_gauge_interval_setting_is_read_forgivingly(monkeypatch, caplog):
    from airflow_provider_sqlqueue.transport import defaults
    from airflow_provider_sqlqueue.triggers.sqlqueue import _health_interval

    monkeypatch.setenv("AIRFLOW__METRICS__STATSD_ON", "True")
    for text, expected in (
        ("30", 30.0),
        ("0", 0.0),
        ("-5", 0.0),
        ("0.0001", defaults.MIN_HEALTH_METRICS_INTERVAL),  # never a survey back to back
        ("abc", defaults.HEALTH_METRICS_INTERVAL),  # a typo must not stop the triggers that run DAGs
        ("nan", defaults.HEALTH_METRICS_INTERVAL),
    ):
        monkeypatch.setenv("AIRFLOW__SQLQUEUE__HEALTH_METRICS_INTERVAL", text)
        assert _health_interval() == expected, text
    assert "[sqlqueue] health_metrics_interval is 'abc', not a number of seconds" in caplog.text
    monkeypatch.setenv("AIRFLOW__METRICS__STATSD_ON", "False")
    monkeypatch.setenv("AIRFLOW__SQLQUEUE__HEALTH_METRICS_INTERVAL", "30")
    assert _health_interval() == 0.0  # metrics off: nothing would be sent
