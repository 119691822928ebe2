"""A message's journey (:mod:`.operations.journey`): the rows a message, or every message of one
trace, left in a database's queues, audit and error queues and claim stores, in the order they
happened, on real servers."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from airflow_provider_sqlqueue.transport import (
    ArgumentTypeError,
    AsyncQueueClient,
    InvalidArgumentError,
    Message,
    PermissionDeniedError,
    QueueAddress,
    QueueClient,
)
from airflow_provider_sqlqueue.transport import operations as ops

pytestmark = pytest.mark.every_dialect

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


def traceparent(span: str) -> str:
    """A traceparent as an NServiceBus 8 endpoint writes one, in the trace :data:`TRACE`."""
    return f"00-{TRACE}-{span}-01"


@pytest.fixture
def stages(backend, schema):
    """Two stages, ``ingest`` then ``enrich``, in a schema with an audit queue: the client audits."""
    ingest, enrich, audit = (QueueAddress(name, schema) for name in ("ingest", "enrich", "audit"))
    with backend.client(schema) as plain:
        for address in (ingest, enrich, audit):
            plain.create_queue(address)
    with QueueClient.connect(backend.uri, error_queue=QueueAddress("error", schema), audit_queue=audit) as client:
        yield client, ingest, enrich


def test_a_message_and_its_trace_are_followed_through_two_stages(stages):
    client, ingest, enrich = stages
    outside = Message('{"order": 1}', {"traceparent": traceparent("00f067aa0ba902b7"), "city": "Zürich 東京 🚚"})
    client.send(ingest, outside)
    [claim] = client.claim(ingest, 1)
    result = Message('{"order": 1, "enriched": true}', {"traceparent": traceparent("b7ad6b7169203331")})
    client.forward({ingest: [claim.claim_token]}, {enrich: [result]})
    [held] = client.claim(enrich, 1, holder="enrich-task")

    mine = client.journey(str(outside.id).upper())  # as SQL Server prints a uniqueidentifier
    assert mine.kind == "message"
    [processed] = mine.sightings
    assert (processed.station, processed.queue, processed.message_id) == ("processed", "ingest", str(outside.id))
    assert processed.table == QueueAddress("audit", ingest.schema)
    assert processed.headers["city"] == "Zürich 東京 🚚"
    assert processed.waited(mine.checked_at) >= timedelta(0)
    assert processed.processing is not None and processed.processing >= timedelta(0)
    assert mine.trace_ids == (TRACE,)

    trace = client.journey(traceparent("ffffffffffffffff"))  # a whole traceparent names its trace
    assert trace.kind == "trace"
    assert [(s.station, s.message_id) for s in trace.sightings] == [
        ("processed", str(outside.id)),
        ("claimed", str(held.id)),
    ]
    claimed = trace.sightings[1]
    assert (claimed.holder, claimed.deliveries, claimed.trace) == ("enrich-task", 1, (TRACE, "b7ad6b7169203331"))
    assert claimed.queue == client.dialect.claim_key(enrich)
    assert set(trace.searched) >= {ingest, enrich, client.dialect.inflight_address(ingest)}
    assert not [a for a in trace.partial if a.schema == ingest.schema] and not trace.more  # other tests' queues vary


def test_a_failure_shows_where_and_why_and_a_waiting_message_where_it_waits(stages):
    client, ingest, enrich = stages
    failing = Message("bad", {"traceparent": traceparent("00f067aa0ba902b7")})
    waiting = Message("later", {"traceparent": traceparent("1111111111111111")})
    client.send(ingest, failing)
    [claim] = client.claim(ingest, 1)
    client.fail(ingest, claim, ValueError("no such customer"))
    client.send(enrich, waiting)

    found = client.journey(TRACE)
    failed, still = found.sightings
    assert (failed.station, failed.queue) == ("failed", client.canonical_address(ingest))
    assert "ValueError" in (failed.exception or "") and "no such customer" in (failed.exception or "")
    assert failed.ended is not None and failed.waited(found.checked_at) is not None
    assert (still.station, still.queue, still.message_id) == (
        "waiting",
        client.dialect.format_address(enrich),
        str(waiting.id),
    )


def test_only_the_message_itself_is_found_not_one_that_names_it_in_another_header(stages):
    client, ingest, _ = stages
    original = Message("question")
    client.send(ingest, original)
    client.send(ingest, Message("answer", {"NServiceBus.CorrelationId": str(original.id), "note": str(original.id)}))
    found = client.journey(original.id)
    assert [s.message_id for s in found.sightings] == [str(original.id)]
    assert found.sightings[0].station == "waiting"
    assert not client.journey(uuid.uuid4()).sightings


def test_a_long_queue_is_searched_in_its_newest_rows_and_says_it_was_not_searched_whole(stages, backend):
    client, ingest, _ = stages
    first = Message("the oldest", {"traceparent": traceparent("00f067aa0ba902b7")})
    client.send(ingest, first)
    client.send(ingest, [Message(f"filler {n}", {"traceparent": traceparent(f"{n + 1:016x}")}) for n in range(30)])

    found = client.journey(TRACE, queues=[ingest], scan=10, limit=5)
    assert found.partial == (ingest,)
    assert found.more  # ten match in the newest ten, five are shown
    assert len(found.sightings) == 5
    assert first.id not in {s.row_id for s in found.sightings}
    by_id = client.journey(first.id, queues=[ingest], scan=10)
    # PostgreSQL finds an old row by its indexed Id; SQL Server's NServiceBus tables index no Id.
    assert [s.row_id for s in by_id.sightings] == ([first.id] if backend.name == "postgres" else [])
    assert by_id.partial == (ingest,)


def test_headers_that_cannot_be_read_or_carry_a_malformed_traceparent_are_passed_over(stages, raw, backend):
    client, ingest, _ = stages
    readable = Message("readable", {"traceparent": traceparent("00f067aa0ba902b7")})
    client.send(ingest, readable)
    client.send(ingest, Message("shouting", {"traceparent": traceparent("00f067aa0ba902b7").upper()}))
    client.send(ingest, Message("version ff", {"traceparent": f"ff-{TRACE}-00f067aa0ba902b7-01"}))
    backend.nservicebus_send(raw, ingest.schema, ingest.table, uuid.uuid4(), "not json " + TRACE, b"")
    found = client.journey(TRACE, queues=[ingest])
    assert [s.message_id for s in found.sightings] == [str(readable.id)]  # W3C's form only, as a receive reads it
    assert found.sightings[0].trace == (TRACE, "00f067aa0ba902b7")


@pytest.mark.parametrize(
    ("given", "error"),
    [
        ("", InvalidArgumentError),
        ("orders", InvalidArgumentError),
        ("0" * 32, InvalidArgumentError),
        (f"00-{'0' * 32}-00f067aa0ba902b7-01", InvalidArgumentError),
        (TRACE[:-1] + "g", InvalidArgumentError),
        ("%", InvalidArgumentError),
        ("' OR 1=1 --", InvalidArgumentError),
        ("4bf92f35\x0077b34da6a3ce929d0e0e4736", InvalidArgumentError),
        ("\udcff" * 32, InvalidArgumentError),
        (42, ArgumentTypeError),
        (None, ArgumentTypeError),
        (b"4bf92f3577b34da6a3ce929d0e0e4736", ArgumentTypeError),
    ],
)
def test_what_is_neither_a_message_id_nor_a_trace_id_is_refused_naming_both(stages, given, error):
    client, _, _ = stages
    with pytest.raises(error) as refused:
        client.journey(given)
    assert "message id" in str(refused.value) and "trace id" in str(refused.value)


def test_the_key_is_read_as_a_message_id_a_trace_id_or_a_traceparent():
    assert ops.journey_key(f"  {TRACE.upper()} ") == ("trace", TRACE)
    assert ops.journey_key(traceparent("00f067aa0ba902b7")) == ("trace", TRACE)
    some = uuid.uuid4()
    assert ops.journey_key(some) == ("message", str(some))
    assert ops.journey_key(f"{{{some}}}".strip("{}")) == ("message", str(some))


@pytest.mark.postgres_only
def test_a_role_that_may_not_read_the_audit_queue_is_told_what_it_could_not_search(stages, backend, pg_uri):
    client, ingest, enrich = stages
    outside = Message("x", {"traceparent": traceparent("00f067aa0ba902b7")})
    client.send(ingest, outside)
    [claim] = client.claim(ingest, 1)
    client.forward({ingest: [claim.claim_token]}, {enrich: [Message("y", {"traceparent": traceparent("1" * 16)})]})
    role = f"journey_{uuid.uuid4().hex[:8]}"
    schema = ingest.schema
    with psycopg.connect(pg_uri, autocommit=True) as admin:
        admin.execute(f'CREATE ROLE "{role}" LOGIN')
        try:
            admin.execute(f'GRANT USAGE ON SCHEMA "{schema}" TO "{role}"')
            admin.execute(f'GRANT SELECT ON "{schema}"."ingest", "{schema}"."enrich" TO "{role}"')
            with QueueClient.connect(psycopg.conninfo.make_conninfo(pg_uri, user=role)) as limited:
                found = limited.journey(TRACE)
                assert [s.station for s in found.sightings] == ["waiting"]  # not the audit copy, nor the claim store
                assert found.unreadable is not None and found.unreadable >= 1
                assert client.dialect.inflight_address(ingest) not in found.searched
                with pytest.raises(PermissionDeniedError):  # naming the audit queue: the database's refusal
                    limited.journey(TRACE, queues=[QueueAddress("audit", schema)])
        finally:
            admin.execute(f'DROP OWNED BY "{role}"')
            admin.execute(f'DROP ROLE "{role}"')


@pytest.mark.parametrize("dialect", ["postgres", "sqlserver"])
async def test_a_survey_passes_over_a_queue_dropped_since_it_was_listed_a_named_one_fails(dialect):
    """Scripted (:mod:`tests.operations_script`): the catalog answers no columns for ``gone``."""
    from airflow_provider_sqlqueue.transport.errors import QueueNotFoundError
    from tests.operations_script import QUEUE, Script, dialect_with_known_tables

    d = dialect_with_known_tables(dialect)
    gone = QUEUE.sibling("gone")
    row = (7, uuid.uuid4(), json.dumps({"traceparent": traceparent("00f067aa0ba902b7")}))
    answers = {
        "find": lambda step: [row] if step.target == d.qualified_name(QUEUE) else [],
        "scanned_all": lambda step: (True,),
        "can_read": lambda step: (False,),  # the claim store: not readable, not searched
        "queue_columns": lambda step: [],
        "schema_exists": lambda step: (True,),
        "lock_timeout": lambda step: ("0",),
    }

    def runner(script: Script):
        async def run(op):
            async def execute(step):
                return script(step)

            return await ops.drive(op, execute)

        return run

    wait = timedelta(seconds=1)
    found = await ops.journey(runner(Script(d, answers)), d, "trace", TRACE, [gone, QUEUE], 100, 10, wait, survey=True)
    assert [s.row_id for s in found.sightings] == [row[1]]
    assert found.searched == (QUEUE,) and found.locked == ()
    with pytest.raises(QueueNotFoundError):
        await ops.journey(runner(Script(d, answers)), d, "trace", TRACE, [gone, QUEUE], 100, 10, wait)


@pytest.mark.postgres_only  # found through the Id index, which SQL Server's queue table does not have
def test_a_message_whose_headers_cannot_be_read_is_found_by_its_id_as_unreadable(stages, raw, backend):
    client, ingest, _ = stages
    poison = uuid.uuid4()
    backend.nservicebus_send(raw, ingest.schema, ingest.table, poison, "not json", b"")
    found = client.journey(str(poison), queues=[ingest])
    [seen] = found.sightings
    assert (seen.station, seen.row_id, seen.headers, seen.waited(found.checked_at)) == ("unreadable", poison, {}, None)


def test_clocks_that_disagree_give_no_duration_rather_than_a_negative_one(stages):
    """A stage whose clock is behind the sender's says it started before the message was sent."""
    client, ingest, _ = stages
    message = Message("skewed")
    client.send(ingest, message)
    [claim] = client.claim(ingest, 1)
    client.forward({ingest: [claim.claim_token]}, {}, started={claim.id: datetime.now(UTC) - timedelta(hours=1)})
    found = client.journey(str(message.id), queues=[ingest, QueueAddress("audit", ingest.schema)])
    [processed] = found.sightings
    assert processed.station == "processed" and processed.started is not None
    assert processed.waited(found.checked_at) is None  # not -1 h
    assert processed.processing is not None and processed.processing >= timedelta(0)


