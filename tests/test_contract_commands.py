"""The contract of the command line and the Queues HTTP API under hostile input.

Every ``sqlqueue`` command (the console script and ``airflow sqlqueue``, through Airflow's own
parser) and every route of the Queues API is registered here; the surface is discovered from the
code, so a new command or route fails :func:`test_every_command_and_route_is_registered` until it
has its row. Each is given each hostile value of each of its arguments and must answer as its
users expect: the CLI one line on stderr and exit status 1 (``airflow sqlqueue``'s usage errors are
Airflow's parser's: its usage and status 2),
never a traceback or a password; HTTP a 4xx with a message, never a 500; and no row of any table
of the schema changes.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import uuid
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import quote

import psycopg
import pytest
from psycopg import sql

from airflow_provider_sqlqueue import cli
from airflow_provider_sqlqueue.transport import Message, QueueAddress, QueueClient
from tests.surface import LONE_SURROGATE, MEGABYTE, TOO_LONG
from tests.test_contract import SECRET, checksums, with_password
from tests.test_plugins_sqlqueue import Api, api  # noqa: F401 - the api-server app fixture, shared

#: Every command, with the argument vector of a good call ({q}: a queue, {e}: its error queue,
#: {s}: the subscription table, {uri}: the database). Hostile values replace one argument at a time.
COMMANDS: dict[str, list[str]] = {
    "ddl": ["ddl", "{q}", "--dialect", "postgres", "--write-ledger-table", "{ledger}"],
    "grants": ["grants", "{q}", "--dialect", "postgres", "--role", "app"],
    "depths": ["depths", "{q}", "--conn", "{uri}", "--lock-timeout", "{wait}"],
    "health": ["health", "{q}", "--conn", "{uri}"],
    "errors": ["errors", "--conn", "{uri}", "--error-queue", "{e}"],
    "retry": ["retry", "--conn", "{uri}", "--error-queue", "{e}"],
    "journey": ["journey", "{id}", "--queue", "{q}", "--scan", "{scan}", "--conn", "{uri}"],
    "move-due": ["move-due", "{q}", "--conn", "{uri}"],
    "release-lapsed": ["release-lapsed", "{q}", "--conn", "{uri}"],
    "subscribe": ["subscribe", "{q}", "Contract.Topic", "--subscription-table", "{s}", "--conn", "{uri}"],
    "unsubscribe": ["unsubscribe", "{q}", "Contract.Topic", "--subscription-table", "{s}", "--conn", "{uri}"],
    "subscribers": ["subscribers", "Contract.Topic", "--subscription-table", "{s}", "--conn", "{uri}"],
}

#: Hostile text for each kind of argument, by the placeholder or option it replaces. A process's
#: argv cannot hold NUL; it can hold what os.fsdecode makes of bytes that are not UTF-8.
HOSTILE_ARGS: dict[str, list[tuple[str, str]]] = {
    "{q}": [
        ("business table", 'customers@"{schema}"'),
        ("catalog table", 'pg_authid@"pg_catalog"'),
        ("claim store", 'sqlqueue_inflight@"{schema}"'),
        ("lone surrogate", LONE_SURROGATE),
        ("too long", TOO_LONG),
        ("empty", ""),
        ("unterminated quote", 'orders@"public'),
    ],
    "{e}": [
        ("business table", 'customers@"{schema}"'),
        ("missing table", 'no_such_queue@"{schema}"'),
        ("lone surrogate", LONE_SURROGATE),
    ],
    "{s}": [
        ("business table", 'customers@"{schema}"'),
        ("a queue", 'orders@"{schema}"'),
        ("lone surrogate", LONE_SURROGATE),
    ],
    "{uri}": [
        ("unterminated bracket", f"postgresql://app:{SECRET}@[::1/test"),
        ("bad percent escape", f"postgresql://app:{SECRET}%zz@127.0.0.1/test"),
        ("bad sslmode", "{uri}?sslmode=bogus"),
        ("unreachable", f"postgresql://app:{SECRET}@127.0.0.1:1/test?connect_timeout=2"),
        ("unknown database", "{uri_base}/no_such_database"),
    ],
    "app": [("empty", ""), ("blank", "  "), ("lone surrogate", LONE_SURROGATE)],
    "Contract.Topic": [("lone surrogate", LONE_SURROGATE), ("empty", ""), ("megabyte", MEGABYTE)],
    "--limit": [("zero", "0"), ("negative", "-1"), ("past bigint", str(2**63)), ("text", "many")],
    "{ledger}": [("the queue", "{q}"), ("claim store", 'sqlqueue_inflight@"{schema}"'), ("empty", "")],
    "{id}": [
        ("empty", ""),
        ("a queue's name", "orders"),
        ("W3C's invalid trace id", "0" * 32),
        ("a LIKE pattern", "%"),
        ("injection", "' OR 1=1 --"),
        ("lone surrogate", LONE_SURROGATE),
        ("megabyte", MEGABYTE),
    ],
    "{scan}": [("zero", "0"), ("negative", "-1"), ("past any batch", str(10**12)), ("text", "all")],
    "{wait}": [
        ("zero", "0"),
        ("negative", "-1"),
        ("not a number", "nan"),
        ("past int32 ms", str(2**31)),
        ("text", "x"),
    ],
}


def command_names() -> set[str]:
    return {command.name for command in cli.COMMANDS}


def airflow_command_names() -> set[str]:
    [group] = cli.airflow_commands()
    return {sub.name for sub in group.subcommands}


def routes() -> set[tuple[str, str]]:
    from airflow_provider_sqlqueue.plugins.sqlqueue import create_app

    return {
        (method, route.path)
        for route in create_app().routes
        for method in getattr(route, "methods", set()) - {"HEAD"}
        if getattr(route, "include_in_schema", True)
    }


#: Every route of the Queues API: a good request's parameters or body ({q}, {e} as above), and
#: which of them hostile values replace.
ROUTES: dict[tuple[str, str], dict[str, Any]] = {
    ("GET", "/api/connections"): {},
    ("GET", "/api/connections/{connection_id}/queues"): {"offset": 0, "limit": 50, "search": ""},
    ("GET", "/api/connections/{connection_id}/depth"): {"queue": "{q}"},
    ("GET", "/api/connections/{connection_id}/claims"): {"queue": "{q}", "limit": 10},
    ("GET", "/api/connections/{connection_id}/errors"): {"error_queue": "{e}"},
    ("GET", "/api/connections/{connection_id}/errors/messages"): {"error_queue": "{e}", "limit": 10},
    ("POST", "/api/connections/{connection_id}/errors/retry"): {"error_queue": "{e}", "seqs": [1]},
    ("GET", "/api/connections/{connection_id}/journey"): {"id": "4bf92f3577b34da6a3ce929d0e0e4736", "scan": 100},
    ("POST", "/api/connections/{connection_id}/purge-expired"): {"queue": "{q}"},
    ("POST", "/api/connections/{connection_id}/release-lapsed"): {"queue": "{q}"},
    ("POST", "/api/connections/{connection_id}/move-due"): {"queue": "{q}"},
}

HOSTILE_FIELDS: list[tuple[str, Any]] = [
    ("business table", 'customers@"{schema}"'),
    ("catalog table", 'pg_authid@"pg_catalog"'),
    ("claim store", 'sqlqueue_inflight@"{schema}"'),
    ("missing table", 'no_such_queue@"{schema}"'),
    ("lone surrogate", "\ud800"),
    ("NUL", "orders\x00"),
    ("ten megabytes", "x" * 10_000_000),
    ("a number", 7),
    ("a list", ["orders"]),
    ("null", None),
    ("past bigint", 2**63),
    ("negative", -1),
    ("a float", 1.5),
]


def test_every_command_and_route_is_registered() -> None:
    assert command_names() == set(COMMANDS)
    assert airflow_command_names() == set(COMMANDS)
    assert routes() == set(ROUTES)


# -- the command line ------------------------------------------------------------------------------


@pytest.fixture
def shop(pg_uri: str) -> Iterator[dict[str, str]]:
    """A schema with a queue, its error queue, a subscription table and a business table."""
    schema = f"cli_{uuid.uuid4().hex[:10]}"
    uri = with_password(pg_uri)
    with psycopg.connect(pg_uri, autocommit=True) as raw:
        raw.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        customers = sql.Identifier(schema, "customers")
        raw.execute(sql.SQL("CREATE TABLE {} (Id int PRIMARY KEY, Name text)").format(customers))
        raw.execute(sql.SQL("INSERT INTO {} VALUES (1, 'ada')").format(customers))
    with QueueClient.connect(uri) as client:
        queue = QueueAddress("orders", schema)
        client.create_queue(queue)
        client.create_subscription_table(QueueAddress("SubscriptionRouting", schema))
        client.send(queue, [Message("one"), Message("two")])
        [failed] = client.receive(queue)
        client.move_to_error(queue, failed, "it failed")
    try:
        yield {
            "{q}": f'orders@"{schema}"',
            "{e}": f'error@"{schema}"',
            "{s}": f'SubscriptionRouting@"{schema}"',
            "{uri}": uri,
            "{uri_base}": uri.rsplit("/", 1)[0],
            "{schema}": schema,
            "{wait}": "10",
            "{id}": "4bf92f3577b34da6a3ce929d0e0e4736",
            "{scan}": "100",
            "{ledger}": f'sqlqueue_writes@"{schema}"',
        }
    finally:
        with psycopg.connect(pg_uri, autocommit=True) as raw:
            raw.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


def fill(text: str, values: dict[str, str]) -> str:
    for key, value in values.items():
        text = text.replace(key, value)
    return text


def run_cli(main: Callable[[list[str]], Any], argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main(argv)
        except SystemExit as exited:
            status = exited.code if isinstance(exited.code, int) else 1
    return int(status or 0), out.getvalue(), err.getvalue()


def airflow_main(argv: list[str]) -> Any:
    """``airflow sqlqueue ...`` as Airflow's own parser reads and runs it, in this process."""
    from airflow.cli import cli_parser

    args = cli_parser.get_parser().parse_args(["sqlqueue", *argv])
    return args.func(args)


