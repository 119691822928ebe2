"""The contract of every public entry point under hostile input.

Each registered entry point (``tests/surface.py``) is called, in a schema of its own, with:

- good values, from a session a DBA set up unlike the defaults (time zone +14:00, a non-ISO
  ``DateStyle``, ``IntervalStyle``, ``extra_float_digits``, ``bytea_output``; it must work:
  ``tests/test_session_settings.py`` has the whole catalogue); for a client's methods, once more
  on a connection the caller lends, set up unlike psycopg's defaults (``dict_row``, client-side
  cursors);
- each hostile value of each of its arguments' kinds (it must fail with the library's own error,
  never "unavailable, retry", and change no row of any table in the schema, checksummed before
  and after);
- a role without rights (the library's own error, not "unavailable"; nothing changed);
- a connection the server killed (``TransportUnavailableError``: that one may be retried).

No output -- error text, traceback, log -- may hold the connection's password. The surface is
discovered from the code: a public method, operator, CLI command, HTTP route or Spark option
that is not registered fails :func:`test_every_public_entry_point_is_registered`.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import traceback
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, AbstractContextManager, asynccontextmanager
from datetime import timedelta
from typing import Any
from urllib.parse import quote

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from airflow_provider_sqlqueue.transport import (
    AsyncQueueClient,
    Message,
    QueueAddress,
    QueueClient,
    SqlQueueError,
    TransactionAbortedError,
    TransportUnavailableError,
)
from tests.surface import ABSENT, CATALOGUE, KINDS, NO_INPUT, Kind, LockedHere, World, good_value

SECRET = "contract-s3cret"
#: How the lent connection of a second good-values call is set up: unlike psycopg's defaults, as an
#: application may set up its own (``tests/test_hostile_inputs.py`` tries each setup on its own).
BORROWED_SETUP = "a lent connection with dict_row rows and client-side cursors"
#: The session of the good-values call: settings a role or database default may carry.
ODD_SESSION = (
    "-c TimeZone=Pacific/Kiritimati -c DateStyle=SQL,DMY -c IntervalStyle=sql_standard "
    "-c extra_float_digits=-15 -c bytea_output=escape"
)

#: Every public method of QueueClient: the registry's first rows.
CLIENT = {
    "ack", "ack_held", "ack_locked", "address", "audit_address", "beside", "browse", "browse_columns", "browse_page", "canonical_address",
    "check_queue", "claim", "copies_sends", "claims", "close", "connect", "connection", "create_queue",
    "create_subscription_table", "create_writes", "database", "depth", "drop_queue", "error_address", "error_queues", "error_summary", "extend", "extend_held",
    "fail", "failed_messages", "forget_write", "forward", "health", "held", "held_columns", "hold", "horizon", "in_flight", "installation", "journey", "kind",
    "lapsed_claims", "lock", "meter", "move_due", "move_to_error", "nack", "nack_held", "nack_locked", "next_due", "peek", "publish", "purge",
    "purge_expired", "queue_page", "queue_stats", "queues", "receive", "receive_native", "record_write", "release_lapsed",
    "reserve", "retry_errors", "retry_errors_page", "send", "send_copied", "send_csv", "seq_range", "subscribe", "subscribers",
    "subscription_table", "take", "transaction", "unsubscribe",
}  # fmt: skip
#: AsyncQueueClient is the one implementation of the same API, with the asyncio-only wait for notifications.
ASYNC_CLIENT = CLIENT | {"wait_for_notifications"}
#: Entry points that parse names or report settings without touching the database.
PURE = {"address", "audit_address", "beside", "canonical_address", "error_address", "installation", "kind"}
PURE |= {"subscription_table", "database", "connection", "close", "meter", "copies_sends"}


def public_methods(cls: type) -> set[str]:
    return {name for name, _ in inspect.getmembers(cls) if not name.startswith("_")}


def test_every_public_entry_point_is_registered() -> None:
    assert public_methods(QueueClient) == CLIENT
    assert public_methods(AsyncQueueClient) == ASYNC_CLIENT
    for cls, names in ((QueueClient, CLIENT), (AsyncQueueClient, ASYNC_CLIENT)):
        for name in names - NO_INPUT:
            unclassified = set(parameters(getattr(cls, name))) - set(KINDS)
            assert not unclassified, f"{cls.__name__}.{name}: classify {unclassified} in tests/surface.py KINDS"


def parameters(function: Callable[..., Any]) -> dict[str, inspect.Parameter]:
    if isinstance(function, property):
        return {}
    return {
        name: p
        for name, p in inspect.signature(function).parameters.items()
        if name not in ("self", "cls") and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    }


# -- the world each entry point runs in ------------------------------------------------------------


def with_password(uri: str) -> str:
    """The test server's URI with a password (trust authentication ignores it): the secret no output may show."""
    params = conninfo_to_dict(uri)
    params.setdefault("password", SECRET)
    host = params.get("host", "127.0.0.1")
    if host.startswith("/"):  # a socket directory: keep the key=value form
        return make_conninfo("", **params)
    user, password = quote(params.get("user", "postgres"), safe=""), quote(params["password"], safe="")
    return f"postgresql://{user}:{password}@{host}:{params.get('port', 5432)}/{quote(params.get('dbname', 'test'))}"


