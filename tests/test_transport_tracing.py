"""Trace context on the wire (:mod:`.transport.tracing`), on a real PostgreSQL, spans caught by the
OpenTelemetry SDK's in-memory exporter: the headers NServiceBus reads, the spans' parents and
links by NServiceBus's rules (a send is continued, a publish starts a new trace linked to it), and
nothing at all without a tracer provider or without OpenTelemetry."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from opentelemetry import baggage, context, trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, StatusCode, TraceFlags, TraceState
from opentelemetry.util._once import Once

from airflow_provider_sqlqueue.transport import Message, MessagePump, QueueAddress, QueueClient, tracing
from airflow_provider_sqlqueue.transport.drivers import open_pool
from airflow_provider_sqlqueue.transport.tracing import BAGGAGE, START_NEW_TRACE, TRACEPARENT, TRACESTATE

#: W3C Trace Context: version 00, trace id, parent span id, flags (sampled; level 2 adds "random").
W3C_TRACEPARENT = re.compile(r"^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")
#: A sender's context from elsewhere (another service, an NServiceBus endpoint).
FOREIGN_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
FOREIGN_SPAN = "00f067aa0ba902b7"
FOREIGN = f"00-{FOREIGN_TRACE}-{FOREIGN_SPAN}-01"


def tracer() -> trace.Tracer:
    """The tests' tracer, from the provider set now (a tracer from the API caches the first one it met)."""
    return trace.get_tracer("tests")


def _reset_global_provider() -> None:
    # The API lets a process set its provider once; each test sets its own.
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace._TRACER_PROVIDER = None


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    _reset_global_provider()
    trace.set_tracer_provider(provider)
    yield exporter
    _reset_global_provider()


def by_name(exporter: InMemorySpanExporter, prefix: str) -> list[ReadableSpan]:
    return [span for span in exporter.get_finished_spans() if span.name.startswith(prefix)]


def stored_headers(client: QueueClient, queue: QueueAddress) -> list[dict[str, Any]]:
    return [dict(m.headers) for m in client.browse(queue)]


def test_send_then_receive_is_one_trace_the_receive_a_child_of_the_send(client, queue, spans):
    with tracer().start_as_current_span("work") as work:
        client.send(queue, Message(b'{"secret": "body"}'))
    (headers,) = stored_headers(client, queue)
    (send,) = by_name(spans, "send ")
    assert W3C_TRACEPARENT.match(headers[TRACEPARENT])
    assert (
        headers[TRACEPARENT]
        == f"00-{send.context.trace_id:032x}-{send.context.span_id:016x}-{send.context.trace_flags:02x}"
    )
    assert headers[START_NEW_TRACE] == "False"  # NServiceBus's value for a send: continue the trace
    assert send.kind is SpanKind.PRODUCER and send.parent.span_id == work.get_span_context().span_id
    assert send.name == f"send {client.dialect.format_address(queue)}"
    assert send.attributes["messaging.system"] == "sqlqueue"
    assert send.attributes["messaging.operation.type"] == "send"
    assert send.attributes["messaging.destination.name"] == client.dialect.format_address(queue)
    assert send.attributes["db.system.name"] == "postgresql"
    (message,) = client.receive(queue)
    (receive,) = by_name(spans, "receive ")
    assert receive.kind is SpanKind.CONSUMER
    assert receive.context.trace_id == send.context.trace_id and receive.parent.span_id == send.context.span_id
    assert receive.attributes["messaging.message.id"] == str(message.id) == send.attributes["messaging.message.id"]
    assert receive.start_time <= receive.end_time
    for span in (send, receive):  # names, ids and counts only: never a body or a header's value
        assert not any("secret" in str(value) for value in span.attributes.values())


