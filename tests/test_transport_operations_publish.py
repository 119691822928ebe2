"""Publish/subscribe (:mod:`.operations.publish`): one copy per subscribed table, as NServiceBus publishes."""

from __future__ import annotations

import json
import uuid

import pytest

from airflow_provider_sqlqueue.transport import Message
from airflow_provider_sqlqueue.transport import operations as ops
from airflow_provider_sqlqueue.transport.message import ENCLOSED_MESSAGE_TYPES, MESSAGE_ID, MESSAGE_INTENT
from tests.operations_script import DIALECTS, QUEUE, SUBSCRIPTIONS, Script, dialect_with_known_tables, drive


@pytest.mark.parametrize("name", DIALECTS)
def test_subscriptions_written_differently_for_one_table_get_one_copy_with_the_events_headers(name):
    d = dialect_with_known_tables(name)
    spellings = [d.format_address(QUEUE), f"{QUEUE.table}@{d.format_address(QUEUE).split('@', 1)[1]}"]
    script = Script(d, {"subscribers": lambda step: [(text,) for text in spellings]})
    event = Message(b"{}", id=uuid.uuid4())
    reached = drive(ops.publish(d, SUBSCRIPTIONS, ["Shop.OrderPlaced", "Shop.IEvent"], [event]), script)
    assert reached == [QUEUE]
    assert script.names() == ["subscribers", "send"]
    sent = script.ran[1][1].params
    headers = json.loads(sent["headers"])
    assert (sent["id"], headers[MESSAGE_ID]) == (event.id, str(event.id))
    assert headers[MESSAGE_INTENT] == "Publish"
    assert headers[ENCLOSED_MESSAGE_TYPES] == "Shop.OrderPlaced;Shop.IEvent"


@pytest.mark.parametrize("name", DIALECTS)
def test_an_event_nobody_subscribed_to_is_sent_nowhere(name):
    d = dialect_with_known_tables(name)
    script = Script(d, {"subscribers": lambda step: []})
    assert drive(ops.publish(d, SUBSCRIPTIONS, ["Shop.Nobody"], [Message(b"{}")]), script) == []
    assert script.names() == ["subscribers"]
