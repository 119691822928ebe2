"""The audit queue (:mod:`.operations.audit`): each copy is a new row naming the original, with processing headers."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime

import pytest

from airflow_provider_sqlqueue.transport import operations as ops
from airflow_provider_sqlqueue.transport.message import MESSAGE_ID, ReceivedMessage
from tests.operations_script import AUDIT, DIALECTS, QUEUE, Script, dialect_with_known_tables, drive


@pytest.mark.parametrize("name", DIALECTS)
def test_an_audit_copy_is_a_new_row_that_names_the_original_with_when_it_was_processed(name):
    d = dialect_with_known_tables(name)
    original = ReceivedMessage(uuid.uuid4(), {"city": "Zürich"}, b"\x00body")
    started = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    script = Script(d, {})
    drive(ops.audit(d, QUEUE, AUDIT, [original], {original.id: started}), script)
    [(statement, step)] = script.ran
    assert statement == "audit_send"
    assert step.params["id"] != original.id  # the copy's own row id: the original may be sent again
    assert step.params["body"] == b"\x00body"
    headers = json.loads(step.params["headers"])
    assert headers[MESSAGE_ID] == str(original.id)
    assert headers["city"] == "Zürich"
    assert headers["NServiceBus.ProcessingStarted"].startswith("2026-01-02 03:04:05")
    assert headers["NServiceBus.ProcessingEndpoint"] == QUEUE.table


@pytest.mark.parametrize("name", DIALECTS)
def test_an_ack_with_audit_copies_only_the_claims_still_held(name):
    d = dialect_with_known_tables(name)
    held, lost, message_id = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    script = Script(d, {"ack_copy": lambda step: [(held, message_id, '{"a":"1"}', b"b")]})
    assert drive(ops.ack_audited(d, QUEUE, [held, lost], AUDIT, {}), script) == {held}
    assert script.names() == ["ack_copy", "audit_send"]
    assert json.loads(script.ran[1][1].params["headers"])[MESSAGE_ID] == str(message_id)
