"""The triggerer side: message-to-event latency (polling vs NOTIFY) and the cost of many deferred sensors.

* Latency: one ``SqlQueueEventTrigger`` runs as the triggerer runs it (its ``run()`` under
  asyncio); a sender sends messages at random moments; the figure is the time from the send's
  commit to the trigger's event, p50 and p99, with a 1 s peek interval and polling only, then
  with ``wake_on_notify`` and ``send(notify=True)``, then with ``wake_on_notify`` and a plain SQL
  ``INSERT`` (no library, no NOTIFY of its own) into a queue made with ``notify_on_insert``.
* An idle sensor: a deferred sensor's ``SqlQueueTrigger`` (``wake_on_notify``) over an empty
  ``notify_on_insert`` queue, a plain SQL ``INSERT`` at a random moment, the time from its commit
  to the trigger's event; the queue emptied between rounds.
* Scale: 1,000 ``SqlQueueTrigger`` instances (deferred sensors) over 100 empty queues with a 1 s
  peek interval, for 10 s: transactions per second the server counted (``pg_stat_database``,
  this database, less the same idle window measured first) and the process's memory growth.

    .venv/bin/python bench/triggers.py --json bench/triggers.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="sqlqueue-bench-airflow-"))
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg

from airflow_provider_sqlqueue.transport import Message, QueueAddress, QueueClient
from bench.throughput import database


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


#: A plain SQL insert, as an NServiceBus endpoint or a script makes one (no notification of its own).
PLAIN_INSERT = """INSERT INTO "{schema}"."{table}" (Id, Headers, Body) VALUES (gen_random_uuid(), '{{}}', %s)"""


def _plain_insert(uri: str, schema: str, table: str, body: str) -> None:
    with psycopg.connect(uri, autocommit=True) as conn:
        conn.execute(PLAIN_INSERT.format(schema=schema, table=table), (body.encode(),))


async def latency(uri: str, schema: str, sender: str, count: int) -> dict[str, float]:
    """``sender``: ``poll`` (send, polling only), ``notify`` (send(notify=True)) or ``insert`` (plain SQL)."""
    from airflow_provider_sqlqueue.triggers.sqlqueue import SqlQueueEventTrigger

    table = f"latency_{sender}"
    queue = f'{table}@"{schema}"'
    with QueueClient.connect(uri, error_queue=QueueAddress("error", schema)) as client:
        client.create_queue(client.session.dialect.parse_address(queue), notify_on_insert=sender == "insert")
    trigger = SqlQueueEventTrigger(
        sqlqueue_conn_id="bench",
        queue_name=queue,
        transaction_mode="none",
        peek_interval=1.0,
        wake_on_notify=sender != "poll",
        max_messages=1,
    )
    sent_at: dict[str, float] = {}
    delays: list[float] = []

    async def send_all() -> None:
        with QueueClient.connect(uri) as client:
            address = client.session.dialect.parse_address(queue)
            for n in range(count):
                await asyncio.sleep(random.uniform(0.05, 0.6))
                body = f"m{n}"
                if sender == "insert":
                    await asyncio.to_thread(_plain_insert, uri, schema, table, body)
                else:
                    await asyncio.to_thread(client.send, address, Message(body), notify=sender == "notify")
                sent_at[body] = time.perf_counter()  # after the commit returned

    sending = asyncio.create_task(send_all())
    events = trigger.run()
    async for event in events:
        delays.append(time.perf_counter() - sent_at.get(event.payload["body"], time.perf_counter()))
        if len(delays) == count:
            break
    await events.aclose()
    await sending
    delays.sort()
    return {
        "p50_ms": statistics.median(delays) * 1000,
        "p99_ms": delays[min(len(delays) - 1, int(len(delays) * 0.99))] * 1000,
        "messages": count,
    }


async def sensor_latency(uri: str, schema: str, count: int) -> dict[str, float]:
    """An idle deferred sensor's trigger woken by a plain SQL insert into a ``notify_on_insert`` queue."""
    from airflow_provider_sqlqueue.triggers.sqlqueue import SqlQueueTrigger

    table = "sensor_insert"
    queue = f'{table}@"{schema}"'
    with QueueClient.connect(uri, error_queue=QueueAddress("error", schema)) as client:
        address = client.session.dialect.parse_address(queue)
        client.create_queue(address, notify_on_insert=True)
    delays: list[float] = []
    for n in range(count):
        trigger = SqlQueueTrigger(sqlqueue_conn_id="bench", queue_name=queue, peek_interval=1.0, wake_on_notify=True)
        events = trigger.run()
        waiting = asyncio.create_task(anext(events))
        await asyncio.sleep(random.uniform(0.3, 0.8))  # idle: listening, its last peek found nothing
        await asyncio.to_thread(_plain_insert, uri, schema, table, f"s{n}")
        inserted = time.perf_counter()
        await waiting
        delays.append(time.perf_counter() - inserted)
        await events.aclose()
        with QueueClient.connect(uri) as client:
            client.purge(address)
    delays.sort()
    return {
        "p50_ms": statistics.median(delays) * 1000,
        "p99_ms": delays[min(len(delays) - 1, int(len(delays) * 0.99))] * 1000,
        "messages": count,
    }