def test_tracestate_and_baggage_travel_in_their_w3c_headers(client, queue, spans):
    parent = SpanContext(
        int(FOREIGN_TRACE, 16), int(FOREIGN_SPAN, 16), True, TraceFlags(1), TraceState([("vendor", "v1")])
    )
    ctx = baggage.set_baggage("tenant", "acme", trace.set_span_in_context(NonRecordingSpan(parent)))
    token = context.attach(ctx)
    try:
        client.send(queue, Message(b"x"))
    finally:
        context.detach(token)
    (headers,) = stored_headers(client, queue)
    assert headers[TRACEPARENT].startswith(f"00-{FOREIGN_TRACE}-")
    assert headers[TRACESTATE] == "vendor=v1"
    assert headers[BAGGAGE] == "tenant=acme"


def test_a_batch_send_is_one_span_and_every_message_carries_its_context(client, queue, spans):
    client.send(queue, [Message(f"m{i}") for i in range(3)])
    (send,) = by_name(spans, "send ")
    assert send.attributes["messaging.batch.message_count"] == 3
    assert "messaging.message.id" not in send.attributes
    expected = f"00-{send.context.trace_id:032x}-{send.context.span_id:016x}-{send.context.trace_flags:02x}"
    assert [h[TRACEPARENT] for h in stored_headers(client, queue)] == [expected] * 3


def test_a_message_that_carries_a_traceparent_keeps_it_and_its_receive_continues_that_trace(client, queue, spans):
    given = {TRACEPARENT: FOREIGN, TRACESTATE: "theirs=1", START_NEW_TRACE: "False"}
    client.send(queue, [Message(b"passed on", given), Message(b"new")])
    kept, fresh = stored_headers(client, queue)
    assert {k: kept[k] for k in given} == given and BAGGAGE not in kept
    assert fresh[TRACEPARENT] != FOREIGN
    client.receive(queue, 1)
    (receive,) = by_name(spans, "receive ")
    assert f"{receive.context.trace_id:032x}" == FOREIGN_TRACE and f"{receive.parent.span_id:016x}" == FOREIGN_SPAN


def test_a_malformed_traceparent_is_ignored_with_a_debug_log(client, queue, spans, caplog):
    client.send(queue, Message(b"x", {TRACEPARENT: "00-not-a-trace-01"}))
    assert stored_headers(client, queue)[0][TRACEPARENT] == "00-not-a-trace-01"  # the sender's header, untouched
    with caplog.at_level(logging.DEBUG, logger="airflow_provider_sqlqueue.transport"):
        (message,) = client.receive(queue)
    assert message.text == "x"
    assert any("traceparent" in r.getMessage() and str(message.id) in r.getMessage() for r in caplog.records)
    assert not any(r.levelno > logging.DEBUG and "traceparent" in r.getMessage() for r in caplog.records)
    (receive,) = by_name(spans, "receive ")
    assert receive.parent is None and not receive.links


def test_publish_starts_a_new_trace_at_the_subscriber_linked_to_the_publish(client, queue, spans):
    client.create_subscription_table()
    client.subscribe(queue, "Shop.OrderPlaced")
    client.publish("Shop.OrderPlaced", Message(b"{}"))
    (publish,) = by_name(spans, "publish ")
    assert publish.kind is SpanKind.PRODUCER and publish.name == "publish Shop.OrderPlaced"
    assert not by_name(spans, "send ")  # one span for the publish, whatever the subscribers
    (headers,) = stored_headers(client, queue)
    assert headers[START_NEW_TRACE] == "True"  # NServiceBus's value for a publish
    client.receive(queue)
    (receive,) = by_name(spans, "receive ")
    assert receive.parent is None and receive.context.trace_id != publish.context.trace_id
    assert [link.context.span_id for link in receive.links] == [publish.context.span_id]


def test_a_publish_whose_message_asks_to_continue_the_trace_is_continued(client, queue, spans):
    client.create_subscription_table()
    client.subscribe(queue, "Shop.OrderPlaced")
    client.publish("Shop.OrderPlaced", Message(b"{}", {START_NEW_TRACE: "False"}))  # ContinueExistingTraceOnReceive
    (publish,) = by_name(spans, "publish ")
    client.receive(queue)
    (receive,) = by_name(spans, "receive ")
    assert receive.parent.span_id == publish.context.span_id and not receive.links