def test_the_limit_keeps_what_happened_first_whatever_order_the_rows_were_written_in(stages, raw, backend):
    client, ingest, _ = stages
    for _ in range(5):  # rows with no time at all, written first
        undated = uuid.uuid4()
        headers = {"NServiceBus.MessageId": str(undated), "traceparent": traceparent("1111111111111111")}
        backend.nservicebus_send(raw, ingest.schema, ingest.table, undated, json.dumps(headers), b"")
    dated = Message("dated", {"traceparent": traceparent("2222222222222222")})
    client.send(ingest, dated)
    found = client.journey(TRACE, queues=[ingest], limit=1)
    assert [s.message_id for s in found.sightings] == [str(dated.id)] and found.more


def test_a_queue_named_twice_is_searched_once(stages):
    client, ingest, _ = stages
    client.send(ingest, Message("once", {"traceparent": traceparent("00f067aa0ba902b7")}))
    found = client.journey(TRACE, queues=[ingest, ingest, client.canonical_address(ingest)])
    assert len(found.sightings) == 1 and found.searched.count(ingest) == 1


async def test_a_survey_leaves_out_a_table_that_fails_while_searched_and_a_lost_connection_ends_it(stages):
    """A table dropped between the listing and its search fails its statement: that table is left
    out and the others answer; a lost connection ends the survey at once."""
    from airflow_provider_sqlqueue.transport import QueueNotFoundError, TransportUnavailableError

    client, ingest, _ = stages
    message = Message("found", {"traceparent": traceparent("00f067aa0ba902b7")})
    client.send(ingest, message)
    other = QueueAddress("orders", "another_schema")
    aclient = await AsyncQueueClient.connect(client.connection.info.dsn)
    failures: list[Exception] = []

    async def run(op):
        if failures:
            op.close()
            raise failures.pop()
        return await aclient._run(op)

    wait = timedelta(seconds=5)
    try:
        failures[:] = [QueueNotFoundError("dropped while searched")]  # other is searched first
        found = await ops.journey(run, aclient.dialect, "trace", TRACE, [other, ingest], 100, 10, wait, survey=True)
        assert [s.message_id for s in found.sightings] == [str(message.id)] and other not in found.searched
        failures[:] = [TransportUnavailableError("gone")]
        with pytest.raises(TransportUnavailableError):
            await ops.journey(run, aclient.dialect, "trace", TRACE, [other, ingest], 100, 10, wait, survey=True)
    finally:
        await aclient.close()


