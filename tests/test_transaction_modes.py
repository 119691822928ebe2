"""The three transaction modes, the error queue and poison rows, each checked by counting rows."""

from __future__ import annotations

import json
import time
import uuid

import pytest

from airflow_provider_sqlqueue.transport import Message, QueueAddress
from tests.backends import execute_on

pytestmark = pytest.mark.every_dialect

FAILURE_KEYS = {
    "NServiceBus.FailedQ",
    "NServiceBus.TimeOfFailure",
    "NServiceBus.ExceptionInfo.ExceptionType",
    "NServiceBus.ExceptionInfo.Message",
    "NServiceBus.ExceptionInfo.Source",
    "NServiceBus.ExceptionInfo.StackTrace",
}


def error_rows(raw, schema, backend):
    rows = raw.execute(f'SELECT id, headers, body FROM "{schema}"."error" ORDER BY {backend.seq}').fetchall()
    return [(uuid.UUID(str(id_)), headers, bytes(body)) for id_, headers, body in rows]


def inflight_rows(raw, schema):
    return raw.execute(f'SELECT count(*) FROM "{schema}".sqlqueue_inflight').fetchone()[0]


# -- none ------------------------------------------------------------------------------------------


def test_none_mode_removes_before_returning(client, queue, raw, schema):
    client.send(queue, [Message("a"), Message("b")])
    [first] = client.receive(queue)
    assert first.text == "a"
    assert client.depth(queue) == 1  # gone for good: at-most-once


def test_none_mode_failed_message_copied_to_error_queue_with_failure_headers(client, queue, raw, schema, backend):
    client.send(queue, Message(b"\x00\xffdata", {"k": "v"}))
    [message] = client.receive(queue)
    try:
        raise RuntimeError("handler broke")
    except RuntimeError as exc:
        client.move_to_error(queue, message, exc)
    [(row_id, headers_text, body)] = error_rows(raw, schema, backend)
    headers = json.loads(headers_text)
    assert row_id == message.id and body == b"\x00\xffdata"
    assert headers.keys() >= FAILURE_KEYS
    assert headers["NServiceBus.FailedQ"] == client.session.dialect.format_address(queue)
    assert headers["NServiceBus.ExceptionInfo.ExceptionType"] == "builtins.RuntimeError"
    assert headers["NServiceBus.ExceptionInfo.Message"] == "handler broke"
    assert "RuntimeError: handler broke" in headers["NServiceBus.ExceptionInfo.StackTrace"]
    assert headers["k"] == "v"


# -- native ----------------------------------------------------------------------------------------


def test_native_mode_commits_handler_sql_with_the_receive(client, queue, raw, schema, backend):
    raw.execute(f'CREATE TABLE "{schema}".ledger (message_id {backend.uuid_type})')
    client.send(queue, Message("pay"))
    with client.receive_native(queue) as message:
        execute_on(client.session, f'INSERT INTO "{schema}".ledger VALUES (%s)', (message.id,))
    assert [uuid.UUID(str(r[0])) for r in raw.execute(f'SELECT message_id FROM "{schema}".ledger').fetchall()] == [
        message.id
    ]
    assert client.depth(queue) == 0


def test_native_mode_handler_failure_rolls_back_both(client, queue, raw, schema, backend):
    raw.execute(f'CREATE TABLE "{schema}".ledger (message_id {backend.uuid_type})')
    sent = Message("pay")
    client.send(queue, sent)
    with pytest.raises(RuntimeError, match="boom"), client.receive_native(queue) as message:  # noqa: PT012 - the handler's write, then its failure
        execute_on(client.session, f'INSERT INTO "{schema}".ledger VALUES (%s)', (message.id,))
        raise RuntimeError("boom")
    assert raw.execute(f'SELECT count(*) FROM "{schema}".ledger').fetchone()[0] == 0
    assert client.depth(queue) == 1
    with client.receive_native(queue) as again:
        assert again.id == sent.id
    assert client.depth(queue) == 0


