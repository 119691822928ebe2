"""Queue metrics sent through Airflow's StatsD client to a real UDP listener, compared with the tables."""

from __future__ import annotations

import hashlib
import os
import re
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import hypothesis
import psycopg
import pytest

from airflow_provider_sqlqueue.metrics import metric_name_part
from airflow_provider_sqlqueue.transport import Message, QueueAddress, QueueClient
from demo.services import airflow_connection


def test_metric_name_parts_keep_only_what_airflow_accepts():
    assert metric_name_part("orders_2") == "orders_2"  # letters, digits and _: the name itself
    assert metric_name_part("sqlqueue_default") == "sqlqueue_default"
    assert metric_name_part("Sales.Orders") == "Sales-2e-Orders"
    assert metric_name_part('we"ird.name@x y') == "we-22-ird-2e-name-40-x-20-y"
    assert metric_name_part("") == "-" and metric_name_part("-") == "--"
    for name in ("", "-", "a.b", "ünï😀code", "a\ud800", "x" * 200):
        assert re.fullmatch(r"[A-Za-z0-9_-]+", metric_name_part(name))


def unescaped(part: str) -> str:
    """The name a metric name part was made from: the inverse of ``metric_name_part``, which shows
    that no two names share a part."""
    if part == "-":
        return ""
    out, at = [], 0
    while at < len(part):
        if part[at] != "-":
            out.append(part[at])
            at += 1
        elif part[at + 1] == "-":
            out.append("-")
            at += 2
        else:
            end = part.index("-", at + 1)
            out.append(chr(int(part[at + 1 : end], 16)))
            at = end + 1
    return "".join(out)


#: Pairs of legal names whose parts collided, or could, under a replace-and-hash escaping: a name
#: and the escape of another, a name and its own escape, names differing only in escaped characters.
ADVERSARIAL_PAIRS = [
    ("a.b", "a_b_" + hashlib.sha256(b"a.b").hexdigest()[:6]),  # the old escaping made these one metric
    ("a.b", "a-2e-b"),
    ("a.b", "a_b"),
    ("a.b", "a b"),
    ("a-b", "a--b"),
    ("", "-"),
    ("", "_"),
    ("-", "--"),
    ("a-2e-", "a."),
    ("a-", "a-2d-"),
    ("ü", "-fc-"),
    ("\ud800", "-d800-"),
    ("😀", "-1f600-"),
    ("a-2e-b", "a--2e--b"),
]


@pytest.mark.parametrize(("one", "other"), ADVERSARIAL_PAIRS)
def test_two_different_names_never_share_a_metric(one, other):
    assert metric_name_part(one) != metric_name_part(other)
    assert unescaped(metric_name_part(one)) == one and unescaped(metric_name_part(other)) == other


@hypothesis.settings(max_examples=2000, deadline=None)
@hypothesis.given(hypothesis.strategies.text(alphabet=hypothesis.strategies.characters(codec=None), max_size=40))
def test_a_metric_name_part_gives_back_its_name(name):
    part = metric_name_part(name)
    assert re.fullmatch(r"[A-Za-z0-9_-]+", part) and "." not in part  # one dotted part, as Airflow takes it
    assert unescaped(part) == name


