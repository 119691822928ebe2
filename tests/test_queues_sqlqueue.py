"""Unit behaviour of :mod:`airflow_provider_sqlqueue.queues.sqlqueue`: the ``sqlqueue`` scheme of common-messaging."""

from __future__ import annotations

from airflow_provider_sqlqueue.queues.sqlqueue import SqlQueueMessageQueueProvider
from airflow_provider_sqlqueue.triggers.sqlqueue import SqlQueueEventTrigger


def test_the_scheme_routes_to_the_event_trigger_and_nothing_else_does() -> None:
    provider = SqlQueueMessageQueueProvider()
    assert provider.scheme_matches("sqlqueue") and not provider.scheme_matches("sqs")
    assert provider.trigger_class() is SqlQueueEventTrigger
    assert not provider.queue_matches("postgresql://h/db")  # queue URIs stay other providers'


def test_common_messaging_builds_the_trigger_from_the_schemes_arguments() -> None:
    from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger

    trigger = MessageQueueTrigger(scheme="sqlqueue", sqlqueue_conn_id="shop_db", queue_name="orders")
    inner = trigger.trigger
    assert isinstance(inner, SqlQueueEventTrigger)
    assert inner.queue_name == "orders" and inner.sqlqueue_conn_id == "shop_db"
