"""No session setting a DBA may choose changes what the library returns or breaks a call.

A catalogue of settings a role, a database or a connection string may carry (date and interval
styles, time zones, search paths, float digits, bytea output, message language, string quoting,
client encodings, planner switches, ...). Each is set two ways a DBA sets it: in the URI's
``options`` and with ``ALTER ROLE ... SET`` on a scratch role. Under each, the same representative
calls (send, receive, browse, claim and ack, native receive, the error queue, queue figures,
health and the horizon while a session holds it) must return what they return in a default
session. A non-ISO DateStyle made ``health()`` and ``horizon()`` raise psycopg's
``NotImplementedError``; ``quote_all_identifiers`` made every queue "not a queue".
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from airflow_provider_sqlqueue.transport import Message, QueueAddress, QueueClient

pytestmark = pytest.mark.postgres_only

#: (setting, value) pairs a DBA may give a role, a database or a connection.
SETTINGS = [
    ("DateStyle", "SQL, DMY"),
    ("DateStyle", "German"),
    ("DateStyle", "Postgres, MDY"),
    ("TimeZone", "Pacific/Kiritimati"),
    ("TimeZone", "America/St_Johns"),
    ("IntervalStyle", "sql_standard"),
    ("IntervalStyle", "iso_8601"),
    ("IntervalStyle", "postgres_verbose"),
    ("search_path", ""),
    ("search_path", "pg_catalog"),
    ("extra_float_digits", "-15"),
    ("extra_float_digits", "3"),
    ("bytea_output", "escape"),
    ("lc_messages", "C"),
    ("lc_time", "C"),
    ("lc_numeric", "C"),
    ("standard_conforming_strings", "off"),
    ("backslash_quote", "off"),
    ("quote_all_identifiers", "on"),
    ("array_nulls", "off"),
    ("transform_null_equals", "on"),
    ("client_encoding", "LATIN1"),
    ("client_encoding", "SQL_ASCII"),
    ("default_transaction_isolation", "serializable"),
    ("default_transaction_deferrable", "on"),
    ("timezone_abbreviations", "India"),
    ("xmloption", "document"),
    ("client_min_messages", "debug5"),
    ("plan_cache_mode", "force_generic_plan"),
    ("enable_seqscan", "off"),
]

APPLICATION = "settings-pin"


@pytest.fixture(scope="module")
def pin(pg_uri: str) -> Iterator[datetime]:
    """A session holding the xmin horizon for the module (so health and horizon have a holder to
    report, with its start time); yields when its transaction started."""
    with psycopg.connect(pg_uri) as session:
        session.execute(f"SET application_name = '{APPLICATION}'")
        session.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        started = session.execute("SELECT xact_start FROM pg_stat_activity WHERE pid = pg_backend_pid()").fetchone()
        assert started is not None
        yield started[0]
        session.rollback()


def representative_calls(client: QueueClient, schema: str) -> dict[str, Any]:
    """What each kind of call returns in a fresh queue, with what differs from run to run (ids, the
    schema's name, send times) left out."""
    queue, error = QueueAddress("orders", schema), QueueAddress("error", schema)
    out: dict[str, Any] = {"create": [a.table for a in client.create_queue(queue)]}
    now = datetime.now(UTC)
    # A batch none of whose messages expires (its expiries all NULL), then one with an expiry.
    out["send"] = client.send(queue, [Message("é ✓ ü", {"k": "v ✓"}), Message(b"\x00\xff\\x")]) + client.send(
        queue, [Message("c", time_to_be_received=3600), Message("d")]
    )
    client.send(queue, Message("later"), delay=timedelta(hours=1))
    out["browse"] = [
        (m.body, {k: v for k, v in m.headers.items() if not k.startswith("NServiceBus.")}) for m in client.browse(queue)
    ]
    out["receive"] = [m.body for m in client.receive(queue, 1)]
    claimed = client.claim(queue, 2, holder="catalogue")
    out["claim"] = [(m.body, m.deliveries) for m in claimed]
    out["claims"] = [(c.holder, c.deliveries, c.lease_left > timedelta(0)) for c in client.claims(queue)]
    out["settle"] = (client.nack(queue, claimed[1].claim_token), client.ack(queue, claimed[0].claim_token))
    with client.receive_native(queue) as native:
        out["native"] = native.body if native is not None else None
    [stats] = client.queue_stats(queue)
    out["stats"] = (stats.waiting, stats.expired, stats.in_flight, stats.lapsed, stats.due_delayed, stats.overdue)
    assert stats.oldest_sent is None or abs(stats.oldest_sent - now) < timedelta(minutes=5)
    out["depth"] = (client.depth(queue), client.peek(queue), client.in_flight(queue), client.lapsed_claims(queue))
    due = client.next_due(queue)
    out["next_due"] = None if due is None else round(due / timedelta(minutes=1))
    client.send(queue, Message("fails"))
    [failing] = client.receive(queue, 1)
    client.move_to_error(queue, failing, ValueError("ünïcode ✓ failure"))
    out["errors"] = [(g.count, g.exception_type, g.newest_message) for g in client.error_summary(error)]
    out["failed"] = [
        (f.body_size, f.body_preview, {k: v for k, v in (f.headers or {}).items() if k.endswith(("Type", ".Message"))})
        for f in client.failed_messages(error)[0]
    ]
    horizon = client.horizon()
    assert horizon is not None
    out["horizon"] = [(h.application, h.state, h.since) for h in horizon.holders if h.application == APPLICATION]
    health = client.health(queue)
    out["health"] = sorted((p.concern, p.queue and p.queue.table) for p in health.problems)
    out["queues"] = sorted(a.table for a in client.queues() if a.schema == schema)
    out["retry"] = client.retry_errors(error)
    out["purge"] = client.purge(queue)
    return out


def fresh_schema(raw: psycopg.Connection[Any], owner: str | None = None) -> str:
    name = f"s_{uuid.uuid4().hex[:12]}"
    raw.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
    if owner is not None:
        raw.execute(sql.SQL("ALTER SCHEMA {} OWNER TO {}").format(sql.Identifier(name), sql.Identifier(owner)))
    return name


@pytest.fixture(scope="module")
def expected(pg_uri: str, pin: datetime) -> dict[str, Any]:
    """What the calls return in a default session."""
    with psycopg.connect(pg_uri, autocommit=True) as raw:
        schema = fresh_schema(raw)
        try:
            with QueueClient.connect(pg_uri) as client:
                found = representative_calls(client, schema)
        finally:
            raw.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
    assert found["horizon"] and found["horizon"][0][2] == pin  # the holder, and when it started
    return found


@pytest.fixture
def scratch_role(pg_uri: str) -> Iterator[tuple[str, str]]:
    """A login role of its own (its settings are the test's) with the rights the calls need; its URI."""
    role = f"settings_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_uri, autocommit=True) as raw:
        raw.execute(sql.SQL("CREATE ROLE {} LOGIN IN ROLE pg_read_all_stats").format(sql.Identifier(role)))
        try:
            yield role, make_conninfo(pg_uri, user=role)
        finally:
            raw.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            raw.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def options_uri(pg_uri: str, setting: str, value: str) -> str:
    """``pg_uri`` with ``-c setting=value`` in its options (spaces and backslashes escaped as libpq reads them)."""
    escaped = value.replace("\\", "\\\\").replace(" ", "\\ ")
    options = (conninfo_to_dict(pg_uri).get("options") or "") + f" -c {setting}={escaped}"
    return make_conninfo(pg_uri, options=options.strip())


@pytest.mark.parametrize(("setting", "value"), SETTINGS, ids=[f"{s}={v}" for s, v in SETTINGS])
def test_a_setting_in_the_uri_changes_no_result(pg_uri, expected, setting, value) -> None:
    uri = options_uri(pg_uri, setting, value)
    with psycopg.connect(uri) as probe:  # the setting took
        shown = probe.execute(sql.SQL("SHOW {}").format(sql.Identifier(setting.lower()))).fetchone()
        assert shown is not None
        text = shown[0].decode() if isinstance(shown[0], bytes) else shown[0]  # SQL_ASCII: psycopg reads bytes
        assert text.replace(" ", "").lower().startswith(value.replace(" ", "").lower())
    with psycopg.connect(pg_uri, autocommit=True) as raw:
        schema = fresh_schema(raw)
        try:
            with QueueClient.connect(uri) as client:
                assert representative_calls(client, schema) == expected
        finally:
            raw.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


@pytest.mark.parametrize(("setting", "value"), SETTINGS, ids=[f"{s}={v}" for s, v in SETTINGS])
def test_a_roles_setting_changes_no_result(pg_uri, expected, scratch_role, setting, value) -> None:
    role, uri = scratch_role
    with psycopg.connect(pg_uri, autocommit=True) as raw:
        raw.execute(
            sql.SQL("ALTER ROLE {} SET {} TO {}").format(
                sql.Identifier(role), sql.Identifier(setting), sql.Literal(value)
            )
        )
        schema = fresh_schema(raw, owner=role)
        try:
            with QueueClient.connect(uri) as client:
                assert representative_calls(client, schema) == expected
        finally:
            raw.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


@pytest.mark.parametrize("value", ["SQL, DMY", "German"])
def test_a_borrowed_connection_with_another_datestyle_reads_the_horizon(pg_uri, pin, value) -> None:
    with psycopg.connect(pg_uri, autocommit=True) as connection:
        connection.execute(sql.SQL("SET datestyle TO {}").format(sql.Literal(value)))
        horizon = QueueClient.connect(connection).horizon()
    assert horizon is not None
    assert [h.since for h in horizon.holders if h.application == APPLICATION] == [pin]


def test_a_borrowed_connection_in_another_client_encoding_is_refused_saying_why(pg_uri) -> None:
    from airflow_provider_sqlqueue.transport import TransportMisconfiguredError

    with psycopg.connect(pg_uri, autocommit=True) as connection:
        connection.execute("SET client_encoding TO 'LATIN1'")
        client = QueueClient.connect(connection)
        with pytest.raises(TransportMisconfiguredError, match="client_encoding LATIN1"):
            client.depth(QueueAddress("orders"))
        connection.execute("SET client_encoding TO 'UTF8'")
        assert client.queues() is not None  # set back, the connection serves


def test_sqlqueue_health_with_another_datestyle_names_the_holder(pg_uri, pin) -> None:
    from tests.test_cli import sqlqueue

    uri = options_uri(pg_uri, "DateStyle", "SQL, DMY")
    run = sqlqueue("health", "--conn", uri)
    assert run.returncode in (0, 3), run.stderr
    assert "NotImplementedError" not in run.stderr + run.stdout
    assert f"({APPLICATION}, idle in transaction) since " in run.stdout


async def test_the_asyncio_client_and_the_pumps_pool_under_a_roles_settings(scratch_role) -> None:
    from airflow_provider_sqlqueue.transport import AsyncQueueClient
    from airflow_provider_sqlqueue.transport.drivers import open_pool

    role, uri = scratch_role
    with psycopg.connect(make_conninfo(uri, user="postgres"), autocommit=True) as raw:
        raw.execute(sql.SQL("ALTER ROLE {} SET client_encoding TO 'LATIN1'").format(sql.Identifier(role)))
        raw.execute(sql.SQL("ALTER ROLE {} SET datestyle TO 'German'").format(sql.Identifier(role)))
        schema = fresh_schema(raw, owner=role)
    queue = QueueAddress("orders", schema)
    async with await AsyncQueueClient.connect(uri) as client:
        await client.create_queue(queue)
        await client.send(queue, Message("✓", {"k": "ü"}))
        assert [(m.text, m.headers["k"]) for m in await client.browse(queue)] == [("✓", "ü")]
        assert (await client.horizon()) is not None
    pool = open_pool(uri, max_size=1)
    try:
        async with pool.session() as session:
            pooled = AsyncQueueClient(session)
            [message] = await pooled.receive(queue)
            assert message.headers["k"] == "ü"
    finally:
        await pool.close()
