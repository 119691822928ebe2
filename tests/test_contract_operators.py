"""The contract of every operator and the sensor under hostile input.

Each operator of the provider is registered with the arguments of a good task and the arguments
hostile values replace; the registry is checked against the classes the modules define. Each
operator is built and executed as a worker executes it (``execute`` with the task's context) on
the real database: a hostile argument must fail the task with the library's own error (never
"unavailable, retry", which Airflow would only retry), and change no row of the schema.
"""

from __future__ import annotations

import inspect
import uuid
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_provider_sqlqueue import tasks
from airflow_provider_sqlqueue.operators import sqlqueue as operators
from airflow_provider_sqlqueue.sensors import sqlqueue as sensors
from airflow_provider_sqlqueue.transport import Message, QueueAddress, SqlQueueError, TransportUnavailableError
from tests.surface import LONE_SURROGATE, TOO_LONG
from tests.test_contract import checksums

pytestmark = pytest.mark.usefixtures("conn_id")

QUEUE_NAMES = [
    'customers@"{schema}"',
    'pg_authid@"pg_catalog"',
    'sqlqueue_inflight@"{schema}"',
    LONE_SURROGATE,
    TOO_LONG,
    "",
]
MISSING = ['no_such_queue@"{schema}"']
COUNTS = [0, -1, 2**63, "5", 1.5, True]
DURATIONS = [-1, float("nan"), float("inf"), "soon", 10**12]
MESSAGE_DICTS = ["rendered text", [{"queue": "{q}", "claim_token": "not-a-token"}], [{"no": "keys"}], 42]

#: Operator -> (good arguments, hostile values by argument). {q}: the queue, {e}: its error queue.
OPERATORS: dict[str, tuple[dict[str, Any], dict[str, list[Any]]]] = {
    "CreateQueueOperator": (
        {"queue_name": "{q}"},
        {"queue_name": QUEUE_NAMES[:3] + QUEUE_NAMES[3:], "secondary": [LONE_SURROGATE, "", 42]},
    ),
    "SendMessageOperator": (
        {"queue_name": "{q}", "body": "hello"},
        {
            "queue_name": QUEUE_NAMES + MISSING,
            "delay": DURATIONS,
            "due": ["not a date", "2030-01-01T00:00:00"],
            "time_to_be_received": DURATIONS,
            "headers": [{"k": 1}, "text", {"\udcff": "x"}],
        },
    ),
    "PublishMessageOperator": (
        {"topics": "Contract.Topic", "body": "hello", "subscription_table": 'SubscriptionRouting@"{schema}"'},
        {"topics": ["", "\x00", 42, LONE_SURROGATE], "subscription_table": ['customers@"{schema}"', *MISSING]},
    ),
    "ForwardMessagesOperator": (
        {"queue_name": "{q}", "messages": ["out"], "claims": []},
        {"queue_name": QUEUE_NAMES + MISSING, "claims": MESSAGE_DICTS},
    ),
    "AckMessagesOperator": ({"messages": []}, {"messages": MESSAGE_DICTS}),
    "NackMessagesOperator": ({"messages": []}, {"messages": MESSAGE_DICTS, "delay": DURATIONS}),
    "PurgeExpiredMessagesOperator": (
        {"queue_name": "{q}"},
        {"queue_name": QUEUE_NAMES + MISSING, "batch_size": COUNTS},
    ),
    "RetryErrorMessagesOperator": (
        {"queue_name": "{q}", "error_queue": "{e}"},
        {"queue_name": QUEUE_NAMES + MISSING, "limit": COUNTS, "error_queue": ['customers@"{schema}"', *MISSING]},
    ),
    "QueueMetricsOperator": ({"conn_ids": ["sqlqueue_test"]}, {}),
    # A task helper, entered as a task body enters it.
    "hold_messages": (
        {"messages": []},
        {"messages": MESSAGE_DICTS, "lease": DURATIONS, "limit": COUNTS, "sqlqueue_conn_id": ["no_such_conn", "", 42]},
    ),
    "SqlQueueSensor": (
        {"queue_name": "{q}", "error_queue": "{e}"},
        {
            "queue_name": QUEUE_NAMES + MISSING,
            "max_messages": COUNTS,
            "lease": DURATIONS,
            "transaction_mode": ["sometimes", "native"],
            "error_queue": ['customers@"{schema}"', *MISSING],
        },
    ),
}