def secret_of(uri: str) -> str:
    return str(conninfo_to_dict(uri)["password"])


@pytest.fixture
def world(pg_uri: str, raw_pg: psycopg.Connection[Any]) -> Iterator[World]:
    schema = f"c_{uuid.uuid4().hex[:12]}"
    raw_pg.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    uri = with_password(pg_uri)
    made = World(
        schema=schema,
        queue=QueueAddress("orders", schema),
        error=QueueAddress("error", schema),
        delayed_queue=QueueAddress("orders.Delayed", schema),
        customers=QueueAddress("customers", schema),
        lookalike=QueueAddress("ledger_lines", schema),
        subscriptions=QueueAddress("SubscriptionRouting", schema),
        ledger=QueueAddress("sqlqueue_writes", schema),
        uri=uri,
    )
    customers = sql.Identifier(schema, "customers")
    raw_pg.execute(sql.SQL("CREATE TABLE {} (Id int PRIMARY KEY, Name text, Body bytea)").format(customers))
    raw_pg.execute(sql.SQL("INSERT INTO {} VALUES (1, 'ada', 'a'), (2, 'bob', 'b')").format(customers))
    lookalike = sql.Identifier(schema, "ledger_lines")  # a queue's column names, other types
    raw_pg.execute(
        sql.SQL(
            "CREATE TABLE {} (Id uuid PRIMARY KEY, Expires timestamp, Headers jsonb, Body text, Seq serial)"
        ).format(lookalike)
    )
    raw_pg.execute(
        sql.SQL("INSERT INTO {} (Id, Headers, Body) VALUES (gen_random_uuid(), '{{}}', 'a line')").format(lookalike)
    )
    with QueueClient.connect(uri, error_queue=made.error) as client:
        client.create_queue(made.queue)
        client.create_subscription_table(made.subscriptions)
        client.create_writes(made.ledger)
        client.subscribe(made.queue, "Contract.Events.Something", table=made.subscriptions)
        client.send(made.queue, [Message(f"waiting {n}") for n in range(3)])
        client.send(made.queue, Message("later"), delay=3600)
        client.send(made.queue, Message("claimed"))
        client.claim(made.queue, 1, holder="contract-holder")
        client.send(made.queue, Message("failed"))
        [failed] = client.receive(made.queue, 1)
        client.move_to_error(made.queue, failed, "it failed")
    try:
        yield made
    finally:
        raw_pg.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


