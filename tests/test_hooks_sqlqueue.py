"""Unit behaviour of :mod:`airflow_provider_sqlqueue.hooks.sqlqueue`: connections in, clients out.

The hook owns the connection settings and hands out clients; every queue operation is the
client's (its own tests are in ``test_transport_client.py`` and the behaviour suites).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import traceback
import uuid

import pytest
from psycopg.conninfo import conninfo_to_dict

from airflow_provider_sqlqueue.hooks.sqlqueue import SqlQueueHook, UnsupportedConnectionError
from airflow_provider_sqlqueue.transport import (
    ArgumentTypeError,
    AsyncQueueClient,
    ClientClosedError,
    InvalidQueueNameError,
    Message,
    QueueClient,
    QueueNotFoundError,
    TransportMisconfiguredError,
    TransportUnavailableError,
)

from .conftest import airflow_connection

pytestmark = pytest.mark.postgres_only


def test_a_hook_client_runs_the_whole_queue_api(conn_id, queue, schema):
    hook = SqlQueueHook(conn_id, error_queue=f'error@"{schema}"')
    name = f'orders@"{schema}"'
    assert hook.dialect_name == "postgres"
    assert hook.test_connection() == (True, "Connected (postgres)")
    with hook.client() as client:
        assert isinstance(client, QueueClient)
        client.send(name, [Message("a"), Message("b"), Message("c")])
        [claimed] = client.claim(name)
        assert claimed.text == "a" and client.in_flight(name) == 1
        assert client.nack(name, [claimed.claim_token], error="try later") == {claimed.claim_token}
        [again] = client.claim(name)
        assert again.id == claimed.id and again.deliveries == 2
        assert client.ack(name, [again.claim_token]) == {again.claim_token}
        [gone] = client.receive(name)
        assert gone.text == "b"
        with client.receive_native(name) as message:
            client.connection.execute(f'CREATE TABLE "{schema}".handled (body text)')
            client.connection.execute(f'INSERT INTO "{schema}".handled VALUES (%s)', [message.text])
        assert client.depth(name) == 0
    assert client.session.connection.closed  # the with block closed the connection the hook opened


async def test_an_async_client_comes_from_the_same_settings(conn_id, queue, schema):
    hook = SqlQueueHook(conn_id)
    async with await hook.async_client() as client:
        assert isinstance(client, AsyncQueueClient)
        await client.send(queue, Message("from the triggerer"))
        [message] = await client.receive(queue)
        assert message.text == "from the triggerer"


async def test_the_postgres_providers_settings_reach_every_connection(airflow_db, pg_uri, monkeypatch, queue):
    """Connections are opened by PostgresHook.get_conn: its extras (here a libpq option) apply to the
    blocking client, the asyncio client and the connection string handed to other processes."""
    conn = json.loads(airflow_connection(pg_uri))
    conn["extra"] = {"application_name": "sqlqueue-hook-test", "error_queue": "failed"}
    monkeypatch.setenv("AIRFLOW_CONN_TUNED", json.dumps(conn))
    hook = SqlQueueHook("tuned")
    with hook.client() as client:
        assert client.connection.execute("SHOW application_name").fetchone() == ("sqlqueue-hook-test",)
        assert client.connection.info.get_parameters()["connect_timeout"] == "10"  # the transport's default
    async with await hook.async_client() as aclient:
        cursor = await aclient.session.connection.execute("SHOW application_name")
        assert await cursor.fetchone() == ("sqlqueue-hook-test",)
    conninfo = hook.conninfo()
    assert "application_name=sqlqueue-hook-test" in conninfo and "failed" not in conninfo
    with QueueClient.connect(conninfo) as other:
        assert other.depth(queue) == 0


def test_a_connection_the_server_dropped_is_opened_again(conn_id, queue, raw):
    with SqlQueueHook(conn_id).client() as client:
        client.send(queue, Message("x"))
        pid = client.connection.info.backend_pid
        raw.execute("SELECT pg_terminate_backend(%s)", [pid])
        with pytest.raises(TransportUnavailableError):
            client.depth(queue)
        assert client.depth(queue) == 1 and client.connection.info.backend_pid != pid


def test_queue_extras_configure_the_hook_and_never_reach_the_driver(
    airflow_db, pg_uri, schema, client, queue, monkeypatch
):
    conn = json.loads(airflow_connection(pg_uri, dialect="postgres", error_queue=f'error@"{schema}"', audit_queue=True))
    conn["conn_type"] = "sqlqueue"
    monkeypatch.setenv("AIRFLOW_CONN_QUEUES", json.dumps(conn))
    hook = SqlQueueHook("queues")
    assert hook.dialect_name == "postgres" and hook.error_queue == f'error@"{schema}"' and hook.audit_queue is True
    with hook.client() as own:
        own.send(f'orders@"{schema}"', Message("x"))
    assert client.depth(queue) == 1


def test_connections_no_queue_can_use_are_refused_clearly(airflow_db, pg_uri, monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_WEB", json.dumps({"conn_type": "http", "host": "example.com"}))
    with pytest.raises(UnsupportedConnectionError, match="has type 'http'; a queue needs a postgres, mssql, odbc"):
        SqlQueueHook("web").client()
    monkeypatch.setenv("AIRFLOW_CONN_ODD", json.dumps({"conn_type": "sqlqueue", "extra": {"dialect": "oracle"}}))
    with pytest.raises(UnsupportedConnectionError, match="extra 'dialect' is 'oracle'"):
        SqlQueueHook("odd").client()
    conn = json.loads(airflow_connection(pg_uri))
    conn["extra"] = {"cursor": "dictcursor"}
    monkeypatch.setenv("AIRFLOW_CONN_DICTS", json.dumps(conn))
    with pytest.raises(UnsupportedConnectionError, match="'cursor' extra changes row types"):
        SqlQueueHook("dicts").client()


def test_missing_queue_is_a_clear_error(conn_id, schema):
    with SqlQueueHook(conn_id).client() as client, pytest.raises(QueueNotFoundError, match="nowhere"):
        client.send(f'nowhere@"{schema}"', Message("x"))


def test_unreachable_database_is_a_clear_error_without_the_password(airflow_db, monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_DOWN", airflow_connection("postgresql://postgres:s3cret-pw@127.0.0.1:1/test"))
    ok, text = SqlQueueHook("down").test_connection()
    assert not ok and "127.0.0.1" in text and "s3cret-pw" not in text
    with pytest.raises(TransportUnavailableError) as caught:
        SqlQueueHook("down").client()
    assert "s3cret-pw" not in str(caught.value)


#: Run in a fresh interpreter where ``import pyodbc`` fails as it does on a host without unixODBC,
#: and pymssql as on a host that installed neither SQL Server extra.
WITHOUT_ODBC = textwrap.dedent(
    """
    import sys

    class NoOdbc:
        def find_spec(self, name, path=None, target=None):
            if name == "pyodbc":
                raise ImportError("libodbc.so.2: cannot open shared object file: No such file or directory")
            if name == "pymssql":
                raise ImportError("No module named 'pymssql'")
            return None

    sys.meta_path.insert(0, NoOdbc())

    import airflow_provider_sqlqueue.cli
    import airflow_provider_sqlqueue.operators.sqlqueue
    import airflow_provider_sqlqueue.plugins.sqlqueue
    import airflow_provider_sqlqueue.sensors.sqlqueue
    import airflow_provider_sqlqueue.triggers.sqlqueue
    from airflow_provider_sqlqueue.hooks.sqlqueue import SqlQueueHook, UnsupportedConnectionError
    from airflow_provider_sqlqueue.transport import Message

    queue = 'orders@"' + sys.argv[1] + '"'
    with SqlQueueHook("queue_db").client() as client:
        client.create_queue(queue)
        client.send(queue, Message("without odbc"))
        print("RESULT", [m.text for m in client.receive(queue, 5)])
        client.drop_queue(queue)
    for conn_id in ("odbc_db", "mssql_db"):
        try:
            SqlQueueHook(conn_id).client()
        except UnsupportedConnectionError as exc:
            print("RESULT hook:", exc)
    from airflow_provider_sqlqueue.transport import QueueClient, TransportMisconfiguredError
    for uri in ("mssql+pyodbc://sa:pw@127.0.0.1:1433/test?driver=FreeTDS", "mssql://sa:pw@127.0.0.1:1433/test"):
        try:
            QueueClient.connect(uri)
        except TransportMisconfiguredError as exc:
            print("RESULT client:", exc)
    assert "pyodbc" not in sys.modules and "pymssql" not in sys.modules
    """
)


def test_a_host_without_sql_server_drivers_runs_postgresql_queues_and_names_the_extra_a_connection_needs(
    pg_uri, raw
) -> None:
    schema = f"t_{uuid.uuid4().hex[:12]}"
    raw.execute(f'CREATE SCHEMA "{schema}"')
    env = {
        **os.environ,
        "PYTHONPATH": os.getcwd(),
        "AIRFLOW_CONN_QUEUE_DB": pg_uri,
        "AIRFLOW_CONN_ODBC_DB": "odbc://sa:pw@127.0.0.1:1433/test",
        "AIRFLOW_CONN_MSSQL_DB": "mssql://sa:pw@127.0.0.1:1433/test",
    }
    try:
        run = subprocess.run(
            [sys.executable, "-c", WITHOUT_ODBC, schema], capture_output=True, text=True, timeout=300, env=env
        )
    finally:
        raw.execute(f'DROP SCHEMA "{schema}" CASCADE')
    assert run.returncode == 0, run.stderr[-3000:]
    lines = [line.removeprefix("RESULT ") for line in run.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines[0] == "['without odbc']"
    odbc_hook, mssql_hook, odbc_client, mssql_client = lines[1:]
    assert odbc_hook.startswith("hook: connection 'odbc_db' is of type odbc"), odbc_hook
    assert "airflow-provider-sqlqueue[odbc]" in odbc_hook and "unixodbc" in odbc_hook, odbc_hook
    assert mssql_hook.startswith("hook: connection 'mssql_db' is of type mssql"), mssql_hook
    assert "airflow-provider-sqlqueue[mssql]" in mssql_hook, mssql_hook
    assert "airflow-provider-sqlqueue[odbc]" in odbc_client and "unixodbc" in odbc_client, odbc_client
    assert "airflow-provider-sqlqueue[mssql]" in mssql_client, mssql_client
    assert "pw" not in " ".join(lines[1:]).replace("pymssql", "").replace("pyodbc", "")


def set_conn(monkeypatch, conn_id: str, pg_uri: str, **changes) -> None:
    conn = json.loads(airflow_connection(pg_uri))
    conn.update(changes)
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(conn))


def connection_of(pg_uri: str, **changes):
    """An Airflow connection object to the test server (values an environment variable cannot hold)."""
    from airflow.sdk import Connection

    fields = json.loads(airflow_connection(pg_uri))
    fields["extra"] = json.dumps(fields["extra"])
    return Connection(conn_id="odd", **{**fields, **changes})


def backends_named(raw, name: str) -> int:
    return raw.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [name]).fetchone()[0]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("host", "127.0.0.1\x00elsewhere"),
        ("password", "pw\x00x"),
        ("schema", "test\x00other"),
        ("host", "bad\udcffhost"),
    ],
)
def test_connection_fields_no_driver_can_send_are_refused_before_connecting(
    airflow_db, pg_uri, monkeypatch, field, value
) -> None:
    """libpq stops reading at a NUL (and would connect elsewhere); invalid Unicode fails inside drivers,
    in errors quoting the whole connection string. The value itself is never echoed."""
    with pytest.raises(TransportMisconfiguredError, match=f"the {field} ") as caught:
        SqlQueueHook("odd", connection=connection_of(pg_uri, **{field: value})).client()
    assert value not in str(caught.value) and caught.value.__cause__ is None and caught.value.__context__ is None


def test_an_extra_with_text_no_driver_can_send_never_puts_the_password_in_the_error(airflow_db, pg_uri, monkeypatch):
    odd = connection_of(
        pg_uri,
        password="Good-Secret-20",  # noqa: S106 - a password to look for
        extra=json.dumps({"application_name": "x\udc80"}),
    )
    with pytest.raises(TransportMisconfiguredError) as caught:
        SqlQueueHook("odd", connection=odd).client()
    chain = "".join(traceback.format_exception(caught.value)) + repr(caught.value.__context__)
    assert "Good-Secret-20" not in chain and "application_name" in str(caught.value)


def test_an_extra_that_is_not_a_json_object_is_refused(airflow_db, pg_uri, monkeypatch) -> None:
    set_conn(monkeypatch, "listed", pg_uri, extra=[1, 2])
    with pytest.raises(UnsupportedConnectionError, match="must be a JSON object"):
        SqlQueueHook("listed").client()
    set_conn(monkeypatch, "listed", pg_uri, conn_type="sqlqueue", extra=[1, 2])
    with pytest.raises(UnsupportedConnectionError, match="must be a JSON object"):
        SqlQueueHook("listed").client()


def test_queue_names_are_checked_before_a_connection_is_opened(airflow_db, pg_uri, monkeypatch, raw) -> None:
    set_conn(monkeypatch, "named", pg_uri, extra={"application_name": "sqlqueue-names-first", "error_queue": 5})
    with pytest.raises(ArgumentTypeError):
        SqlQueueHook("named").client()
    with pytest.raises(InvalidQueueNameError):
        SqlQueueHook("named", error_queue="").client()
    assert backends_named(raw, "sqlqueue-names-first") == 0


def test_a_closed_client_stays_closed(conn_id, queue, raw) -> None:
    with SqlQueueHook(conn_id).client() as client:
        client.send(queue, Message("x"))
    with pytest.raises(ClientClosedError):
        client.send(queue, Message("after the block"))
    assert raw.execute(f'SELECT count(*) FROM "{queue.schema}"."orders"').fetchone()[0] == 1


async def test_a_closed_async_client_stays_closed(conn_id, queue) -> None:
    async with await SqlQueueHook(conn_id).async_client() as client:
        await client.depth(queue)
    with pytest.raises(ClientClosedError):
        await client.depth(queue)


def test_settings_the_sql_server_provider_refuses_are_a_setting_to_fix(airflow_db, monkeypatch) -> None:
    monkeypatch.setenv(
        "AIRFLOW_CONN_MSSQL_ODD",
        json.dumps(
            {
                "conn_type": "mssql",
                "host": "127.0.0.1",
                "port": 1,
                "login": "sa",
                "password": "Pw-9x;z",
                "extra": {"bogus": 1},
            }
        ),
    )
    with pytest.raises(TransportMisconfiguredError, match="MsSqlHook cannot open it") as caught:
        SqlQueueHook("mssql_odd").client()
    assert "Pw-9x;z" not in str(caught.value)


def test_odbc_connections_the_odbc_provider_would_misquote_or_misroute_are_refused(airflow_db, monkeypatch) -> None:
    monkeypatch.setenv(
        "AIRFLOW_CONN_ODBC_SEMI",
        json.dumps({"conn_type": "odbc", "host": "db", "login": "sa", "password": "abc;DATABASE=evil", "extra": {}}),
    )
    with pytest.raises(TransportMisconfiguredError, match="contains ';'") as caught:
        SqlQueueHook("odbc_semi").conninfo()
    assert "evil" not in str(caught.value)
    monkeypatch.delenv("AIRFLOW__PROVIDERS_ODBC__ALLOW_DRIVER_IN_EXTRA", raising=False)
    monkeypatch.setenv(
        "AIRFLOW_CONN_ODBC_NODRIVER",
        json.dumps(
            {"conn_type": "odbc", "host": "db", "login": "sa", "password": "pw", "extra": {"driver": "FreeTDS"}}
        ),
    )
    with pytest.raises(UnsupportedConnectionError, match="allow_driver_in_extra"):
        SqlQueueHook("odbc_nodriver").conninfo()


def test_a_connection_string_carries_what_the_connection_set_not_what_libpq_filled_in(conn_id) -> None:
    params = conninfo_to_dict(SqlQueueHook(conn_id).conninfo())
    assert "hostaddr" not in params and "sslcertmode" not in params
    assert params["connect_timeout"] == "10"


def test_a_trigger_finds_a_connection_of_the_metadata_database_under_airflow_dags_test(pg_uri, queue, schema):
    """``airflow dags test`` runs a deferred task's trigger in its own process, over comms that answer
    only blocking requests (Airflow's InProcessSupervisorComms has no ``asend``): the trigger must
    still find a connection only Airflow's API knows (``airflow connections add``), as a triggerer does."""
    import asyncio

    from airflow.sdk.execution_time.comms import ConnectionResult, GetConnection
    from airflow.sdk.execution_time.supervisor import InProcessSupervisorComms, set_supervisor_comms

    params = conninfo_to_dict(pg_uri)
    conn_id = f"stored_{uuid.uuid4().hex[:8]}"
    asked: list[str] = []

    class Supervisor:  # what InProcessTestSupervisor does with a request: ask the API, queue the answer
        def _handle_request(self, msg: object, log: object, req_id: int) -> None:
            assert isinstance(msg, GetConnection)
            asked.append(msg.conn_id)
            answer = ConnectionResult(
                conn_id=msg.conn_id,
                conn_type="postgres",
                host=params.get("host", "127.0.0.1"),
                port=int(params.get("port", 5432)),
                login=params.get("user", "postgres"),
                schema=params.get("dbname", "test"),
                password=params.get("password"),
                extra=None,
            )
            comms.messages.append(answer)

    comms = InProcessSupervisorComms(supervisor=Supervisor())  # type: ignore[arg-type]
    assert os.environ.get(f"AIRFLOW_CONN_{conn_id.upper()}") is None

    async def wait_as_the_trigger_does() -> int:
        async with await SqlQueueHook(conn_id).async_client() as client:
            return await client.depth(queue)

    with set_supervisor_comms(comms):
        assert asyncio.run(wait_as_the_trigger_does()) == 0
    assert asked == [conn_id]
