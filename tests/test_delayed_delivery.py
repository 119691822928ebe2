"""Delayed delivery through NServiceBus's ``<queue>.Delayed`` table, on every database of the suite.

Messages are stored with a delay computed by the database clock and reach their queue when due,
moved by :meth:`QueueClient.move_due` (which the pump runs) or by NServiceBus's own mover; rows
NServiceBus's own statements stored are moved by this package, and the other way round. Counted:
nothing moved early, nothing lost, nothing moved twice by competing movers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta, timezone

import pytest

from airflow_provider_sqlqueue.transport import (
    AsyncQueueClient,
    Message,
    MessagePump,
    QueueAddress,
    QueueClient,
    QueueNotFoundError,
)
from airflow_provider_sqlqueue.transport import operations as ops
from airflow_provider_sqlqueue.transport.drivers import finish, open_pool
from airflow_provider_sqlqueue.transport.message import FORWARD_DESTINATION, decode_headers

pytestmark = pytest.mark.every_dialect


def delayed_rows(backend, raw, queue: QueueAddress) -> list[dict[str, str]]:
    delayed = backend.table(queue.schema, queue.delayed().table)
    return [decode_headers(row[0]) for row in raw.execute(f"SELECT Headers FROM {delayed}").fetchall()]


def test_create_queue_creates_the_delayed_table_as_nservicebus_names_it(backend, raw, client, queue):
    assert f"{queue.table}.Delayed" in backend.tables(raw, queue.schema)
    columns = {name: kind for name, kind, _ in backend.columns(raw, queue.schema, "orders.Delayed")}
    assert {"headers", "body", "due"} <= set(columns)


def test_a_delayed_message_reaches_its_queue_when_due_and_not_before(backend, raw, client, queue):
    message = Message("later", {"NServiceBus.EnclosedMessageTypes": "Shop.Remind"})
    assert client.send(queue, message, delay=1.5) == 1

    assert client.peek(queue) == 0
    [stored] = delayed_rows(backend, raw, queue)
    assert stored[FORWARD_DESTINATION] == client.canonical_address(queue)
    assert stored["NServiceBus.MessageId"] == str(message.id)
    wait = client.next_due(queue)
    assert wait is not None and timedelta(seconds=1) < wait <= timedelta(seconds=1.5)
    assert client.move_due(queue) == 0  # not due yet: nothing moves
    assert client.receive(queue) == []

    time.sleep(1.6)
    assert client.move_due(queue) == 1
    [received] = client.receive(queue)
    assert received.text == "later"
    assert received.headers["NServiceBus.MessageId"] == str(message.id)
    assert FORWARD_DESTINATION not in received.headers  # removed on the way, as NServiceBus forwards
    assert client.next_due(queue) is None
    assert delayed_rows(backend, raw, queue) == []


def test_a_due_time_in_the_past_or_a_zero_delay_sends_at_once(client, queue):
    client.send(queue, Message("now"), due=datetime.now(UTC) - timedelta(minutes=1))
    client.send(queue, Message("also now"), delay=0)
    assert sorted(m.text for m in client.receive(queue, 5)) == ["also now", "now"]


def test_a_due_time_is_a_delay_from_now(client, queue):
    client.send(queue, Message("tomorrow"), due=datetime.now(UTC) + timedelta(days=1))
    wait = client.next_due(queue)
    assert wait is not None and timedelta(hours=23, minutes=59) < wait <= timedelta(days=1)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"delay": 5, "due": datetime.now(UTC)}, ValueError, "not both"),
        ({"delay": -1}, ValueError, "delay must be at least"),
        ({"delay": "soon"}, TypeError, "delay must be a timedelta"),
        ({"due": datetime(2030, 1, 1)}, TypeError, "timezone-aware"),
    ],
)
def test_bad_delays_are_refused_before_anything_is_stored(backend, raw, client, queue, kwargs, error, match):
    with pytest.raises(error, match=match):
        client.send(queue, Message("x"), **kwargs)
    assert delayed_rows(backend, raw, queue) == [] and client.peek(queue) == 0


def test_a_message_with_a_ttbr_cannot_be_delayed_as_in_nservicebus(backend, raw, client, queue):
    with pytest.raises(ValueError, match="TimeToBeReceived set is not supported"):
        client.send(queue, [Message("ok"), Message("x", time_to_be_received=60)], delay=10)
    assert delayed_rows(backend, raw, queue) == []


def test_a_queue_without_delayed_table_says_so(client, schema):
    plain = QueueAddress("plain", schema)
    client.create_queue(plain, delayed=False)
    with pytest.raises(QueueNotFoundError, match=r"plain\.Delayed"):
        client.send(plain, Message("x"), delay=5)
    with pytest.raises(QueueNotFoundError, match=r"plain\.Delayed"):
        client.move_due(plain)


def test_competing_movers_move_every_due_message_exactly_once(backend, client, queue, schema):
    count = 600
    client.send(queue, [Message(str(n)) for n in range(count)], delay=0.05)
    time.sleep(0.1)
    moved: list[int] = []
    errors: list[BaseException] = []

    def mover() -> None:
        try:
            with backend.client(schema) as own:
                moved.append(own.move_due(queue, batch_size=25))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=mover) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert sum(moved) == count
    received = Counter(m.text for m in client.receive(queue, 2 * count))
    assert len(received) == count and set(received.values()) == {1}


def test_rows_nservicebus_stored_are_moved_here_to_the_destination_they_name(backend, raw, client, queue, schema):
    other = QueueAddress("shipping", schema)
    client.create_queue(other)
    headers = json.dumps(
        {
            "NServiceBus.MessageId": "m-1",
            "NServiceBus.EnclosedMessageTypes": "Shop.Ship",
            FORWARD_DESTINATION: client.canonical_address(other),
        }
    )
    backend.nservicebus_store_delayed(raw, schema, queue.delayed().table, headers, b"ship it", timedelta(0))
    own = '{"NServiceBus.MessageId":"m-2"}'  # no destination: the table's own queue
    backend.nservicebus_store_delayed(raw, schema, queue.delayed().table, own, b"mine", timedelta(0))
    time.sleep(0.05)

    assert client.move_due(queue) == 2
    [shipped] = client.receive(other)
    assert shipped.body == b"ship it" and shipped.headers == {
        "NServiceBus.MessageId": "m-1",
        "NServiceBus.EnclosedMessageTypes": "Shop.Ship",
    }
    assert [m.body for m in client.receive(queue)] == [b"mine"]


def test_rows_stored_here_are_moved_by_nservicebus_into_the_queue(backend, raw, client, queue, schema):
    message = Message(b"\x00binary", {"NServiceBus.ContentType": "application/octet-stream"})
    client.send(queue, message, delay=0.05)
    time.sleep(0.1)
    backend.nservicebus_move_due(raw, schema, queue.delayed().table, queue.table, 10)

    row = backend.nservicebus_receive(raw, schema, queue.table)
    headers = decode_headers(row[2])
    assert bytes(row[3]) == b"\x00binary"
    # What the NServiceBus receiver reads to forward it: this very queue, so it processes it.
    assert headers[FORWARD_DESTINATION] == client.canonical_address(queue)
    assert headers["NServiceBus.MessageId"] == str(message.id)


def test_stores_into_nservicebus_own_table_with_its_unique_due_index(backend, raw, schema):
    """NServiceBus's PostgreSQL table makes Due unique; stores of one batch must not collide there."""
    with QueueClient.connect(backend.uri) as client:
        queue = QueueAddress("nsb", schema)
        client.create_queue(queue, delayed=False)
        backend.nservicebus_create_delayed(raw, schema, queue.delayed().table)
        assert client.send(queue, [Message(str(n)) for n in range(20)], delay=0.05) == 20
        time.sleep(0.1)
        assert client.move_due(queue) == 20
        assert sorted(int(m.text) for m in client.receive(queue, 50)) == list(range(20))


