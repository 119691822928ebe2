"""Unit behaviour of :mod:`airflow_provider_sqlqueue.transport.client`: one API, two ways to call it.

The queue behaviour itself is the behaviour suites' (``test_queue_behaviour.py`` and the rest);
here is what the module adds: the blocking client derived from the asyncio one, the locks that
let callers share a client, and transaction blocks.
"""

from __future__ import annotations

import inspect
import threading
import uuid

import psycopg
import pytest

from airflow_provider_sqlqueue.transport import AsyncQueueClient, Message, QueueAddress, QueueClient
from airflow_provider_sqlqueue.transport.dialects import get_dialect
from airflow_provider_sqlqueue.transport.errors import ArgumentTypeError, ClientClosedError, TransportMisconfiguredError

#: What only one of the two clients has, and why: the context manager protocols differ, and only
#: asyncio callers (the shared poller, the pump) wait for send notifications between peeks.
OWN = {"__aenter__", "__aexit__", "__enter__", "__exit__", "wait_for_notifications"}


def public(cls: type) -> dict[str, object]:
    return {name: member for name, member in vars(cls).items() if not name.startswith("_") or name in OWN}


def test_the_blocking_client_has_every_coroutine_of_the_asyncio_client_with_its_signature() -> None:
    blocking, asynchronous = public(QueueClient), public(AsyncQueueClient)
    assert set(asynchronous) - OWN == set(blocking) - OWN
    for name, member in asynchronous.items():
        if name in OWN or not inspect.iscoroutinefunction(member):
            continue
        derived = blocking[name]
        assert not inspect.iscoroutinefunction(derived), name
        assert inspect.signature(derived) == inspect.signature(member), name  # type: ignore[arg-type]


async def test_each_client_refuses_the_other_kind_of_connection(pg_uri: str) -> None:
    with (
        psycopg.connect(pg_uri, autocommit=True) as blocking,
        pytest.raises(ArgumentTypeError, match="AsyncConnection"),
    ):
        await AsyncQueueClient.connect(blocking)  # it would stall the event loop at every call
    async with await AsyncQueueClient.connect(pg_uri) as asynchronous:
        with pytest.raises(ArgumentTypeError, match="blocking session"):
            QueueClient(asynchronous.session)


def test_calls_in_a_transaction_block_commit_together_or_not_at_all(client: QueueClient, queue: QueueAddress) -> None:
    with pytest.raises(RuntimeError), client.transaction():  # noqa: PT012 - a block that sends, then fails
        client.send(queue, Message("one"))
        raise RuntimeError("the block fails: nothing it sent stays")
    assert client.depth(queue) == 0
    with client.transaction():
        client.send(queue, Message("one"))
        client.send(queue, Message("two"))
    assert [m.text for m in client.receive(queue, 5)] == ["one", "two"]


def test_threads_sharing_a_blocking_client_take_turns(client: QueueClient, queue: QueueAddress) -> None:
    def send(n: int) -> None:
        for i in range(20):
            client.send(queue, Message(f"{n}-{i}"))

    threads = [threading.Thread(target=send, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert client.depth(queue) == 80


def test_a_notified_send_wakes_listeners_once_at_commit_and_a_plain_one_not_at_all(
    pg_uri: str, client: QueueClient, queue: QueueAddress
) -> None:
    channel = client.dialect.notify_channel(queue)
    with psycopg.connect(pg_uri, autocommit=True) as listener:
        listener.execute(psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(channel)))

        def heard() -> list[str]:
            return [n.channel for n in listener.notifies(timeout=0.5)]

        client.send(queue, Message("plain"))
        assert heard() == []
        client.send(queue, Message("one"), notify=True)
        assert heard() == [channel]
        client.send(queue, [Message(f"batch-{n}") for n in range(3)], notify=True)
        assert heard() == [channel]  # a batch wakes listeners once
        with client.transaction():
            client.send(queue, Message("in a block"), notify=True)
            assert heard() == []  # delivered at commit, not before
        assert heard() == [channel]
    assert [m.text for m in client.receive(queue, 10)] == [
        "plain",
        "one",
        "batch-0",
        "batch-1",
        "batch-2",
        "in a block",
    ]


def test_a_queue_made_to_notify_on_insert_wakes_listeners_of_every_sender(
    pg_uri: str, client: QueueClient, schema: str
) -> None:
    """Plain SQL, COPY and the library's sends each wake a listener once per statement, with the
    lowest Seq inserted, as a notified send does; installing it twice is harmless; SQL Server is refused."""
    queue = QueueAddress("notified", schema)
    client.create_queue(queue, notify_on_insert=True)
    client.create_queue(queue, notify_on_insert=True)
    channel = client.dialect.notify_channel(queue)
    table = psycopg.sql.Identifier(schema, "notified")
    with psycopg.connect(pg_uri, autocommit=True) as listener, psycopg.connect(pg_uri, autocommit=True) as sender:
        listener.execute(psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(channel)))

        def heard() -> list[str]:
            return [n.payload for n in listener.notifies(timeout=0.5)]

        sender.execute(
            psycopg.sql.SQL(
                "INSERT INTO {} (Id, Headers, Body) SELECT gen_random_uuid(), '{{}}', 'x' FROM generate_series(1, 3)"
            ).format(table)
        )
        [first] = heard()
        assert int(first) == min(r[0] for r in sender.execute(psycopg.sql.SQL("SELECT Seq FROM {}").format(table)))
        with sender.cursor().copy(psycopg.sql.SQL("COPY {} (Id, Headers, Body) FROM STDIN").format(table)) as copy:
            copy.write_row(("6c0b4a43-2cf6-4d3e-9b59-3c8ea7c54e5d", "{}", b"y"))
        assert len(heard()) == 1
        client.send(queue, [Message("a"), Message("b")])
        assert len(heard()) == 1  # a plain send wakes listeners too, once
        client.send(queue, [Message("c"), Message("d")], notify=True)
        assert len(heard()) == 1  # the send's notification and the trigger's are one
    assert client.depth(queue) == 8
    from airflow_provider_sqlqueue.transport.operations import notifies_inserts

    with pytest.raises(TransportMisconfiguredError, match="sqlserver has no notifications"):
        notifies_inserts(get_dialect("sqlserver"))


