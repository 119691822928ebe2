"""Messages and headers (``transport/message.py``): the wire format, checked with generated input."""

from __future__ import annotations

import json
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


def test_empty_headers_text_is_no_headers():
    assert decode_headers("") == {}


@pytest.mark.parametrize(
    "text", [" ", "nope", "[]", '"str"', "1", '{"a": 1}', '{"a": {"b": "c"}}', '{"a": ["x"]}', None]
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
