"""Regression tests for what a black-box attack on the public API found, one test per finding.

Bodies and ids that are not valid, a handler raising ``CancelledError`` or another
``BaseException``, a client whose session the server killed, connection strings that are not
valid Unicode, hold NUL, carry startup options the server refuses or name a missing ODBC driver,
a Spark ``writeId`` that is not text, and ``sqlqueue subscribe`` given a misspelt table.

A second attack: tables with a queue's column names but other types (never treated as queues,
never emptied or dropped), a delayed message bound for one, installations refused half-way, a
queue as its own error queue, roles a grant must not name, wrong pump arguments, a hook whose
connection is not defined, and a lent connection the caller closed.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid

import psycopg
import pytest

from airflow_provider_sqlqueue.transport import (
    ArgumentTypeError,
    AsyncQueueClient,
    InvalidArgumentError,
    Message,
    MessagePump,
    NotAQueueError,
    QueueAddress,
    QueueClient,
    SqlQueueError,
    TransportMisconfiguredError,
    TransportUnavailableError,
)
from airflow_provider_sqlqueue.transport.drivers import open_pool

pytestmark = pytest.mark.postgres_only

PASSWORD = "Att4ck-S3cret"
LONE = os.fsdecode(b"\xff")


def test_a_body_or_an_id_no_message_can_hold_is_the_librarys_error() -> None:
    with pytest.raises(InvalidArgumentError, match="not valid Unicode"):
        Message("bad " + LONE)
    for bad in ("not-a-uuid", "", LONE):
        with pytest.raises(InvalidArgumentError, match="not a UUID"):
            Message("x", id=bad)
    with pytest.raises(SqlQueueError, match="UUID"):
        Message("x", id=5)  # type: ignore[arg-type]


class Fatal(BaseException):
    """Not an Exception: what a handler may raise without meaning to stop the process."""


@pytest.mark.parametrize("raised", [asyncio.CancelledError, Fatal], ids=["cancelled", "base-exception"])
@pytest.mark.parametrize("mode", ["none", "claim", "native"])
async def test_a_handler_raising_a_base_exception_fails_its_message_not_the_pump(
    backend, client, queue, schema, mode, raised
):
    client.send(queue, [Message("poison"), Message("innocent")])
    handled: list[str] = []

    async def handler(message, connection):
        if message.text == "poison":
            raise raised("from inside the handler")
        handled.append(message.text)

    error = QueueAddress("error", schema)
    pool = open_pool(backend.uri, max_size=2)
    await pool.open()
    pump = MessagePump(
        pool, queue, handler, transaction_mode=mode, error_queue=error, max_deliveries=1, peek_interval=0.05, lease=1.0
    )
    task = asyncio.create_task(pump.run())
    try:
        for _ in range(600):
            if handled == ["innocent"] and client.depth(error) == 1 and client.in_flight(queue) == 0:
                break
            assert not task.done(), "the pump stopped by itself"
            await asyncio.sleep(0.05)
    finally:
        pump.stop()
        await asyncio.wait_for(task, 30)
        await pool.close()
    assert handled == ["innocent"]
    assert [m.text for m in client.browse(error)] == ["poison"]  # not lost, in any mode
    assert client.depth(queue) == 0


def test_an_owned_client_opens_a_new_connection_after_the_server_killed_its_session(pg_uri, queue) -> None:
    with QueueClient.connect(pg_uri) as client, psycopg.connect(pg_uri, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (client.connection.info.backend_pid,))
        with pytest.raises(TransportUnavailableError):
            client.send(queue, Message("met the loss"))
        assert client.send(queue, Message("the retry")) == 1  # "retry" must be able to succeed
        assert [m.text for m in client.receive(queue, 5)] == ["the retry"]


@pytest.mark.parametrize(
    "uri",
    [
        f"postgresql://postgres:{PASSWORD}@127.0.0.1:5432/test{LONE}",
        f"postgresql://postgres:{PASSWORD}\x00@127.0.0.1:5432/test",
        f"postgresql://postgres:{PASSWORD}@127.0.0.1:5432/test?options=-c%20statement_timeout%3Dabc",
        f"postgresql://postgres:{PASSWORD}@127.0.0.1:5432/test?options=-c%20TimeZone%3DNot/AZone",
        f"postgresql://postgres:{PASSWORD}@127.0.0.1:5432/test?connect_timeout=abc",
        f"postgresql://postgres:{PASSWORD}@127.0.0.1:5432/test?nosuchopt=1",
        f"postgresql://postgres:{PASSWORD}@[::1/test",
        f"mssql+pyodbc://sa:{PASSWORD}@127.0.0.1:1/test?driver=NoSuchDriver",
        f"DRIVER={{NoSuchDriver}};SERVER=127.0.0.1;UID=sa;PWD={PASSWORD}",
    ],
)
def test_a_connection_no_retry_can_fix_is_misconfigured_and_keeps_its_password(uri: str) -> None:
    with pytest.raises(TransportMisconfiguredError) as raised:
        QueueClient.connect(uri)
    chain, error = [], raised.value
    while error is not None:  # the whole chain, as an error tracker walks it
        chain.append(repr(error) + str(error))
        error = error.__cause__ or error.__context__
    assert PASSWORD not in "".join(chain)


def test_a_spark_write_id_that_is_not_text_is_refused() -> None:
    from airflow_provider_sqlqueue import spark

    for bad in (LONE, "\x00"):
        with pytest.raises(spark.InvalidOptionError, match="writeId"):
            spark.Options.parse({"url": "postgresql://postgres@127.0.0.1/test", "queue": "orders", "writeId": bad})


def test_sqlqueue_subscribe_refuses_a_misspelt_subscription_table(pg_uri, client, queue, schema, raw) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "airflow_provider_sqlqueue.console", "subscribe", f'orders@"{schema}"', "Shop.Placed",
         "--subscription-table", f'SubscriptonRouting@"{schema}"', "--conn", pg_uri],
        capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": os.getcwd()},
    )  # fmt: skip
    assert run.returncode == 1 and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert "SubscriptonRouting" not in {row[0] for row in raw.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (schema,)
    ).fetchall()}  # fmt: skip


# -- a second attack: tables named like queues, refused installations, roles, pump arguments -----------


LOOKALIKES = {
    "int columns": "Id int PRIMARY KEY, Expires int, Headers int, Body int, Seq int",
    "jsonb headers, text body": "Id uuid PRIMARY KEY, Expires timestamp, Headers jsonb NOT NULL, Body text, Seq serial",
}


@pytest.fixture(params=sorted(LOOKALIKES))
def lookalike(request, raw, schema) -> QueueAddress:
    """A business table with rows whose columns have a queue's names but other types."""
    raw.execute(f'CREATE TABLE "{schema}".lines ({LOOKALIKES[request.param]})')
    if request.param == "int columns":
        raw.execute(f'INSERT INTO "{schema}".lines VALUES (1, 1, 1, 1, 1), (2, 2, 2, 2, 2)')
    else:
        raw.execute(f"INSERT INTO \"{schema}\".lines (Id, Headers, Body) VALUES (gen_random_uuid(), '{{}}', 'a line')")
    return QueueAddress("lines", schema)


