"""The audit queue: a copy of every processed message, made in the transaction that finishes it, counted.

The copy is what NServiceBus's auditing sends (the message's headers plus the processing headers,
a new row whose ``NServiceBus.MessageId`` names the original), so ServiceControl or an
NServiceBus endpoint reads it from the same table. It exists exactly when the message was
acknowledged (claim mode) or its native receive committed -- also when the consumer is SIGKILLed
with the ack half done.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import random
import signal
import socket
import time
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest

from airflow_provider_sqlqueue.transport import (
    LeaseLostError,
    Message,
    MessagePump,
    QueueAddress,
    QueueClient,
    QueueNotFoundError,
)
from airflow_provider_sqlqueue.transport.drivers import open_pool
from airflow_provider_sqlqueue.transport.message import (
    MESSAGE_ID,
    PROCESSING_ENDED,
    PROCESSING_ENDPOINT,
    PROCESSING_MACHINE,
    PROCESSING_STARTED,
    wire_timestamp,
)

pytestmark = pytest.mark.every_dialect


@pytest.fixture
def auditing(backend, schema):
    """A client that audits to ``audit`` in the test's schema; its queue ``orders`` is created with it."""
    with QueueClient.connect(backend.uri, error_queue=QueueAddress("error", schema), audit_queue=True) as client:
        client.create_queue(QueueAddress("orders", schema))
        yield client


def audited(backend, raw, schema: str) -> list[tuple[dict[str, str | None], bytes]]:
    """Every row of the audit queue, read with NServiceBus's own receive statement (which empties it)."""
    rows = []
    while (row := backend.nservicebus_receive(raw, schema, "audit")) is not None:
        _id, expired, headers, body = row
        assert not expired
        rows.append((json.loads(headers), bytes(body)))
    return rows


def audited_ids(raw, backend, schema: str) -> Counter[str]:
    """How many audit copies each original message id has (the audit queue is left as it is)."""
    rows = raw.execute(f"SELECT Headers FROM {backend.table(schema, 'audit')}").fetchall()
    return Counter(json.loads(headers)[MESSAGE_ID] for (headers,) in rows)


def test_ack_copies_each_message_with_the_processing_headers(backend, raw, schema, auditing):
    queue = QueueAddress("orders", schema)
    assert "audit" in backend.tables(raw, schema)  # create_queue made it, beside error
    sent = [Message(f"m{i}", {"Custom": f"v{i}"}) for i in range(3)]
    auditing.send(queue, sent)
    claimed = auditing.claim(queue, 3)
    started = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    before = datetime.now(UTC)
    held = auditing.ack(queue, [m.claim_token for m in claimed[:2]], started={claimed[0].id: started})
    assert held == {claimed[0].claim_token, claimed[1].claim_token}
    assert auditing.in_flight(queue) == 1  # the third is still being worked on: no copy yet

    copies = sorted(audited(backend, raw, schema), key=lambda row: row[1])
    assert [body for _, body in copies] == [b"m0", b"m1"]
    for (headers, _), original in zip(copies, sent, strict=False):
        assert headers[MESSAGE_ID] == str(original.id)
        assert headers["Custom"] == original.headers["Custom"]
        assert headers[PROCESSING_ENDPOINT] == "orders"
        assert headers[PROCESSING_MACHINE] == socket.gethostname()
        ended = datetime.strptime(headers[PROCESSING_ENDED], "%Y-%m-%d %H:%M:%S:%f Z").replace(tzinfo=UTC)
        assert before - timedelta(seconds=1) <= ended <= datetime.now(UTC)
    assert copies[0][0][PROCESSING_STARTED] == wire_timestamp(started)
    assert copies[1][0][PROCESSING_STARTED] == copies[1][0][PROCESSING_ENDED]  # not told: the ack's time


def test_a_client_without_an_audit_queue_makes_no_copies(backend, raw, schema, client, queue):
    client.send(queue, Message("plain"))
    [message] = client.claim(queue)
    assert client.ack(queue, message.claim_token)
    assert "audit" not in backend.tables(raw, schema)