def test_a_send_that_asks_for_a_new_trace_gets_one_linked_to_it(client, queue, spans):
    client.send(queue, Message(b"x", {START_NEW_TRACE: "True"}))  # StartNewTraceOnReceive
    (send,) = by_name(spans, "send ")
    client.receive(queue)
    (receive,) = by_name(spans, "receive ")
    assert receive.parent is None and [link.context.span_id for link in receive.links] == [send.context.span_id]


def test_a_batch_receive_links_to_each_message(client, queue, spans):
    for i in range(3):
        client.send(queue, Message(f"m{i}"))
    sends = by_name(spans, "send ")
    with tracer().start_as_current_span("consumer loop") as loop:
        got = client.receive(queue, 10)
    assert len(got) == 3
    (receive,) = by_name(spans, "receive ")
    assert receive.parent.span_id == loop.get_span_context().span_id  # the caller's trace
    assert [link.context.span_id for link in receive.links] == [s.context.span_id for s in sends]
    assert receive.attributes["messaging.batch.message_count"] == 3


def test_claim_reserve_and_take_continue_the_senders_trace_and_ack_settles(client, queue, spans):
    client.send(queue, Message(b"claimed"))
    (send,) = by_name(spans, "send ")
    (message,) = client.claim(queue, 1)
    (claim,) = by_name(spans, "claim ")
    assert claim.parent.span_id == send.context.span_id and claim.attributes["messaging.operation.type"] == "receive"
    assert client.ack(queue, message.claim_token) is True
    client.send(queue, Message(b"reserved"))
    (reserved,) = client.reserve(queue, 1)
    (taken,) = client.take(queue, reserved.claim_token)
    second = by_name(spans, "send ")[1]
    for name in ("reserve ", "take "):
        (span,) = by_name(spans, name)
        assert span.parent.span_id == second.context.span_id
    assert client.ack(queue, taken.claim_token) is True


def test_forward_and_delayed_sends_carry_the_context_of_their_send(client, queue, schema, spans):
    client.send(queue, Message(b"first"))
    (message,) = client.claim(queue, 1)
    later = QueueAddress("later", schema)
    client.create_queue(later, delayed=True)
    with tracer().start_as_current_span("handler"):
        client.forward({queue: message.claim_token}, {later: Message(b"result")})
        client.send(later, Message(b"delayed"), delay=timedelta(milliseconds=1))
    forward_send, delayed_send = by_name(spans, "send ")[1:]
    assert forward_send.attributes["messaging.destination.name"] == client.dialect.format_address(later)
    asyncio.run(asyncio.sleep(0.05))
    assert client.move_due(later) == 1
    got = client.receive(later, 10)
    assert [m.text for m in got] == ["result", "delayed"]
    # NServiceBus: a delayed message's receive starts a new trace linked to its send; a send continues.
    assert [m.headers[START_NEW_TRACE] for m in got] == ["False", "True"]
    (receive,) = by_name(spans, "receive ")
    assert [link.context.span_id for link in receive.links] == [
        forward_send.context.span_id,
        delayed_send.context.span_id,
    ]


def test_a_delayed_message_starts_a_new_trace_linked_to_its_send(client, queue, spans):
    client.send(queue, Message(b"later"), delay=timedelta(milliseconds=1))
    (send,) = by_name(spans, "send ")
    asyncio.run(asyncio.sleep(0.05))
    assert client.move_due(queue) == 1
    (message,) = client.receive(queue)
    (receive,) = by_name(spans, "receive ")
    assert message.headers[START_NEW_TRACE] == "True"
    assert receive.parent is None and [link.context.span_id for link in receive.links] == [send.context.span_id]