def test_notify_on_insert_is_made_whole_by_installers_at_once_and_reaches_the_secondary_queue(
    pg_uri: str, schema: str
) -> None:
    """Several processes creating notifying queues of one schema at once (they share its trigger
    function) all succeed and every queue gets its trigger; an endpoint's secondary queue gets one
    too, since the endpoint receives from it."""
    names = [f"n{n}" for n in range(30)]
    errors: list[BaseException] = []

    def install(share: list[str]) -> None:
        try:
            with QueueClient.connect(pg_uri) as installer:
                for name in share:
                    installer.create_queue(QueueAddress(name, schema), notify_on_insert=True)
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=install, args=(names[n::3],)) for n in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert errors == []
    with QueueClient.connect(pg_uri) as client:
        client.create_queue(QueueAddress("sales", schema), secondary="W1", notify_on_insert=True)
    with psycopg.connect(pg_uri, autocommit=True) as connection:
        notifying = connection.execute(
            "SELECT c.relname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace n "
            "ON n.oid = c.relnamespace WHERE n.nspname = %s AND t.tgname = 'sqlqueue_notify_insert'",
            (schema,),
        ).fetchall()
    assert sorted(name for (name,) in notifying) == sorted([*names, "sales", "sales.W1"])


async def test_a_closed_client_refuses_even_an_empty_send(pg_uri: str, queue: QueueAddress) -> None:
    with QueueClient.connect(pg_uri) as client:
        pass
    for call in (lambda: client.send(queue, []), lambda: client.send_copied(queue, [])):
        with pytest.raises(ClientClosedError, match="the client is closed"):
            call()
    closed = await AsyncQueueClient.connect(pg_uri)
    await closed.close()
    with pytest.raises(ClientClosedError):
        await closed.send(queue, [])


def test_close_from_another_thread_waits_for_an_open_native_block(pg_uri: str, queue: QueueAddress) -> None:
    """Calls take turns on the client's connection, close() too: the block another thread has open
    commits its receive, then the connection closes."""
    client = QueueClient.connect(pg_uri)
    client.send(queue, [Message("a"), Message("b")])
    inside, closing = threading.Event(), threading.Event()
    outcome: list[object] = []

    def handle() -> None:
        try:
            with client.receive_native(queue) as message:
                inside.set()
                closing.wait(30)
                outcome.append(message.text if message is not None else None)
        except Exception as exc:  # reported to the test below
            outcome.append(exc)

    worker = threading.Thread(target=handle)
    worker.start()
    assert inside.wait(30)
    closer = threading.Thread(target=client.close)
    closer.start()
    closer.join(0.5)
    assert closer.is_alive()  # waiting for the block, however long it takes
    closing.set()
    worker.join(30)
    closer.join(30)
    assert outcome == ["a"]
    with QueueClient.connect(pg_uri) as other:
        assert other.depth(queue) == 1  # the block's receive committed before the close
    with pytest.raises(ClientClosedError):
        client.depth(queue)


def test_send_csv_loads_again_and_again_on_one_client_and_refuses_an_early_end_of_data(pg_uri, schema):
    """A reused client (its table layout known, so the COPY is the transaction's first statement)
    loads every time; a line of only a backslash and a dot, which would end PostgreSQL's data and
    drop the rows after it, is refused and nothing of that load is sent; a name with % is named as given."""
    from airflow_provider_sqlqueue.transport import InvalidArgumentError, QueueNotFoundError

    queue = QueueAddress("csv%q", schema)

    def row() -> bytes:
        return f'{uuid.uuid4()},"{{""NServiceBus.MessageId"":""m""}}",\\x41\n'.encode()

    with QueueClient.connect(pg_uri) as client:
        client.create_queue(queue)
        client.send(queue, Message("first"))
        for _ in range(3):
            assert client.send_csv(queue, [row(), row()]) == 2
        with pytest.raises(InvalidArgumentError, match="end of data"):
            client.send_csv(queue, [row(), b"\\.\n", row()])
        with pytest.raises(InvalidArgumentError, match="end of data"):
            client.send_csv(queue, [row() + b"\\", b".\r\n" + row()])
        assert client.depth(queue) == 7
        assert [m.body for m in client.browse(queue)][1:] == [b"A"] * 6
        with pytest.raises(QueueNotFoundError) as missing:
            client.send_csv(QueueAddress("no%such", schema), [row()])
    assert '"no%such"' in str(missing.value) and "%%" not in str(missing.value)
