"""Addressing and header encoding: pure functions, checked exhaustively and with generated input."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_sqlqueue.transport import InvalidHeadersError, InvalidQueueNameError, Message, QueueAddress
from airflow_provider_sqlqueue.transport.dialects.postgres import PostgresDialect, quote_ident
from airflow_provider_sqlqueue.transport.message import decode_headers, encode_headers, wire_timespan

pg = PostgresDialect()
names = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1, max_size=20
).filter(lambda s: s.strip())


@pytest.mark.parametrize(
    ("text", "table", "schema"),
    [
        ("orders", "orders", None),
        ("sales.orders", "orders", "sales"),
        ('"Sales"."Orders"', "Orders", "Sales"),
        ('"Endpoint.Machine"', "Endpoint.Machine", None),
        ('"my ""odd"" schema"."t"', "t", 'my "odd" schema'),
        ('orders@"sales"', "orders", "sales"),
        ('Endpoint.Machine@"public"', "Endpoint.Machine", "public"),
        ('a@b@"s""x"', "a@b", 's"x'),
    ],
)
def test_postgres_address_forms(text, table, schema):
    assert pg.parse_address(text) == QueueAddress(table, schema)


@pytest.mark.parametrize("text", ['"unterminated', "a.b.c", 'ab"c', ""])
def test_postgres_bad_addresses_are_refused(text):
    with pytest.raises(InvalidQueueNameError):
        pg.parse_address(text)


def test_postgres_refuses_catalogs_and_long_names():
    with pytest.raises(InvalidQueueNameError, match="catalog"):
        pg.qualified_name(QueueAddress("t", "s", "db"))
    with pytest.raises(InvalidQueueNameError, match="over 63 bytes"):
        pg.qualified_name(QueueAddress("t", "s" * 64))


@given(table=names, schema=names)
@settings(max_examples=300)
def test_canonical_address_round_trips(table, schema):
    address = QueueAddress(table, schema)
    if len(table.encode()) > 55:
        return
    assert pg.parse_address(pg.format_address(address)) == address


@given(name=names)
def test_quoted_identifier_is_one_token(name):
    quoted = quote_ident(name)
    assert quoted.startswith('"') and quoted.endswith('"')
    inner = quoted[1:-1].replace('""', "").replace("%%", "")
    assert '"' not in inner and "%" not in inner


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


def test_transport_imports_without_airflow():
    """The core runs on Spark executors and in plain scripts: importing it must not pull in Airflow."""
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'airflow' or name.startswith('airflow.'):\n"
        "            raise ImportError('airflow is blocked in this test')\n"
        "sys.meta_path.insert(0, Block())\n"
        "import airflow_provider_sqlqueue.transport as t\n"
        "import airflow_provider_sqlqueue.transport.dialects.postgres\n"
        "import airflow_provider_sqlqueue.transport.pump\n"
        "assert not any(m == 'airflow' or m.startswith('airflow.') for m in sys.modules)\n"
        "print('ok', t.QueueClient.__name__)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok QueueClient"


def test_ascii_only_headers_are_the_same_json_in_ascii():
    headers = {"city": "Zürich 東京", "emoji": "\U0001f600"}
    text = encode_headers(headers, ascii_only=True)
    assert text.isascii() and decode_headers(text) == headers
    assert Message(b"", headers).wire_headers(ascii_only=True).isascii()


def test_a_varchar_headers_table_is_written_ascii_and_warned_about(caplog):
    import logging

    from airflow_provider_sqlqueue.transport.dialects import get_dialect

    dialect = get_dialect("sqlserver")
    address = QueueAddress("legacy")
    assert dialect.table_shape(address) is None  # unknown until the catalog was read
    with caplog.at_level(logging.WARNING, logger="airflow_provider_sqlqueue"):
        shape = dialect.learn_table_shape(
            address, [("id", "uniqueidentifier"), ("headers", "varchar"), ("body", "varbinary")]
        )
    assert (shape.recoverable, shape.ascii_headers) == (False, True)
    assert dialect.table_shape(address) == shape
    assert "varchar Headers column" in caplog.text