def test_a_lost_claim_is_not_audited_the_ack_that_holds_it_is(backend, raw, schema, auditing):
    queue = QueueAddress("orders", schema)
    sent = Message("slow")
    auditing.send(queue, sent)
    [first] = auditing.claim(queue, lease=0.2)
    time.sleep(0.5)
    [second] = auditing.claim(queue)  # the lease ran out: delivered again
    assert auditing.ack(queue, first.claim_token) is False
    assert audited_ids(raw, backend, schema) == Counter()
    assert auditing.ack(queue, second.claim_token) is True
    assert audited_ids(raw, backend, schema) == Counter({str(sent.id): 1})


def test_nack_and_fail_make_no_copy(backend, raw, schema, auditing):
    queue = QueueAddress("orders", schema)
    auditing.send(queue, [Message("again"), Message("never")])
    first, second = auditing.claim(queue, 2)
    assert auditing.nack(queue, first.claim_token, error="try later")
    assert auditing.fail(queue, second, "hopeless")
    assert audited_ids(raw, backend, schema) == Counter()


def test_forward_audits_with_its_ack_and_not_when_a_lease_is_lost(backend, raw, schema, auditing):
    queue, results = QueueAddress("orders", schema), QueueAddress("results", schema)
    auditing.create_queue(results)
    sent = [Message("a"), Message("b")]
    auditing.send(queue, sent)
    kept, lost = auditing.claim(queue, 2, lease=60)
    assert auditing.nack(queue, lost.claim_token)  # given back and taken again: the old token is void
    [again] = auditing.claim(queue)
    assert again.id == lost.id
    with pytest.raises(LeaseLostError):
        auditing.forward({queue: [kept.claim_token, lost.claim_token]}, {results: [Message("r")]})
    assert audited_ids(raw, backend, schema) == Counter()  # rolled back whole
    assert auditing.depth(results) == 0
    assert auditing.forward({queue: [kept.claim_token]}, {results: [Message("r")]}) == 1
    assert audited_ids(raw, backend, schema) == Counter({str(kept.id): 1})


def test_native_receive_audits_when_it_commits_and_not_when_it_rolls_back(backend, raw, schema, auditing):
    queue = QueueAddress("orders", schema)
    sent = Message("native")
    auditing.send(queue, sent)

    def fail_in_the_block() -> None:
        with auditing.receive_native(queue) as message:
            assert message is not None
            raise RuntimeError("handler failed")

    with pytest.raises(RuntimeError):
        fail_in_the_block()
    assert audited_ids(raw, backend, schema) == Counter()
    assert auditing.depth(queue) == 1
    with auditing.receive_native(queue) as message:
        assert message is not None and message.id == sent.id
    assert audited_ids(raw, backend, schema) == Counter({str(sent.id): 1})
    assert auditing.depth(queue) == 0


def test_a_missing_audit_queue_fails_the_ack_and_keeps_the_claim(backend, raw, schema, auditing):
    """Never acknowledged without a copy: the ack fails whole, and succeeds once the table is back."""
    queue = QueueAddress("orders", schema)
    auditing.send(queue, Message("kept"))
    [message] = auditing.claim(queue)
    auditing.drop_queue(QueueAddress("audit", schema))
    with pytest.raises(QueueNotFoundError):
        auditing.ack(queue, message.claim_token)
    assert auditing.in_flight(queue) == 1
    auditing.create_queue(queue)
    assert auditing.ack(queue, message.claim_token) is True
    assert audited_ids(raw, backend, schema) == Counter({str(message.id): 1})


def test_an_audit_queue_in_another_schema(backend, raw, schema, client):
    queue = QueueAddress("orders", schema)
    elsewhere = f"{schema}_a"
    backend.create_schema(raw, elsewhere)
    try:
        with QueueClient.connect(backend.uri, audit_queue=QueueAddress("central", elsewhere)) as auditing:
            auditing.create_queue(queue)
            auditing.send(queue, Message("x"))
            [message] = auditing.claim(queue)
            assert auditing.ack(queue, message.claim_token)
        rows = raw.execute(f"SELECT Headers FROM {backend.table(elsewhere, 'central')}").fetchall()
        assert [json.loads(h)[MESSAGE_ID] for (h,) in rows] == [str(message.id)]
    finally:
        backend.drop_schema(raw, elsewhere)


