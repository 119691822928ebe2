"""Unit behaviour of :mod:`airflow_provider_sqlqueue.transport.dialects.postgres`: names, channels and limits of PostgreSQL.

Its statements are run by every behaviour suite; here are the rules it applies before any runs.
"""

from __future__ import annotations

import pytest

from airflow_provider_sqlqueue.transport import QueueAddress
from airflow_provider_sqlqueue.transport.dialects import get_dialect
from airflow_provider_sqlqueue.transport.errors import InvalidQueueNameError

POSTGRES = get_dialect("postgres")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("orders", QueueAddress("orders")),
        ('orders@"shop"', QueueAddress("orders", "shop")),
        ('Or"ders@"We""ird"', QueueAddress('Or"ders', 'We"ird')),
    ],
)
def test_addresses_in_nservicebus_form(text: str, expected: QueueAddress) -> None:
    assert POSTGRES.parse_address(text) == expected


def test_identifiers_are_quoted_never_formatted_in() -> None:
    assert POSTGRES.qualified_name(QueueAddress('a"; DROP TABLE x; --', "s")) == '"s"."a""; DROP TABLE x; --"'


def test_names_are_refused_not_truncated_where_derived_names_would_pass_63_bytes() -> None:
    POSTGRES.validate_address(QueueAddress("q" * 55))
    with pytest.raises(InvalidQueueNameError, match="55 bytes"):
        POSTGRES.validate_address(QueueAddress("é" * 28))  # 56 bytes in UTF-8


def test_each_queue_has_its_own_notification_channel() -> None:
    one = POSTGRES.notify_channel(QueueAddress("orders", "shop"))
    assert one != POSTGRES.notify_channel(QueueAddress("orders", "other"))
    assert one == POSTGRES.notify_channel(POSTGRES.parse_address('orders@"shop"'))
    assert len(one.encode()) <= 63