def test_async_client_sends_delayed_and_moves(backend, queue):
    async def run() -> list[str]:
        client = await AsyncQueueClient.connect(backend.uri)
        try:
            await client.send(queue, Message("async later"), delay=timedelta(milliseconds=50))
            await asyncio.sleep(0.1)
            assert await client.move_due(queue) == 1
            return [m.text for m in await client.receive(queue)]
        finally:
            await client.close()

    assert asyncio.run(run()) == ["async later"]


def test_a_destination_that_does_not_exist_sends_the_message_to_the_error_queue(backend, raw, client, queue, schema):
    nowhere = client.canonical_address(QueueAddress("gone", "nowhere"))
    sent_id = uuid.uuid4()
    headers = json.dumps({"NServiceBus.MessageId": str(sent_id), FORWARD_DESTINATION: nowhere})
    backend.nservicebus_store_delayed(raw, schema, queue.delayed().table, headers, b"lost?", timedelta(0))
    time.sleep(0.05)
    assert client.move_due(queue) == 1
    assert client.depth(queue) == 0
    [failed] = client.browse(QueueAddress("error", schema))
    assert (failed.id, failed.body) == (sent_id, b"lost?")
    assert "does not exist" in failed.headers["NServiceBus.ExceptionInfo.Message"]


def test_the_pump_moves_due_delayed_messages_and_handles_them(backend, client, queue):
    client.send(queue, [Message(f"d{n}") for n in range(5)], delay=0.3)
    client.send(queue, Message("now"))

    async def run() -> list[str]:
        handled: list[str] = []
        pool = open_pool(backend.uri, max_size=3)
        await pool.open()
        try:

            async def handler(message, connection) -> None:
                handled.append(message.text)

            pump = MessagePump(pool, queue, handler, transaction_mode="none", peek_interval=0.1)
            task = asyncio.create_task(pump.run())
            for _ in range(100):
                if len(handled) == 6:
                    break
                await asyncio.sleep(0.05)
            pump.stop()
            await task
        finally:
            await pool.close()
        return handled

    handled = asyncio.run(run())
    assert handled[0] == "now" and sorted(handled[1:]) == [f"d{n}" for n in range(5)]
    assert client.next_due(queue) is None


