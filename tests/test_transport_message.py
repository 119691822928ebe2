"""Messages and headers (``transport/message.py``): the wire format, checked with generated input."""

from __future__ import annotations

import json
import pickle
from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_sqlqueue.transport import InvalidHeadersError, Message
from airflow_provider_sqlqueue.transport.message import decode_headers, encode_headers, wire_timespan

header_maps = st.dictionaries(st.text(max_size=30), st.one_of(st.none(), st.text(max_size=60)), max_size=12)


@given(headers=header_maps)
@settings(max_examples=300)
def test_headers_round_trip(headers):
    assert decode_headers(encode_headers(headers)) == headers


@given(headers=header_maps)
def test_headers_read_with_ascii_escapes_and_escaped_slashes(headers):
    escaped = json.dumps(headers, ensure_ascii=True).replace("/", "\\/")
    assert decode_headers(escaped) == headers


@given(headers=header_maps, ascii_only=st.booleans())
def test_headers_are_encoded_as_json_dumps_would(headers, ascii_only):
    expected = json.dumps(headers, ensure_ascii=ascii_only, separators=(",", ":"))
    assert encode_headers(headers, ascii_only=ascii_only) == expected


@given(headers=header_maps, given_id=st.booleans(), ttbr=st.none() | st.integers(1, 10**6))
def test_wire_headers_add_the_defaults_after_what_was_given(headers, given_id, ttbr):
    if given_id:
        headers = {**headers, "NServiceBus.MessageId": "mine"}
    message = Message(b"", headers, time_to_be_received=ttbr)
    wire = decode_headers(message.wire_headers("2026-11-23 10:00:00:000000 Z"))
    assert list(wire)[: len(headers)] == list(headers) and wire.items() >= headers.items()
    assert wire["NServiceBus.MessageId"] == ("mine" if given_id else str(message.id))
    assert wire.get("NServiceBus.TimeSent", headers.get("NServiceBus.TimeSent")) is not None
    if ttbr is not None and "NServiceBus.TimeToBeReceived" not in headers:
        assert wire["NServiceBus.TimeToBeReceived"] == wire_timespan(timedelta(seconds=ttbr))


def test_empty_headers_text_is_no_headers():
    assert decode_headers("") == {}


@pytest.mark.parametrize(
    "text",
    [
        " ",
        "nope",
        "[]",
        '"str"',
        "1",
        '{"a": 1}',
        '{"a": {"b": "c"}}',
        '{"a": ["x"]}',
        '{"a": true}',
        '{"a": "x"} trailing',
        '{"a": "\\ud800"}',  # a lone surrogate: no UTF-8 spelling, NServiceBus could not read it
        '{"\\udc00": "x"}',
        None,
    ],
)
def test_malformed_headers_are_rejected(text):
    with pytest.raises(InvalidHeadersError):
        decode_headers(text)


def test_wire_timespan_matches_dotnet():
    assert wire_timespan(timedelta(minutes=5)) == "00:05:00"
    assert wire_timespan(timedelta(days=2, hours=3, seconds=4, milliseconds=250)) == "2.03:00:04.2500000"


def test_ascii_only_headers_are_the_same_json_in_ascii():
    headers = {"city": "Zürich 東京", "emoji": "\U0001f600"}
    text = encode_headers(headers, ascii_only=True)
    assert text.isascii() and decode_headers(text) == headers
    assert Message(b"", headers).wire_headers(ascii_only=True).isascii()


def test_a_message_cannot_be_changed_once_built_and_travels_by_pickle():
    """Sends trust the constructor's checks: a body, id or header changed afterwards would reach the table unchecked."""
    message = Message(b"body", {"Shop.Note": "a"}, time_to_be_received=5)
    for name, value in (("body", "text"), ("id", "abc"), ("time_to_be_received", -5), ("headers", {})):
        with pytest.raises(AttributeError, match="cannot be changed once built"):
            setattr(message, name, value)
    with pytest.raises(TypeError):
        message.headers["Shop.Note"] = 1  # type: ignore[index]
    with pytest.raises(AttributeError, match="cannot be changed once built"):
        del message.body
    copied = pickle.loads(pickle.dumps(message))  # noqa: S301  # our own bytes, as Spark ships them
    assert (copied.body, dict(copied.headers), copied.id, copied.time_to_be_received) == (
        b"body",
        {"Shop.Note": "a"},
        message.id,
        timedelta(seconds=5),
    )
    assert dict(Message("again", message.headers).headers) == {"Shop.Note": "a"}  # a view is taken as headers
    assert "body" not in repr(Message(b"secret body")) and "secret" not in repr(Message(b"secret"))


def test_a_default_header_given_as_none_is_filled_in():
    message = Message("x", {"NServiceBus.MessageId": None, "NServiceBus.TimeSent": None, "Shop.Empty": None})
    wire = json.loads(message.wire_headers("2026-01-01 00:00:00:000000 Z"))
    assert wire == {
        "Shop.Empty": None,
        "NServiceBus.MessageId": str(message.id),
        "NServiceBus.TimeSent": "2026-01-01 00:00:00:000000 Z",
    }


def test_readable_headers_set_aside_what_decode_headers_refuses():
    from airflow_provider_sqlqueue.transport.message import readable_headers

    assert readable_headers('{"a":"1","b":null}') == {"a": "1", "b": None}
    assert readable_headers("") == {}
    for unreadable in (None, "not json", "[]", '{"a":1}'):
        assert readable_headers(unreadable) is None