def transactions(uri: str) -> int:
    with psycopg.connect(uri, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        return conn.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()").fetchone()[0]


async def scale(uri: str, schema: str, triggers: int, queues: int, seconds: float) -> dict[str, float]:
    from airflow_provider_sqlqueue.transport.watch import _pollers
    from airflow_provider_sqlqueue.triggers.sqlqueue import SqlQueueTrigger

    names = [f'scale_{n}@"{schema}"' for n in range(queues)]
    with QueueClient.connect(uri, error_queue=QueueAddress("error", schema)) as client:
        for name in names:
            client.create_queue(client.session.dialect.parse_address(name))
    # Baseline: what the server commits in the same window with no triggers (stats collector, ...).
    before = transactions(uri)
    await asyncio.sleep(seconds)
    idle_rate = (transactions(uri) - before) / seconds
    memory_before = rss_mib()
    tasks = []
    for n in range(triggers):
        trigger = SqlQueueTrigger(sqlqueue_conn_id="bench", queue_name=names[n % queues], peek_interval=1.0)
        events = trigger.run()
        tasks.append(asyncio.create_task(anext(events)))
    await asyncio.sleep(2.0)  # every watcher started and peeking
    start, began = transactions(uri), time.perf_counter()
    await asyncio.sleep(seconds)
    rate = (transactions(uri) - start) / (time.perf_counter() - began) - idle_rate
    memory_after = rss_mib()
    pollers = len([p for p in _pollers.values() if set(p.queues) & set(names)])
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return {
        "triggers": triggers,
        "queues": queues,
        "pollers (connections)": pollers,
        "server_transactions_per_s": rate,
        "per_queue_per_interval": rate / queues,
        "unshared_would_be_per_s": triggers / 1.0,
        "memory_growth_mib": memory_after - memory_before,
        "memory_per_trigger_kib": (memory_after - memory_before) * 1024 / triggers,
    }


async def main_async(uri: str, count: int, triggers: int, queues: int, seconds: float) -> dict[str, object]:
    schema = f"bench_{os.getpid()}"
    with psycopg.connect(uri, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
        server = conn.execute("SHOW server_version").fetchone()[0]
    os.environ["AIRFLOW_CONN_BENCH"] = json.dumps({"conn_type": "postgres", **_conn_fields(uri)})
    try:
        polling = await latency(uri, schema, "poll", count)
        print(f"latency, polling every 1 s: p50 {polling['p50_ms']:.0f} ms, p99 {polling['p99_ms']:.0f} ms", flush=True)
        notified = await latency(uri, schema, "notify", count)
        print(
            f"latency, NOTIFY:            p50 {notified['p50_ms']:.1f} ms, p99 {notified['p99_ms']:.1f} ms", flush=True
        )
        inserted = await latency(uri, schema, "insert", count)
        print(
            f"latency, plain SQL INSERT, notify_on_insert: p50 {inserted['p50_ms']:.1f} ms, "
            f"p99 {inserted['p99_ms']:.1f} ms",
            flush=True,
        )
        sensor = await sensor_latency(uri, schema, min(count, 100))
        print(
            f"idle sensor, plain SQL INSERT, notify_on_insert: p50 {sensor['p50_ms']:.1f} ms, "
            f"p99 {sensor['p99_ms']:.1f} ms",
            flush=True,
        )
        shared = await scale(uri, schema, triggers, queues, seconds)
        print(
            f"{triggers} triggers on {queues} queues: {shared['server_transactions_per_s']:.0f} transactions/s "
            f"({shared['per_queue_per_interval']:.2f} per queue per 1 s interval; unshared would be "
            f"{shared['unshared_would_be_per_s']:.0f}/s), {shared['pollers (connections)']} poller connection(s), "
            f"+{shared['memory_growth_mib']:.1f} MiB ({shared['memory_per_trigger_kib']:.1f} KiB per trigger)",
            flush=True,
        )
    finally:
        with psycopg.connect(uri, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
    return {
        "postgresql": server,
        "latency_polling": polling,
        "latency_notify": notified,
        "latency_plain_insert_notify_on_insert": inserted,
        "idle_sensor_plain_insert_notify_on_insert": sensor,
        "scale": shared,
    }


def _conn_fields(uri: str) -> dict[str, object]:
    from urllib.parse import urlsplit

    parts = urlsplit(uri)
    fields = {
        "host": parts.hostname,
        "port": parts.port or 5432,
        "login": parts.username,
        "schema": parts.path.lstrip("/"),
    }
    if parts.password:
        fields["password"] = parts.password
    return fields


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--uri", default=os.environ.get("SQLQUEUE_BENCH_PG_URI"))
    parser.add_argument("--json", type=Path, default=Path("bench/triggers.json"))
    parser.add_argument("--messages", type=int, default=60)
    parser.add_argument("--triggers", type=int, default=1000)
    parser.add_argument("--queues", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=10.0)
    options = parser.parse_args()
    with database(options.uri) as uri:
        result = asyncio.run(main_async(uri, options.messages, options.triggers, options.queues, options.seconds))
    options.json.parent.mkdir(parents=True, exist_ok=True)
    options.json.write_text(json.dumps(result, indent=2))
    print(f"wrote {options.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
