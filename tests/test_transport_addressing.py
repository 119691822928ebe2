"""Addressing (``transport/addressing.py`` and the PostgreSQL address syntax): pure functions, checked
exhaustively and with generated input; and the transport's independence from Airflow."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_sqlqueue.transport import InvalidQueueNameError, QueueAddress
from airflow_provider_sqlqueue.transport.client import Addressing
from airflow_provider_sqlqueue.transport.dialects.postgres import PostgresDialect, quote_ident

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


@pytest.mark.parametrize(
    ("error_queue", "audit_queue", "table", "kind"),
    [
        (None, None, "error", "error"),
        (None, None, "audit", "audit"),  # NServiceBus's default name, audited or not
        (None, None, "orders", "queue"),
        ("failures", None, "failures", "error"),
        ("failures", None, "error", "queue"),  # the connection's error queue is another
        (None, "processed", "processed", "audit"),
        ('error@"elsewhere"', None, "error", "queue"),  # in this schema it is a plain queue
    ],
)
def test_a_listed_table_is_told_apart_as_queue_error_or_audit(error_queue, audit_queue, table, kind):
    addressing = Addressing(pg, error_queue, audit_queue)
    assert addressing.kind(QueueAddress(table, "sales")) == kind


@pytest.mark.parametrize(
    ("longest", "shortest_refused"),
    [
        ("q" * 55, "q" * 56),
        ("é" * 27, "é" * 28),  # two bytes a character: 54 bytes fit, 56 do not
        ("€" * 18 + "q", "€" * 18 + "qq"),  # three bytes a character: 55 bytes fit, 56 do not
        ("q" * 51 + "€", "q" * 53 + "€"),  # 54 and 56 bytes
    ],
)
def test_a_postgres_table_name_fits_in_55_bytes(longest: str, shortest_refused: str) -> None:
    """55 bytes of UTF-8, counted in bytes, not characters: what leaves room for the 8 bytes the
    names derived from a table add (``<table>_seq_seq``, ``<table>_Expires``) in PostgreSQL's 63."""
    pg.validate_address(QueueAddress(longest))
    with pytest.raises(InvalidQueueNameError) as refused:
        pg.validate_address(QueueAddress(shortest_refused))
    message = str(refused.value)
    size = len(shortest_refused.encode("utf-8"))
    assert f"is {size} bytes in UTF-8" in message and "limited to 55 bytes" in message
    assert "63-byte identifiers" in message


@pytest.mark.parametrize(
    ("longest", "shortest_refused"),
    [("q" * 47, "q" * 48), ("é" * 23 + "q", "é" * 24), ("€" * 15 + "qq", "€" * 16)],  # 47 bytes fit, 48 do not
)
def test_a_postgres_queue_with_a_delayed_table_fits_in_47_bytes(longest: str, shortest_refused: str) -> None:
    """A queue's delayed table is ``<queue>.Delayed``, 8 bytes longer, and must fit in 55 bytes itself:
    a queue made with one has a name of at most 47 bytes; made without one, 55. The refusal says both."""
    addressing = Addressing(pg)
    addressing.installation(QueueAddress(longest))
    addressing.installation(QueueAddress("q" * 55), delayed=False)
    with pytest.raises(InvalidQueueNameError) as refused:
        addressing.installation(QueueAddress(shortest_refused))
    message = str(refused.value)
    assert "leaves no room for its delayed-message table" in message
    assert "at most 47 bytes" in message and "delayed=False" in message
    assert "queue names are limited to 55" not in message  # the delayed table's own limit, not the queue's
