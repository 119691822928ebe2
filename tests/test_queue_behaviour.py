"""Queue behaviour on each real database: round trips, order, expiry, wire compatibility, bad input."""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from datetime import timedelta

import pytest

from airflow_provider_sqlqueue.transport import (
    InvalidHeadersError,
    InvalidQueueNameError,
    Message,
    QueueAddress,
    QueueClient,
    QueueNotFoundError,
    SqlQueueError,
    TransportUnavailableError,
)

pytestmark = pytest.mark.every_dialect


def test_round_trip_keeps_headers_and_body_exactly(client, queue):
    binary = bytes(range(256)) * 3
    text = "Zürich → 東京 ✓ \u0000 nul inside"
    large = b"x" * (8 * 1024 * 1024)
    headers = {"NServiceBus.ContentType": "application/json", "Ünïcode": 'välue/ä \\ "q"', "nullable": None}
    sent = [Message(binary, headers), Message(text), Message(large), Message(b"")]
    assert client.send(queue, sent) == 4

    got = client.receive(queue, 10)

    assert [m.id for m in got] == [m.id for m in sent]
    assert got[0].body == binary
    assert got[1].text == text
    assert got[2].body == large
    assert got[3].body == b""
    for key, value in headers.items():
        assert got[0].headers[key] == value
    assert got[0].headers["NServiceBus.MessageId"] == str(sent[0].id)
    assert client.depth(queue) == 0


def test_fifo_across_single_and_batched_sends(client, queue):
    for i in range(5):
        client.send(queue, Message(f"single-{i}"))
    client.send(queue, [Message(f"batch-{i}") for i in range(300)])
    client.send(queue, Message("last"))

    bodies = [m.text for m in client.receive(queue, 1000)]

    assert bodies == [f"single-{i}" for i in range(5)] + [f"batch-{i}" for i in range(300)] + ["last"]


def test_receive_never_returns_more_than_asked(client, queue):
    client.send(queue, [Message(str(i)) for i in range(10)])
    assert len(client.receive(queue, 3)) == 3
    assert len(client.receive(queue, 1)) == 1
    assert len(client.receive(queue, 100)) == 6
    assert client.receive(queue, 5) == []


def test_expired_messages_are_never_delivered_and_are_purged_in_batches(client, queue, raw, backend):
    client.send(queue, [Message(f"short-{i}", time_to_be_received=timedelta(milliseconds=50)) for i in range(25)])
    client.send(queue, Message("keeps", time_to_be_received=timedelta(hours=1)))
    client.send(queue, Message("forever"))
    time.sleep(0.2)
    table = backend.table(queue.schema, "orders")
    expires = raw.execute(f"SELECT count(*) FROM {table} WHERE Expires IS NOT NULL").fetchone()[0]
    assert expires == 26

    assert client.purge_expired(queue, batch_size=10) == 25
    assert client.depth(queue) == 2

    client.send(queue, [Message(f"again-{i}", time_to_be_received=0.05) for i in range(3)])
    time.sleep(0.2)
    received = client.receive(queue, 10)
    assert [m.text for m in received] == ["keeps", "forever"]
    assert client.depth(queue) == 0


def test_expired_head_of_queue_does_not_hide_live_messages(client, queue):
    client.send(queue, [Message(f"old-{i}", time_to_be_received=0.02) for i in range(5)])
    client.send(queue, Message("live"))
    time.sleep(0.1)
    assert [m.text for m in client.receive(queue, 1)] == ["live"]


def test_expires_comes_from_the_database_clock(client, queue, raw, backend):
    client.send(queue, Message("m", time_to_be_received=timedelta(minutes=10)))
    assert 595 <= backend.expires_seconds_from_now(raw, queue.schema, "orders") <= 600.01


def test_ttbr_beyond_a_month_is_stored(client, queue, raw, backend):
    client.send(queue, Message("m", time_to_be_received=timedelta(days=400)))
    assert 399 * 86400 <= backend.expires_seconds_from_now(raw, queue.schema, "orders") <= 400 * 86400 + 0.01


@pytest.mark.parametrize("ttbr", [0, -1, timedelta(0), timedelta(seconds=-5)])
def test_ttbr_must_be_positive(ttbr):
    with pytest.raises(ValueError, match="positive"):
        Message("m", time_to_be_received=ttbr)


def test_peek_estimates_pending_and_skips_locked_rows(client, queue, backend):
    assert client.peek(queue) == 0
    client.send(queue, [Message(str(i)) for i in range(10)])
    assert client.peek(queue) == 10

    with backend.hold_oldest(queue, 2):  # another receiver in the middle of receiving the two oldest rows
        assert client.peek(queue) == 8
        received = client.receive(queue, 20)
        assert len(received) == 8
    # The other receiver rolled back: its rows are waiting again. A new session sees them at once; a
    # session whose head passed them while they were locked sees them at its next look back over
    # what it skipped (transport/heads.py: within HEAD_RECENT_RESCAN), never later than a full rescan.
    with backend.client(queue.schema) as fresh:
        assert fresh.peek(queue) == 2
    deadline = time.monotonic() + 60
    while client.peek(queue) != 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert client.peek(queue) == 2
    assert sorted(m.text for m in client.receive(queue, 5)) == ["0", "1"]