def rows_of(raw, address: QueueAddress) -> list[tuple[object, ...]]:
    return sorted(map(tuple, raw.execute(f'SELECT * FROM "{address.schema}"."{address.table}"').fetchall()), key=str)


def test_a_table_with_a_queues_column_names_but_other_types_is_no_queue(raw, client, queue, lookalike) -> None:
    before = rows_of(raw, lookalike)
    calls = {
        "purge": lambda: client.purge(lookalike),
        "drop_queue": lambda: client.drop_queue(lookalike),
        "receive": lambda: client.receive(lookalike),
        "claim": lambda: client.claim(lookalike),
        "send": lambda: client.send(lookalike, Message("x")),
        "browse": lambda: client.browse(lookalike),
        "queue_stats": lambda: client.queue_stats(lookalike),
        "failed_messages": lambda: client.failed_messages(lookalike),
        "retry_errors": lambda: client.retry_errors(lookalike),
        "create_queue": lambda: client.create_queue(lookalike),
    }
    for name, call in calls.items():
        with pytest.raises(NotAQueueError, match="is not a queue table"):
            call()
        assert rows_of(raw, lookalike) == before, f"{name} changed the business table"
    assert lookalike not in client.queues()  # and the listing of the real queues still works
    assert queue in client.queues()


def test_a_delayed_message_bound_for_a_lookalike_table_goes_to_the_error_queue(raw, client, queue, lookalike) -> None:
    delayed = f'"{queue.schema}"."{queue.delayed().table}"'
    headers = f'{{"NServiceBus.SqlServer.ForwardDestination": "{lookalike.table}@\\"{lookalike.schema}\\""}}'
    raw.execute(
        f"INSERT INTO {delayed} (Headers, Body, Due) VALUES (%s, 'stray', now() - interval '1 minute')", (headers,)
    )
    client.send(queue, [Message(f"good {n}") for n in range(3)], delay=0.01)
    time.sleep(0.05)
    before = rows_of(raw, lookalike)
    assert client.move_due(queue) == 4  # every due message moved on: three to the queue, one to the error queue
    assert sorted(m.text for m in client.receive(queue, 10)) == ["good 0", "good 1", "good 2"]
    assert [m.body for m in client.browse(QueueAddress("error", queue.schema))] == [b"stray"]
    assert rows_of(raw, lookalike) == before


