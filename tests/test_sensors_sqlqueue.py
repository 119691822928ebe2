"""Unit behaviour of :mod:`airflow_provider_sqlqueue.sensors.sqlqueue`: one poke, on a real queue.

The sensor inside real DAG runs (poking and deferred) is in ``test_operators_sqlqueue.py`` and the
end-to-end suites.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from airflow_provider_sqlqueue.sensors.sqlqueue import SqlQueueSensor
from airflow_provider_sqlqueue.transport import Message, QueueAddress, QueueClient
from airflow_provider_sqlqueue.transport.errors import InvalidArgumentError

#: The part of a task's context the sensor reads: who holds the claims it takes.
CONTEXT: dict[str, Any] = {"ti": SimpleNamespace(dag_id="shop", run_id="r1", task_id="wait", try_number=2)}


def sensor(conn_id: str, schema: str, **kwargs: Any) -> SqlQueueSensor:
    return SqlQueueSensor(task_id="wait", sqlqueue_conn_id=conn_id, queue_name=f'orders@"{schema}"', **kwargs)


def test_a_poke_claims_messages_for_the_task_that_poked(
    conn_id: str, client: QueueClient, queue: QueueAddress, schema: str
) -> None:
    assert sensor(conn_id, schema).poke(CONTEXT).is_done is False
    client.send(queue, [Message.of({"n": 1}), Message("two")])
    done = sensor(conn_id, schema, max_messages=5).poke(CONTEXT)
    assert done.is_done
    messages = done.xcom_value
    assert [m["body"] for m in messages] == [{"n": 1}, "two"]
    assert {m["queue"] for m in messages} == {f'orders@"{schema}"'} and all(m["claim_token"] for m in messages)
    assert [claim.holder for claim in client.claims(queue)] == ["shop/r1/wait#2"] * 2


def test_a_poke_in_none_mode_takes_the_messages_for_good(
    conn_id: str, client: QueueClient, queue: QueueAddress, schema: str
) -> None:
    client.send(queue, Message("gone on receipt"))
    [message] = sensor(conn_id, schema, transaction_mode="none").poke(CONTEXT).xcom_value
    assert message["claim_token"] is None and client.depth(queue) == 0 and client.in_flight(queue) == 0


@pytest.mark.parametrize(
    ("kwargs", "match"), [({"transaction_mode": "native"}, "native"), ({"max_messages": 0}, "max_messages")]
)
def test_settings_no_sensor_can_honour_are_refused_when_the_dag_is_parsed(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        sensor("any", "s", **kwargs)
