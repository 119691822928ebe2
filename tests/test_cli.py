"""``sqlqueue`` / ``airflow sqlqueue``: the DBA scripts run by hand, and the commands on live queues.

The scripts are checked against what they promise: the DDL is what ``create_queue`` runs (recorded
from a real install), run as an installer role it yields the same tables and indexes, and a
runtime role holding only the printed grants can do everything the transport does at run time
-- and cannot create anything.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import psycopg
import pytest
import sqlglot
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from sqlglot import exp

from airflow_provider_sqlqueue import cli
from airflow_provider_sqlqueue.transport import Message, PermissionDeniedError, QueueAddress, QueueClient
from airflow_provider_sqlqueue.transport.client import Addressing
from airflow_provider_sqlqueue.transport.dialects import get_dialect
from airflow_provider_sqlqueue.transport.install import Installation
from airflow_provider_sqlqueue.transport.message import FAILED_QUEUE, MESSAGE_ID

SQLQUEUE = [sys.executable, "-m", "airflow_provider_sqlqueue.console"]
#: The command as a terminal starts it, Ctrl-C acting on it: a process started in the background of a
#: shell without job control (a CI runner's) inherits SIGINT ignored, and Python then keeps ignoring it.
SQLQUEUE_IN_A_TERMINAL = [
    sys.executable,
    "-c",
    (
        "import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "runpy.run_module('airflow_provider_sqlqueue.console', run_name='__main__')"
    ),
]


def sqlqueue(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the console script as a DBA would, in a process of its own."""
    return subprocess.run(
        [*SQLQUEUE, *args], capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})}
    )


def plan_args(schema: str) -> list[str]:
    return [
        "orders",
        "billing",
        "--dialect",
        "postgres",
        "--error-queue",
        f'error@"{schema}"',
        "--audit",
        "--subscriptions",
        "--subscription-table",
        f'SubscriptionRouting@"{schema}"',
        "--write-ledger",
    ]


def with_schema(schema: str, queues: list[str]) -> list[str]:
    return [f'{name}@"{schema}"' for name in queues]


@pytest.fixture
def roles(pg_uri: str, schema: str) -> Iterator[tuple[str, str]]:
    """(installer URI, runtime URI): an installer with CREATE on the test's schema, a runtime role with nothing yet."""
    suffix = uuid.uuid4().hex[:8]
    installer, runtime = f"sqlqueue_inst_{suffix}", f"sqlqueue_rt_{suffix}"
    with psycopg.connect(pg_uri, autocommit=True) as admin:
        admin.execute(f'CREATE ROLE "{installer}" LOGIN')
        admin.execute(f'CREATE ROLE "{runtime}" LOGIN')
        admin.execute(f'GRANT USAGE, CREATE ON SCHEMA "{schema}" TO "{installer}"')
    base = conninfo_to_dict(pg_uri)
    try:
        yield make_conninfo(**{**base, "user": installer}), make_conninfo(**{**base, "user": runtime})
    finally:
        with psycopg.connect(pg_uri, autocommit=True) as admin:
            for role in (installer, runtime):
                admin.execute(f'DROP OWNED BY "{role}" CASCADE')
                admin.execute(f'DROP ROLE "{role}"')


def catalog(raw, schema: str) -> dict[str, object]:
    """Tables with their columns and indexes (definitions with the schema name taken out)."""
    columns = raw.execute(
        "SELECT table_name, column_name, data_type, is_nullable, column_default FROM information_schema.columns "
        "WHERE table_schema = %s ORDER BY table_name, ordinal_position",
        (schema,),
    ).fetchall()
    indexes = raw.execute("SELECT indexdef FROM pg_indexes WHERE schemaname = %s ORDER BY indexname", (schema,))
    return {
        "columns": [tuple(str(v).replace(schema, "S") for v in row) for row in columns],
        "indexes": sorted(str(row[0]).replace(schema, "S") for row in indexes.fetchall()),
    }


def test_the_printed_ddl_is_what_create_queue_runs(pg_uri, schema):
    """create_queue on an empty schema, every statement recorded: its DDL is the script, statement for statement."""
    args = plan_args(schema)
    printed = sqlqueue("ddl", *with_schema(schema, ["orders", "billing"]), *args[2:])
    assert printed.returncode == 0, printed.stderr
    ran: list[str] = []
    with QueueClient.connect(pg_uri, error_queue=f'error@"{schema}"', audit_queue=True) as client:
        execute = client.session.execute

        async def recording(step):
            ran.append(step.sql)
            return await execute(step)

        client.session.execute = recording
        for queue in with_schema(schema, ["orders", "billing"]):
            client.create_queue(queue)
        client.create_subscription_table(f'SubscriptionRouting@"{schema}"')
        client.create_writes(f'sqlqueue_writes@"{schema}"')  # as the data source's first write
    ddl = [sql for sql in ran if sql.lstrip().upper().startswith(("CREATE", "ALTER", "DROP INDEX"))]
    once = list(dict.fromkeys(ddl))  # the claim store's statements run for each queue; the script has them once
    script = printed.stdout.split("\n\n", 1)[1]  # after the header comment
    assert script == get_dialect("postgres").script(once)
    # orders, error, audit, inflight, 2 delayed, billing, routing, the write ledger (once: one schema)
    assert printed.stdout.count("CREATE TABLE") == 9


