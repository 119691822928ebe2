"""Batches locked by a transaction (``lock``, ``browse_columns(locked_by=...)``, ``ack_locked``,
``nack_locked``), counted on PostgreSQL: every message handed out once among competing lockers and
receivers, every message back when the locking transaction ends any other way than its ack, and
nothing outside the lock read or deleted.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
import uuid
from collections import Counter
from typing import Any

import psycopg
import pytest

from airflow_provider_sqlqueue.transport import (
    InvalidArgumentError,
    Message,
    QueueAddress,
    QueueClient,
    TransportMisconfiguredError,
)
from airflow_provider_sqlqueue.transport.operations import LockedBatch

pytestmark = pytest.mark.postgres_only


def read_locked(uri: str, queue: QueueAddress, batch: LockedBatch, page: int = 7) -> list[str]:
    """The bodies of the batch's messages as its readers read them: from another session, page by page."""
    bodies: list[str] = []
    with QueueClient.connect(uri) as reader:
        after = batch.after
        while True:
            columns = reader.browse_columns(queue, page, after=after, last=batch.last, locked_by=batch.xid)
            bodies += [body.decode() for body in columns.bodies]
            if columns.after is None:
                return bodies
            after = columns.after


def insert_raw(raw: Any, queue: QueueAddress, headers: str | None, body: bytes = b"raw") -> str:
    message_id = str(uuid.uuid4())
    raw.execute(
        f'INSERT INTO "{queue.schema}"."{queue.table}" (Id, Headers, Body) VALUES (%s, %s, %s)',
        (message_id, headers, body),
    )
    return message_id


def test_competing_lockers_and_a_receiver_get_every_message_once(backend, client, queue) -> None:
    sent = [Message(f"m{n}") for n in range(600)]
    client.send(queue, sent)
    got: Counter[str] = Counter()
    failures: list[BaseException] = []

    def locker() -> None:
        try:
            with QueueClient.connect(backend.uri) as mine:
                while True:
                    with mine.transaction():
                        batch = mine.lock(queue, 40)
                        ids = read_locked(backend.uri, queue, batch)
                        time.sleep(0.01)  # the readers' time: the others take what is not locked meanwhile
                        assert mine.ack_locked(queue, batch) == len(ids) == batch.count
                    got.update(ids)
                    if not batch.count:
                        return
        except BaseException as exc:
            failures.append(exc)

    def receiver() -> None:
        try:
            with QueueClient.connect(backend.uri) as mine:
                while taken := mine.receive(queue, 5):
                    got.update(m.text for m in taken)
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=t) for t in (locker, locker, receiver)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not failures, failures
    assert set(got) == {m.body.decode() for m in sent} and set(got.values()) == {1}  # each once, none twice
    assert client.depth(queue) == 0


def test_a_block_that_raises_gives_every_message_back_as_it_was(pg_uri, client, queue) -> None:
    client.send(queue, [Message(f"m{n}") for n in range(30)])
    before = [(m.id, m.text) for m in client.browse(queue, 100)]
    with pytest.raises(RuntimeError, match="the job failed"), client.transaction():  # noqa: PT012
        batch = client.lock(queue, 20)
        assert len(read_locked(pg_uri, queue, batch)) == 20
        with QueueClient.connect(pg_uri) as other:
            assert [m.text for m in other.receive(queue, 30)] == [f"m{n}" for n in range(20, 30)]  # not the batch
        raise RuntimeError("the job failed")
    assert [(m.id, m.text) for m in client.browse(queue, 100)] == before[:20]  # back in order
    with pytest.raises(InvalidArgumentError, match="has ended"):
        read_locked(pg_uri, queue, batch)  # a read after the block finds no lock, and says so