def cli_problems(status: int, out: str, err: str, secret: str) -> list[str]:
    lines = [line for line in err.splitlines() if line.strip()]
    found = []
    if status not in (1, 2):
        found.append(f"exit status {status}")
    if status == 1 and len(lines) != 1:
        found.append(f"{len(lines)} lines on stderr: {err[:300]!r}")
    if status == 1 and out.strip():
        found.append(f"printed before it failed: {out[:200]!r}")
    if "Traceback" in err or "Traceback" in out:
        found.append("a traceback")
    if secret in err or secret in out:
        found.append("the password in the output")
    return found


#: Commands that print a script without connecting: any well-formed name is theirs to plan for.
PLANNERS = {"ddl", "grants"}
#: Values that are well-formed names of existing tables (not queues): refused by commands that touch them.
EXISTING_TABLES = {"business table", "catalog table", "a queue"}


@pytest.mark.parametrize("program", ["sqlqueue", "airflow sqlqueue"])
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_command_keeps_its_contract(program: str, command: str, shop: dict[str, str], pg_uri: str) -> None:
    main = cli.main if program == "sqlqueue" else airflow_main
    good = [fill(arg, shop) for arg in COMMANDS[command]]
    status, out, err = run_cli(main, good)
    # health's 3 says what it found (the shop's error queue holds what other commands failed), not an error
    succeeded = {0, cli.PROBLEMS_FOUND} if command == "health" else {0}
    assert status in succeeded, f"{program} {command} with good arguments: {err}"
    failures = []
    with psycopg.connect(pg_uri, autocommit=True) as raw:
        for position, template in enumerate(COMMANDS[command]):
            for label, hostile in HOSTILE_ARGS.get(template, []):
                if command in PLANNERS and label in EXISTING_TABLES:
                    continue
                argv = list(good)
                argv[position] = fill(hostile, shop)
                before = checksums(raw, shop["{schema}"])
                status, out, err = run_cli(main, argv)
                failures += [f"{template}={label}: {p}" for p in cli_problems(status, out, err, SECRET)]
                if checksums(raw, shop["{schema}"]) != before:
                    failures.append(f"{template}={label}: rows changed")
    assert not failures, f"{program} {command}:\n" + "\n".join(failures)