@pytest.mark.parametrize("which", ["error_queue", "audit_queue"])
def test_a_refused_installation_creates_nothing(backend, raw, schema, which) -> None:
    raw.execute(f'CREATE TABLE "{schema}".customers (Id int PRIMARY KEY, Name text)')
    customers = QueueAddress("customers", schema)
    audit = {"audit_queue": customers} if which == "audit_queue" else {}
    error = {"error_queue": customers} if which == "error_queue" else {}
    with QueueClient.connect(backend.uri, **audit) as client, pytest.raises(NotAQueueError):
        client.create_queue(QueueAddress("neworders", schema), **error)
    tables = {row[0] for row in raw.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (schema,)
    ).fetchall()}  # fmt: skip
    assert tables == {"customers"}


async def test_a_queue_cannot_be_its_own_error_queue(pg_uri, client, queue, schema) -> None:
    same = f'orders@"{schema}"'  # the queue, spelt otherwise
    with pytest.raises(InvalidArgumentError, match="cannot be that queue itself"):
        client.create_queue(QueueAddress("orders", schema), error_queue=same)
    client.send(queue, Message("waiting"))
    for call in (client.receive, client.claim):
        with pytest.raises(InvalidArgumentError, match="cannot be that queue itself"):
            call(queue, 1, error_queue=same)
    pool = open_pool(pg_uri, max_size=1)

    async def handler(message, connection):
        return None

    with pytest.raises(InvalidArgumentError, match="another error queue"):
        MessagePump(pool, queue, handler, error_queue=QueueAddress("orders", schema))
    await pool.close()
    assert client.depth(queue) == 1  # nothing was received
    error = QueueAddress("error", schema)
    client.send(error, Message("a failure"))
    assert [m.text for m in client.receive(error, 5)] == ["a failure"]  # draining the error queue is allowed


@pytest.mark.parametrize(
    "role", ["public", "PUBLIC", "pg_write_all_data", "a" * 63 + "_intended_role", "none"], ids=str.__len__
)
def test_sqlqueue_grants_refuses_a_role_a_grant_must_not_name(role) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "airflow_provider_sqlqueue.console", "grants", "orders", "--dialect", "postgres", "--role", role],
        capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": os.getcwd()},
    )  # fmt: skip
    assert run.returncode == 1 and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert "GRANT" not in run.stdout


@pytest.mark.parametrize(
    "arguments",
    [
        {"max_concurrency": "x"},
        {"max_concurrency": True},
        {"receive_batch_size": "5"},
        {"peek_batch_size": None},
        {"max_deliveries": "3"},
        {"move_delayed": "yes"},
        {"wake_on_notify": "yes"},
        {"error_queue": "error"},
        {"pool": None},
        {"pool": "postgresql://postgres@127.0.0.1/test"},
        {"queue": "orders"},
    ],
    ids=repr,
)
async def test_a_pump_given_wrong_arguments_refuses_them_with_the_librarys_error(pg_uri, arguments) -> None:
    pool = open_pool(pg_uri, max_size=1)

    async def handler(message, connection):
        return None

    given = {"pool": pool, "queue": QueueAddress("orders"), "handler": handler, **arguments}
    with pytest.raises(SqlQueueError):
        MessagePump(given.pop("pool"), given.pop("queue"), given.pop("handler"), **given)
    await pool.close()