def test_queue_metrics_reach_statsd_tagged_and_named_per_queue(airflow_db, pg_uri):
    schema = f"metrics_{uuid.uuid4().hex[:8]}"
    orders = QueueAddress("orders", schema)
    with QueueClient.connect(pg_uri) as client:
        client.session.connection.execute(f'CREATE SCHEMA "{schema}"')
        try:
            client.create_queue(orders)
            client.create_queue(QueueAddress("billing", schema))  # empty: its oldest message is 0 s old
            client.send(orders, [Message(f"m{n}") for n in range(6)])
            [failing] = client.claim(orders, 1)  # before the lapsing claims: a claim takes lapsed ones first
            client.fail(orders, failing, ValueError("x"))
            client.claim(orders, 2, lease=timedelta(milliseconds=1))
            client.send(orders, [Message("late"), Message("later")], delay=0.001)  # due, and no mover runs
            client.session.connection.execute(
                f'UPDATE "{schema}"."orders.Delayed" SET Due = Due - interval \'3 minutes\''
            )
            script = (
                "from airflow_provider_sqlqueue.hooks.sqlqueue import SqlQueueHook; "
                "from airflow_provider_sqlqueue.metrics import emit_queue_metrics; "
                "print(emit_queue_metrics(['shop', 'missing'], lambda conn_id: SqlQueueHook(conn_id).client()))"
            )
            with psycopg.connect(pg_uri) as pin:  # a report left idle in its transaction pins the xmin horizon
                pin.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
                pin.execute("SELECT 1")
                time.sleep(2)
                lines, output = statsd_datagrams({"AIRFLOW_CONN_SHOP": airflow_connection(pg_uri)}, script)
                pin.rollback()
            measured = output.strip().splitlines()[-1]  # what emit_queue_metrics returned
            assert "'shop'" in measured and "'missing'" not in measured  # an unknown connection is skipped
            assert "no Airflow connection 'missing' is defined" in output  # and the log says why
            gauges = dict(line.rsplit("|", 1)[0].split(":", 1) for line in lines)
            path = f"shop.{schema}"
            assert gauges[f"airflow.sqlqueue.waiting.{path}.orders"] == "3"
            assert gauges[f"airflow.sqlqueue.in_flight.{path}.orders"] == "2"
            assert gauges[f"airflow.sqlqueue.lapsed.{path}.orders"] == "2"
            assert gauges[f"airflow.sqlqueue.expired.{path}.orders"] == "0"
            assert 0 <= float(gauges[f"airflow.sqlqueue.oldest_age.{path}.orders"]) < 60
            assert gauges[f"airflow.sqlqueue.errors.{path}.error"] == "1"
            # sent for an empty queue, so an alert on a stuck queue clears (StatsD keeps a gauge's last value)
            assert float(gauges[f"airflow.sqlqueue.oldest_age.{path}.billing"]) == 0
            assert f"airflow.sqlqueue.errors.{path}.orders" not in gauges
            assert gauges["airflow.sqlqueue.waiting"]  # the tagged form (tags travel only with tag-aware backends)
            # Health: due delayed messages unmoved for 3 minutes, the lapsed claims and the failure are problems.
            assert gauges[f"airflow.sqlqueue.due_delayed.{path}.orders"] == "2"
            assert float(gauges[f"airflow.sqlqueue.overdue.{path}.orders"]) >= 180
            assert float(gauges[f"airflow.sqlqueue.overdue.{path}.billing"]) == 0  # cleared once none is due
            assert int(gauges[f"airflow.sqlqueue.dead_rows.{path}.orders"]) >= 0
            assert gauges[f"airflow.sqlqueue.problems.{path}.orders"] == "2"  # lapsed, overdue
            assert gauges[f"airflow.sqlqueue.problems.{path}.error"] == "1"  # a failed message
            assert gauges[f"airflow.sqlqueue.problems.{path}.billing"] == "0"
            assert float(gauges["airflow.sqlqueue.horizon_age.shop"]) >= 2  # the pin, or an older holder
            assert int(gauges["airflow.sqlqueue.horizon_xid_age.shop"]) >= 0  # transactions since: none need have run
            assert (
                "airflow.sqlqueue.horizon_xid_age.shop" in gauges and "airflow.sqlqueue.horizon_problems.shop" in gauges
            )
        finally:
            client.session.connection.execute(f'DROP SCHEMA "{schema}" CASCADE')