async def test_the_pumps_handler_runs_inside_the_process_span(pg_uri, client, queue, schema, spans):
    client.send(queue, [Message(b"ok")])
    client.send(queue, [Message(b"fails")])
    seen: list[tuple[str, Any]] = []

    async def handler(message, connection):
        with tracer().start_as_current_span("user work") as mine:
            seen.append((message.text, mine))
        if message.text == "fails":
            raise ValueError("the body says no")

    pool = open_pool(pg_uri, max_size=2)
    pump = MessagePump(
        pool, queue, handler, transaction_mode="none", error_queue=QueueAddress("error", schema), peek_interval=0.05
    )
    task = asyncio.create_task(pump.run())
    try:
        for _ in range(500):
            if len(seen) == 2:
                break
            await asyncio.sleep(0.02)
    finally:
        pump.stop()
        await asyncio.wait_for(task, 30)
    sends = by_name(spans, "send ")
    processes = by_name(spans, "process ")
    users = by_name(spans, "user work")
    assert len(processes) == 2 and len(users) == 2
    for process, user, send in zip(processes, users, sends, strict=True):
        assert user.parent.span_id == process.context.span_id  # the user's spans nest under process
        assert process.parent.span_id == send.context.span_id and process.kind is SpanKind.CONSUMER
    assert processes[0].status.status_code is StatusCode.UNSET
    assert processes[1].status.status_code is StatusCode.ERROR
    assert processes[1].attributes["error.type"] == "builtins.ValueError"
    assert not any("says no" in str(v) for v in processes[1].attributes.values())


async def test_the_asyncio_client_traces_as_the_blocking_one(pg_uri, queue, spans):
    from airflow_provider_sqlqueue.transport import AsyncQueueClient

    async with await AsyncQueueClient.connect(pg_uri) as client:
        with tracer().start_as_current_span("work") as work:
            await client.send(queue, Message(b"x"))
        (message,) = await client.receive(queue)
    (send,) = by_name(spans, "send ")
    (receive,) = by_name(spans, "receive ")
    assert send.parent.span_id == work.get_span_context().span_id
    assert receive.parent.span_id == send.context.span_id
    assert message.headers[TRACEPARENT].split("-")[2] == f"{send.context.span_id:016x}"


async def test_the_triggers_receive_continues_the_senders_trace(pg_uri, client, queue, schema, spans):
    from airflow_provider_sqlqueue.transport import AsyncQueueClient
    from airflow_provider_sqlqueue.triggers.sqlqueue import SqlQueueTrigger

    client.send(queue, Message(b"reserved"))
    client.send(queue, Message(b"received"))
    first, second = by_name(spans, "send ")
    for mode in ("claim", "none"):  # a reservation (claim mode) takes the oldest
        trigger = SqlQueueTrigger(
            sqlqueue_conn_id="unused", queue_name=f'orders@"{schema}"', max_messages=1, transaction_mode=mode
        )
        async with await AsyncQueueClient.connect(pg_uri) as lent:
            assert len(await trigger._receive(lent)) == 1
    (reserve,) = by_name(spans, "reserve ")
    (receive,) = by_name(spans, "receive ")
    assert reserve.parent.span_id == first.context.span_id
    assert receive.parent.span_id == second.context.span_id


