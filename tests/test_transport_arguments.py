"""Unit behaviour of :mod:`airflow_provider_sqlqueue.transport.arguments`: what a call's arguments are turned into.

Every public entry point's hostile arguments are the contract test's (``tests/test_contract.py``);
here are the rules of the shared checks themselves.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest

from airflow_provider_sqlqueue.transport import Message, QueueAddress, defaults
from airflow_provider_sqlqueue.transport.arguments import (
    as_messages,
    as_tokens,
    delay_ms,
    error_seqs,
    lease_ms,
    one_or_many,
    place,
    same_table,
)
from airflow_provider_sqlqueue.transport.dialects import get_dialect
from airflow_provider_sqlqueue.transport.errors import ArgumentTypeError, InvalidArgumentError


def test_same_table_follows_the_databases_name_rules() -> None:
    postgres, sqlserver = get_dialect("postgres"), get_dialect("sqlserver")
    assert same_table(postgres, postgres.parse_address("orders"), postgres.parse_address('orders@"public"'))
    assert not same_table(postgres, QueueAddress("Orders", "public"), QueueAddress("orders", "public"))
    assert same_table(sqlserver, sqlserver.parse_address("orders"), sqlserver.parse_address("orders@[dbo]"))


def test_durations_become_whole_milliseconds_within_their_bounds() -> None:
    assert lease_ms(timedelta(microseconds=1_400)) == 1  # whole milliseconds
    assert lease_ms(2.5) == 2_500
    assert delay_ms(0) == 0  # a give-back delay may be none
    with pytest.raises(InvalidArgumentError):
        lease_ms(defaults.MAX_LEASE + timedelta(seconds=1))


def test_one_or_many_in_and_out() -> None:
    token = uuid.uuid4()
    assert as_tokens(str(token)) == [token] and one_or_many(str(token), {token}) is True
    assert one_or_many([token], set()) == set()
    message = Message("one")
    assert as_messages(message) == [message]
    with pytest.raises(ArgumentTypeError, match="Message or an iterable"):
        as_messages("a body")  # type: ignore[arg-type]


def test_places_are_integers_of_a_seqs_range() -> None:
    assert place("after", 0) == 0 and place("last", defaults.LAST_SEQ) == defaults.LAST_SEQ
    for wrong in (True, 1.0, "1"):
        with pytest.raises(ArgumentTypeError):
            place("after", wrong)
    with pytest.raises(InvalidArgumentError):
        place("after", defaults.LAST_SEQ + 1)
    with pytest.raises(InvalidArgumentError, match="positive"):
        error_seqs([0])
