"""Inspection (:mod:`.operations.inspection`) with fixed rows: a browse skips what it cannot read and
pages on; its columnar form hands out the same rows."""

from __future__ import annotations

import uuid

import pytest

from airflow_provider_sqlqueue.transport import operations as ops
from tests.operations_script import DIALECTS, QUEUE, Script, dialect_with_known_tables, drive


def _rows() -> list[tuple[int, uuid.UUID, str | None, bytes | None]]:
    return [
        (4, uuid.uuid4(), '{"a":"1"}', b"x"),
        (5, uuid.uuid4(), "not json", b"y"),
        (7, uuid.uuid4(), "", None),  # NServiceBus reads an empty Headers column as no headers
    ]


@pytest.mark.parametrize("name", DIALECTS)
def test_a_browse_skips_unreadable_rows_and_continues_after_a_full_page(name):
    d = dialect_with_known_tables(name)
    rows = _rows()
    page = drive(ops.browse(d, QUEUE, 3, after=2), Script(d, {"browse": lambda step: rows}))
    assert [(m.id, m.headers, m.body) for m in page.messages] == [
        (rows[0][1], {"a": "1"}, b"x"),
        (rows[2][1], {}, b""),
    ]
    assert page.after == 7  # a full page: there may be more after the last row read, unreadable or not
    short = drive(ops.browse(d, QUEUE, 4, after=2), Script(d, {"browse": lambda step: rows}))
    assert short.after is None


@pytest.mark.parametrize("name", DIALECTS)
def test_browse_columns_hands_out_the_rows_browse_hands_out(name):
    d = dialect_with_known_tables(name)
    rows = _rows()
    texts = [(seq, str(i).upper(), h, b) for seq, i, h, b in rows]  # ids as a driver may load them: text, any case
    columns = drive(ops.browse_columns(d, QUEUE, 3), Script(d, {"browse": lambda step: texts}))
    page = drive(ops.browse(d, QUEUE, 3), Script(d, {"browse": lambda step: rows}))
    assert columns.ids == [str(m.id) for m in page.messages]
    assert columns.headers == [m.headers for m in page.messages]
    assert columns.bodies == [m.body for m in page.messages]
    assert columns.after == page.after == 7
