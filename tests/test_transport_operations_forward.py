"""Forward (:mod:`.operations.forward`): nothing is sent when a claim was lost."""

from __future__ import annotations

import uuid

import pytest

from airflow_provider_sqlqueue.transport import LeaseLostError, Message
from airflow_provider_sqlqueue.transport import operations as ops
from tests.operations_script import DIALECTS, QUEUE, Script, dialect_with_known_tables, drive


@pytest.mark.parametrize("name", DIALECTS)
def test_forward_sends_nothing_when_a_claim_was_lost(name):
    d = dialect_with_known_tables(name)
    held, lost = uuid.uuid4(), uuid.uuid4()
    script = Script(d, {"ack": lambda step: [(held,)]})
    with pytest.raises(LeaseLostError, match=str(lost)):
        drive(ops.forward(d, [(QUEUE, [held, lost])], [(QUEUE, [Message(b"result")])]), script)
    assert script.names() == ["ack"]  # the send never ran; the caller's transaction rolls the ack back