def test_create_is_idempotent_and_makes_nservicebus_compatible_tables(client, queue, raw, schema, backend):
    client.create_queue(queue)  # second time: no error, nothing changed
    assert backend.columns(raw, schema, "orders") == backend.queue_columns
    assert backend.tables(raw, schema) == {"orders", "error", "sqlqueue_inflight", "orders.Delayed"}


@pytest.mark.postgres_only
def test_postgres_queue_table_has_id_as_primary_key(queue, raw, schema):
    primary = raw.execute(
        "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
        "WHERE i.indrelid = %s::regclass AND i.indisprimary",
        (f'"{schema}"."orders"',),
    ).fetchall()
    assert primary == [("id",)]


def test_body_string_column_is_optional_and_readable(client, schema, raw, backend):
    address = QueueAddress("readable", schema)
    client.create_queue(address, body_string=True)
    client.create_queue(address, body_string=True)  # idempotent
    client.send(address, Message('{"a": 1}'))
    assert tuple(raw.execute(f"SELECT BodyString FROM {backend.table(schema, 'readable')}").fetchone()) == ('{"a": 1}',)
    assert client.receive(address)[0].json() == {"a": 1}


def test_row_written_as_nservicebus_writes_it_is_received(client, queue, raw, schema, backend):
    """NServiceBus's own SQL: unquoted columns, headers JSON with escaped slashes and \\u escapes."""
    message_id = uuid.uuid4()
    headers = '{"NServiceBus.MessageId":"' + str(message_id) + '","NServiceBus.ReplyToAddress":"billing@\\"public\\"",'
    headers += '"NServiceBus.EnclosedMessageTypes":"Sales.OrderPlaced, Sales","Path":"a\\/b","City":"Z\\u00fcrich"}'
    backend.nservicebus_send(raw, schema, "orders", message_id, headers, b'{"OrderId":7}')
    [message] = client.receive(queue)
    assert message.id == message_id
    assert message.headers["Path"] == "a/b"
    assert message.headers["City"] == "Zürich"
    assert message.headers["NServiceBus.ReplyToAddress"] == 'billing@"public"'
    assert message.json() == {"OrderId": 7}


def test_row_we_send_reads_as_nservicebus_reads_it(client, queue, raw, schema, backend):
    """NServiceBus's receive statement, verbatim in shape, works on our rows and parses our headers."""
    sent = Message(b"payload", {"NServiceBus.EnclosedMessageTypes": "Sales.PlaceOrder"}, time_to_be_received=60)
    client.send(queue, sent)
    message_id, expired, headers_text, body = backend.nservicebus_receive(raw, schema, "orders")
    headers = json.loads(headers_text)
    assert (message_id, expired, body) == (sent.id, 0, b"payload")
    assert all(isinstance(k, str) and (v is None or isinstance(v, str)) for k, v in headers.items())
    assert headers["NServiceBus.MessageId"] == str(sent.id)
    assert headers["NServiceBus.TimeToBeReceived"] == "00:01:00"


def test_invalid_headers_are_refused_on_send(client, queue):
    with pytest.raises(InvalidHeadersError):
        Message("m", {"nested": {"a": "b"}})  # type: ignore[dict-item]
    with pytest.raises(InvalidHeadersError):
        Message("m", {"count": 3})  # type: ignore[dict-item]
    with pytest.raises(InvalidHeadersError):
        Message("m", ["not", "a", "dict"])  # type: ignore[arg-type]
    assert client.depth(queue) == 0


def test_missing_table_gives_a_clear_error(client, schema):
    missing = QueueAddress("nope", schema)
    with pytest.raises(QueueNotFoundError, match=r"nope.? does not exist; create it first"):
        client.send(missing, Message("m"))
    with pytest.raises(QueueNotFoundError):
        client.receive(missing)
    with pytest.raises(QueueNotFoundError):
        client.peek(missing)
    with pytest.raises(QueueNotFoundError):
        client.check_queue(missing)
    with pytest.raises(QueueNotFoundError):
        client.send(QueueAddress("nope", "no_such_schema"), Message("m"))


def test_a_table_that_is_not_a_queue_is_refused(client, schema, raw, backend):
    raw.execute(f"CREATE TABLE {backend.table(schema, 'customers')} (id int)")
    with pytest.raises(SqlQueueError, match=f"not a queue table.*body, expires, headers, .*{backend.seq.lower()}"):
        client.create_queue(QueueAddress("customers", schema))