def statsd_datagrams(
    env: dict[str, str], script: str, until: Callable[[list[str]], bool] | None = None, stop: Path | None = None
) -> tuple[list[str], str]:
    """Run ``script`` in a process with Airflow's StatsD client pointed at a real UDP listener: the datagrams
    received (read while they are sent: every queue of the database may be measured, more datagrams
    than a socket buffer holds), and what the script printed.

    With ``until``, the file ``stop`` is made once the datagrams received satisfy it: the script
    waits for that file instead of a fixed time, however loaded the machine is.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * 1024 * 1024)
        listener.bind(("127.0.0.1", 0))
        listener.settimeout(0.5)
        settings = {
            **os.environ,
            "AIRFLOW__METRICS__STATSD_ON": "True",
            "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
            "AIRFLOW__METRICS__STATSD_PORT": str(listener.getsockname()[1]),
            "AIRFLOW__METRICS__STATSD_PREFIX": "airflow",
            **env,
        }
        lines: list[str] = []
        done = threading.Event()

        def listen() -> None:
            while not done.is_set():
                try:
                    lines.extend(listener.recv(65536).decode().splitlines())
                except TimeoutError:
                    continue
                if until is not None and stop is not None and until(lines):
                    stop.touch()

        reader = threading.Thread(target=listen, daemon=True)
        reader.start()
        try:
            run = subprocess.run(
                [sys.executable, "-c", script], env=settings, capture_output=True, text=True, timeout=120
            )
            time.sleep(0.5)  # the last datagrams in flight
        finally:
            done.set()
            reader.join(5)
    assert run.returncode == 0, run.stderr[-3000:]
    return lines, run.stdout


def test_what_a_hooks_clients_do_is_counted_in_statsd(airflow_db, pg_uri):
    schema = f"counters_{uuid.uuid4().hex[:8]}"
    with QueueClient.connect(pg_uri) as client:
        client.session.connection.execute(f'CREATE SCHEMA "{schema}"')
        try:
            client.create_queue(QueueAddress("orders", schema))
            script = f"""
from airflow_provider_sqlqueue.hooks.sqlqueue import SqlQueueHook
from airflow_provider_sqlqueue.transport import Message, QueueAddress
orders = QueueAddress("orders", {schema!r})
with SqlQueueHook("shop").client() as client:
    client.send(orders, [Message(f"m{{n}}") for n in range(5)])
    claimed = client.claim(orders, 3)
    client.ack(orders, [m.claim_token for m in claimed[:2]])
    client.fail(orders, claimed[2], ValueError("no"))
"""
            lines, _ = statsd_datagrams({"AIRFLOW_CONN_SHOP": airflow_connection(pg_uri)}, script)
        finally:
            client.session.connection.execute(f'DROP SCHEMA "{schema}" CASCADE')
    counters: dict[str, int] = {}
    for line in lines:
        name, rest = line.split(":", 1)
        if rest.endswith("|c"):
            counters[name] = counters.get(name, 0) + int(rest.split("|")[0])
    path = f"shop.{schema}.orders"
    assert counters[f"airflow.sqlqueue.sent.{path}"] == 5
    assert counters[f"airflow.sqlqueue.received.{path}"] == 3
    assert counters[f"airflow.sqlqueue.handled.{path}"] == 2
    assert counters[f"airflow.sqlqueue.moved_to_error.{path}"] == 1
    assert counters["airflow.sqlqueue.sent"] >= 5  # the tagged form


def test_a_waiting_trigger_sends_its_connections_gauges_without_any_dag(airflow_db, pg_uri, tmp_path):
    """The triggerer's triggers keep the gauges flowing (every [sqlqueue] health_metrics_interval)."""
    stop = tmp_path / "seen"
    schema = f"trigger_metrics_{uuid.uuid4().hex[:8]}"
    with QueueClient.connect(pg_uri) as client:
        client.session.connection.execute(f'CREATE SCHEMA "{schema}"')
        try:
            client.create_queue(QueueAddress("idle", schema))
            client.create_queue(QueueAddress("busy", schema))
            client.send(QueueAddress("busy", schema), [Message("a"), Message("b")])
            script = f"""
import asyncio, os
from airflow_provider_sqlqueue.triggers.sqlqueue import SqlQueueTrigger, _reporters

async def main():
    triggers = [SqlQueueTrigger(queue_name='idle@"{schema}"', sqlqueue_conn_id="shop", peek_interval=0.2) for _ in range(3)]
    waiting = [asyncio.create_task(t.batches().__anext__()) for t in triggers]
    for _ in range(1200):  # nothing arrives: the triggers wait, the gauges flow, until two were seen
        await asyncio.sleep(0.1)
        if os.path.exists({str(stop)!r}):
            break
    assert len(_reporters) == 1, _reporters  # one sender for the connection, however many triggers
    for task in waiting:
        task.cancel()
    await asyncio.gather(*waiting, return_exceptions=True)
    assert not _reporters, _reporters  # the last trigger gone, the connection's sender stops

asyncio.run(main())
"""
            env = {"AIRFLOW_CONN_SHOP": airflow_connection(pg_uri), "AIRFLOW__SQLQUEUE__HEALTH_METRICS_INTERVAL": "1"}
            busy = f"airflow.sqlqueue.waiting.shop.{schema}.busy:"
            lines, _ = statsd_datagrams(env, script, lambda got: sum(line.startswith(busy) for line in got) >= 2, stop)
        finally:
            client.session.connection.execute(f'DROP SCHEMA "{schema}" CASCADE')
    waiting = [line for line in lines if line.startswith(f"airflow.sqlqueue.waiting.shop.{schema}.busy:")]
    assert len(waiting) >= 2 and waiting[-1].startswith(f"airflow.sqlqueue.waiting.shop.{schema}.busy:2|g")
    assert any(line.startswith("airflow.sqlqueue.horizon_age.shop:") for line in lines)


