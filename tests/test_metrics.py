"""Queue metrics sent through Airflow's StatsD client to a real UDP listener, compared with the tables."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from datetime import timedelta

from airflow_provider_sqlqueue.metrics import metric_name_part
from airflow_provider_sqlqueue.transport import Message, QueueAddress, QueueClient
from demo.services import airflow_connection


def test_metric_name_parts_keep_only_what_airflow_accepts():
    assert metric_name_part('we"ird.name@x y') == "we_ird_name_x_y"
    assert metric_name_part("") == "_"


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
            time.sleep(0.05)
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as listener:
                # Room for every datagram of a burst: every queue of the database is measured (other tests' too).
                listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * 1024 * 1024)
                listener.bind(("127.0.0.1", 0))
                listener.settimeout(0.5)
                env = {
                    **os.environ,
                    "AIRFLOW__METRICS__STATSD_ON": "True",
                    "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
                    "AIRFLOW__METRICS__STATSD_PORT": str(listener.getsockname()[1]),
                    "AIRFLOW__METRICS__STATSD_PREFIX": "airflow",
                    "AIRFLOW_CONN_SHOP": airflow_connection(pg_uri),
                }
                script = (
                    "from airflow_provider_sqlqueue.metrics import emit_queue_metrics; "
                    "print(emit_queue_metrics(['shop', 'missing']))"
                )
                # Read while the metrics are sent: every queue of the database is measured (other tests'
                # too), more datagrams than a socket buffer holds if they wait until the end.
                lines: list[str] = []
                done = threading.Event()

                def listen() -> None:
                    while not done.is_set():
                        try:
                            lines.extend(listener.recv(65536).decode().splitlines())
                        except TimeoutError:
                            continue

                reader = threading.Thread(target=listen, daemon=True)
                reader.start()
                run = subprocess.run(
                    [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
                )
                assert run.returncode == 0, run.stderr[-3000:]
                measured = run.stdout.strip().splitlines()[-1]  # what emit_queue_metrics returned
                assert "'shop'" in measured and "'missing'" not in measured  # an unknown connection is skipped
                assert "no Airflow connection 'missing' is defined" in run.stdout  # and the log says why
                time.sleep(0.5)  # the last datagrams in flight
                done.set()
                reader.join(5)
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
            assert float(gauges["airflow.sqlqueue.horizon_age.shop"]) >= 0
            assert (
                "airflow.sqlqueue.horizon_xid_age.shop" in gauges and "airflow.sqlqueue.horizon_problems.shop" in gauges
            )
        finally:
            client.session.connection.execute(f'DROP SCHEMA "{schema}" CASCADE')