def test_missing_expires_index_is_reported_with_its_fix(client, queue, raw, schema, backend, caplog):
    fix = backend.drop_expires_index(raw, schema, "orders")
    with caplog.at_level(logging.WARNING, logger="airflow_provider_sqlqueue"):
        client.check_queue(queue)
    assert fix in caplog.text
    caplog.clear()
    # The installer leaves an existing (live) table alone: building an index locks it. It warns.
    with caplog.at_level(logging.WARNING, logger="airflow_provider_sqlqueue"):
        client.create_queue(queue)
    assert fix in caplog.text
    caplog.clear()
    raw.execute(fix)  # what the operator runs at a quiet time
    with caplog.at_level(logging.WARNING, logger="airflow_provider_sqlqueue"):
        client.check_queue(queue)
    assert "no index on Expires" not in caplog.text


@pytest.mark.parametrize(
    "name",
    [
        'orders"; DROP TABLE victims; --',
        "robert'); DROP TABLE victims;--",
        "semi;colon",
        "[brackets]",
        "50% off %s %(x)s",
        "Endpoint.Machine",
        "ÜnïcødeQueue 東京",
        "MixedCase",
        "   spaced name  ",
    ],
)
def test_injection_shaped_names_are_only_ever_identifiers(client, schema, raw, backend, name):
    raw.execute(f"CREATE TABLE {backend.table(schema, 'victims')} (x int)")
    address = QueueAddress(name, schema)
    client.create_queue(address)
    client.send(address, Message("safe"))
    assert [m.text for m in client.receive(address)] == ["safe"]
    client.send(address, Message("claimed"))
    [claimed] = client.claim(address)
    assert client.ack(address, claimed.claim_token)
    tables = backend.tables(raw, schema)
    assert name in tables and "victims" in tables


def test_over_long_and_empty_names_are_refused_before_any_sql(client, schema, backend, raw):
    with pytest.raises(InvalidQueueNameError, match=backend.too_long_message):
        client.create_queue(QueueAddress("q" * (backend.max_table_name + 1), schema))
    longest = QueueAddress("q" * backend.max_table_name, schema)
    with pytest.raises(InvalidQueueNameError, match="no room for its delayed-message table"):
        client.create_queue(longest)  # every queue made has all its tables, or none is made
    assert not backend.tables(raw, schema)
    client.create_queue(longest, delayed=False)
    with_delays = QueueAddress("d" * (backend.max_table_name - len(".Delayed")), schema)
    client.create_queue(with_delays)
    assert f"{with_delays.table}.Delayed" in backend.tables(raw, schema)
    for bad in ["", "   ", "nul\x00byte"]:
        with pytest.raises(InvalidQueueNameError):
            QueueAddress(bad, schema)


@pytest.mark.postgres_only
def test_postgres_measures_names_in_utf8_bytes(client, schema):
    with pytest.raises(InvalidQueueNameError, match="limited to 55"):
        client.send(QueueAddress("ü" * 28, schema), Message("m"))  # 56 bytes in UTF-8


def test_secondary_queue_is_endpoint_dot_machine(client, schema, raw, backend):
    primary = QueueAddress("Sales", schema)
    created = client.create_queue(primary, secondary="WORKER01")
    assert QueueAddress("Sales.WORKER01", schema) in created
    client.send(primary.secondary("WORKER01"), Message("reply"))
    assert tuple(raw.execute(f"SELECT count(*) FROM {backend.table(schema, 'Sales.WORKER01')}").fetchone()) == (1,)
    canonical = client.session.dialect.format_address(QueueAddress("Sales.WORKER01", schema))
    assert client.receive(canonical)[0].text == "reply"


def test_concurrent_create_of_the_same_queue(backend, schema):
    address = QueueAddress("raced", schema)
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def create() -> None:
        try:
            with backend.client(schema) as c:
                barrier.wait()
                c.create_queue(address)
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=create) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    with backend.client(schema) as c:
        c.send(address, Message("works"))
        assert c.depth(address) == 1


@pytest.mark.parametrize(
    "uri",
    [
        "postgresql://postgres@127.0.0.1:1/test?connect_timeout=2",
        "mssql://sa:secret@127.0.0.1:1/test?login_timeout=2",
        "mssql+pyodbc://sa:secret@127.0.0.1:1/test?driver=FreeTDS",
    ],
)
def test_unreachable_database_is_a_clear_transport_error(uri):
    with pytest.raises(TransportUnavailableError, match="database"):
        QueueClient.connect(uri)


def test_wrong_connection_kind_is_refused():
    with pytest.raises(ValueError, match="use a postgresql:// or mssql:// URI"):
        QueueClient.connect("mysql://root@localhost/test")
    with pytest.raises(TypeError, match="unsupported connection type"):
        QueueClient.connect(object())


def test_no_transaction_is_left_open_between_calls(client, queue, raw, backend):
    client.send(queue, [Message(str(i)) for i in range(3)])
    client.receive(queue)
    client.claim(queue)
    client.peek(queue)
    assert backend.open_transactions_of(raw, client) == 0