def test_ddl_notify_on_insert_makes_a_plain_sql_insert_wake_a_listener(pg_uri, schema):
    """The script with --notify-on-insert, run by hand: an INSERT no library makes notifies the
    queue's channel, as create_queue(notify_on_insert=True) would have it; SQL Server is refused."""
    [queue] = with_schema(schema, ["orders"])
    printed = sqlqueue("ddl", queue, "--dialect", "postgres", "--notify-on-insert")
    assert printed.returncode == 0, printed.stderr
    channel = get_dialect("postgres").notify_channel(QueueAddress("orders", schema))
    with psycopg.connect(pg_uri, autocommit=True) as installer, psycopg.connect(pg_uri, autocommit=True) as listener:
        installer.execute(printed.stdout)
        listener.execute(f"LISTEN {channel}")
        installer.execute(
            f'INSERT INTO "{schema}".orders (Id, Headers, Body) VALUES (gen_random_uuid(), %s, %s)',
            ('{"NServiceBus.MessageId":"x"}', b"plain"),
        )
        woken = list(listener.notifies(timeout=10, stop_after=1))
    assert [n.channel for n in woken] == [channel]
    refused = sqlqueue("ddl", "orders", "--dialect", "sqlserver", "--notify-on-insert")
    assert refused.returncode == 1 and "has no notifications" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1


def test_ddl_run_as_the_installer_and_the_grants_give_a_runtime_role_what_it_needs(pg_uri, schema, raw, roles):
    installer_uri, runtime_uri = roles
    queues = with_schema(schema, ["orders", "billing"])
    rest = plan_args(schema)[2:]
    ddl, grants = (
        sqlqueue("ddl", *queues, *rest),
        sqlqueue("grants", *queues, *rest, "--role", conninfo_to_dict(runtime_uri)["user"]),
    )
    assert ddl.returncode == 0 and grants.returncode == 0, ddl.stderr + grants.stderr
    with psycopg.connect(installer_uri, autocommit=True) as installer:  # by hand: the script, as printed
        installer.execute(ddl.stdout)
        installer.execute(ddl.stdout)  # idempotent
    with psycopg.connect(pg_uri, autocommit=True) as dba:  # granting USAGE on a schema takes its owner
        dba.execute(grants.stdout)

    # The same tables and indexes as create_queue makes.
    reference = f"{schema}_ref"
    raw.execute(f'CREATE SCHEMA "{reference}"')
    try:
        with QueueClient.connect(pg_uri, error_queue=f'error@"{reference}"', audit_queue=True) as client:
            for queue in with_schema(reference, ["orders", "billing"]):
                client.create_queue(queue)
            client.create_subscription_table(f'SubscriptionRouting@"{reference}"')
            client.create_writes(f'sqlqueue_writes@"{reference}"')
        assert catalog(raw, schema) == catalog(raw, reference)
    finally:
        raw.execute(f'DROP SCHEMA "{reference}" CASCADE')

    orders, billing, error = (QueueAddress(name, schema) for name in ("orders", "billing", "error"))
    routing = QueueAddress("SubscriptionRouting", schema)
    with QueueClient.connect(runtime_uri, error_queue=error, audit_queue=True) as runtime:
        runtime.send(orders, [Message(f"m{i}") for i in range(4)])
        assert [m.text for m in runtime.receive(orders)] == ["m0"]
        with runtime.receive_native(orders) as message:  # audited
            assert message is not None and message.text == "m1"
        first, second = runtime.claim(orders, 2)
        assert runtime.ack(orders, first.claim_token)  # audited
        assert runtime.fail(orders, second, "bad")
        assert runtime.retry_errors(queue=orders) == 1
        runtime.send(orders, Message("later"), delay=0.05)
        assert runtime.move_due(orders) in (0, 1)
        runtime.subscribe(billing, "Shop.OrderPlaced", table=routing)
        assert runtime.publish("Shop.OrderPlaced", Message("event"), table=routing) == [billing]
        assert runtime.purge_expired(orders) == 0
        ledger = runtime.create_writes(QueueAddress("sqlqueue_writes", schema))  # there already: no CREATE needed
        write = uuid.uuid4()
        with runtime.transaction():  # a partition of a Spark write
            assert runtime.record_write(ledger, write, 0)
            runtime.send(billing, Message("row"))
        with runtime.transaction():
            assert not runtime.record_write(ledger, write, 0)  # a re-run of it sends nothing
        assert runtime.forget_write(ledger, write) == 1
        with pytest.raises(PermissionDeniedError):
            runtime.create_queue(QueueAddress("new_queue", schema))
    audit_ids = [json.loads(h)[MESSAGE_ID] for (h,) in raw.execute(f'SELECT Headers FROM "{schema}".audit').fetchall()]
    assert sorted(audit_ids) == sorted([str(message.id), str(first.id)])


def test_sqlserver_scripts_parse_as_tsql_batches():
    """Text level (no SQL Server here): every GO batch of both scripts is T-SQL sqlglot can parse."""
    args = [
        "orders@[sales]",
        "billing@[sales]",
        "--dialect",
        "sqlserver",
        "--audit",
        "--subscriptions",
        "--write-ledger",
    ]
    for command in (["ddl"], ["grants", "--role", "app]rt"]):
        printed = sqlqueue(*command, *args)
        assert printed.returncode == 0, printed.stderr
        batches = [b.strip() for b in printed.stdout.split("\nGO\n") if b.strip() and not b.strip().startswith("--")]
        assert batches
        for batch in batches:
            body = "\n".join(line for line in batch.splitlines() if not line.startswith("--"))
            parsed = sqlglot.parse(body, read="tsql", error_level=sqlglot.ErrorLevel.RAISE)
            if command[0] == "ddl":
                assert not [n for p in parsed for n in p.walk() if isinstance(n, exp.Command)], batch
            else:
                assert body.startswith("GRANT SELECT, INSERT, UPDATE, DELETE ON [") and body.endswith(" TO [app]]rt]")
    plan = Installation.combine(
        Addressing(get_dialect("sqlserver"), None, True).installation(q) for q in ["orders@[sales]", "billing@[sales]"]
    )
    assert [str(a) for a in plan.queue_tables()] == [
        str(QueueAddress(n, "sales")) for n in ("orders", "error", "audit", "billing")
    ]


