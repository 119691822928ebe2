"""Unit behaviour of :mod:`airflow_provider_sqlqueue.transport.drivers.psycopg_access`, on a real PostgreSQL.

The public behaviour (borrowed connections set up otherwise give the same results, pipelines and
aborted transactions refused) is in ``test_hostile_inputs.py`` and ``test_failures_recorded.py``;
here, each piece alone.
"""

from __future__ import annotations

import uuid

import psycopg
import pytest
from psycopg.types.string import TextLoader

from airflow_provider_sqlqueue.transport.drivers.psycopg_access import (
    own_cursor,
    refuse_in_aborted,
    refuse_unusable,
    typed_nulls,
)
from airflow_provider_sqlqueue.transport.errors import TransactionAbortedError, TransportMisconfiguredError

pytestmark = pytest.mark.postgres_only


def test_an_own_cursor_reads_tuples_with_the_default_adapters_whatever_the_connection_says(pg_uri) -> None:
    with psycopg.connect(pg_uri, row_factory=psycopg.rows.dict_row, cursor_factory=psycopg.RawCursor) as connection:
        connection.adapters.register_loader("uuid", TextLoader)
        connection.adapters.register_loader("int4", TextLoader)
        token = uuid.uuid4()
        with own_cursor(psycopg.Cursor, connection) as cursor:
            cursor.execute("SELECT %(id)s::uuid, 1", {"id": token})  # named placeholders, not RawCursor's $1
            assert cursor.fetchone() == (token, 1)
        assert connection.execute("SELECT 1 AS n").fetchone() == {"n": "1"}  # the caller's own, as it set them


def test_a_list_of_only_nulls_travels_as_a_typed_null(pg_uri) -> None:
    assert typed_nulls({"a": [None, None], "b": [None, 1], "c": [], "d": 5}) == {
        "a": None,
        "b": [None, 1],
        "c": [],
        "d": 5,
    }
    params = {"n": 1}
    assert typed_nulls(params) is params  # no list: nothing copied
    with psycopg.connect(pg_uri, autocommit=True) as connection:
        connection.execute("SET array_nulls = off")
        rows = connection.execute(
            "SELECT * FROM unnest(%(ids)b::int[], %(ttbrs)b::bigint[])",
            typed_nulls({"ids": [1, 2], "ttbrs": [None, None]}),
        ).fetchall()
    assert rows == [(1, None), (2, None)]


def test_a_pipeline_and_an_aborted_transaction_are_refused_before_anything_is_sent(pg_uri) -> None:
    with psycopg.connect(pg_uri) as connection:
        refuse_unusable(connection)
        refuse_in_aborted(connection)
        with connection.pipeline(), pytest.raises(TransportMisconfiguredError, match="pipeline mode"):
            refuse_unusable(connection)
        with pytest.raises(psycopg.errors.DivisionByZero):
            connection.execute("SELECT 1 / 0")
        with pytest.raises(TransactionAbortedError, match="error was caught"):
            refuse_in_aborted(connection)