@pytest.mark.parametrize("mode", ["claim", "native", "none"])
async def test_the_pump_audits_what_its_handler_processed(backend, raw, schema, auditing, mode):
    queue = QueueAddress("orders", schema)
    sent = [Message(f"p{i:03d}") for i in range(60)]
    auditing.send(queue, sent)
    bad = {m.id for m in sent[::10]}  # these always fail and end in the error queue

    async def handler(message, connection):
        if message.id in bad:
            raise ValueError("bad message")

    pool = open_pool(backend.uri, max_size=3)
    await pool.open()
    pump = MessagePump(
        pool,
        queue,
        handler,
        transaction_mode=mode,
        error_queue=QueueAddress("error", schema),
        audit_queue=QueueAddress("audit", schema),
        max_concurrency=2,
        receive_batch_size=5,
        max_deliveries=2,
        peek_interval=0.05,
        move_delayed=False,
    )
    try:
        task = asyncio.create_task(pump.run())
        deadline = time.monotonic() + 60
        while auditing.depth(QueueAddress("error", schema)) < len(bad) or sum(
            audited_ids(raw, backend, schema).values()
        ) < len(sent) - len(bad):
            assert time.monotonic() < deadline, "the pump did not process the queue"
            await asyncio.sleep(0.1)
        pump.stop()
        await asyncio.wait_for(task, 30)
    finally:
        await pool.close()
    assert audited_ids(raw, backend, schema) == Counter({str(m.id): 1 for m in sent if m.id not in bad})


# -- SIGKILL with the ack half done --------------------------------------------------------------


def ack_in_child(uri: str, schema: str, mode: str, taken: multiprocessing.synchronize.Event) -> None:
    """Take the one message and finish it (ack, or leave the native block); the parent kills this mid-way."""
    queue = QueueAddress("orders", schema)
    with QueueClient.connect(uri, audit_queue=True) as client:
        if mode == "claim":
            [message] = client.claim(queue, lease=1.0)
            taken.set()
            client.ack(queue, message.claim_token)
        else:
            with client.receive_native(queue) as message:
                assert message is not None
                taken.set()
    time.sleep(600)  # not reached while the audit table is locked


@pytest.mark.postgres_only
@pytest.mark.parametrize("mode", ["claim", "native"])
def test_sigkill_between_the_ack_and_its_audit_copy_leaves_neither(backend, raw, schema, auditing, mode):
    """The consumer is killed while its transaction has finished the message but waits to insert the copy.

    A lock on the audit table holds the INSERT; the kill lands there, after the ack's DELETE
    (claim) or the receive's DELETE (native) ran in the same transaction. The server rolls it
    back: the message is unfinished and uncopied, then processed once more and copied once.
    """
    queue = QueueAddress("orders", schema)
    sent = Message("fragile")
    auditing.send(queue, sent)
    audit_table = backend.table(schema, "audit")
    ctx = multiprocessing.get_context("spawn")
    taken = ctx.Event()
    locker = backend.raw()  # pg_stat_activity is read once per transaction: the lock needs its own session
    with locker.transaction():
        locker.execute(f"LOCK TABLE {audit_table} IN ACCESS EXCLUSIVE MODE")
        child = ctx.Process(target=ack_in_child, args=(backend.uri, schema, mode, taken))
        child.start()
        assert taken.wait(60), "the consumer never took the message"
        deadline = time.monotonic() + 30
        while not raw.execute(  # the child's session: its statement names the test's schema
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'INSERT INTO%%audit%%' "
            "AND strpos(query, %s) > 0",
            (schema,),
        ).fetchone()[0]:
            assert time.monotonic() < deadline, "the consumer never reached the audit insert"
            time.sleep(0.05)
        os.kill(child.pid, signal.SIGKILL)
        child.join(30)
        assert child.exitcode == -signal.SIGKILL
    locker.close()
    # The lock is released: the dead session's transaction is rolled back, not committed.
    deadline = time.monotonic() + 30
    while raw.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'INSERT INTO%%audit%%' AND strpos(query, %s) > 0",
        (schema,),
    ).fetchone()[0]:
        assert time.monotonic() < deadline, "the killed session lingers"
        time.sleep(0.05)
    assert audited_ids(raw, backend, schema) == Counter()
    if mode == "claim":
        assert auditing.in_flight(queue) == 1  # still claimed: back when its lease runs out
        deadline = time.monotonic() + 30
        while not (again := auditing.claim(queue)):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert auditing.ack(queue, again[0].claim_token)
    else:
        assert auditing.depth(queue) == 1  # the receive rolled back: queued again at once
        with auditing.receive_native(queue) as message:
            assert message is not None and message.id == sent.id
    assert audited_ids(raw, backend, schema) == Counter({str(sent.id): 1})
    assert auditing.depth(queue) == 0 and auditing.in_flight(queue) == 0