def test_the_write_ledger_is_made_in_each_queues_schema_unless_named_with_one():
    """Where the data source looks for it: beside the queue written to, or where the ledger option says."""
    each = sqlqueue("ddl", "orders@[sales]", "billing@[billing]", "--dialect", "sqlserver", "--write-ledger")
    assert each.returncode == 0, each.stderr
    assert "CREATE TABLE [sales].[sqlqueue_writes]" in each.stdout
    assert "CREATE TABLE [billing].[sqlqueue_writes]" in each.stdout
    one = sqlqueue(
        "grants", 'orders@"sales"', 'billing@"billing"', "--dialect", "postgres", "--role", "app",
        "--write-ledger-table", 'spark_writes@"shared"',
    )  # fmt: skip
    assert one.returncode == 0, one.stderr
    assert 'GRANT SELECT, INSERT, UPDATE, DELETE ON "shared"."spark_writes" TO "app";' in one.stdout
    assert "sqlqueue_writes" not in one.stdout and 'ON SCHEMA "shared"' in one.stdout


def test_names_cannot_break_out_of_the_scripts(pg_uri, schema, raw, client, queue):
    """A role name full of quotes, dollar signs and a newline stays one name: the script grants to it, nothing else runs."""
    nasty = f"x'; DROP TABLE {schema}.y; --\n$grant$ \"z"
    raw.execute(f'CREATE TABLE "{schema}".y (n int)')
    raw.execute('CREATE ROLE "' + nasty.replace('"', '""') + '"')
    try:
        printed = sqlqueue("grants", f'orders@"{schema}"', "--dialect", "postgres", "--role", nasty)
        assert printed.returncode == 0, printed.stderr
        assert "$grant_$" in printed.stdout  # the DO block's dollar tag steps around the one in the name
        with psycopg.connect(pg_uri, autocommit=True) as dba:
            dba.execute(printed.stdout)
        assert raw.execute(f"SELECT to_regclass('{schema}.y') IS NOT NULL").fetchone()[0]
        granted = raw.execute(
            "SELECT has_table_privilege(%s, %s, 'INSERT'), has_sequence_privilege(%s, pg_get_serial_sequence(%s, 'seq'), 'USAGE')",
            (nasty, f'"{schema}"."orders"', nasty, f'"{schema}"."orders"'),
        ).fetchone()
        assert tuple(granted) == (True, True)
    finally:
        raw.execute('DROP OWNED BY "' + nasty.replace('"', '""') + '"')
        raw.execute('DROP ROLE "' + nasty.replace('"', '""') + '"')


def test_depths_errors_and_retry_on_a_live_database(pg_uri, schema, client, queue):
    error = QueueAddress("error", schema)
    client.send(queue, [Message(f"m{i}") for i in range(5)])
    held = client.claim(queue, 3)
    assert client.fail(queue, held[0], ValueError("bad value"))
    assert client.fail(queue, held[1], ValueError("worse value"))
    client.send(error, Message("hand-made", {FAILED_QUEUE: 'elsewhere@"public"'}))
    env = {"SQLQUEUE_CONN": pg_uri}

    depths = sqlqueue("depths", f'orders@"{schema}"', env=env)
    assert depths.returncode == 0, depths.stderr
    header, row = depths.stdout.splitlines()
    assert header.split()[:7] == ["queue", "waiting", "in", "flight", "lapsed", "claims", "failed"]
    assert row.split() == [f'orders@"{schema}"', "2", "1", "0", "2"]  # its own failures, not elsewhere's

    # Tables an NServiceBus endpoint made (no claim store): shown, claims as "-"
    for sql in client.dialect.create_queue_sql(QueueAddress("nsb", schema)):
        client.session.connection.execute(sql)
    client.send(QueueAddress("nsb", schema), Message("theirs"))
    client.session.connection.execute(f'DROP TABLE "{schema}".sqlqueue_inflight')
    theirs = sqlqueue("depths", f'nsb@"{schema}"', env=env)
    assert theirs.returncode == 0, theirs.stderr
    assert theirs.stdout.splitlines()[1].split() == [f'nsb@"{schema}"', "1", "-", "-", "0"]
    client.create_queue(queue)  # the claim store back, for what follows

    errors = sqlqueue("errors", "--queue", f'orders@"{schema}"', env=env)
    assert errors.returncode == 0, errors.stderr
    lines = errors.stdout.splitlines()
    assert lines[1].split()[:3] == ["2", f'orders@"{schema}"', "builtins.ValueError"]
    assert "worse value" in lines[1]  # the newest failure's message
    assert lines[2].split()[:2] == ["1", 'elsewhere@"public"']

    retry = sqlqueue("retry", "--queue", f'orders@"{schema}"', env=env)
    assert retry.returncode == 0 and "sent 2 message(s)" in retry.stdout
    assert client.depth(queue) == 4 and client.depth(error) == 1

    rest = sqlqueue("retry", "--error-queue", f'error@"{schema}"', env=env)  # what it cannot route, it says
    assert rest.returncode == 0, rest.stderr
    assert rest.stdout.splitlines()[0] == "sent 0 message(s) back to the queue(s) they failed in"
    assert "left the message at seq" in rest.stdout and "does not exist" in rest.stdout