# -- the Queues HTTP API ---------------------------------------------------------------------------


def test_every_route_answers_hostile_input_with_a_4xx(api: Api, pg_uri: str) -> None:  # noqa: F811
    schema = api.schema
    values = {"{q}": f'orders@"{schema}"', "{e}": f'error@"{schema}"', "{schema}": schema}
    failures = []
    with psycopg.connect(pg_uri, autocommit=True) as raw:
        customers = sql.Identifier(schema, "customers")
        raw.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} (Id int PRIMARY KEY, Name text)").format(customers))
        raw.execute(sql.SQL("INSERT INTO {} VALUES (1, 'ada') ON CONFLICT DO NOTHING").format(customers))
        for (method, path), good in ROUTES.items():
            url = path.replace("/api", "", 1).replace("{connection_id}", "shop")
            filled = {key: fill(value, values) if isinstance(value, str) else value for key, value in good.items()}
            answer = send(api, method, url, filled)
            if answer.status_code >= 400:
                failures.append(f"{method} {path} with good values: {answer.status_code} {answer.text[:200]}")
            for field in good:
                for label, hostile in HOSTILE_FIELDS:
                    value = fill(hostile, values) if isinstance(hostile, str) else hostile
                    if method == "GET" and label == "ten megabytes":
                        value = value[:60_000]  # a URL holds at most 64 kB (httpx's limit, and most servers')
                    before = checksums(raw, schema)
                    try:
                        answer = send(api, method, url, {**filled, field: value})
                    except Exception as exc:  # the app raised: a real server answers 500
                        failures.append(
                            f"{method} {path} {field}={label}: server error {type(exc).__name__}: {exc!s:.150}"
                        )
                        continue
                    if answer.status_code >= 500:
                        failures.append(f"{method} {path} {field}={label}: {answer.status_code} {answer.text[:200]}")
                    elif label.endswith("table") and field in ("queue", "error_queue") and answer.status_code < 400:
                        failures.append(f"{method} {path} {field}={label}: answered {answer.status_code}")
                    if answer.status_code >= 400 and "detail" not in answer.text:
                        failures.append(f"{method} {path} {field}={label}: no message in {answer.text[:200]!r}")
                    if checksums(raw, schema) != before:
                        failures.append(f"{method} {path} {field}={label}: rows changed")
            answer = send(api, method, path.replace("/api", "", 1).replace("{connection_id}", "no_such_conn"), filled)
            if "{connection_id}" in path and answer.status_code not in (403, 404):
                failures.append(f"{method} {path} unknown connection: {answer.status_code}")
    assert not failures, "\n".join(failures)