def test_a_hook_whose_connection_is_not_defined_says_so(monkeypatch) -> None:
    from airflow_provider_sqlqueue.hooks.sqlqueue import ConnectionNotDefinedError, SqlQueueHook

    monkeypatch.delenv("AIRFLOW_CONN_NO_SUCH_CONN", raising=False)
    for conn_id in ("no_such_conn", "", None):
        with pytest.raises(ConnectionNotDefinedError) as raised:
            SqlQueueHook(conn_id).client()  # type: ignore[arg-type]
        assert isinstance(raised.value, TransportMisconfiguredError)  # permanent: not "retry later"


def test_a_lent_connection_the_caller_closed_is_misconfigured_not_unavailable(pg_uri, queue) -> None:
    connection = psycopg.connect(pg_uri, autocommit=True)
    client = QueueClient.connect(connection)
    connection.close()
    for _ in range(2):
        with pytest.raises(TransportMisconfiguredError, match="closed"):
            client.depth(queue)


# -- a third attack: the operators, the sensor's trigger and the task helpers ------------------------


def test_a_body_that_is_not_valid_unicode_is_the_librarys_error(conn_id, schema, client) -> None:
    from airflow_provider_sqlqueue.operators.sqlqueue import SendMessageOperator

    queue = QueueAddress("orders", schema)
    client.create_queue(queue)
    for body in (f"x{LONE}", {LONE: 1}):
        task = SendMessageOperator(task_id="send", queue_name=f'orders@"{schema}"', body=body, sqlqueue_conn_id=conn_id)
        with pytest.raises(InvalidArgumentError, match="not valid Unicode"):
            task.execute({})
    assert client.depth(queue) == 0


@pytest.mark.parametrize(
    "arguments",
    [
        {"subscribe_to": ["T" * 300]},
        {"subscribe_to": ["Shop.Placed"], "subscription_table": 'customers@"{schema}"'},
        {"notify_on_insert": "yes"},
    ],
    ids=["long topic", "business table", "notify_on_insert not a boolean"],
)
def test_a_refused_create_queue_task_creates_nothing(conn_id, schema, raw, arguments) -> None:
    from airflow_provider_sqlqueue.operators.sqlqueue import CreateQueueOperator

    raw.execute(f'CREATE TABLE "{schema}".customers (Id int PRIMARY KEY, Name text)')
    given = {key: [v.format(schema=schema) for v in value] if isinstance(value, list) else value.format(schema=schema)
             for key, value in arguments.items()}  # fmt: skip
    task = CreateQueueOperator(task_id="create", queue_name=f'neworders@"{schema}"', sqlqueue_conn_id=conn_id, **given)
    with pytest.raises(SqlQueueError):
        task.execute({})
    tables = {row[0] for row in raw.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (schema,)
    ).fetchall()}  # fmt: skip
    assert tables == {"customers"}


def test_the_metrics_task_refuses_a_string_and_fails_on_a_connection_it_cannot_read(conn_id) -> None:
    from airflow_provider_sqlqueue.operators.sqlqueue import QueueMetricsOperator

    with pytest.raises(ArgumentTypeError, match="list of connection ids"):
        QueueMetricsOperator(task_id="m", conn_ids="sqlqueue_test").execute({})
    with pytest.raises(SqlQueueError, match="no_such_conn"):
        QueueMetricsOperator(task_id="m", conn_ids=[conn_id, "no_such_conn"]).execute({})


def test_an_ack_task_refuses_a_switch_that_is_not_boolean(conn_id) -> None:
    from airflow_provider_sqlqueue.operators.sqlqueue import AckMessagesOperator

    with pytest.raises(ArgumentTypeError, match="fail_on_expired"):
        AckMessagesOperator(task_id="ack", messages=[], fail_on_expired="no", sqlqueue_conn_id=conn_id).execute({})