def operator_classes() -> dict[str, type]:
    from airflow.sdk import BaseOperator

    found = {}
    for module in (operators, sensors):
        for name, member in vars(module).items():
            ours = inspect.isclass(member) and member.__module__ == module.__name__ and not name.startswith("_")
            if ours and issubclass(member, BaseOperator):
                found[name] = member
    return found


def test_every_operator_is_registered() -> None:
    helpers = {name for name in tasks.__all__ if inspect.isfunction(getattr(tasks, name))}
    assert set(operator_classes()) | helpers == set(OPERATORS)


def fill(value: Any, values: dict[str, str]) -> Any:
    if isinstance(value, str):
        for key, text in values.items():
            value = value.replace(key, text)
        return value
    if isinstance(value, list):
        return [fill(item, values) for item in value]
    if isinstance(value, dict):
        return {key: fill(item, values) for key, item in value.items()}
    return value


def context_for(task_id: str) -> dict[str, Any]:
    """What a worker hands ``execute``: the task instance the operators read (which task, which try)."""
    ti = SimpleNamespace(dag_id="contract", task_id=task_id, run_id="manual__contract", try_number=1, map_index=-1)
    return {"ti": ti, "task_instance": ti, "triggering_asset_events": {}}


def run(name: str, arguments: dict[str, Any]) -> Any:
    connection = {} if name == "QueueMetricsOperator" else {"sqlqueue_conn_id": "sqlqueue_test"}
    if name == "hold_messages":
        with tasks.hold_messages(**{**connection, **arguments}, context=context_for("work")) as held:
            return held.messages
    task = operator_classes()[name](task_id=f"t_{uuid.uuid4().hex[:6]}", **connection, **arguments)
    if name == "SqlQueueSensor":
        return task.poke(context_for(task.task_id))
    return task.execute(context_for(task.task_id))


@pytest.mark.parametrize("name", sorted(OPERATORS))
def test_an_operator_keeps_its_contract(name: str, schema: str, client, raw) -> None:
    queue = QueueAddress("orders", schema)
    client.create_queue(queue)
    client.create_subscription_table(QueueAddress("SubscriptionRouting", schema))
    client.send(queue, Message("waiting"))
    raw.execute(f'CREATE TABLE "{schema}".customers (Id int PRIMARY KEY, Name text)')
    raw.execute(f"INSERT INTO \"{schema}\".customers VALUES (1, 'ada')")
    values = {"{q}": f'orders@"{schema}"', "{e}": f'error@"{schema}"', "{schema}": schema}
    good, hostile = OPERATORS[name]
    failures = []
    for argument, candidates in hostile.items():
        for value in candidates:
            label = f"{argument}={fill(value, values)!r:.50}"
            before = checksums(raw.session.connection, schema)
            try:
                run(name, {**fill(good, values), argument: fill(value, values)})
            except Exception as exc:
                if not isinstance(exc, SqlQueueError) or isinstance(exc, TransportUnavailableError):
                    failures.append(f"{label}: {type(exc).__module__}.{type(exc).__name__}: {exc!s:.150}")
            else:
                if not (name == "SqlQueueSensor" and argument == "transaction_mode" and value == "native"):
                    failures.append(f"{label}: accepted")
            if checksums(raw.session.connection, schema) != before:
                failures.append(f"{label}: rows changed")
    run(name, fill(good, values))  # and the good task works
    assert not failures, f"{name}:\n" + "\n".join(failures)
