"""What an operation declares of itself (:mod:`.operations.steps`): which run without an enclosing transaction."""

from __future__ import annotations

import uuid

import pytest

from airflow_provider_sqlqueue.transport import Message
from airflow_provider_sqlqueue.transport import operations as ops
from tests.operations_script import DIALECTS, ERROR, QUEUE, dialect_with_known_tables


@pytest.mark.parametrize("name", DIALECTS)
def test_which_operations_run_without_a_transaction(name):
    """None-mode receives and claims commit statement by statement (one round trip each); a native
    receive and a forward must commit as one."""
    d = dialect_with_known_tables(name)
    assert ops.needs_no_transaction(ops.receive(d, QUEUE, ERROR, 10, atomic=False))
    assert not ops.needs_no_transaction(ops.receive(d, QUEUE, ERROR, 10))
    assert ops.needs_no_transaction(ops.claim(d, QUEUE, ERROR, 10, 60_000, 5, "me"))
    assert ops.needs_no_transaction(ops.ack(d, QUEUE, [uuid.uuid4()]))
    assert not ops.needs_no_transaction(ops.forward(d, [(QUEUE, [uuid.uuid4()])], [(QUEUE, [Message(b"r")])]))