def test_errors_are_the_librarys_own_and_exit_1(pg_uri, schema):
    missing = sqlqueue("depths", f'nowhere@"{schema}"', "--conn", pg_uri)
    assert missing.returncode == 1 and "does not exist" in missing.stderr and "Traceback" not in missing.stderr
    unnamed = sqlqueue("ddl", "orders", env={"SQLQUEUE_CONN": ""})
    assert unnamed.returncode == 1 and "--dialect" in unnamed.stderr
    bad = sqlqueue("ddl", 'a"b"c', "--dialect", "postgres")
    assert bad.returncode == 1 and "Traceback" not in bad.stderr
    secret = "postgresql://postgres:s3cret@127.0.0.1:1/test?connect_timeout=2"
    down = sqlqueue("depths", "orders", "--conn", secret)
    assert down.returncode == 1 and "s3cret" not in down.stderr and "Traceback" not in down.stderr


def test_airflow_sqlqueue_is_registered_with_the_same_commands(airflow_db, pg_uri, schema):
    """``airflow sqlqueue ...`` through the provider's cli entry, against an Airflow connection."""
    listed = subprocess.run(
        [sys.executable, "-m", "airflow", "sqlqueue", "--help"], capture_output=True, text=True, timeout=240
    )
    assert listed.returncode == 0, listed.stderr
    for command in cli.COMMANDS:
        assert command.name in listed.stdout
    from demo.services import airflow_connection

    env = {**os.environ, "AIRFLOW_CONN_QUEUES": airflow_connection(pg_uri)}
    with QueueClient.connect(pg_uri) as client:
        client.create_queue(QueueAddress("orders", schema))
        client.send(QueueAddress("orders", schema), Message("x"))
    shown = subprocess.run(
        [sys.executable, "-m", "airflow", "sqlqueue", "depths", f'orders@"{schema}"', "--conn-id", "queues"],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[1].split()[:2] == [f'orders@"{schema}"', "1"]


def test_move_due_and_subscriptions_from_the_shell(pg_uri, schema, client, queue):
    """What must run the mover where no pump does (cron, a maintenance task), and subscriptions by hand."""
    env = {"SQLQUEUE_CONN": pg_uri}
    client.send(queue, [Message("soon")], delay=0.05)
    client.send(queue, [Message("later")], delay=3600)
    time.sleep(0.3)
    moved = sqlqueue("move-due", f'orders@"{schema}"', env=env)
    assert moved.returncode == 0, moved.stderr
    assert "moved 1 due delayed message(s); next due in 3" in moved.stdout  # 3599.x s
    assert [m.text for m in client.receive(queue, 5)] == ["soon"]

    routing = f'SubscriptionRouting@"{schema}"'
    for name in ("billing", "shipping"):
        client.create_queue(QueueAddress(name, schema))
        done = sqlqueue("subscribe", f'{name}@"{schema}"', "Shop.OrderPlaced", "--subscription-table", routing, env=env)
        assert done.returncode == 0, done.stderr
    listed = sqlqueue("subscribers", "Shop.OrderPlaced", "--subscription-table", routing, env=env)
    assert sorted(listed.stdout.split()) == sorted([f'billing@"{schema}"', f'shipping@"{schema}"'])
    gone = sqlqueue("unsubscribe", f'billing@"{schema}"', "Shop.OrderPlaced", "--subscription-table", routing, env=env)
    assert gone.returncode == 0, gone.stderr
    assert client.subscribers("Shop.OrderPlaced", table=routing) == [f'shipping@"{schema}"']


def test_health_names_what_is_wrong_and_exits_3(pg_uri, schema, client, queue, raw):
    env = {"SQLQUEUE_CONN": pg_uri}
    healthy = sqlqueue("health", f'orders@"{schema}"', env=env)
    assert healthy.returncode == 0, healthy.stderr
    assert healthy.stdout.splitlines()[-1] == "no problems found"
    client.send(queue, [Message("later")], delay=0.001)
    raw.execute(f'UPDATE "{schema}"."orders.Delayed" SET Due = Due - interval \'5 minutes\'')
    client.send(queue, [Message("m0"), Message("m1")])
    [failing] = client.claim(queue)
    client.fail(queue, failing, ValueError("no price"))
    with psycopg.connect(pg_uri) as pin:
        pin.execute("SET application_name = 'cli-health-pin'")
        pin.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        pin.execute("SELECT 1")
        pid = pin.info.backend_pid
        sick = sqlqueue("health", f'orders@"{schema}"', f'error@"{schema}"', env=env)
        pin.rollback()
    assert sick.returncode == 3, sick.stderr
    lines = sick.stdout.splitlines()
    assert any(f"by pid {pid} (cli-health-pin, idle in transaction) since " in line for line in lines[:5])
    header = lines[lines.index("") + 1].split()
    assert header[:3] == ["queue", "waiting", "oldest"]
    rows = {line.split()[0]: line.split() for line in lines if line.startswith(('orders@"', 'error@"'))}
    assert rows[f'orders@"{schema}"'][1] == "1" and rows[f'orders@"{schema}"'][5] == "1"  # waiting, due delayed
    problems = [line for line in lines if line.startswith("PROBLEM")]
    assert any(
        line.startswith(f'PROBLEM overdue (orders@"{schema}"): 1 delayed message(s) due for 5 min') for line in problems
    )
    assert any(line.startswith(f'PROBLEM failed (error@"{schema}")') for line in problems)
    alone = sqlqueue("health", f'orders@"{schema}"', env=env)  # a check of the queue alone finds its failures
    assert alone.returncode == 3 and f'PROBLEM failed (error@"{schema}")' in alone.stdout


def test_health_prints_names_as_text_and_reports_what_it_cannot_measure(pg_uri, schema, client, queue, raw):
    forged = QueueAddress("evil\n\nno problems found\n\x1b[2J", schema)
    client.create_queue(forged, delayed=False)
    broken = QueueAddress("broken", schema)
    client.create_queue(broken)
    raw.execute(f'DROP TABLE "{schema}"."broken.Delayed"')
    raw.execute(f'CREATE TABLE "{schema}"."broken.Delayed" (Headers text, Body bytea, Due text)')  # not NServiceBus's
    raw.execute(f"INSERT INTO \"{schema}\".\"broken.Delayed\" VALUES ('{{}}', '', 'soon')")
    named = sqlqueue("health", f'broken@"{schema}"', "--conn", pg_uri)
    assert named.returncode == 1 and len(named.stderr.splitlines()) == 1  # named, it is an error
    survey = sqlqueue("health", "--conn", pg_uri)  # every queue: the broken one is a problem, the rest measured
    assert survey.returncode == 3, survey.stderr
    assert "\x1b" not in survey.stdout and "\\x1b[2J" in survey.stdout
    assert not any(line == "no problems found" for line in survey.stdout.splitlines())
    assert f'PROBLEM unreadable (broken@"{schema}"): cannot be measured: ' in survey.stdout
    assert any(line.startswith(f'orders@"{schema}"') for line in survey.stdout.splitlines())


def test_help_is_plain_text_and_version_is_the_packages() -> None:
    from airflow_provider_sqlqueue import __version__

    run = subprocess.run(
        [sys.executable, "-m", "airflow_provider_sqlqueue.console", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0 and "``" not in run.stdout and ":mod:" not in run.stdout
    run = subprocess.run(
        [sys.executable, "-m", "airflow_provider_sqlqueue.console", "--version"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (run.returncode, run.stdout.strip()) == (0, f"sqlqueue {__version__}")


def _locked(pg_uri: str, table: str) -> psycopg.Connection[tuple[object, ...]]:
    """A second session holding ``table`` (a quoted name) as a migration would: locked, transaction open."""
    holder = psycopg.connect(pg_uri)
    holder.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
    return holder


def test_a_command_waits_for_a_locked_table_no_longer_than_lock_timeout(pg_uri, schema, queue):
    error = f'"{schema}"."error"'
    holder = _locked(pg_uri, error)
    try:
        # It returns at all (the lock is held until the finally below) and says why: the wait was bounded.
        errors = sqlqueue("errors", "--error-queue", f'error@"{schema}"', "--lock-timeout", "0.5", "--conn", pg_uri)
        assert errors.returncode == 1 and errors.stdout == ""
        assert errors.stderr.count("\n") == 1 and "Traceback" not in errors.stderr
        assert errors.stderr.startswith(f"sqlqueue errors: {error} is locked by another session")
    finally:
        holder.close()
    holder = _locked(pg_uri, f'"{schema}"."orders"')
    try:
        depths = sqlqueue("depths", f'orders@"{schema}"', "--conn", pg_uri)  # the default bound, not for ever
        assert depths.returncode == 1 and depths.stderr.count("\n") == 1
        assert f'"{schema}"."orders" is locked by another session' in depths.stderr
    finally:
        holder.close()
    assert sqlqueue("depths", f'orders@"{schema}"', "--conn", pg_uri).returncode == 0  # the lock gone, it answers


def test_the_figures_of_depths_wait_as_long_as_lock_timeout_says(pg_uri, schema, queue):
    holder = _locked(pg_uri, f'"{schema}"."orders"')
    try:
        depths = subprocess.Popen(
            [*SQLQUEUE, "depths", f'orders@"{schema}"', "--lock-timeout", "120", "--conn", pg_uri],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        _wait_until_blocked(pg_uri, f'"{schema}"."orders"', depths)
        # Past the 5 s a watcher waits by default, the command still waits: --lock-timeout is its bound.
        time.sleep(7)
        assert depths.poll() is None, depths.communicate()
    finally:
        holder.close()
    out, err = depths.communicate(timeout=120)
    assert depths.returncode == 0, err
    assert out.splitlines()[1].split()[:2] == [f'orders@"{schema}"', "0"]


def _wait_until_blocked(pg_uri: str, table: str, command: subprocess.Popen[str]) -> None:
    """Until ``command`` waits for the lock on ``table`` (a session of it asks and is not granted)."""
    with psycopg.connect(pg_uri, autocommit=True) as watcher:
        deadline = time.monotonic() + 60
        while not watcher.execute(
            "SELECT count(*) FROM pg_locks WHERE relation = %s::regclass AND NOT granted", (table,)
        ).fetchone()[0]:
            assert time.monotonic() < deadline and command.poll() is None, "the command never waited"
            time.sleep(0.05)


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "ten", "3000000"])
def test_lock_timeout_takes_a_number_of_seconds_the_database_can_hold(value: str, pg_uri: str) -> None:
    refused = sqlqueue("depths", "orders", "--conn", pg_uri, "--lock-timeout", value)
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1, refused.stderr  # one line, as any refusal
    assert "--lock-timeout" in refused.stderr and "Traceback" not in refused.stderr


def test_an_error_line_shows_a_hostile_name_escaped(pg_uri: str, schema: str) -> None:
    """A name given on the command line (or read from the database) cannot recolour the terminal or
    turn the text right to left: its error line shows the characters escaped, as the tables do."""
    refused = sqlqueue("depths", f'evil\x1b[31mRED\x01\u202e@"{schema}"', "--conn", pg_uri)
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1
    assert not any(c in refused.stderr for c in "\x1b\x01\u202e")
    assert "evil\\x1b[31mRED\\x01\\u202e" in refused.stderr


def test_lock_timeout_says_its_bound_truly_and_a_dash_dash_value_is_one_line(pg_uri: str) -> None:
    refused = sqlqueue("depths", "orders", "--conn", pg_uri, "--lock-timeout", "2147484")
    assert refused.returncode == 1 and "2,147,483.647 seconds" in refused.stderr  # the bound shown is the one held
    dashes = sqlqueue("depths", "orders", "--conn", pg_uri, "--lock-timeout=--")
    assert dashes.returncode == 1 and dashes.stderr.count("\n") == 1 and "--lock-timeout takes" in dashes.stderr


def test_a_reader_that_closes_the_pipe_ends_the_command_quietly() -> None:
    # The pipe is shrunk to one page and the output (~1.7 MB) is larger than any pipe may grow
    # (/proc/sys/fs/pipe-max-size, 1 MiB by default), so the command cannot have written it all before
    # the reader goes (else it may finish first and rightly say nothing): a run with 300 queues (~160 KB)
    # once ended with status 0 under load.
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, 4096)
    command = subprocess.Popen(
        [*SQLQUEUE, "ddl", *[f"q{n}" for n in range(3000)], "--dialect", "postgres"],
        stdout=write_end,
        stderr=subprocess.PIPE,
        text=True,
    )
    os.close(write_end)
    with open(read_end, encoding="utf-8") as reader:
        first = reader.readline()
    # as `| head -1` does: the reader has gone with one line of what the command writes
    assert first.startswith("--")
    _, err = command.communicate(timeout=120)
    assert (command.returncode, err) == (141, "")


def test_ctrl_c_ends_a_command_in_one_line_with_status_130(pg_uri, schema, queue):
    holder = _locked(pg_uri, f'"{schema}"."error"')
    try:
        command = subprocess.Popen(
            [
                *SQLQUEUE_IN_A_TERMINAL,
                "errors",
                "--error-queue",
                f'error@"{schema}"',
                "--lock-timeout",
                "60",
                "--conn",
                pg_uri,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        _wait_until_blocked(pg_uri, f'"{schema}"."error"', command)  # waiting for the lock: interrupt it there
        command.send_signal(signal.SIGINT)
        out, err = command.communicate(timeout=30)
    finally:
        holder.close()
    assert command.returncode == 130
    assert err == "sqlqueue errors: interrupted\n" and out == ""


@pytest.mark.parametrize(
    ("layout", "refusal"),
    [
        (["--error-queue", "orders"], 'the error queue of "public"."orders" cannot be that queue itself'),
        (["--audit-queue", "error"], "the audit queue of orders cannot be error: it is the queue or its error queue"),
        (["--audit-queue", "orders"], "the audit queue of orders cannot be orders"),
        (["--error-queue", "dead", "--audit-queue", "dead"], "cannot be dead: it is the queue or its error queue"),
        (["--write-ledger-table", "orders"], '"public"."orders" cannot be both a queue and the write ledger'),
        (["--subscription-table", "error"], '"public"."error" cannot be both a queue and the subscription table'),
        (["--write-ledger-table", "sqlqueue_inflight"], "is the name of each schema's claim store"),
        (["--write-ledger-table", '"orders.Delayed"'], "cannot be both a delayed-message table and the write ledger"),
    ],
)
def test_ddl_refuses_a_layout_the_runtime_refuses(layout: list[str], refusal: str) -> None:
    for command in (["ddl"], ["grants", "--role", "app"]):
        refused = sqlqueue(*command, "orders", "--dialect", "postgres", *layout)
        assert refused.returncode == 1 and refused.stdout == "", refused.stdout
        assert refused.stderr.count("\n") == 1 and refusal in refused.stderr, refused.stderr


def test_ddl_plans_the_layouts_the_runtime_takes() -> None:
    """An error queue's own script (its error queue is itself, as the client drains it), a shared
    error queue, and a ledger named apart are printed whole."""
    for layout in (["error"], ["orders", "billing", "--error-queue", "dead", "--audit"], ["orders", "--write-ledger"]):
        planned = sqlqueue("ddl", *layout, "--dialect", "postgres")
        assert planned.returncode == 0, planned.stderr
    ledger = sqlqueue("ddl", "orders", "--dialect", "postgres", "--write-ledger-table", "ledger")
    assert '"public"."ledger"' in ledger.stdout


def test_the_longest_postgres_names_are_made_whole(pg_uri, schema, client):
    """At the limits (47 bytes with a delayed table, 55 without) every name PostgreSQL derives fits
    in its 63 bytes: nothing is cut short, so the tables are the ones named."""
    with_delayed, without = "é" * 23 + "q", "€" * 18 + "q"
    assert sqlqueue("ddl", f'{with_delayed}@"{schema}"', "--dialect", "postgres").returncode == 0
    refused = sqlqueue("ddl", f'{with_delayed}q@"{schema}"', "--dialect", "postgres")
    assert refused.returncode == 1 and "at most 47 bytes" in refused.stderr
    client.create_queue(QueueAddress(with_delayed, schema))
    client.create_queue(QueueAddress(without, schema), delayed=False)
    made = {
        name
        for (name,) in client.session.connection.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s",
            (schema,),
        )
    }
    for table in (with_delayed, f"{with_delayed}.Delayed", without):
        assert {table, f"{table}_Expires"} <= made or {table, f"{table}_Due"} <= made, table
    assert {f"{with_delayed}_seq_seq", f"{without}_seq_seq"} <= made


def test_release_lapsed_gives_lapsed_claims_back(pg_uri, schema, client, queue):
    """What health's lapsed problem tells the operator to run."""
    client.send(queue, [Message("a"), Message("b")])
    client.claim(queue, 2, lease=0.001)
    time.sleep(0.05)
    found = sqlqueue("health", f'orders@"{schema}"', "--conn", pg_uri)
    assert found.returncode == 3
    [lapsed] = [line for line in found.stdout.splitlines() if line.startswith("PROBLEM lapsed")]
    assert f"`sqlqueue release-lapsed 'orders@\"{schema}\"'`" in lapsed and "Give back" in lapsed
    done = sqlqueue("release-lapsed", f'orders@"{schema}"', "--conn", pg_uri)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f'orders@"{schema}": gave 2 lapsed claim(s) back to the queue\n'
    assert (client.lapsed_claims(queue), client.in_flight(queue), client.depth(queue)) == (0, 0, 2)
    missing = sqlqueue("release-lapsed", f'nowhere@"{schema}"', "--conn", pg_uri)
    assert missing.returncode == 1 and len(missing.stderr.splitlines()) == 1 and missing.stdout == ""


@pytest.fixture
def database(pg_uri: str) -> Iterator[str]:
    """The URI of a database of its own, whose every table the test knows: no public.error in it."""
    name = f"cli_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_uri, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield make_conninfo(pg_uri, dbname=name)
    finally:
        with psycopg.connect(pg_uri, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


def test_errors_and_retry_look_where_health_finds_the_error_queue(database):
    """Queues in a schema of their own: errors and retry without --queue read that schema's error
    queue, as health finds it, not public.error; the failure's time is ISO 8601 in UTC."""
    with QueueClient.connect(database) as client:
        client.session.connection.execute('CREATE SCHEMA "shop"')
        orders = QueueAddress("orders", "shop")
        client.create_queue(orders)
        client.send(orders, Message("to fail"))
        [failing] = client.claim(orders)
        client.fail(orders, failing, ValueError("no price"))
        env = {"SQLQUEUE_CONN": database}

        health = sqlqueue("health", env=env)
        assert health.returncode == 3 and 'PROBLEM failed (error@"shop")' in health.stdout
        assert "`sqlqueue errors --error-queue 'error@\"shop\"'`" in health.stdout
        errors = sqlqueue("errors", env=env)
        assert errors.returncode == 0, errors.stderr
        heading, header, row = errors.stdout.splitlines()
        assert heading == 'error@"shop":' and header.split()[:5] == ["count", "failed", "in", "exception", "newest"]
        count, source, exception, when, *_ = row.split()
        assert (count, source, exception) == ("1", 'orders@"shop"', "builtins.ValueError")
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", when), row  # not NServiceBus's header form

        client.session.connection.execute('CREATE SCHEMA "billing"')
        client.create_queue(QueueAddress("invoices", "billing"))
        both = sqlqueue("errors", env=env)
        assert both.returncode == 0 and 'error@"billing":' in both.stdout.splitlines()
        ambiguous = sqlqueue("retry", env=env)
        assert ambiguous.returncode == 1 and ambiguous.stdout == ""
        assert ambiguous.stderr.splitlines() == [
            (
                'sqlqueue retry: the database has 2 error queues (error@"billing", error@"shop"); '
                "name the one to retry with --error-queue"
            )
        ]
        client.drop_queue(QueueAddress("invoices", "billing"))
        client.drop_queue(QueueAddress("error", "billing"))
        retry = sqlqueue("retry", env=env)
        assert retry.returncode == 0, retry.stderr
        assert retry.stdout == "sent 1 message(s) back to the queue(s) they failed in\n"
        assert client.depth(orders) == 1

        client.drop_queue(orders)
        client.drop_queue(QueueAddress("error", "shop"))
        none = sqlqueue("errors", env=env)
        assert none.returncode == 1 and none.stderr.splitlines() == [
            (
                "sqlqueue errors: found no error queue among the tables the connection may read; name one with "
                "--error-queue"
            )
        ]


def test_times_are_shown_in_iso_8601_utc_whatever_wrote_them() -> None:
    from datetime import UTC, datetime, timedelta, timezone

    from airflow_provider_sqlqueue.transport.message import shown_time, wire_timestamp

    moment = datetime(2026, 1, 31, 10, 5, 2, 123456, tzinfo=timezone(timedelta(hours=1)))
    assert shown_time(moment) == "2026-01-31T09:05:02Z"
    assert shown_time(wire_timestamp(moment)) == "2026-01-31T09:05:02Z"  # NServiceBus's TimeOfFailure
    assert shown_time(moment.astimezone(UTC).replace(tzinfo=None).isoformat()) != "2026-01-31T09:05:02Z"
    assert shown_time("yesterday") == "yesterday"  # a sender's own text: shown as written
    assert shown_time(None) is None


def test_both_help_texts_name_every_command() -> None:
    """``sqlqueue --help`` and ``airflow sqlqueue --help`` say the commands from the one list."""
    [group] = cli.airflow_commands()
    for command in cli.COMMANDS:
        assert command.name in cli.DESCRIPTION
    assert group.description == cli.DESCRIPTION
    assert [sub.name for sub in group.subcommands] == [command.name for command in cli.COMMANDS]
    shown = cli.build_parser().format_help()
    assert all(command.name in shown for command in cli.COMMANDS)


def test_health_by_a_role_that_can_read_no_queue_says_so_and_fails(pg_uri, raw, queue):
    from psycopg import sql

    role = f"cli_blind_{uuid.uuid4().hex[:8]}"
    raw.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    try:
        survey = sqlqueue("health", "--conn", make_conninfo(pg_uri, user=role))
    finally:
        raw.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
    assert survey.returncode == 3, survey.stderr  # never "no problems found" for a survey of nothing
    assert "no problems found" not in survey.stdout
    assert "PROBLEM unreadable (database): this role could read no queue" in survey.stdout
    assert "lacks SELECT" in survey.stdout and "sqlqueue grants" in survey.stdout


def test_journey_follows_a_trace_through_its_stages_and_refuses_what_is_no_id(pg_uri, schema, client, queue):
    """``sqlqueue journey``: the rows of a trace oldest first, each stage's times; a bad id is one line, exit 1."""
    trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    audit, enrich = QueueAddress("audit", schema), QueueAddress("enrich", schema)
    client.create_queue(audit)
    client.create_queue(enrich)
    outside = Message("order", {"traceparent": f"00-{trace}-00f067aa0ba902b7-01"})
    with QueueClient.connect(pg_uri, error_queue=QueueAddress("error", schema), audit_queue=audit) as audited:
        audited.send(queue, outside)
        [claim] = audited.claim(queue, 1)
        result = Message("enriched", {"traceparent": f"00-{trace}-b7ad6b7169203331-01"})
        audited.forward({queue: [claim.claim_token]}, {enrich: [result]})
        [held] = audited.claim(enrich, 1)
        audited.fail(enrich, held, ValueError("no such \x1b[31mcustomer" + "!" * 100_000))
    env = {"SQLQUEUE_CONN": pg_uri}
    tables = [f'--queue={name}@"{schema}"' for name in ("orders", "enrich", "audit", "error")]

    shown = sqlqueue("journey", trace, *tables, env=env)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0] == f"trace {trace}: 2 row(s), searched 5 table(s)"
    processed, failed = lines[2], lines[3]
    assert str(outside.id) in processed and " processed " in processed and f'audit@"{schema}"' in processed
    assert str(result.id) in failed and " failed " in failed and f'enrich@"{schema}"' in failed
    assert "no such \\x1b[31mcustomer" in failed  # a sender's control characters shown, never obeyed
    assert len(failed) < 600  # a huge exception message cut to its column
    assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ  ", processed)
    assert re.search(r" \d+\.\d{3}s ", processed)

    mine = sqlqueue("journey", str(outside.id).upper(), *tables, env=env)
    assert mine.returncode == 0, mine.stderr
    assert f"its trace: {trace} (sqlqueue journey {trace} shows every message of it)" in mine.stdout

    bounded = sqlqueue("journey", trace, *tables, "--scan", "1", env=env)
    assert "only the newest 1 rows were searched (--scan) of:" not in bounded.stdout  # each table holds one row
    assert sqlqueue("journey", trace, f'--queue=orders@"{schema}"', "--limit", "1", env=env).returncode == 0

    holder = _locked(pg_uri, f'"{schema}"."enrich"')  # a migration's lock: left out, named, the rest shown
    try:
        held = sqlqueue("journey", trace, *tables, "--lock-timeout", "0.5", env=env)
    finally:
        holder.close()
    assert held.returncode == 0, held.stderr
    assert held.stdout.splitlines()[0] == f"trace {trace}: 2 row(s), searched 4 table(s)"
    assert f'locked by another session past --lock-timeout, not searched: enrich@"{schema}"' in held.stdout

    for bad in ("not-an-id", "0" * 32, "4bf92f3577b34da6a3ce929d0e0e473", "x" * 100_000):
        refused = sqlqueue("journey", bad, *tables, env=env)
        assert refused.returncode == 1
        [line] = refused.stderr.splitlines()
        assert line.startswith("sqlqueue journey: ") and "trace id" in line and len(line) < 400


@pytest.mark.parametrize(
    "argv",
    [
        ["journey", "--scan", "1.5", "4bf92f3577b34da6a3ce929d0e0e4736"],
        ["journey", "--limit", "abc", "4bf92f3577b34da6a3ce929d0e0e4736"],
        ["depths", "--lock-timeout", "nan", "orders"],
        ["nosuch"],
        [],
    ],
    ids=["float-scan", "text-limit", "nan-lock-timeout", "unknown-command", "no-command"],
)
def test_a_bad_argument_is_one_line_and_exit_status_1(argv: list[str], pg_uri: str) -> None:
    refused = sqlqueue(*argv, *(["--conn", pg_uri] if argv[:1] in (["journey"], ["depths"]) else []))
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1, refused.stderr
    assert refused.stderr.startswith("sqlqueue") and "usage:" not in refused.stderr