def test_hold_messages_takes_a_lease_in_seconds_and_refuses_nan(conn_id) -> None:
    from types import SimpleNamespace

    from airflow_provider_sqlqueue.tasks import hold_messages

    ti = SimpleNamespace(dag_id="d", task_id="t", run_id="r", try_number=1, map_index=-1)
    context = {"ti": ti, "task_instance": ti, "triggering_asset_events": {}}
    with hold_messages([], sqlqueue_conn_id=conn_id, lease=30.0, context=context) as held:
        assert held.messages == []
    with pytest.raises(SqlQueueError), hold_messages([], sqlqueue_conn_id=conn_id, lease=float("nan"), context=context):
        pass


@pytest.mark.parametrize(
    "arguments",
    [
        {"max_messages": "5"},
        {"queue_name": "a\x00"},
        {"error_queue": "e\x00"},
        {"sqlqueue_conn_id": 5},
        {"max_deliveries": 0},
        {"wake_on_notify": "yes"},
    ],
    ids=repr,
)
def test_a_trigger_refuses_bad_arguments_where_the_task_defers(arguments) -> None:
    from airflow_provider_sqlqueue.triggers.sqlqueue import SqlQueueTrigger

    with pytest.raises(SqlQueueError):
        SqlQueueTrigger(**{"sqlqueue_conn_id": "queue_db", "queue_name": "orders", **arguments})


def test_a_connection_lost_inside_a_transaction_is_not_replaced_mid_block(pg_uri, queue) -> None:
    """A call that meets the loss says "retry"; a retry inside the same block must not commit on a
    new connection by itself while the block's transaction is gone."""
    with QueueClient.connect(pg_uri) as client, psycopg.connect(pg_uri, autocommit=True) as admin:

        def block() -> None:
            with client.transaction():
                client.send(queue, Message("a"))
                admin.execute("SELECT pg_terminate_backend(%s)", (client.connection.info.backend_pid,))
                with pytest.raises(TransportUnavailableError):
                    client.send(queue, Message("b"))
                client.send(queue, Message("b"))  # the retry inside the dead block is refused too

        with pytest.raises(TransportUnavailableError):
            block()
        assert client.depth(queue) == 0  # neither committed: the block is all or nothing
        with client.transaction():  # and the next block runs on a new connection
            client.send(queue, Message("c"))
        assert [m.text for m in client.receive(queue, 5)] == ["c"]


async def test_an_async_client_refuses_a_blocking_connection(pg_uri) -> None:
    with (
        psycopg.connect(pg_uri, autocommit=True) as connection,
        pytest.raises(ArgumentTypeError, match="AsyncConnection"),
    ):
        await AsyncQueueClient.connect(connection)


# -- borrowed connections set up unlike the library's own --------------------------------------


class SubclassedConnection(psycopg.Connection):
    """A psycopg connection class of an application's own, defined outside psycopg."""


class SubclassedAsyncConnection(psycopg.AsyncConnection):
    """An asyncio psycopg connection class of an application's own."""


def _text_loaders(connection):
    """Loaders a caller may register on its connection: uuid, bytea, integers and times read as text."""
    from psycopg.types.string import TextLoader

    for name in ("uuid", "bytea", "int4", "int8", "timestamptz", "text", "jsonb"):
        connection.adapters.register_loader(name, TextLoader)
    return connection


#: Connections a caller may lend, each set up otherwise than psycopg's defaults.
BORROWED_SETUPS = {
    "dict_row": {"row_factory": psycopg.rows.dict_row},
    "namedtuple_row": {"row_factory": psycopg.rows.namedtuple_row},
    "scalar_row": {"row_factory": psycopg.rows.scalar_row},
    "client_cursor": {"cursor_factory": psycopg.ClientCursor},
    "raw_cursor": {"cursor_factory": psycopg.RawCursor},
    "subclass": {},
    "text_loaders": {},
}