def test_a_nack_moves_the_poison_and_the_block_commits_only_that(pg_uri, client, queue, raw) -> None:
    client.send(queue, [Message(f"m{n}") for n in range(5)])
    poison = insert_raw(raw, queue, '{"not": 1}')
    with client.transaction():
        batch = client.lock(queue, 10)
        assert (batch.count, len(batch.poison)) == (6, 1)
        assert client.nack_locked(queue, batch) == 5
    error = queue.sibling("error")
    assert [m.text for m in client.browse(queue)] == [f"m{n}" for n in range(5)]
    assert client.depth(error) == 1
    assert raw.execute(f'SELECT Id::text, Headers FROM "{error.schema}"."error"').fetchall() == [(poison, '{"not": 1}')]


def test_poison_goes_to_the_error_queue_unchanged_and_expired_messages_are_not_taken(
    pg_uri, client, queue, raw, caplog
) -> None:
    client.send(queue, [Message("expires", time_to_be_received=0.05), Message("first")])
    raw.execute(f'ALTER TABLE "{queue.schema}"."orders" ALTER COLUMN Headers DROP NOT NULL')  # as a hand-made table
    unreadable = [insert_raw(raw, queue, text) for text in ("{not json", '{"lone":"\\ud800"}', None)]
    odd = Message("odd", {"Shop.Note": "naïve café — 日本語 😀 \u200f\u202e", "Shop.Null": None})
    client.send(queue, odd)
    time.sleep(0.1)
    with client.transaction():
        batch = client.lock(queue, 100)
        assert batch.count == 5 and len(batch.poison) == 3  # the expired message is not locked
        with QueueClient.connect(pg_uri) as reader:
            columns = reader.browse_columns(queue, 100, after=batch.after, last=batch.last, locked_by=batch.xid)
        assert [body.decode() for body in columns.bodies] == ["first", "odd"]
        assert columns.headers[1]["Shop.Note"] == odd.headers["Shop.Note"] and columns.headers[1]["Shop.Null"] is None
        assert client.ack_locked(queue, batch) == 2
    moved = dict(raw.execute(f'SELECT Id::text, Headers FROM "{queue.schema}"."error"').fetchall())
    assert moved == dict(zip(unreadable, ["{not json", '{"lone":"\\ud800"}', ""], strict=True))  # NULL: as a receive
    assert sum("has unreadable headers" in r.getMessage() for r in caplog.records) == 3
    assert raw.execute(f'SELECT count(*) FROM "{queue.schema}"."orders"').fetchone()[0] == 1  # the expired row


def test_a_message_committed_into_the_locks_range_and_one_another_session_holds_are_left_alone(
    pg_uri, client, queue, raw
) -> None:
    client.send(queue, [Message("m0"), Message("m1")])
    table = f'"{queue.schema}"."orders"'
    with psycopg.connect(pg_uri) as late, psycopg.connect(pg_uri) as holder:
        late.execute(  # a sender whose transaction draws its Seq now and commits after the lock
            f"INSERT INTO {table} (Id, Headers, Body) VALUES (gen_random_uuid(), '{{}}', 'late')"
        )
        client.send(queue, [Message(f"m{n}") for n in range(2, 6)])
        holder.execute(f"SELECT 1 FROM {table} WHERE Body = 'm3' FOR UPDATE")  # another receiver holds m3
        with client.transaction():
            batch = client.lock(queue, 100)
            late.commit()
            (late_seq,) = raw.execute(f"SELECT Seq FROM {table} WHERE Body = 'late'").fetchone()
            assert batch.after < late_seq < batch.last  # in the batch's range, not in the batch
            assert read_locked(pg_uri, queue, batch) == ["m0", "m1", "m2", "m4", "m5"]
            assert client.ack_locked(queue, batch) == 5
        holder.rollback()
    assert sorted(m.text for m in client.browse(queue)) == ["late", "m3"]  # neither read nor deleted