def test_a_mover_whose_connection_dies_mid_batch_moves_nothing(backend, client, queue, schema):
    client.send(queue, [Message(str(n)) for n in range(10)], delay=0.05)
    time.sleep(0.1)
    dying = backend.client(schema)
    session = dying.session
    with contextlib.suppress(Exception), dying.transaction():
        moved = finish(ops.drive(ops.move_due(session.dialect, queue, queue.delayed(), 100), session.execute))
        assert moved == 10  # inserted and deleted, not committed
        dying.connection.close()  # the process dies here: the server rolls the batch back
    assert client.peek(queue) == 0
    assert client.move_due(queue) == 10
    assert sorted(int(m.text) for m in client.receive(queue, 20)) == list(range(10))


# -- hostile input (each test reproduces a defect found by trying the feature as an attacker would) ---


def _forwarded_to(backend, raw, queue: QueueAddress, destination: str, body: bytes) -> uuid.UUID:
    """A due row, as any NServiceBus sender stores one, bound for ``destination``."""
    sent = uuid.uuid4()
    headers = json.dumps({"NServiceBus.MessageId": str(sent), FORWARD_DESTINATION: destination})
    backend.nservicebus_store_delayed(raw, queue.schema, queue.delayed().table, headers, body, timedelta(0))
    return sent


