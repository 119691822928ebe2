"""Publish/subscribe: NServiceBus's ``SubscriptionRouting`` table, and publishing an event to every
queue subscribed to its topics in one transaction.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..addressing import QueueAddress
from ..dialects import Dialect
from ..logs import logger
from ..message import ENCLOSED_MESSAGE_TYPES, MESSAGE_INTENT, Message
from ..tracing import producing
from .send import send_messages
from .steps import Fetch, Operation, Step, autocommitted
from .tables import install_table, table_of, table_shape

log = logger("airflow_provider_sqlqueue.transport")


def create_subscriptions(d: Dialect, table: QueueAddress) -> Operation[None]:
    """Create the subscription table (idempotent, safe concurrently)."""
    yield from install_table(d, table, d.create_subscriptions_sql(table), "subscriptions")


def subscribe(
    d: Dialect, table: QueueAddress, queue: QueueAddress, endpoint: str, topics: Sequence[str]
) -> Operation[None]:
    """Subscribe ``endpoint``, whose queue is ``queue``, to each topic.

    Idempotent: subscribing again changes nothing, or moves the subscription to a new address.
    The queue must be a queue table: a subscription that points elsewhere would fail every publish.
    """
    yield from table_shape(d, queue)
    yield from table_of(d, table, "subscriptions")
    address = d.format_address(queue)
    target = d.qualified_name(table)
    for topic in topics:
        params = {"address": address, "endpoint": endpoint, "topic": topic}
        yield Step(d.subscribe_sql(table), params, Fetch.NONE, target)


def unsubscribe(d: Dialect, table: QueueAddress, endpoint: str, topics: Sequence[str]) -> Operation[None]:
    yield from table_of(d, table, "subscriptions")
    target = d.qualified_name(table)
    for topic in topics:
        yield Step(d.unsubscribe_sql(table), {"endpoint": endpoint, "topic": topic}, Fetch.NONE, target)


@autocommitted
def subscribers(d: Dialect, table: QueueAddress, topics: Sequence[str]) -> Operation[list[str]]:
    """The queue addresses subscribed to any of ``topics``, each once."""
    yield from table_of(d, table, "subscriptions")
    target = d.qualified_name(table)
    rows = yield Step(d.subscribers_sql(table), {"topics": d.topic_list(topics)}, Fetch.ALL, target)
    return [row[0] for row in rows]


def publish(
    d: Dialect, table: QueueAddress, topics: Sequence[str], messages: Sequence[Message], notify: bool = False
) -> Operation[list[QueueAddress]]:
    """Send ``messages`` to every queue subscribed to any of ``topics``, in this one transaction.

    ``topics`` are the event's type and the types it derives from, most specific first, as
    NServiceBus publishes; each message goes out with ``NServiceBus.MessageIntent: Publish`` and,
    unless it has them, ``NServiceBus.EnclosedMessageTypes`` naming the topics. Every subscriber
    gets the same message ids. A subscribed queue that does not exist fails the whole publish
    (nothing is sent), so no subscriber silently misses an event. Returns the queues reached.
    """
    found = yield from subscribers(d, table, topics)
    # Subscriptions written differently (``orders``, ``orders@"public"``) may name one table: each gets one copy.
    resolved: dict[tuple[str | None, str, str], QueueAddress] = {}
    for text in found:
        destination = d.parse_address(text)
        key = (destination.catalog, destination.schema or d.default_schema, destination.table)
        resolved.setdefault(key, destination)
    destinations = list(resolved.values())
    event_headers = {MESSAGE_INTENT: "Publish", ENCLOSED_MESSAGE_TYPES: ";".join(topics)}
    published = [
        Message(m.body, {**event_headers, **m.headers}, id=m.id, time_to_be_received=m.time_to_be_received)
        for m in messages
    ]
    # One span for the publish (named by the event's type), as NServiceBus makes one: its subscribers'
    # process spans start new traces linked to it, unless a message says otherwise.
    with producing("publish", lambda: topics[0], published, database=d.name, start_new_trace=True) as outgoing:
        for destination in destinations:
            yield from send_messages(d, destination, outgoing, notify, traced=False)
    log.debug("Published %d message(s) on %s to %d queue(s)", len(messages), ", ".join(topics), len(destinations))
    return destinations
