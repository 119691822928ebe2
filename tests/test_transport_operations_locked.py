"""Batches locked by a transaction (:mod:`.operations.locked`) with fixed rows: the poison found, the
lock's range, and the refusals that come before anything is sent or settled."""

from __future__ import annotations

import uuid

import pytest

from airflow_provider_sqlqueue.transport import operations as ops
from airflow_provider_sqlqueue.transport.dialects import get_dialect
from airflow_provider_sqlqueue.transport.errors import (
    InvalidArgumentError,
    TransportMisconfiguredError,
)
from tests.operations_script import AUDIT, ERROR, QUEUE, Script, dialect_with_known_tables, drive

#: The queue as a batch of it names it (on PostgreSQL).
QUEUE_KEY = get_dialect("postgres").claim_key(QUEUE)


def test_sql_server_refuses_every_step_of_a_locked_batch_before_any_statement() -> None:
    d = dialect_with_known_tables("sqlserver")
    batch = ops.LockedBatch(QUEUE_KEY, 7, 0, 10, 3)
    for op in (
        ops.lock_batch(d, QUEUE, ERROR, 10),
        ops.ack_locked(d, QUEUE, ERROR, batch, None),
        ops.ack_locked(d, QUEUE, ERROR, batch, AUDIT),
        ops.nack_locked(d, QUEUE, ERROR, batch),
        ops.browse_columns(d, QUEUE, 10, 0, 10, locked_by=7),
    ):
        script = Script(d, {})
        with pytest.raises(TransportMisconfiguredError, match="READ UNCOMMITTED"):
            drive(op, script)
        assert script.ran == []


def test_a_lock_names_its_range_and_the_poison_among_its_rows() -> None:
    d = dialect_with_known_tables("postgres")
    rows = [(5, '{"a":"b"}'), (6, "{not json"), (8, ""), (9, None), (12, '{"n":1}')]
    script = Script(d, {"lock_batch": lambda step: rows, "locker": lambda step: (777, True)})
    batch = drive(ops.lock_batch(d, QUEUE, ERROR, 50), script)
    assert batch == ops.LockedBatch(QUEUE_KEY, 777, 4, 12, 5, (6, 9, 12))  # "" reads as no headers: not poison
    assert script.names() == ["lock_batch", "locker"]
    assert script.ran[1][1].params == {"seq": 5}  # the first row locked tells whose lock it is


def test_a_lock_that_found_nothing_is_an_empty_range() -> None:
    d = dialect_with_known_tables("postgres")
    script = Script(d, {"lock_batch": lambda step: [], "locker": lambda step: (778, None)})
    assert drive(ops.lock_batch(d, QUEUE, ERROR, 50), script) == ops.LockedBatch(QUEUE_KEY, 778, 0, 0, 0)


def test_a_lock_taken_under_a_savepoint_is_refused() -> None:
    d = dialect_with_known_tables("postgres")
    script = Script(d, {"lock_batch": lambda step: [(5, "{}")], "locker": lambda step: (777, False)})
    with pytest.raises(TransportMisconfiguredError, match="locked in a savepoint"):
        drive(ops.lock_batch(d, QUEUE, ERROR, 50), script)


@pytest.mark.parametrize("current", [778, None])
def test_a_batch_is_settled_by_its_own_transaction_only(current: int | None) -> None:
    d = dialect_with_known_tables("postgres")
    batch = ops.LockedBatch(QUEUE_KEY, 777, 4, 12, 5, (6,))
    for op in (ops.ack_locked(d, QUEUE, ERROR, batch, None), ops.nack_locked(d, QUEUE, ERROR, batch)):
        script = Script(d, {"current_transaction": lambda step: (current,)})
        with pytest.raises(InvalidArgumentError, match="settle a batch in the transaction block that locked it"):
            drive(op, script)
        assert script.names() == ["current_transaction"]  # nothing moved, nothing deleted


def test_an_ack_moves_the_poison_then_deletes_the_rest_and_a_nack_only_moves_the_poison() -> None:
    d = dialect_with_known_tables("postgres")
    batch = ops.LockedBatch(QUEUE_KEY, 777, 4, 12, 5, (6, 9))
    answers = {
        "current_transaction": lambda step: (777,),
        "locked_to_error": lambda step: [(uuid.uuid4(), "{not json"), (uuid.uuid4(), None)],
        "ack_locked": lambda step: (3,),
    }
    script = Script(d, answers)
    assert drive(ops.ack_locked(d, QUEUE, ERROR, batch, None), script) == (3, 2)
    assert script.names() == ["current_transaction", "locked_to_error", "ack_locked"]
    assert script.ran[1][1].params == {"seqs": [6, 9], "locked_by": 777}
    assert script.ran[2][1].params == {"after": 4, "last": 12, "locked_by": 777}
    script = Script(d, answers)
    assert drive(ops.nack_locked(d, QUEUE, ERROR, batch), script) == (3, 2)
    assert script.names() == ["current_transaction", "locked_to_error"]


def test_a_batch_is_settled_on_its_own_queue_only() -> None:
    d = dialect_with_known_tables("postgres")
    batch = ops.LockedBatch(d.claim_key(ERROR), 777, 4, 12, 5)
    for op in (ops.ack_locked(d, QUEUE, ERROR, batch, None), ops.nack_locked(d, QUEUE, ERROR, batch)):
        script = Script(d, {"current_transaction": lambda step: (777,)})
        with pytest.raises(InvalidArgumentError, match="settle it on its own queue"):
            drive(op, script)
        assert script.ran == []