@pytest.fixture(scope="module")
def raw_pg(pg_uri: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(pg_uri, autocommit=True) as connection:
        yield connection


@pytest.fixture(scope="module")
def nobody(pg_uri: str, raw_pg: psycopg.Connection[Any]) -> Iterator[str]:
    """A role that may log in and nothing more: the URI it connects with."""
    role = f"contract_nobody_{uuid.uuid4().hex[:8]}"
    raw_pg.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    try:
        yield make_conninfo(with_password(pg_uri), user=role)
    finally:
        raw_pg.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def checksums(raw: psycopg.Connection[Any], schema: str) -> dict[str, str]:
    """Every table of the schema, each row's text hashed in order: what "nothing changed" compares."""
    tables = raw.execute(
        "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relkind = 'r' ORDER BY 1",
        (schema,),
    ).fetchall()
    sums = {}
    for (table,) in tables:
        query = sql.SQL("SELECT md5(coalesce(string_agg(t::text, '|' ORDER BY t::text), '')) FROM {} t").format(
            sql.Identifier(schema, table)
        )
        sums[table] = raw.execute(query).fetchone()[0]
    return sums


# -- calling an entry point ----------------------------------------------------------------------


#: Optional parameters given a good value all the same: left out, the call would reach no table
#: (``health()`` of every queue a role without rights may read: none), and prove nothing; or a
#: subscription table in the default schema that every test running at once shares, whose rows
#: name other tests' queues (a publish reached a queue another test had dropped).
ALWAYS_GIVEN = {"queues", "table", "subscription_table"}


def arguments(function: Callable[..., Any], world: World, hostile: tuple[str, Any] | None = None) -> dict[str, Any]:
    """Good values for the required parameters, and the hostile one when given (by name)."""
    chosen: dict[str, Any] = {}
    for name, p in parameters(function).items():
        if p.default is inspect.Parameter.empty or name in ALWAYS_GIVEN:
            chosen[name] = good_value(KINDS[name], name, world)
    if hostile is not None:
        chosen[hostile[0]] = hostile[1]
    return chosen


#: Calls that work on rows a transaction holds locked: each is made in a transaction block, in which
#: the good batch of a settle is locked first (LockedHere).
IN_A_TRANSACTION = {"lock", "ack_locked", "nack_locked"}


def call_sync(client: QueueClient, name: str, kwargs: dict[str, Any]) -> Any:
    if name == "connect":
        with QueueClient.connect(**kwargs):
            return None
    if name in IN_A_TRANSACTION:
        with client.transaction():
            if isinstance(kwargs.get("batch"), LockedHere):
                kwargs = {**kwargs, "batch": client.lock(kwargs["batch"].queue, 1)}
            return getattr(client, name)(**kwargs)
    member = getattr(client, name)
    if not callable(member):
        return member
    result = member(**kwargs)
    if isinstance(result, AbstractContextManager):
        with result:
            pass
    return result


async def call_async(client: AsyncQueueClient, name: str, kwargs: dict[str, Any]) -> Any:
    if name == "connect":
        opened = await AsyncQueueClient.connect(**kwargs)
        await opened.close()
        return None
    if name in IN_A_TRANSACTION:
        async with client.transaction():
            if isinstance(kwargs.get("batch"), LockedHere):
                kwargs = {**kwargs, "batch": await client.lock(kwargs["batch"].queue, 1)}
            return await getattr(client, name)(**kwargs)
    member = getattr(client, name)
    if not callable(member):
        return member
    result = member(**kwargs)
    if isinstance(result, AbstractAsyncContextManager):
        async with result:
            pass
        return None
    return await result if inspect.isawaitable(result) else result


def problems_of(
    outcome: BaseException | None, *, kind: Kind | None, secret: str, logs: str, expect_unavailable: bool = False
) -> list[str]:
    """What is wrong with how a call ended (an empty list: it kept the contract)."""
    found = []
    if outcome is None:
        if kind is not Kind.ERROR:
            found.append("accepted")
    elif expect_unavailable:
        if not isinstance(outcome, TransportUnavailableError):
            found.append(f"{type(outcome).__name__} where TransportUnavailableError was due: {outcome!s:.200}")
    elif not isinstance(outcome, SqlQueueError):
        found.append(f"raised {type(outcome).__module__}.{type(outcome).__name__}: {outcome!s:.200}")
    elif isinstance(outcome, TransportUnavailableError):
        found.append(f"'unavailable, retry' for a permanent problem: {outcome!s:.200}")
    if outcome is not None:
        text = "".join(traceback.format_exception(type(outcome), outcome, outcome.__traceback__))
        if secret in text:
            found.append("the password is in the error or its traceback")
    if secret in logs:
        found.append("the password is in the log")
    return found


#: Installers: a name that reaches no table yet is theirs to create.
CREATORS = {"create_queue", "create_subscription_table", "create_writes"}
#: What a name that reaches no table may leave as it is: an installer creates it, a drop has nothing to drop.
IDEMPOTENT = CREATORS | {"drop_queue"}
#: Entry points a role without rights may call: they only read the catalog (a queue's layout, its
#: notifications, the queues it may read: none), or find nothing to do (an installer whose tables exist).
NEEDS_NO_RIGHTS = PURE | CREATORS | {"connect", "check_queue", "wait_for_notifications", "queue_page", "horizon"}


def hostile_cases(name: str, function: Callable[..., Any], world: World) -> Iterator[tuple[str, Kind, tuple[str, Any]]]:
    for parameter in parameters(function):
        kind = KINDS[parameter]
        if kind is Kind.QUEUE and (name in PURE or name == "connect"):
            kind = Kind.NAME  # parsed only: any well-formed name is theirs to accept
        for label, value in CATALOGUE[kind](world):
            if name == "connect" and kind is Kind.AUDIT and isinstance(value, QueueAddress):
                continue  # an audit queue is judged against the queue it audits, when one is used
            yield f"{parameter}={label}", kind, (parameter, value)


async def exercise(
    name: str,
    function: Callable[..., Any],
    invoke: Callable[[dict[str, Any]], Any],
    connect: Callable[[str], Any],
    world: World,
    raw: psycopg.Connection[Any],
    nobody: str,
    caplog: pytest.LogCaptureFixture,
    *,
    killable: bool = True,
    idempotent: set[str] = IDEMPOTENT,
    borrowed: Callable[[str], Any] | None = None,
) -> list[str]:
    """Run one entry point through the whole catalogue; return what broke its contract.

    ``invoke(kwargs)`` calls it on the current client, ``connect(uri)`` opens that client (an
    async context manager). The good call runs last, as destructive ones (drop, purge) must.
    """
    secret, failures = secret_of(world.uri), []

    async def attempt(kwargs: dict[str, Any]) -> BaseException | None:
        caplog.clear()
        try:
            await invoke(kwargs)
        except Exception as exc:
            return exc
        return None

    async with connect(world.uri) as client:
        for label, kind, hostile in hostile_cases(name, function, world):
            before = checksums(raw, world.schema)
            outcome = await attempt({**arguments(function, world, hostile), "__client": client})
            creates = name in idempotent and label.split("=", 1)[1] in ABSENT
            if not (creates and outcome is None):
                failures += [f"{label}: {p}" for p in problems_of(outcome, kind=kind, secret=secret, logs=caplog.text)]
            after = checksums(raw, world.schema)
            if kind is not Kind.ERROR and {t: after.get(t) for t in before} != before:
                failures.append(f"{label}: rows changed")

    if name not in NEEDS_NO_RIGHTS:
        before = checksums(raw, world.schema)
        async with connect(nobody) as client:
            outcome = await attempt({**arguments(function, world), "__client": client})
        failures += [f"role without rights: {p}" for p in problems_of(outcome, kind=None, secret=secret, logs="")]
        if checksums(raw, world.schema) != before:
            failures.append("role without rights: rows changed")

    if killable and name not in PURE and name != "connect":
        async with connect(world.uri) as client:
            raw.execute("SELECT pg_terminate_backend(%s)", (client.connection.info.backend_pid,))
            outcome = await attempt({**arguments(function, world), "__client": client})
        problems = problems_of(outcome, kind=None, secret=secret, logs="", expect_unavailable=True)
        failures += [f"killed connection: {p}" for p in problems]

    odd = make_conninfo(world.uri, options=ODD_SESSION)
    async with connect(odd) as client:
        outcome = await attempt({**arguments(function, world), "__client": client})
    if outcome is not None:
        failures.append(f"good values, odd session settings: {type(outcome).__name__}: {outcome!s:.300}")
    if borrowed is not None and name != "connect":
        async with borrowed(world.uri) as client:
            outcome = await attempt({**arguments(function, world), "__client": client})
        if outcome is not None:
            failures.append(f"good values, {BORROWED_SETUP}: {type(outcome).__name__}: {outcome!s:.300}")
    return failures


@pytest.mark.parametrize("name", sorted(CLIENT - NO_INPUT - {"connection", "database"}))
def test_a_client_method_keeps_its_contract(
    name: str, world: World, raw_pg: psycopg.Connection[Any], nobody: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="airflow_provider_sqlqueue")

    @asynccontextmanager
    async def connect(uri: str) -> AsyncIterator[QueueClient]:
        with QueueClient.connect(uri, error_queue=world.error) as client:
            yield client

    @asynccontextmanager
    async def borrowed(uri: str) -> AsyncIterator[QueueClient]:
        lent = psycopg.Connection.connect(
            uri, autocommit=True, row_factory=psycopg.rows.dict_row, cursor_factory=psycopg.ClientCursor
        )
        try:
            yield QueueClient.connect(lent, error_queue=world.error)
        finally:
            lent.close()

    async def invoke(kwargs: dict[str, Any]) -> None:
        client = kwargs.pop("__client")
        call_sync(client, name, kwargs)

    function = getattr(QueueClient, name)
    failures = asyncio.run(exercise(name, function, invoke, connect, world, raw_pg, nobody, caplog, borrowed=borrowed))
    assert not failures, f"QueueClient.{name}:\n" + "\n".join(failures)


@pytest.mark.parametrize("name", sorted(CLIENT - PURE - {"connect"}))
def test_a_client_method_after_a_caught_database_error_in_a_block_says_transaction_aborted(
    name: str, world: World, raw_pg: psycopg.Connection[Any]
) -> None:
    """A block's code caught a database error (the transaction is aborted): any call after it is
    refused with TransactionAbortedError -- not a generic rejection, not "unavailable" -- and the
    block commits nothing."""
    before = checksums(raw_pg, world.schema)
    kwargs = arguments(getattr(QueueClient, name), world)
    with (
        QueueClient.connect(world.uri, error_queue=world.error) as client,
        pytest.raises(TransactionAbortedError, match="error was caught"),
    ):
        call_after_a_caught_error(client, name, kwargs)
    assert checksums(raw_pg, world.schema) == before


def call_after_a_caught_error(client: QueueClient, name: str, kwargs: dict[str, Any]) -> None:
    with client.transaction():
        try:
            client.connection.execute("SELECT 1 / 0")
        except psycopg.Error:
            pass
        call_sync(client, name, kwargs)


@pytest.mark.parametrize("name", sorted(ASYNC_CLIENT - NO_INPUT - {"connection", "database"}))
def test_an_async_client_method_keeps_its_contract(
    name: str, world: World, raw_pg: psycopg.Connection[Any], nobody: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="airflow_provider_sqlqueue")

    @asynccontextmanager
    async def connect(uri: str) -> AsyncIterator[AsyncQueueClient]:
        client = await AsyncQueueClient.connect(uri, error_queue=world.error)
        try:
            yield client
        finally:
            await client.close()

    @asynccontextmanager
    async def borrowed(uri: str) -> AsyncIterator[AsyncQueueClient]:
        lent = await psycopg.AsyncConnection.connect(
            uri, autocommit=True, row_factory=psycopg.rows.dict_row, cursor_factory=psycopg.AsyncClientCursor
        )
        try:
            yield await AsyncQueueClient.connect(lent, error_queue=world.error)
        finally:
            await lent.close()

    async def invoke(kwargs: dict[str, Any]) -> None:
        client = kwargs.pop("__client")
        await call_async(client, name, kwargs)

    function = getattr(AsyncQueueClient, name)
    failures = asyncio.run(exercise(name, function, invoke, connect, world, raw_pg, nobody, caplog, borrowed=borrowed))
    assert not failures, f"AsyncQueueClient.{name}:\n" + "\n".join(failures)


#: Every public member of SqlQueueHook (its own: BaseHook's are Airflow's). The hook only hands out
#: clients, so its input is its settings: what a caller gives the constructor.
HOOK = {
    "aconnection", "async_client", "audit_queue", "client", "connection", "conninfo", "dialect_name",
    "error_queue", "get_conn", "meter", "test_connection",
}  # fmt: skip
#: The hook's settings -> their kinds (an error queue is only parsed until a failure needs it).
HOOK_SETTINGS = {"sqlqueue_conn_id": Kind.CONN_ID, "error_queue": Kind.NAME, "audit_queue": Kind.AUDIT}


def test_every_hook_member_is_registered() -> None:
    from airflow_provider_sqlqueue.hooks.sqlqueue import SqlQueueHook

    public = {
        name
        for name, member in vars(SqlQueueHook).items()
        if not name.startswith("_") and (callable(member) or isinstance(member, property))
    }
    assert public - {"get_ui_field_behaviour", "get_connection_form_widgets"} == HOOK
    assert HOOK <= NO_INPUT
    assert set(parameters(SqlQueueHook.__init__)) - {"connection"} == set(HOOK_SETTINGS)


def airflow_connection_of(uri: str) -> Any:
    from airflow.sdk import Connection

    params = conninfo_to_dict(uri)
    return Connection(
        conn_id="contract",
        conn_type="postgres",
        host=params.get("host"),
        port=int(params["port"]) if params.get("port") else None,
        login=params.get("user"),
        password=params.get("password"),
        schema=params.get("dbname"),
    )


async def use_hook(way: str, settings: dict[str, Any]) -> None:
    """Build a hook from ``settings`` and use it ``way``; a refused setting raises."""
    from airflow_provider_sqlqueue.hooks.sqlqueue import SqlQueueHook

    hook = SqlQueueHook(**{"sqlqueue_conn_id": "contract", **settings})
    if way == "client":
        with hook.client():
            return
    if way == "async_client":
        async with await hook.async_client():
            return
    if way == "conninfo":
        await asyncio.to_thread(hook.conninfo)
        return
    ok, text = await asyncio.to_thread(hook.test_connection)
    if not ok:
        raise SqlQueueError(text)  # the UI shows the text: judged as an error would be


@pytest.mark.parametrize("way", ["client", "async_client", "conninfo", "test_connection"])
def test_the_hooks_settings_keep_their_contract(
    way: str, world: World, raw_pg: psycopg.Connection[Any], caplog: pytest.LogCaptureFixture, airflow_db: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """Each hostile setting fails the hook's use with the library's own error, changes nothing and
    leaks no password; the connection id is looked up on every way of using the hook, the queue
    settings are checked by the clients it hands out."""
    monkeypatch.setenv("AIRFLOW_CONN_CONTRACT", airflow_connection_of(world.uri).get_uri())
    monkeypatch.setenv("AIRFLOW_CONN_CONTRACT_HTTP", "http://app:contract-s3cret@example.com")
    caplog.set_level(logging.DEBUG, logger="airflow_provider_sqlqueue")
    secret, failures = secret_of(world.uri), []
    for parameter, kind in HOOK_SETTINGS.items():
        if kind is not Kind.CONN_ID and way in ("conninfo", "test_connection"):
            continue  # neither reads the queue settings
        for label, value in CATALOGUE[kind](world):
            if kind is Kind.AUDIT and isinstance(value, QueueAddress):
                continue  # an audit queue is judged against the queue it audits, when one is used
            caplog.clear()
            before = checksums(raw_pg, world.schema)
            outcome: BaseException | None = None
            try:
                asyncio.run(use_hook(way, {parameter: value}))
            except Exception as exc:  # judged below
                outcome = exc
            failures += [
                f"{parameter}={label}: {p}" for p in problems_of(outcome, kind=kind, secret=secret, logs=caplog.text)
            ]
            if checksums(raw_pg, world.schema) != before:
                failures.append(f"{parameter}={label}: rows changed")
    asyncio.run(use_hook(way, {"error_queue": str(world.error)}))  # and the good settings work
    assert not failures, f"SqlQueueHook ({way}):\n" + "\n".join(failures)


# -- the pump, its pool and the lease keeper -----------------------------------------------------

#: The transport's other public classes -> their public members. Their input is what their
#: constructors take: each constructor parameter is classified in KINDS and run through its
#: catalogue below.
PUMP = {"meter", "run", "stop"}
POOL = {"close", "listener", "open", "session"}
LEASE_KEEPER = {"renew", "stop_renewing"}
CLASSES = {
    "QueueClient": CLIENT,
    "AsyncQueueClient": ASYNC_CLIENT,
    "MessagePump": PUMP,
    "AsyncPsycopgPool": POOL,
    "LeaseKeeper": LEASE_KEEPER,
}
#: The values the catalogue is made of (tests/test_transport_message.py and
#: tests/test_transport_addressing.py hold their hostile cases), and the driver session through
#: which a caller lends a connection (tests/test_hostile_inputs.py). Errors are not listed.
VALUES = {"Message", "ReceivedMessage", "QueueAddress", "Failure", "TransactionMode", "PsycopgSession"}


def test_every_public_class_of_the_transport_is_registered() -> None:
    from airflow_provider_sqlqueue import transport

    errors = {name for name in transport.__all__ if issubclass(getattr(transport, name), Exception)}
    assert set(transport.__all__) - errors == set(CLASSES) | VALUES
    for name, members in CLASSES.items():
        cls = getattr(transport, name)
        assert public_methods(cls) == members, name
        if name.endswith("QueueClient"):
            continue  # built by connect(), whose arguments are registered above
        unclassified = set(parameters(cls.__init__)) - set(KINDS)
        assert not unclassified, f"{name}: classify {unclassified} in tests/surface.py KINDS"


async def _handle(message: Any, connection: Any) -> None:
    """A good handler: it only has to succeed."""


#: The pump's good arguments besides the pool: a short peek, so a hostile run shows itself quickly.
def pump_arguments(world: World) -> dict[str, Any]:
    return {"queue": world.queue, "handler": _handle, "error_queue": world.error, "peek_interval": 0.2}


async def run_pump(uri: str, arguments: dict[str, Any], until_handled: int = 0) -> BaseException | None:
    """Build and run a pump on ``uri``; None when it ran (for a few peeks, or until ``until_handled``
    messages were handled), else what stopped it.

    A pump is a long-running loop that rides out what may pass (an outage); what cannot pass -- a
    wrong argument, a table that is no queue, missing rights -- must stop it with the library's own
    error, at construction or as it starts. ``arguments`` may name its own ``pool``.
    """
    from airflow_provider_sqlqueue.transport import MessagePump
    from airflow_provider_sqlqueue.transport.drivers import open_pool

    given = dict(arguments)
    pool = open_pool(uri, max_size=2)
    try:
        pump = MessagePump(given.pop("pool", pool), given.pop("queue"), given.pop("handler"), **given)
        running = asyncio.ensure_future(pump.run())
        try:
            for _ in range(50):  # five seconds of peeks, or until the messages were handled
                await asyncio.wait([running], timeout=0.1)
                if running.done() or (until_handled and pump.handled >= until_handled):
                    break
            if running.done():
                running.result()
            elif until_handled and pump.handled < until_handled:
                return AssertionError(f"handled {pump.handled} of {until_handled}")
        finally:
            pump.stop()
            await asyncio.gather(running, return_exceptions=True)
    except Exception as exc:
        return exc
    finally:
        await pool.close()
    return None


def test_the_pump_keeps_its_contract(
    world: World, raw_pg: psycopg.Connection[Any], nobody: str, caplog: pytest.LogCaptureFixture
) -> None:
    from airflow_provider_sqlqueue.transport import MessagePump

    caplog.set_level(logging.DEBUG, logger="airflow_provider_sqlqueue")
    secret, failures = secret_of(world.uri), []
    for parameter in parameters(MessagePump.__init__):
        kind = KINDS[parameter]
        for label, value in CATALOGUE[kind](world):
            caplog.clear()
            before = checksums(raw_pg, world.schema)
            outcome = asyncio.run(run_pump(world.uri, {**pump_arguments(world), parameter: value}))
            failures += [
                f"{parameter}={label}: {p}" for p in problems_of(outcome, kind=kind, secret=secret, logs=caplog.text)
            ]
            if checksums(raw_pg, world.schema) != before:
                failures.append(f"{parameter}={label}: rows changed")

    before = checksums(raw_pg, world.schema)
    outcome = asyncio.run(run_pump(nobody, pump_arguments(world)))
    failures += [f"role without rights: {p}" for p in problems_of(outcome, kind=None, secret=secret, logs="")]
    if checksums(raw_pg, world.schema) != before:
        failures.append("role without rights: rows changed")

    odd = make_conninfo(world.uri, options=ODD_SESSION)
    outcome = asyncio.run(run_pump(odd, pump_arguments(world), until_handled=3))
    if outcome is not None:
        failures.append(f"good values, odd session settings: {type(outcome).__name__}: {outcome!s:.300}")
    assert not failures, "MessagePump:\n" + "\n".join(failures)


def test_the_pool_keeps_its_contract(world: World, caplog: pytest.LogCaptureFixture) -> None:
    """The pool is built from a connection target and sizes: a hostile one is refused when the pool
    is built or first used -- never an endless "unavailable" for a target no retry can reach."""
    from airflow_provider_sqlqueue.transport import AsyncPsycopgPool

    async def use(arguments: dict[str, Any]) -> BaseException | None:
        try:
            pool = AsyncPsycopgPool(**arguments)
        except Exception as exc:
            return exc
        try:
            await pool.open()
            async with pool.session():
                pass
            listener = await pool.listener()
            if listener is not None:
                await listener.close()
        except Exception as exc:
            return exc
        finally:
            await pool.close()
        return None

    caplog.set_level(logging.DEBUG, logger="airflow_provider_sqlqueue")
    secret, failures = secret_of(world.uri), []
    good = {"conninfo": world.uri, "max_size": 2, "min_size": 1}
    for parameter in parameters(AsyncPsycopgPool.__init__):
        kind = KINDS[parameter]
        for label, value in CATALOGUE[kind](world):
            caplog.clear()
            outcome = asyncio.run(use({**good, parameter: value}))
            failures += [
                f"{parameter}={label}: {p}" for p in problems_of(outcome, kind=kind, secret=secret, logs=caplog.text)
            ]
    if (outcome := asyncio.run(use(good))) is not None:
        failures.append(f"good values: {type(outcome).__name__}: {outcome!s:.300}")
    assert not failures, "AsyncPsycopgPool:\n" + "\n".join(failures)


def test_the_lease_keeper_keeps_its_contract(world: World, raw_pg: psycopg.Connection[Any]) -> None:
    """The keeper renews claims it is given: hostile claims or leases are refused as it is built or
    enters, and change nothing."""
    from airflow_provider_sqlqueue.transport import LeaseKeeper

    def use(arguments: dict[str, Any]) -> BaseException | None:
        try:
            with LeaseKeeper(**arguments):
                pass
        except Exception as exc:
            return exc
        return None

    def open_client() -> QueueClient:
        return QueueClient.connect(world.uri, error_queue=world.error)

    secret, failures = secret_of(world.uri), []
    good = {"open_client": open_client, "claims": {world.queue: [uuid.uuid4()]}, "lease": timedelta(seconds=30)}
    for parameter in parameters(LeaseKeeper.__init__):
        kind = KINDS[parameter]
        for label, value in CATALOGUE[kind](world):
            before = checksums(raw_pg, world.schema)
            outcome = use({**good, parameter: value})
            failures += [f"{parameter}={label}: {p}" for p in problems_of(outcome, kind=kind, secret=secret, logs="")]
            if checksums(raw_pg, world.schema) != before:
                failures.append(f"{parameter}={label}: rows changed")
    if (outcome := use(good)) is not None:
        failures.append(f"good values: {type(outcome).__name__}: {outcome!s:.300}")
    assert not failures, "LeaseKeeper:\n" + "\n".join(failures)