def send(client: Api, method: str, url: str, values: dict[str, Any]) -> Any:
    """A request as any HTTP client may send it: JSON bodies escaped (a lone surrogate travels as
    ``\\ud800``), query strings percent-encoded byte by byte (one as bytes no UTF-8 decoder takes)."""
    headers = {"Authorization": f"Bearer {client.token('operator')}"}
    if method == "GET":
        query = "&".join(
            f"{quote(key)}={quote(str(value), errors='surrogatepass')}"
            for key, value in values.items()
            if value is not None
        )
        return client.http.get(f"/sqlqueue/api{url}?{query}", headers=headers)
    headers["Content-Type"] = "application/json"
    return client.http.post(f"/sqlqueue/api{url}", content=json.dumps(values), headers=headers)


def test_airflow_sqlqueue_finds_a_connection_added_with_airflow_connections_add(airflow_db: str, shop: dict[str, str]):
    """As README shows it: the connection lives in the metadata database, and the command finds it."""
    import subprocess
    import sys

    conn_id = f"shop_{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    added = subprocess.run(
        [sys.executable, "-m", "airflow", "connections", "add", conn_id, "--conn-uri", shop["{uri}"]],
        capture_output=True, text=True, timeout=240, env=env,
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    depths = subprocess.run(
        [sys.executable, "-m", "airflow", "sqlqueue", "depths", shop["{q}"], "--conn-id", conn_id],
        capture_output=True, text=True, timeout=240, env=env,
    )  # fmt: skip
    assert depths.returncode == 0, depths.stderr
    assert shop["{q}"] in depths.stdout and "1" in depths.stdout.splitlines()[1]
    missing = subprocess.run(
        [sys.executable, "-m", "airflow", "sqlqueue", "depths", shop["{q}"], "--conn-id", "no_such_conn"],
        capture_output=True, text=True, timeout=240, env=env,
    )  # fmt: skip
    assert missing.returncode == 1
    assert [line for line in missing.stderr.splitlines() if line.strip()] == [
        (
            "sqlqueue depths: no Airflow connection 'no_such_conn' (looked for in the environment, the secrets backends "
            "and the metadata database); add it with 'airflow connections add' or pass --conn"
        )
    ]
    assert SECRET not in depths.stdout + depths.stderr + missing.stderr
