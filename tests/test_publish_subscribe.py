"""Publish/subscribe through NServiceBus's ``SubscriptionRouting`` table, on every database of the suite.

Subscriptions written here are read by NServiceBus's own statement and the other way round; a
publish reaches exactly the subscribed queues, in one transaction, with the headers NServiceBus
sets on an event.
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter

import pytest

from airflow_provider_sqlqueue.transport import LeaseLostError, Message, QueueAddress, QueueNotFoundError

pytestmark = pytest.mark.every_dialect


@pytest.fixture
def queues(client, schema) -> dict[str, QueueAddress]:
    names = ("billing", "shipping", "audit_log")
    addresses = {name: QueueAddress(name, schema) for name in names}
    for address in addresses.values():
        client.create_queue(address, delayed=False)
    client.create_subscription_table(QueueAddress("SubscriptionRouting", schema))
    return addresses


def routing(schema: str) -> QueueAddress:
    return QueueAddress("SubscriptionRouting", schema)


def test_the_subscription_table_has_nservicebus_columns_and_key(backend, raw, queues, schema):
    columns = {name for name, _, _ in backend.columns(raw, schema, "SubscriptionRouting")}
    assert columns == {"queueaddress", "endpoint", "topic"}


def test_publish_reaches_exactly_the_subscribed_queues(client, queues, schema):
    table = routing(schema)
    client.subscribe(queues["billing"], "Shop.OrderPlaced", table=table)
    client.subscribe(queues["shipping"], ["Shop.OrderPlaced", "Shop.OrderCancelled"], table=table)
    client.subscribe(queues["audit_log"], "Shop.IEvent", table=table)  # a base type of the event

    message = Message('{"order": 7}', {"NServiceBus.ContentType": "application/json"})
    reached = client.publish(["Shop.OrderPlaced", "Shop.IEvent"], message, table=table)
    assert {a.table for a in reached} == {"billing", "shipping", "audit_log"}
    for name in ("billing", "shipping", "audit_log"):
        [got] = client.receive(queues[name])
        assert got.id == message.id and got.body == b'{"order": 7}'
        assert got.headers["NServiceBus.MessageIntent"] == "Publish"
        assert got.headers["NServiceBus.EnclosedMessageTypes"] == "Shop.OrderPlaced;Shop.IEvent"
        assert got.headers["NServiceBus.ContentType"] == "application/json"

    assert {a.table for a in client.publish("Shop.OrderCancelled", Message("c"), table=table)} == {"shipping"}
    assert client.publish("Shop.Nobody", Message("x"), table=table) == []
    assert [client.depth(q) for q in queues.values()] == [0, 1, 0]


def test_a_stage_publishes_its_result_and_acknowledges_its_claims_in_one_transaction(client, queues, schema):
    table, source = routing(schema), queues["audit_log"]
    client.subscribe(queues["billing"], "Shop.Cleaned", table=table)
    client.subscribe(queues["shipping"], "Shop.Cleaned", table=table)
    client.send(source, [Message("a"), Message("b")])
    kept, lost = client.claim(source, 2)
    assert client.nack(source, lost.claim_token)
    [again] = client.claim(source)  # lost's token is void now
    with pytest.raises(LeaseLostError):
        client.publish("Shop.Cleaned", Message("r"), table=table, claims={source: [kept.claim_token, lost.claim_token]})
    assert [client.depth(queues[n]) for n in ("billing", "shipping")] == [0, 0]  # nothing published ...
    assert client.in_flight(source) == 2  # ... and nothing acknowledged
    reached = client.publish("Shop.Cleaned", Message("r"), table=table, claims={source: [kept.claim_token]})
    assert {a.table for a in reached} == {"billing", "shipping"}
    assert client.in_flight(source) == 1 and client.ack(source, again.claim_token)


def test_subscribing_again_is_idempotent_and_unsubscribe_stops_delivery(client, queues, schema):
    table = routing(schema)
    for _ in range(3):
        client.subscribe(queues["billing"], "Shop.OrderPlaced", table=table)
    assert client.subscribers("Shop.OrderPlaced", table=table) == [client.canonical_address(queues["billing"])]
    client.unsubscribe(queues["billing"], "Shop.OrderPlaced", table=table)
    client.unsubscribe(queues["billing"], "Shop.OrderPlaced", table=table)  # nothing left: no error
    assert client.publish("Shop.OrderPlaced", Message("x"), table=table) == []


def test_concurrent_subscribers_leave_one_row_per_endpoint_and_topic(backend, client, queues, schema):
    table = routing(schema)
    errors: list[BaseException] = []

    def subscribe(name: str) -> None:
        try:
            with backend.client(schema) as own:
                for n in range(20):
                    own.subscribe(queues[name], [f"Shop.Event{n}", "Shop.Common"], table=table)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=subscribe, args=(name,)) for name in ("billing", "shipping") for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(client.subscribers("Shop.Common", table=table)) == 2
    reached = Counter(a.table for a in client.publish([f"Shop.Event{n}" for n in range(20)], Message("e"), table=table))
    assert reached == Counter({"billing": 1, "shipping": 1})  # distinct queues, once each


def test_a_publish_to_a_missing_subscriber_queue_sends_nothing(client, queues, schema):
    table = routing(schema)
    client.subscribe(queues["billing"], "Shop.OrderPlaced", table=table)
    gone = QueueAddress("gone", schema)
    client.create_queue(gone)
    client.subscribe(gone, "Shop.OrderPlaced", table=table)
    client.drop_queue(gone)  # its endpoint went away and left its subscription behind
    with pytest.raises(QueueNotFoundError, match="gone"):
        client.publish("Shop.OrderPlaced", Message("x"), table=table)
    assert client.depth(queues["billing"]) == 0  # rolled back with the failed send


def test_nservicebus_subscriptions_are_read_here_and_ours_by_nservicebus(backend, raw, client, queues, schema):
    table = routing(schema)
    theirs = client.canonical_address(queues["shipping"])
    backend.nservicebus_subscribe(raw, schema, theirs, "Shipping", "Shop.OrderPlaced")
    client.subscribe(queues["billing"], "Shop.OrderPlaced", endpoint="Billing", table=table)

    assert set(client.subscribers("Shop.OrderPlaced", table=table)) == {
        theirs,
        client.canonical_address(queues["billing"]),
    }
    assert backend.nservicebus_subscribers(raw, schema, ["Shop.OrderPlaced"]) == {
        theirs,
        client.canonical_address(queues["billing"]),
    }
    assert {a.table for a in client.publish("Shop.OrderPlaced", Message("x"), table=table)} == {"billing", "shipping"}


@pytest.mark.parametrize(
    ("topics", "match"),
    [("", "topic must not be empty"), ([], "at least one topic"), ("x" * 201, "at most 200 are kept")],
)
def test_bad_topics_are_refused(client, queues, schema, topics, match):
    with pytest.raises(ValueError, match=match):
        client.subscribe(queues["billing"], topics, table=routing(schema))
    with pytest.raises(ValueError, match=match):
        client.publish(topics, Message("x"), table=routing(schema))


@pytest.mark.postgres_only
def test_two_spellings_of_one_subscriber_get_one_copy(backend, raw, client, schema):
    """``orders`` and ``orders@"public"`` name one table: the publish used to fail with a duplicate id."""
    billing = QueueAddress(f"billing_{uuid.uuid4().hex[:8]}", "public")
    table = routing(schema)
    client.create_subscription_table(table)
    client.create_queue(QueueAddress("error", schema), delayed=False)  # the client's error queue
    for sql in client.dialect.create_queue_sql(billing):  # the queue table alone: nothing else left in public
        raw.execute(sql)
    try:
        client.subscribe(billing, "Shop.OrderPlaced", endpoint="Billing", table=table)
        backend.nservicebus_subscribe(raw, schema, billing.table, "BillingToo", "Shop.OrderPlaced")  # bare name
        reached = client.publish("Shop.OrderPlaced", Message("placed"), table=table)
        assert len(reached) == 1
        assert [m.text for m in client.receive(billing, 5)] == ["placed"]
    finally:
        raw.execute(f'DROP TABLE "public"."{billing.table}"')


@pytest.mark.parametrize("topic", ["Shop.\x00Placed", "Shop.\udcffPlaced", "", "x" * 1_000_000])
def test_a_topic_no_table_can_hold_is_refused_before_anything_is_sent(client, queues, schema, topic):
    from airflow_provider_sqlqueue.transport import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match="topic"):
        client.publish(topic, Message("x"), table=routing(schema))
    with pytest.raises(InvalidArgumentError, match="topic"):
        client.subscribe(queues["billing"], topic, table=routing(schema))
    assert client.subscribers("Shop.Placed", table=routing(schema)) == []