def test_legacy_names_off_sends_only_the_tagged_names(airflow_db, pg_uri):
    schema = f"tagged_{uuid.uuid4().hex[:8]}"
    with QueueClient.connect(pg_uri) as client:
        client.session.connection.execute(f'CREATE SCHEMA "{schema}"')
        try:
            client.create_queue(QueueAddress("orders", schema))
            script = f"""
from airflow_provider_sqlqueue.hooks.sqlqueue import SqlQueueHook
from airflow_provider_sqlqueue.metrics import emit_queue_metrics
from airflow_provider_sqlqueue.transport import Message, QueueAddress
with SqlQueueHook("shop").client() as client:
    client.send(QueueAddress("orders", {schema!r}), Message("m"))
emit_queue_metrics(["shop"], lambda conn_id: SqlQueueHook(conn_id).client())
"""
            env = {"AIRFLOW_CONN_SHOP": airflow_connection(pg_uri), "AIRFLOW__METRICS__LEGACY_NAMES_ON": "False"}
            lines, _ = statsd_datagrams(env, script)
        finally:
            client.session.connection.execute(f'DROP SCHEMA "{schema}" CASCADE')
    names = {line.split(":", 1)[0] for line in lines}
    assert "airflow.sqlqueue.sent" in names and "airflow.sqlqueue.waiting" in names
    assert not [name for name in names if name.startswith("airflow.sqlqueue.") and name.count(".") > 2]


def test_a_connection_whose_role_can_read_no_queue_is_not_counted_a_horizon_problem(pg_uri, monkeypatch):
    from airflow.sdk.observability.stats import Stats
    from psycopg import sql
    from psycopg.conninfo import make_conninfo

    from airflow_provider_sqlqueue.metrics import emit_queue_metrics

    gauges: dict[str, float] = {}
    monkeypatch.setattr(Stats, "gauge", lambda name, value, *a, **k: gauges.__setitem__(name, value))
    seen = []

    def open_client(conn_id: str) -> QueueClient:
        client = QueueClient.connect(make_conninfo(pg_uri, user=role))
        survey = client.health
        client.health = lambda **kw: seen.append(survey(**kw)) or seen[-1]  # the survey the gauges come from
        return client

    role = f"metrics_blind_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_uri, autocommit=True) as raw:
        raw.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
        try:
            assert emit_queue_metrics(["blind"], open_client) == {"blind": 0}
        finally:
            raw.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
    [health] = seen
    assert [p.concern for p in health.problems if p.queue is None and "could read no queue" in p.message]
    assert gauges["sqlqueue.horizon_problems"] == sum(p.concern == "horizon" for p in health.problems)