def test_native_mode_holds_the_row_while_handling(client, queue, backend, schema):
    client.send(queue, [Message("first"), Message("second")])
    with backend.client(schema) as other:
        with client.receive_native(queue) as message:
            assert message.text == "first"
            assert [m.text for m in other.receive(queue, 5)] == ["second"]
            assert other.receive(queue, 5) == []
        assert client.depth(queue) == 0


def test_native_mode_on_empty_queue_yields_none(client, queue):
    with client.receive_native(queue) as message:
        assert message is None


# -- claim -----------------------------------------------------------------------------------------


def test_claim_ack_removes_for_good(client, queue, raw, schema):
    client.send(queue, [Message("a"), Message("b")])
    claims = client.claim(queue, 5)
    assert [c.text for c in claims] == ["a", "b"]
    assert all(c.claim_token and c.deliveries == 1 for c in claims)
    assert client.depth(queue) == 0 and client.in_flight(queue) == 2
    assert client.claim(queue, 5) == []  # held by a lease: not receivable
    assert client.ack(queue, claims[0].claim_token) is True
    assert client.ack(queue, claims[0].claim_token) is False  # second ack: nothing to remove
    assert client.ack(queue, claims[1].claim_token) is True
    assert inflight_rows(raw, schema) == 0 and client.depth(queue) == 0


def test_claim_nack_redelivers_with_count_and_new_token(client, queue):
    client.send(queue, Message("retry me"))
    [first] = client.claim(queue)
    assert client.nack(queue, first.claim_token, error="transient") is True
    assert client.peek(queue, include_claims=True) == 1
    [second] = client.claim(queue)
    assert (second.id, second.deliveries) == (first.id, 2)
    assert second.claim_token != first.claim_token
    assert client.ack(queue, first.claim_token) is False  # the stale holder cannot settle it
    assert client.ack(queue, second.claim_token) is True


def test_claim_lease_expiry_makes_message_receivable_again(client, queue):
    client.send(queue, Message("slow"))
    [held] = client.claim(queue, lease=0.2)
    assert client.claim(queue, lease=0.2) == []
    assert client.extend(queue, held.claim_token, lease=0.3) is True
    time.sleep(0.1)
    assert client.claim(queue) == []  # extended lease still held
    time.sleep(0.4)
    [again] = client.claim(queue)
    assert (again.id, again.deliveries) == (held.id, 2)
    assert client.extend(queue, held.claim_token) is False
    assert client.ack(queue, held.claim_token) is False
    assert client.ack(queue, again.claim_token) is True


def test_claim_max_deliveries_moves_to_error_queue(client, queue, raw, schema, backend):
    client.send(queue, Message("poisonous work", {"trace": "t-1"}))
    for attempt in range(1, 4):
        [claim] = client.claim(queue, max_deliveries=3)
        assert claim.deliveries == attempt
        client.nack(queue, claim.claim_token, error=f"ValueError: attempt {attempt}")
    assert client.claim(queue, max_deliveries=3) == []
    assert client.in_flight(queue) == 0 and client.depth(queue) == 0
    [(row_id, headers_text, body)] = error_rows(raw, schema, backend)
    headers = json.loads(headers_text)
    assert row_id == claim.id and body == b"poisonous work"
    assert headers["NServiceBus.ExceptionInfo.Message"] == "ValueError: attempt 3"
    assert headers["NServiceBus.FailedQ"] == client.session.dialect.format_address(queue)
    assert headers["SqlQueue.DeliveryCount"] == "3"
    assert headers["trace"] == "t-1"


def test_claim_expired_message_is_dropped_not_delivered(client, queue):
    client.send(queue, Message("short", time_to_be_received=0.3))
    [_held] = client.claim(queue, lease=0.05)
    time.sleep(0.4)
    assert client.claim(queue) == []
    assert client.in_flight(queue) == 0


