"""Delayed delivery (:mod:`.operations.delayed`) with fixed rows: a due message whose destination
cannot take it goes to the error queue with the reason, and the rest are moved."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta

import pytest

from airflow_provider_sqlqueue.transport import InvalidArgumentError, Message
from airflow_provider_sqlqueue.transport import operations as ops
from airflow_provider_sqlqueue.transport.message import FAILED_QUEUE, FORWARD_DESTINATION, MESSAGE_ID
from tests.operations_script import DELAYED, DIALECTS, ERROR, QUEUE, Script, dialect_with_known_tables, drive


@pytest.mark.parametrize("name", DIALECTS)
def test_a_due_message_for_a_missing_queue_goes_to_the_error_queue_with_the_reason(name):
    d = dialect_with_known_tables(name)
    key, sent_id = (uuid.uuid4() if name == "postgres" else 17), uuid.uuid4()
    missing = d.format_address(QUEUE).replace("orders", "gone", 1)
    headers = json.dumps({MESSAGE_ID: str(sent_id), FORWARD_DESTINATION: missing, "k": "v"})
    script = Script(
        d,
        {
            "due_delayed": lambda step: [(key, headers, b"body")],
            "queue_columns": lambda step: [],  # the destination does not exist
            "waiting_ids": lambda step: [],
        },
    )
    assert drive(ops.move_due(d, QUEUE, DELAYED, ERROR, 10), script) == 1
    names = script.names()
    assert names[0] == "due_delayed" and names[-1] == "delete_delayed"
    [moved] = [step.params for name, step in script.ran if name == "error_send"]
    assert moved["id"] == sent_id and moved["body"] == b"body"
    failed = json.loads(moved["headers"])
    assert FORWARD_DESTINATION not in failed and failed["k"] == "v"
    assert failed[FAILED_QUEUE] == d.format_address(QUEUE)
    assert "delayed delivery to" in failed["NServiceBus.ExceptionInfo.Message"]


@pytest.mark.parametrize("name", DIALECTS)
def test_a_message_with_a_time_to_be_received_cannot_be_delayed(name):
    d = dialect_with_known_tables(name)
    script = Script(d, {})
    with pytest.raises(InvalidArgumentError, match="TimeToBeReceived"):
        drive(
            ops.send_delayed(d, QUEUE, DELAYED, [Message(b"x", time_to_be_received=timedelta(seconds=5))], 1000), script
        )
    assert script.ran == []  # refused before any statement
