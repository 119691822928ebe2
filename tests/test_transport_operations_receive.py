"""Receiving (:mod:`.operations.receive`) with fixed rows: expired rows dropped, poison rows moved unchanged."""

from __future__ import annotations

import uuid

import pytest

from airflow_provider_sqlqueue.transport import operations as ops
from tests.operations_script import DIALECTS, ERROR, QUEUE, Script, dialect_with_known_tables, drive


@pytest.mark.parametrize("name", DIALECTS)
def test_receive_drops_expired_rows_moves_poison_unchanged_and_asks_again_for_the_shortfall(name):
    d = dialect_with_known_tables(name)
    good, expired, poison, later = (uuid.uuid4() for _ in range(4))
    batches = iter(
        [
            [(good, 0, '{"a":"1"}', b"g", 3), (expired, 1, "{}", b"x", 1), (poison, 0, "not json", b"\x00p", 2)],
            [(later, 0, "{}", b"l", 4)],
        ]
    )
    script = Script(d, {"receive": lambda step: next(batches), "purge_expired": lambda step: 7})
    received = drive(ops.receive(d, QUEUE, ERROR, 3), script)
    assert [(m.id, m.body) for m in received] == [(good, b"g"), (later, b"l")]
    # the expired row met says more may follow it: they are deleted in bulk, not one receive each
    assert script.names() == ["receive", "purge_expired", "insert_error", "receive"]
    moved = script.ran[2][1].params
    assert (moved["id"], moved["headers"], moved["body"]) == (poison, "not json", b"\x00p")
    assert script.ran[3][1].params["limit"] == 2  # the two that were dropped, asked for again


@pytest.mark.parametrize("name", DIALECTS)
def test_receive_from_its_own_error_queue_never_meets_its_poison_row_again(name):
    d = dialect_with_known_tables(name)
    script = Script(d, {"receive": lambda step: [(uuid.uuid4(), 0, "[]", b"", 1)]})
    assert drive(ops.receive(d, ERROR, ERROR, 5), script) == []
    assert script.names() == ["receive", "insert_error"]  # no second receive within the call