def test_fail_moves_claim_to_error_at_once(client, queue, raw, schema, backend):
    client.send(queue, Message("never works"))
    [claim] = client.claim(queue)
    assert client.fail(queue, claim, ValueError("bad data")) is True
    assert client.in_flight(queue) == 0
    [(_, headers_text, _)] = error_rows(raw, schema, backend)
    assert json.loads(headers_text)["NServiceBus.ExceptionInfo.Message"] == "bad data"


def test_retry_errors_sends_messages_back_without_failure_headers(client, queue, raw, schema, backend):
    other = QueueAddress("other", schema)
    client.create_queue(other)
    client.send(queue, Message("to orders", {"keep": "me"}))
    client.send(other, Message("to other"))
    for address in (queue, other):
        [claim] = client.claim(address)
        client.fail(address, claim, "nope")
    assert len(error_rows(raw, schema, backend)) == 2

    assert client.retry_errors(queue=queue) == 1
    [back] = client.receive(queue)
    assert back.text == "to orders" and back.headers["keep"] == "me"
    assert not FAILURE_KEYS & back.headers.keys() and "SqlQueue.DeliveryCount" not in back.headers
    assert client.retry_errors() == 1
    assert [m.text for m in client.receive(other)] == ["to other"]
    assert error_rows(raw, schema, backend) == []


# -- poison rows -------------------------------------------------------------------------------------


POISON_HEADERS = ["not json at all", '["a", "list"]', '{"nested": {"x": 1}}', '{"number": 5}', "null"]


def receive_one(client, queue, mode):
    """Receive one message in ``mode`` (none, native or claim); a list, empty when nothing came."""
    if mode == "none":
        return client.receive(queue, 1)
    if mode == "native":
        with client.receive_native(queue) as message:
            return [message] if message is not None else []
    return client.claim(queue, 1)


def insert_poison(raw, schema, backend, headers_text):
    poison_id = uuid.uuid4()
    backend.nservicebus_send(raw, schema, "orders", poison_id, headers_text, b"\xde\xad")
    return poison_id


@pytest.mark.parametrize("headers_text", POISON_HEADERS)
@pytest.mark.parametrize("mode", ["none", "native", "claim"])
def test_poison_row_goes_to_error_queue_unchanged_and_never_blocks(
    client, queue, raw, schema, headers_text, mode, backend
):
    poison_id = insert_poison(raw, schema, backend, headers_text)
    client.send(queue, Message("good"))
    got = receive_one(client, queue, mode)
    assert [m.text for m in got] == ["good"]
    assert error_rows(raw, schema, backend) == [(poison_id, headers_text, b"\xde\xad")]
    assert client.depth(queue) == 0
    assert inflight_rows(raw, schema) == (1 if mode == "claim" else 0)


@pytest.mark.parametrize("mode", ["none", "native", "claim"])
def test_empty_headers_are_no_headers_as_nservicebus_reads_them(client, queue, raw, schema, mode, backend):
    """An empty Headers text is a message without headers to NServiceBus; it is delivered, not dead-lettered."""
    message_id = insert_poison(raw, schema, backend, "")
    got = receive_one(client, queue, mode)
    assert [(m.id, m.headers, m.body) for m in got] == [(message_id, {}, b"\xde\xad")]
    assert error_rows(raw, schema, backend) == []


def test_poison_row_found_on_reclaim_goes_to_error_queue(client, queue, raw, schema, backend):
    client.send(queue, Message("fine at first"))
    [claim] = client.claim(queue, lease=0.05)
    raw.execute(f"UPDATE \"{schema}\".sqlqueue_inflight SET headers = 'garbage' WHERE token = %s", (claim.claim_token,))
    time.sleep(0.1)
    assert client.claim(queue) == []
    assert error_rows(raw, schema, backend) == [(claim.id, "garbage", b"fine at first")]