def run_representative_calls(client, queue):
    """Send, browse, receive, claim and ack, native receive, inspection and health: what each returns."""
    client.send(queue, [Message("a", {"k": "v"}), Message("b"), Message("c"), Message("d")])
    seen = [(m.text, m.headers.get("k")) for m in client.browse(queue)]
    [received] = client.receive(queue, 1)
    claimed = client.claim(queue, 1)
    acked = client.ack(queue, [m.claim_token for m in claimed]) == {m.claim_token for m in claimed}
    with client.receive_native(queue) as native:
        native_text = native.text
    stats = client.queue_stats(queue)[0]
    health = client.health(queue)
    depth, peek = client.depth(queue), client.peek(queue)
    client.purge(queue)
    return (
        seen, received.text, [m.text for m in claimed], acked, native_text, stats.waiting, stats.in_flight,
        list(health.problems), depth, peek, client.horizon() is not None,
    )  # fmt: skip


@pytest.mark.parametrize("setup", sorted(BORROWED_SETUPS))
def test_a_borrowed_connection_set_up_otherwise_gives_the_same_results(pg_uri, client, queue, setup) -> None:
    expected = run_representative_calls(client, queue)
    cls = SubclassedConnection if setup == "subclass" else psycopg.Connection
    with cls.connect(pg_uri, autocommit=True, **BORROWED_SETUPS[setup]) as connection:
        if setup == "text_loaders":
            _text_loaders(connection)
        assert run_representative_calls(QueueClient.connect(connection), queue) == expected


@pytest.mark.parametrize("setup", ["dict_row", "raw_cursor", "text_loaders", "subclass"])
async def test_a_borrowed_async_connection_set_up_otherwise_gives_the_same_results(pg_uri, client, queue, setup):
    client.send(queue, [Message("a", {"k": "v"}), Message("b")])
    expected = [(m.id, m.text, m.headers) for m in client.browse(queue)]
    options = {
        "dict_row": {"row_factory": psycopg.rows.dict_row},
        "raw_cursor": {"cursor_factory": psycopg.AsyncRawCursor},
    }
    cls = SubclassedAsyncConnection if setup == "subclass" else psycopg.AsyncConnection
    connection = await cls.connect(pg_uri, autocommit=True, **options.get(setup, {}))
    try:
        if setup == "text_loaders":
            _text_loaders(connection)
        borrowed = await AsyncQueueClient.connect(connection)
        assert [(m.id, m.text, m.headers) for m in await borrowed.browse(queue)] == expected
        [claimed] = await borrowed.claim(queue, 1)
        assert await borrowed.ack(queue, claimed.claim_token) is True
        assert (await borrowed.health(queue)).problems == [] and await borrowed.depth(queue) == 1
    finally:
        await connection.close()


def test_a_cursor_given_where_a_connection_belongs_is_refused_by_name(pg_uri) -> None:
    with psycopg.connect(pg_uri, autocommit=True) as connection:
        for cursor in (connection.cursor(), psycopg.ClientCursor(connection), connection.cursor(name="server")):
            with pytest.raises(ArgumentTypeError, match="cursor was given where a connection belongs"):
                QueueClient.connect(cursor)


async def test_an_async_cursor_given_where_a_connection_belongs_is_refused_by_name(pg_uri) -> None:
    connection = await psycopg.AsyncConnection.connect(pg_uri, autocommit=True)
    try:
        with pytest.raises(ArgumentTypeError, match="cursor was given where a connection belongs"):
            await AsyncQueueClient.connect(connection.cursor())
    finally:
        await connection.close()


def test_a_connection_in_pipeline_mode_is_refused_with_why(pg_uri, queue) -> None:
    with psycopg.connect(pg_uri, autocommit=True) as connection:
        client = QueueClient.connect(connection)
        with connection.pipeline():
            for call in (lambda: client.send(queue, Message("x")), lambda: client.depth(queue)):
                with pytest.raises(TransportMisconfiguredError, match="pipeline mode"):
                    call()
        client.send(queue, Message("after"))  # outside the pipeline the connection serves again
        assert client.depth(queue) == 1