def consume_audited(uri: str, schema: str, mode: str, stop_file: str, seed: int) -> None:
    """Drain the queue with auditing on, pausing at random around the ack so kills land everywhere."""
    queue = QueueAddress("orders", schema)
    rng = random.Random(seed)
    with QueueClient.connect(uri, error_queue=QueueAddress("error", schema), audit_queue=True) as client:
        while not os.path.exists(stop_file):
            if mode == "claim":
                got = client.claim(queue, 5, lease=1.0)
                for message in got:
                    time.sleep(rng.random() * 0.004)
                    client.ack(queue, message.claim_token)
                    time.sleep(rng.random() * 0.002)
            else:
                with client.receive_native(queue) as message:
                    time.sleep(rng.random() * 0.004)
                got = [message] if message is not None else []
            if not got:
                time.sleep(0.05)


@pytest.mark.postgres_only
@pytest.mark.parametrize("mode", ["claim", "native"])
def test_killed_consumers_leave_exactly_one_copy_per_finished_message(backend, raw, schema, auditing, mode):
    """Consumers SIGKILLed at random while draining: every message ends audited exactly once, none twice."""
    queue = QueueAddress("orders", schema)
    total, kills = 2000, 12
    sent = [Message(f"c{i:05d}") for i in range(total)]
    auditing.send(queue, sent)
    ctx = multiprocessing.get_context("spawn")
    stop_file = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"audit-stop-{uuid.uuid4().hex}")
    rng = random.Random(11)
    processes = []

    def spawn() -> None:
        process = ctx.Process(target=consume_audited, args=(backend.uri, schema, mode, stop_file, rng.random()))
        process.start()
        processes.append(process)

    for _ in range(3):
        spawn()
    killed = 0
    try:
        time.sleep(2.0)  # let the consumers start
        while killed < kills and auditing.depth(queue) > 0:
            time.sleep(rng.uniform(0.1, 0.3))
            victim = processes.pop(rng.randrange(len(processes)))
            os.kill(victim.pid, signal.SIGKILL)
            victim.join(10)
            killed += 1
            spawn()
        deadline = time.monotonic() + 120
        while auditing.depth(queue) or auditing.in_flight(queue):
            assert time.monotonic() < deadline, "the consumers did not drain the queue"
            time.sleep(0.2)
    finally:
        open(stop_file, "w").close()
        for process in processes:
            process.join(30)
            if process.is_alive():
                process.kill()
        os.unlink(stop_file)
    copies = audited_ids(raw, backend, schema)
    assert killed >= 5, "the queue drained before the kills meant anything"
    assert set(copies) == {str(m.id) for m in sent}  # every finished message has its copy ...
    assert [mid for mid, count in copies.items() if count > 1] == []  # ... and only one
    print(f"{mode}: {total} messages, {killed} consumers killed, {sum(copies.values())} audit copies")


def test_ack_held_is_audited_like_every_other_ack(backend, raw, auditing, schema):
    queue = QueueAddress("orders", schema)
    auditing.send(queue, [Message("a"), Message("b")])
    auditing.claim(queue, 2, holder="spark-batch-7")
    assert auditing.ack_held(queue, "spark-batch-7") == 2
    assert sorted(body for _, body in audited(backend, raw, schema)) == [b"a", b"b"]


@pytest.mark.parametrize("audit", ["orders", "error"])
def test_an_audit_queue_that_is_the_queue_or_its_error_queue_is_refused(backend, schema, audit):
    from airflow_provider_sqlqueue.transport import InvalidArgumentError

    queue = QueueAddress("orders", schema)
    with QueueClient.connect(backend.uri) as installer:
        installer.create_queue(queue)
    with QueueClient.connect(backend.uri, audit_queue=QueueAddress(audit, schema)) as client:
        if audit == "error":
            with pytest.raises(InvalidArgumentError, match="audit queue"):
                client.create_queue(queue)  # refused at once, as every acknowledgement would be
        client.send(queue, Message("once"))
        [claimed] = client.claim(queue)
        with pytest.raises(InvalidArgumentError, match="audit queue"):
            client.ack(queue, claimed.claim_token)
        assert client.in_flight(queue) == 1  # nothing acknowledged, nothing copied
