"""DAGs the provider tests run with dag.test(); queues live in the test's schema (SQLQUEUE_TEST_SCHEMA)."""

from __future__ import annotations

import os
from datetime import datetime

from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger
from airflow.sdk import DAG, Asset, AssetWatcher, task

from airflow_provider_sqlqueue.operators.sqlqueue import (
    AckMessagesOperator,
    CreateQueueOperator,
    NackMessagesOperator,
    PublishMessageOperator,
    PurgeExpiredMessagesOperator,
    RetryErrorMessagesOperator,
    SendMessageOperator,
)
from airflow_provider_sqlqueue.sensors.sqlqueue import SqlQueueSensor
from airflow_provider_sqlqueue.tasks import claimed_messages

SCHEMA = os.environ.get("SQLQUEUE_TEST_SCHEMA", "public")
CONN = "sqlqueue_test"
ORDERS = f'orders@"{SCHEMA}"'
ERROR = f'error@"{SCHEMA}"'
START = datetime(2026, 1, 1)
common = {"sqlqueue_conn_id": CONN, "error_queue": ERROR}

with DAG("sqlqueue_install_and_send", schedule=None, start_date=START, catchup=False):
    create = CreateQueueOperator(task_id="create", queue_name=ORDERS, secondary="worker1", **common)
    send_one = SendMessageOperator(
        task_id="send_one", queue_name=ORDERS, body={"order": 1}, message_type="Shop.OrderPlaced", **common
    )

    @task
    def make_bodies() -> list[str]:
        return [f"order-{n}" for n in range(2, 6)]

    send_many = SendMessageOperator(task_id="send_many", queue_name=ORDERS, messages=make_bodies(), **common)
    send_expiring = SendMessageOperator(
        task_id="send_expiring", queue_name=ORDERS, body=b"\x00\xff", time_to_be_received=0.05, **common
    )
    send_later = SendMessageOperator(task_id="send_later", queue_name=ORDERS, body="reminder", delay=3600, **common)
    send_at = SendMessageOperator(
        task_id="send_at", queue_name=ORDERS, body="new year", due="{{ '2099-01-01T00:00:00+00:00' }}", **common
    )
    create >> [send_one, send_many, send_expiring, send_later, send_at]

ROUTING = f'SubscriptionRouting@"{SCHEMA}"'

with DAG("sqlqueue_publish", schedule=None, start_date=START, catchup=False):
    subscribers = [
        CreateQueueOperator(
            task_id=f"create_{name}",
            queue_name=f'{name}@"{SCHEMA}"',
            subscribe_to=["Shop.OrderPlaced"],
            subscription_table=ROUTING,
            **common,
        )
        for name in ("billing", "shipping")
    ]
    publish = PublishMessageOperator(
        task_id="publish",
        topics=["Shop.OrderPlaced", "Shop.IEvent"],
        body={"order": 9},
        subscription_table=ROUTING,
        **common,
    )
    subscribers >> publish

with DAG("sqlqueue_purge_expired", schedule=None, start_date=START, catchup=False):
    PurgeExpiredMessagesOperator(task_id="purge", queue_name=ORDERS, batch_size=2, **common)

for deferrable in (True, False):
    with DAG(
        f"sqlqueue_consume_{'deferrable' if deferrable else 'poke'}", schedule=None, start_date=START, catchup=False
    ):
        wait = SqlQueueSensor(
            task_id="wait",
            queue_name=ORDERS,
            max_messages=3,
            deferrable=deferrable,
            poke_interval=0.2,
            peek_interval=0.2,
            timeout=60,
            **common,
        )

        @task
        def handle(messages: list[dict]) -> list:
            return [message["body"] for message in messages]

        handled = handle(wait.output)
        ack = AckMessagesOperator(task_id="ack", messages=wait.output, **common)
        handled >> ack

for give_back in (True, False):
    # A handler that fails while SQLQUEUE_TEST_FAIL=1. With give_back the nack task returns the
    # message at once; without it the message comes back only when its 1 s lease runs out.
    with DAG(
        "sqlqueue_consume_failing" + ("" if give_back else "_no_nack"), schedule=None, start_date=START, catchup=False
    ):
        wait = SqlQueueSensor(
            task_id="wait",
            queue_name=ORDERS,
            lease=30 if give_back else 1,
            max_deliveries=2,
            peek_interval=0.2,
            timeout=60,
            deferrable=True,
            **common,
        )

        @task
        def handle(messages: list[dict]) -> None:
            if os.environ.get("SQLQUEUE_TEST_FAIL") == "1":
                raise RuntimeError("the handler failed")

        handled = handle(wait.output)
        handled >> AckMessagesOperator(task_id="ack", messages=wait.output, **common)
        if give_back:
            handled >> NackMessagesOperator(task_id="nack", messages=wait.output, trigger_rule="one_failed", **common)

with DAG("sqlqueue_retry_errors", schedule=None, start_date=START, catchup=False):
    RetryErrorMessagesOperator(task_id="retry", queue_name=ORDERS, **common)

# Event-driven: one asset event per message; the run acknowledges the messages that triggered it.
orders_asset = Asset(
    name=f"orders_{SCHEMA}",
    uri=f"sqlqueue://{CONN}/{SCHEMA}/orders",
    watchers=[
        AssetWatcher(
            name="orders_watcher",
            trigger=MessageQueueTrigger(
                scheme="sqlqueue",
                sqlqueue_conn_id=CONN,
                queue_name=ORDERS,
                error_queue=ERROR,
                peek_interval=0.2,
                lease=60,
            ),
        )
    ],
)

# One DAG id per test schema: the metadata database outlives a test, and a DAG re-parsed with a
# new asset would otherwise be matched against the previous test's serialized version.
with DAG(f"sqlqueue_on_message_{SCHEMA}", schedule=[orders_asset], start_date=START, catchup=False):

    @task
    def handle(**context) -> list:
        return [message["body"] for message in claimed_messages(None, context)]

    handle() >> AckMessagesOperator(task_id="ack", **common)