async def test_an_async_connection_in_pipeline_mode_is_refused_with_why(pg_uri, queue) -> None:
    connection = await psycopg.AsyncConnection.connect(pg_uri, autocommit=True)
    try:
        client = await AsyncQueueClient.connect(connection)
        async with connection.pipeline():
            with pytest.raises(TransportMisconfiguredError, match="pipeline mode"):
                await client.send(queue, Message("x"))
        assert await client.depth(queue) == 0
    finally:
        await connection.close()


#: Calls that create or use a table, each given a name in a schema that does not exist.
IN_A_MISSING_SCHEMA = {
    "create_queue": lambda c, s: c.create_queue(QueueAddress("orders", s)),
    "create_queue_alone": lambda c, s: c.create_queue(QueueAddress("orders", s), delayed=False),
    "create_subscription_table": lambda c, s: c.create_subscription_table(QueueAddress("routing", s)),
    "create_writes": lambda c, s: c.create_writes(QueueAddress("ledger", s)),
    "send": lambda c, s: c.send(QueueAddress("orders", s), Message("x")),
    "receive": lambda c, s: c.receive(QueueAddress("orders", s)),
    "depth": lambda c, s: c.depth(QueueAddress("orders", s)),
    "subscribe": lambda c, s: c.subscribe(QueueAddress("billing", s), "Topic", table=QueueAddress("routing", s)),
}


@pytest.mark.parametrize("call", sorted(IN_A_MISSING_SCHEMA))
def test_a_schema_that_does_not_exist_is_named_with_what_to_create(client, call) -> None:
    from airflow_provider_sqlqueue.transport import QueueNotFoundError

    with pytest.raises(QueueNotFoundError, match="CREATE SCHEMA") as caught:
        IN_A_MISSING_SCHEMA[call](client, "no_such_schema_anywhere")
    assert "create_queue" not in str(caught.value)  # the advice that cannot work: it makes no schema


def test_a_queue_missing_from_a_schema_that_exists_is_still_create_queues_to_make(client, schema) -> None:
    from airflow_provider_sqlqueue.transport import QueueNotFoundError

    with pytest.raises(QueueNotFoundError, match=r"create it first \(create_queue"):
        client.send(QueueAddress("nope", schema), Message("x"))


#: Calls that need a table of a kind other than a queue, each given one that is missing: the error
#: names the kind and the call that makes it (create_queue makes neither a subscription table nor a ledger).
MISSING_TABLE_OF_A_KIND = {
    "subscribe": (
        lambda c, s: c.subscribe(QueueAddress("orders", s), "T", table=QueueAddress("nosubs", s)),
        "create_subscription_table",
    ),
    "subscribers": (lambda c, s: c.subscribers("T", table=QueueAddress("nosubs", s)), "create_subscription_table"),
    "publish": (
        lambda c, s: c.publish("T", Message("x"), table=QueueAddress("nosubs", s)),
        "create_subscription_table",
    ),
    "record_write": (lambda c, s: c.record_write(QueueAddress("noledger", s), uuid.uuid4(), 0), "create_writes"),
    "forget_write": (lambda c, s: c.forget_write(QueueAddress("noledger", s), uuid.uuid4()), "create_writes"),
}


@pytest.mark.parametrize("call", sorted(MISSING_TABLE_OF_A_KIND))
def test_a_missing_table_of_another_kind_is_named_with_the_call_that_makes_it(client, queue, schema, call) -> None:
    from airflow_provider_sqlqueue.transport import QueueNotFoundError

    attempt, maker = MISSING_TABLE_OF_A_KIND[call]
    with pytest.raises(QueueNotFoundError, match=rf"create it first \({maker}") as caught:
        attempt(client, schema)
    assert "queue table" not in str(caught.value) and "create_queue" not in str(caught.value)


def test_a_missing_delayed_table_is_create_queues_to_add(client, queue, raw, schema) -> None:
    from airflow_provider_sqlqueue.transport import QueueNotFoundError

    raw.execute(f'DROP TABLE "{schema}"."orders.Delayed"')
    with pytest.raises(
        QueueNotFoundError, match=r"delayed-message table .* create it first \(create_queue, which adds"
    ):
        client.send(queue, Message("later"), delay=60)
    client.create_queue(queue)  # as the error says: the queue stays, its delayed table is added
    client.send(queue, Message("later"), delay=60)