def test_a_failing_tracer_never_fails_a_send_a_receive_or_a_handler(client, queue, spans, monkeypatch, caplog):
    class Broken:
        def start_span(self, *args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("the tracer is broken")

    assert tracing._api() is not None
    monkeypatch.setattr(tracing._otel, "tracer", Broken())
    with caplog.at_level(logging.DEBUG, logger="airflow_provider_sqlqueue.transport"):
        client.send(queue, [Message(b"a"), Message(b"b")])
        assert TRACEPARENT not in stored_headers(client, queue)[0]
        assert [m.text for m in client.receive(queue, 1)] == ["a"]
        with client.receive_native(queue) as message:
            assert message is not None and message.text == "b"
    assert client.depth(queue) == 0
    assert any("Not tracing" in r.getMessage() for r in caplog.records)


def test_an_unsampled_send_still_carries_its_context(client, queue, spans):
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

    _reset_global_provider()
    trace.set_tracer_provider(TracerProvider(sampler=ALWAYS_OFF))
    client.send(queue, Message(b"x"))
    (headers,) = stored_headers(client, queue)
    assert W3C_TRACEPARENT.match(headers[TRACEPARENT]) and int(headers[TRACEPARENT][-2:], 16) & 1 == 0  # not sampled
    assert headers[START_NEW_TRACE] == "False"
    client.receive(queue)
    assert not spans.get_finished_spans()


def test_without_a_tracer_provider_nothing_is_written_or_made(client, queue):
    _reset_global_provider()
    assert tracing.clock() == 0
    client.send(queue, [Message(b"a"), Message(b"b", {TRACEPARENT: FOREIGN})])
    first, second = stored_headers(client, queue)
    assert TRACEPARENT not in first and START_NEW_TRACE not in first
    assert second[TRACEPARENT] == FOREIGN
    assert [m.text for m in client.receive(queue, 10)] == ["a", "b"]


def test_without_opentelemetry_installed_sends_and_receives_work(pg_uri, schema):
    script = textwrap.dedent(
        f"""
        import sys
        sys.modules["opentelemetry"] = None  # as if not installed: every import of it fails
        from airflow_provider_sqlqueue.transport import Message, QueueAddress, QueueClient
        from airflow_provider_sqlqueue.transport import tracing
        with QueueClient.connect({pg_uri!r}) as client:
            queue = QueueAddress("plain", {schema!r})
            client.create_queue(queue)
            client.send(queue, Message(b"x"))
            (message,) = client.receive(queue)
            assert "traceparent" not in message.headers, message.headers
            assert tracing.clock() == 0 and tracing._otel is None
        print("ok")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_the_headers_are_json_strings_an_nservicebus_endpoint_reads(client, queue, raw, spans):
    client.send(queue, Message(b"x"))
    text = raw.execute(f'SELECT headers FROM "{queue.schema}"."{queue.table}"').fetchone()[0]
    headers = json.loads(text)
    assert all(isinstance(value, str) for value in headers.values())
    assert {TRACEPARENT, START_NEW_TRACE} <= set(headers)


def test_a_native_receives_block_runs_inside_the_process_span(client, queue, spans):
    client.send(queue, Message(b"x"))
    (send,) = by_name(spans, "send ")
    with client.receive_native(queue) as message:
        assert message is not None
        with tracer().start_as_current_span("user work"):
            pass
    (process,) = by_name(spans, "process ")
    (user,) = by_name(spans, "user work")
    assert user.parent.span_id == process.context.span_id and process.parent.span_id == send.context.span_id


def test_hold_messages_work_runs_in_a_process_span_per_message_or_batch(conn_id, client, queue, schema, spans):
    from airflow_provider_sqlqueue.tasks import hold_messages
    from tests.test_tasks import context as task_context

    client.send(queue, [Message("a")])
    client.send(queue, [Message("b")])
    sends = by_name(spans, "send ")
    claimed = [m.to_dict(f'orders@"{schema}"') for m in client.claim(queue, 2)]

    def work(message: Any) -> str:
        with tracer().start_as_current_span("user work"):
            return str(message)

    with hold_messages(claimed, sqlqueue_conn_id=conn_id, context=task_context()) as held:
        held.map(work)
        held.batch(lambda messages: [work(m) for m in messages])
    one_a, one_b, both = by_name(spans, "process ")
    assert [one_a.parent.span_id, one_b.parent.span_id] == [s.context.span_id for s in sends]
    assert [link.context.span_id for link in both.links] == [s.context.span_id for s in sends]
    users = by_name(spans, "user work")
    assert [u.parent.span_id for u in users] == [
        one_a.context.span_id,
        one_b.context.span_id,
        *[both.context.span_id] * 2,
    ]


def test_a_spark_claim_read_links_each_partitions_read_to_its_messages(pg_uri, client, queue, schema, spans):
    pytest.importorskip("pyspark")
    from tests.test_spark_read import read

    for i in range(3):
        client.send(queue, Message(f"m{i}"))
    sends = by_name(spans, "send ")
    name = f'orders@"{schema}"'
    got = read({"url": pg_uri, "queue": name, "mode": "claim", "holder": "h1", "numPartitions": "1"})
    assert sum(batch.num_rows for batch in got) == 3
    (claim,) = by_name(spans, "claim ")
    (partition,) = by_name(spans, "read ")
    for span in (claim, partition):
        assert sorted(link.context.span_id for link in span.links) == sorted(s.context.span_id for s in sends)
    browse = read({"url": pg_uri, "queue": name, "numPartitions": "1"})
    assert sum(batch.num_rows for batch in browse) == 0  # claimed: nothing waits


def parent_of(span: ReadableSpan) -> int | None:
    return None if span.parent is None else span.parent.span_id


def test_a_chain_of_stages_is_one_trace_from_the_outside_sender_each_stage_a_child_of_the_last(
    conn_id, client, queue, schema, spans
):
    """An NServiceBus endpoint's message (its traceparent) through two stages: each stage's process
    span is the child of the send that delivered to it, and each stage's send the child of its process
    span, as NServiceBus sends from a handler; the publish at the end continues it too."""
    from airflow_provider_sqlqueue.operators.sqlqueue import ForwardMessagesOperator, PublishMessageOperator
    from airflow_provider_sqlqueue.tasks import hold_messages
    from tests.test_tasks import context as task_context

    enrich = QueueAddress("enrich", schema)
    client.create_queue(enrich)
    client.create_subscription_table(QueueAddress("SubscriptionRouting", schema))
    report = QueueAddress("report", schema)
    client.create_queue(report)
    client.subscribe(report, "Shop.Reported", table=QueueAddress("SubscriptionRouting", schema))
    client.send(
        queue, Message('{"order": 1}', {TRACEPARENT: FOREIGN, "NServiceBus.OpenTelemetry.StartNewTrace": "False"})
    )

    def stage(source: QueueAddress) -> dict[str, Any]:
        claimed = [m.to_dict(client.canonical_address(source)) for m in client.claim(source, 1)]
        with hold_messages(claimed, sqlqueue_conn_id=conn_id, context=task_context()) as held:
            results = held.batch(lambda batch: [{"from": m["id"]} for m in batch])  # a Spark job's shape
            return {"claims": held.messages, "results": results}

    first = stage(queue)
    ForwardMessagesOperator(
        task_id="forward",
        queue_name=str(enrich),
        messages=first["results"],
        claims=first["claims"],
        sqlqueue_conn_id=conn_id,
    ).execute(task_context())
    second = stage(enrich)
    PublishMessageOperator(
        task_id="publish", topics="Shop.Reported", messages=second["results"], claims=second["claims"],
        subscription_table=str(QueueAddress("SubscriptionRouting", schema)), sqlqueue_conn_id=conn_id,
    ).execute(task_context())  # fmt: skip

    process_1, process_2 = by_name(spans, "process ")
    [forwarded] = [s for s in by_name(spans, "send ") if enrich.table in s.name]
    [published] = by_name(spans, "publish ")
    stages = (process_1, forwarded, process_2, published)
    assert {s.context.trace_id for s in stages} == {int(FOREIGN_TRACE, 16)}  # one trace, the outside sender's
    assert parent_of(process_1) == int(FOREIGN_SPAN, 16)
    assert parent_of(forwarded) == process_1.context.span_id
    assert parent_of(process_2) == forwarded.context.span_id
    assert parent_of(published) == process_2.context.span_id
    [event] = stored_headers(client, report)
    assert event[TRACEPARENT].split("-")[1] == FOREIGN_TRACE  # a subscriber starts its own, linked (NServiceBus's rule)
    assert event[START_NEW_TRACE] == "True"


def test_the_results_of_a_map_each_continue_their_own_messages_trace(conn_id, client, queue, schema, spans):
    """Two messages of two traces, processed one by one: each result is sent in its own message's
    process span, the two sends commit together; a batch of several links and its results continue it."""
    from airflow_provider_sqlqueue.operators.sqlqueue import ForwardMessagesOperator
    from airflow_provider_sqlqueue.tasks import PROCESS_CONTEXT, hold_messages
    from tests.test_tasks import context as task_context

    other = "0af7651916cd43dd8448eb211c80319c"
    client.send(queue, Message("a", {TRACEPARENT: FOREIGN}))
    client.send(queue, Message("b", {TRACEPARENT: f"00-{other}-b7ad6b7169203331-01"}))
    results = QueueAddress("results", schema)
    client.create_queue(results)
    claimed = [m.to_dict(client.canonical_address(queue)) for m in client.claim(queue, 2)]
    with hold_messages(claimed, sqlqueue_conn_id=conn_id, context=task_context()) as held:
        made = held.map(lambda m: m["body"].upper())
        kept = held.messages
    assert all(PROCESS_CONTEXT in m for m in kept)
    ForwardMessagesOperator(
        task_id="forward", queue_name=str(results), messages=made, claims=kept, sqlqueue_conn_id=conn_id
    ).execute(task_context())
    process_a, process_b = by_name(spans, "process ")
    send_a, send_b = [s for s in by_name(spans, "send ") if results.table in s.name]
    assert (parent_of(send_a), parent_of(send_b)) == (process_a.context.span_id, process_b.context.span_id)
    assert [s.context.trace_id for s in (send_a, send_b)] == [int(FOREIGN_TRACE, 16), int(other, 16)]
    by_body = {m.text: m.headers[TRACEPARENT].split("-")[1] for m in client.browse(results)}
    assert by_body == {"A": FOREIGN_TRACE, "B": other}
    assert client.depth(queue) == 0 and client.in_flight(queue) == 0


def test_a_forward_whose_claims_were_not_held_by_a_task_continues_their_senders_trace(
    conn_id, client, queue, schema, spans
):
    """A sensor's message dicts (no process span recorded): the forward is the child of the sender's
    span; several claims whose results are not one per message: one span linked to each."""
    from airflow_provider_sqlqueue.operators.sqlqueue import ForwardMessagesOperator
    from tests.test_tasks import context as task_context

    client.send(queue, Message("a", {TRACEPARENT: FOREIGN}))
    target = QueueAddress("target", schema)
    client.create_queue(target)
    claimed = [m.to_dict(client.canonical_address(queue)) for m in client.claim(queue, 1)]
    ForwardMessagesOperator(
        task_id="forward", queue_name=str(target), messages=["x", "y"], claims=claimed, sqlqueue_conn_id=conn_id
    ).execute(task_context())
    [send] = [s for s in by_name(spans, "send ") if target.table in s.name]
    assert parent_of(send) == int(FOREIGN_SPAN, 16)

    client.send(queue, Message("b", {TRACEPARENT: FOREIGN}))
    client.send(queue, Message("c", {TRACEPARENT: f"00-{'1' * 32}-{'2' * 16}-01"}))
    claimed = [m.to_dict(client.canonical_address(queue)) for m in client.claim(queue, 2)]
    ForwardMessagesOperator(
        task_id="forward", queue_name=str(target), messages=["one for both"], claims=claimed, sqlqueue_conn_id=conn_id
    ).execute(task_context())
    [forward] = by_name(spans, "forward ")
    assert [link.context.span_id for link in forward.links] == [int(FOREIGN_SPAN, 16), int("2" * 16, 16)]
    [send] = [s for s in by_name(spans, "send ") if target.table in s.name][1:]
    assert parent_of(send) == forward.context.span_id


def test_continuing_nothing_readable_or_without_a_provider_runs_the_block_as_it_is(spans):
    ran = []
    with tracing.continuing(lambda: "q", [None, {TRACEPARENT: "garbage"}, {}]):
        ran.append(trace.get_current_span().get_span_context().is_valid)
    assert ran == [False] and not spans.get_finished_spans()
    _reset_global_provider()
    with tracing.continuing(lambda: "q", [{TRACEPARENT: FOREIGN}]):
        ran.append(tracing.current_context())
    assert ran[1] is None