def test_the_audit_copy_of_each_message_acknowledged(backend, schema, pg_uri) -> None:
    queue = QueueAddress("orders", schema)
    with QueueClient.connect(pg_uri, audit_queue=True) as client:
        client.create_queue(queue)
        sent = [Message(f"m{n}", {"Shop.N": str(n)}) for n in range(4)]
        client.send(queue, sent)
        with client.transaction():
            batch = client.lock(queue, 10)
            assert client.ack_locked(queue, batch) == 4
        audited = client.browse(queue.sibling("audit"), 10)
    assert [m.headers["NServiceBus.MessageId"] for m in audited] == [str(m.id) for m in sent]
    assert [m.headers["Shop.N"] for m in audited] == ["0", "1", "2", "3"]
    assert all("NServiceBus.ProcessingEnded" in m.headers for m in audited)


def test_a_lock_is_refused_outside_the_outermost_block_and_a_batch_settled_elsewhere(pg_uri, client, queue) -> None:
    client.send(queue, [Message(f"m{n}") for n in range(3)])
    with pytest.raises(InvalidArgumentError, match="outside a transaction block"):
        client.lock(queue, 3)
    with client.transaction(), client.transaction(), pytest.raises(InvalidArgumentError, match="nested"):
        client.lock(queue, 3)
    with client.transaction():  # one batch of a queue per block: its locks carry one id
        client.lock(queue, 1)
        with pytest.raises(InvalidArgumentError, match=r"has locked a batch of .* already"):
            client.lock(queue, 1)
    with psycopg.connect(pg_uri) as borrowed:  # a connection with a transaction of its own open
        borrowed.execute("SELECT 1")
        with (
            QueueClient.connect(borrowed) as lent,
            lent.transaction(),
            pytest.raises(TransportMisconfiguredError, match="savepoint"),
        ):
            lent.lock(queue, 3)
    with client.transaction():
        batch = client.lock(queue, 3)
        with pytest.raises(InvalidArgumentError, match="settle it on its own queue"):
            client.ack_locked(queue.sibling("error"), batch)
        with QueueClient.connect(pg_uri) as other:
            with pytest.raises(InvalidArgumentError, match="outside a transaction block"):
                other.ack_locked(queue, batch)
            with other.transaction(), pytest.raises(InvalidArgumentError, match="the transaction block that locked it"):
                other.ack_locked(queue, batch)
    assert client.depth(queue) == 3  # nothing acknowledged but by its own block
    with client.transaction(), pytest.raises(InvalidArgumentError, match="the transaction block that locked it"):
        client.ack_locked(queue, batch)  # nor by a later block of its own client
    assert client.depth(queue) == 3


def _hold_and_wait(uri: str, queue: QueueAddress, locked: Any) -> None:
    """Lock a batch and stop dead, inside the block, until killed."""
    with QueueClient.connect(uri) as client, client.transaction():
        client.lock(queue, 100)
        locked.set()
        time.sleep(600)


def test_a_process_killed_holding_a_batch_gives_every_message_back(pg_uri, client, queue) -> None:
    client.send(queue, [Message(f"m{n}") for n in range(50)])
    ctx = multiprocessing.get_context("spawn")
    locked = ctx.Event()
    process = ctx.Process(target=_hold_and_wait, args=(pg_uri, queue, locked))
    process.start()
    assert locked.wait(60), "the locker never locked"
    assert client.receive(queue, 50) == []  # held by the other process
    os.kill(process.pid, signal.SIGKILL)
    process.join(30)
    deadline = time.monotonic() + 20
    while True:  # until the server has seen the process die and ended its transaction
        with client.transaction():
            batch = client.lock(queue, 100)
            if batch.count == 50:
                assert read_locked(pg_uri, queue, batch) == [f"m{n}" for n in range(50)]  # every one, in order
                assert client.ack_locked(queue, batch) == 50
                break
        assert time.monotonic() < deadline, "the killed process's lock was never released"
        time.sleep(0.1)
    assert client.depth(queue) == 0
