"""Unit behaviour of :mod:`airflow_provider_sqlqueue.transport.dialects.base`: what every database's dialect shares."""

from __future__ import annotations

import pytest

from airflow_provider_sqlqueue.transport import QueueAddress
from airflow_provider_sqlqueue.transport.dialects import get_dialect
from airflow_provider_sqlqueue.transport.errors import NotAQueueError


@pytest.mark.parametrize("name", ["postgres", "sqlserver"])
def test_each_dialect_formats_the_addresses_it_parses(name: str) -> None:
    dialect = get_dialect(name)
    for text in ("orders", "orders.Delayed", "o'rders", "Mixed Case"):
        formatted = dialect.format_address(dialect.parse_address(text))
        assert dialect.format_address(dialect.parse_address(formatted)) == formatted
        assert dialect.parse_address(formatted).table == dialect.parse_address(text).table


@pytest.mark.parametrize("name", ["postgres", "sqlserver"])
def test_each_dialect_keeps_the_claim_store_out_of_queue_names(name: str) -> None:
    dialect = get_dialect(name)
    store = dialect.inflight_address(QueueAddress("orders", "shop"))
    assert store.table == dialect.inflight_table and store.schema == "shop"
    with pytest.raises(NotAQueueError, match="claim store"):
        dialect.learn_table_shape(QueueAddress(dialect.inflight_table, "shop"), [])


def test_a_claim_names_its_queue_one_way_however_the_address_was_written() -> None:
    dialect = get_dialect("sqlserver")
    keys = {
        dialect.claim_key(dialect.parse_address(text)) for text in ("orders", "orders@[dbo]", "orders@[dbo]@[Shop]")
    }
    assert keys == {"orders@[dbo]"}