@pytest.mark.postgres_only  # SQL Server's watchers do not bound lock waits (the dialect says None)
def test_a_table_locked_by_another_session_is_left_out_and_named_and_the_rest_is_searched(stages, pg_uri):
    """A migration holds a queue table and the claim store: the journey waits the lock wait once,
    then a short while for the next locked table, and answers from the others (no hang)."""
    client, ingest, enrich = stages
    client.send(ingest, Message("held", {"traceparent": traceparent("00f067aa0ba902b7")}))
    client.send(enrich, Message("free", {"traceparent": traceparent("1111111111111111")}))
    store = client.dialect.inflight_address(ingest)
    with psycopg.connect(pg_uri) as migration:
        migration.execute(f'LOCK TABLE "{ingest.schema}"."{ingest.table}" IN ACCESS EXCLUSIVE MODE')
        migration.execute(f'LOCK TABLE "{store.schema}"."{store.table}" IN ACCESS EXCLUSIVE MODE')
        found = client.journey(TRACE, queues=[ingest, enrich], lock_wait=0.5)
        assert found.locked == (ingest, store)
        assert [s.queue for s in found.sightings] == [client.dialect.format_address(enrich)]
        assert found.searched == (enrich,)
        migration.rollback()
    assert len(client.journey(TRACE, queues=[ingest, enrich]).sightings) == 2