@pytest.mark.postgres_only
def test_a_delayed_message_no_queue_can_take_goes_to_the_error_queue_and_the_rest_move(
    backend, raw, client, queue, schema, pg_uri
):
    """One row bound for a business table, one for a queue the role may not write: each goes to the
    error queue with its reason; every other due message moves (before, none ever moved again)."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    raw.execute(f'CREATE TABLE "{schema}".customers (Id int PRIMARY KEY, Name text)')
    locked = QueueAddress("locked", schema)
    client.create_queue(locked)
    role = f"mover_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_uri, autocommit=True) as admin:
        admin.execute(f'CREATE ROLE "{role}" LOGIN')
        admin.execute(f'GRANT USAGE ON SCHEMA "{schema}" TO "{role}"')
        admin.execute(f'GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA "{schema}" TO "{role}"')
        admin.execute(f'GRANT USAGE ON ALL SEQUENCES IN SCHEMA "{schema}" TO "{role}"')
        admin.execute(f'REVOKE INSERT ON "{schema}"."locked" FROM "{role}"')
    try:
        good = [_forwarded_to(backend, raw, queue, client.canonical_address(queue), b"good") for _ in range(5)]
        business = _forwarded_to(backend, raw, queue, client.canonical_address(QueueAddress("customers", schema)), b"b")
        unwritable = _forwarded_to(backend, raw, queue, client.canonical_address(locked), b"u")
        time.sleep(0.05)
        with QueueClient.connect(make_conninfo(**{**conninfo_to_dict(pg_uri), "user": role})) as mover:
            assert mover.move_due(queue) == 7
        assert sorted(m.id for m in client.receive(queue, 10)) == sorted(good)
        failed = {m.id: m for m in client.browse(QueueAddress("error", schema))}
        assert set(failed) == {business, unwritable}
        assert "not a queue table" in failed[business].headers["NServiceBus.ExceptionInfo.Message"]
        assert "may not insert" in failed[unwritable].headers["NServiceBus.ExceptionInfo.Message"]
        assert client.depth(locked) == 0 and delayed_rows(backend, raw, queue) == []
        assert raw.execute(f'SELECT count(*) FROM "{schema}".customers').fetchone()[0] == 0
    finally:
        with psycopg.connect(pg_uri, autocommit=True) as admin:
            admin.execute(f'DROP OWNED BY "{role}"')
            admin.execute(f'DROP ROLE "{role}"')


@pytest.mark.postgres_only
@pytest.mark.parametrize(
    ("sender_zone", "mover_zone"),
    [("Asia/Tokyo", "America/Los_Angeles"), ("America/Los_Angeles", "Asia/Tokyo"), ("UTC", "Pacific/Chatham")],
)
def test_due_is_absolute_whatever_the_sessions_time_zones(pg_uri, client, queue, sender_zone, mover_zone):
    from psycopg.conninfo import make_conninfo

    def zoned(zone: str) -> QueueClient:
        return QueueClient.connect(make_conninfo(pg_uri, options=f"-c TimeZone={zone}"))

    with zoned(sender_zone) as sender, zoned(mover_zone) as mover:
        sender.send(queue, Message("in an hour"), delay=timedelta(hours=1))
        sender.send(queue, Message("in a second"), delay=timedelta(seconds=1))
        sender.send(
            queue, Message("at a due time"), due=datetime.now(timezone(timedelta(hours=-8))) + timedelta(seconds=1)
        )
        left = mover.next_due(queue)
        assert left is not None and timedelta(0) < left <= timedelta(seconds=1)
        assert mover.move_due(queue) == 0  # nothing moves early
        time.sleep(1.2)
        assert mover.move_due(queue) == 2
        assert sorted(m.text for m in mover.receive(queue, 5)) == ["at a due time", "in a second"]
        left = mover.next_due(queue)
        assert left is not None and timedelta(minutes=59) < left <= timedelta(hours=1)


def test_a_delayed_message_keeps_the_id_it_was_sent_with(client, queue):
    message = Message("later")
    client.send(queue, message, delay=0.05)
    time.sleep(0.1)
    assert client.move_due(queue) == 1
    [received] = client.receive(queue)
    assert received.id == message.id


@pytest.mark.postgres_only
def test_a_batch_of_delayed_messages_is_one_statement(client, queue, monkeypatch):
    inserts: list[str] = []
    execute = client.session.execute

    async def counting(step):
        if step.sql.lstrip().upper().startswith("INSERT"):
            inserts.append(step.sql)
        return await execute(step)

    monkeypatch.setattr(client.session, "execute", counting)
    assert client.send(queue, [Message(f"m{n}") for n in range(5_000)], delay=timedelta(hours=1)) == 5_000
    assert len(inserts) == 1
    monkeypatch.undo()
    assert client.next_due(queue) is not None


def test_drop_queue_drops_its_delayed_table(backend, raw, client, queue, schema):
    client.send(queue, Message("pending"), delay=timedelta(hours=1))
    client.drop_queue(queue)
    assert queue.table not in backend.tables(raw, schema)
    assert queue.delayed().table not in backend.tables(raw, schema)
