"""Queue tables as lineage: what the operators and the sensor report to OpenLineage, named as the
database providers name tables, so a queue a stage writes and a SQL task reads are one dataset."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest
from airflow.providers.postgres.assets.postgres import convert_asset_to_openlineage
from airflow.sdk import Asset

from airflow_provider_sqlqueue.hooks.sqlqueue import SqlQueueHook
from airflow_provider_sqlqueue.lineage import queue_lineage, table_names
from airflow_provider_sqlqueue.operators.sqlqueue import (
    CreateQueueOperator,
    PurgeExpiredMessagesOperator,
    SendMessageOperator,
)
from airflow_provider_sqlqueue.sensors.sqlqueue import SqlQueueSensor

pytestmark = pytest.mark.usefixtures("conn_id")


def names(datasets: list) -> list[tuple[str, str]]:
    return [(d.namespace, d.name) for d in datasets]


def test_operators_report_the_queue_tables_they_read_and_wrote(pg_uri: str, schema: str) -> None:
    server = urlsplit(pg_uri)
    namespace = f"postgres://{server.hostname}:{server.port or 5432}"
    database = server.path.lstrip("/")
    queue = f'orders@"{schema}"'
    create = CreateQueueOperator(task_id="create", sqlqueue_conn_id="sqlqueue_test", queue_name=queue)
    create.execute({})
    created = create.get_openlineage_facets_on_complete(None)
    assert created.inputs == []
    assert names(created.outputs) == [
        (namespace, f"{database}.{schema}.orders"),
        (namespace, f"{database}.{schema}.error"),
    ]
    send = SendMessageOperator(task_id="send", sqlqueue_conn_id="sqlqueue_test", queue_name=queue, body="x")
    send.execute({})
    assert names(send.get_openlineage_facets_on_complete(None).outputs) == [(namespace, f"{database}.{schema}.orders")]
    purge = PurgeExpiredMessagesOperator(task_id="purge", sqlqueue_conn_id="sqlqueue_test", queue_name=queue)
    purge.execute({})
    purged = purge.get_openlineage_facets_on_complete(None)
    assert names(purged.inputs) == names(purged.outputs) == [(namespace, f"{database}.{schema}.orders")]
    sensor = SqlQueueSensor(task_id="wait", sqlqueue_conn_id="sqlqueue_test", queue_name=queue)
    assert names(sensor.get_openlineage_facets_on_complete(None).inputs) == [(namespace, f"{database}.{schema}.orders")]
    # An operator that has not run reports nothing rather than guessing.
    assert (
        SendMessageOperator(task_id="idle", queue_name=queue, body="x").get_openlineage_facets_on_complete(None).outputs
        == []
    )


def test_a_queue_is_named_as_the_postgres_provider_names_its_table(schema: str) -> None:
    """The asset URI the task helpers hand to the hook lineage collector becomes, through the postgres
    provider's own converter, the dataset the operators report: one dataset, whoever reports it."""
    hook = SqlQueueHook("sqlqueue_test")
    for queue, table in ((f'orders@"{schema}"', "orders"), (f'sales.W1@"{schema}"', "sales.W1"), ("plain", "plain")):
        namespace, database, in_schema, name = table_names(hook, queue)
        assert name == table and in_schema == (schema if "@" in queue else "public")
        [reported] = queue_lineage(hook, [queue], []).inputs
        asset = Asset(uri=f"{namespace}/{database}/{in_schema}/{name}")
        converted = convert_asset_to_openlineage(asset, None)
        assert (converted.namespace, converted.name) == (reported.namespace, reported.name)


def test_forward_and_publish_report_the_queues_their_claims_came_from_and_those_they_reached(
    pg_uri: str, schema: str
) -> None:
    from airflow_provider_sqlqueue.operators.sqlqueue import ForwardMessagesOperator, PublishMessageOperator
    from airflow_provider_sqlqueue.transport import Message, QueueAddress, QueueClient
    from tests.test_tasks import context

    server = urlsplit(pg_uri)
    namespace, database = f"postgres://{server.hostname}:{server.port or 5432}", server.path.lstrip("/")

    def table(name: str) -> tuple[str, str]:
        return namespace, f"{database}.{schema}.{name}"

    routing = QueueAddress("SubscriptionRouting", schema)
    with QueueClient.connect(pg_uri) as client:
        for name in ("orders", "cleaned", "billing", "shipping"):
            client.create_queue(QueueAddress(name, schema))
        client.create_subscription_table(routing)
        for name in ("billing", "shipping"):
            client.subscribe(QueueAddress(name, schema), "Shop.Cleaned", table=routing)
        client.send(QueueAddress("orders", schema), [Message("a"), Message("b")])
        orders = client.canonical_address(QueueAddress("orders", schema))
        first, second = ([m.to_dict(orders)] for m in client.claim(QueueAddress("orders", schema), 2))
    forward = ForwardMessagesOperator(
        task_id="forward",
        sqlqueue_conn_id="sqlqueue_test",
        queue_name=f'cleaned@"{schema}"',
        messages=["A"],
        claims=first,
    )
    forward.execute(context())
    forwarded = forward.get_openlineage_facets_on_complete(None)
    assert (names(forwarded.inputs), names(forwarded.outputs)) == ([table("orders")], [table("cleaned")])
    publish = PublishMessageOperator(
        task_id="publish", sqlqueue_conn_id="sqlqueue_test", topics="Shop.Cleaned", messages=["B"], claims=second,
        subscription_table=str(routing),
    )  # fmt: skip
    publish.execute(context())
    published = publish.get_openlineage_facets_on_complete(None)
    assert names(published.inputs) == [table("orders")]
    assert sorted(names(published.outputs)) == [table("billing"), table("shipping")]
    idle = ForwardMessagesOperator(task_id="idle", queue_name="cleaned", messages=[], claims=[])
    assert idle.get_openlineage_facets_on_complete(None).inputs == []  # not run: nothing guessed


def test_the_example_stages_name_the_files_their_spark_job_read_and_wrote(monkeypatch, tmp_path) -> None:
    """``report_files`` (example_dags/sqlqueue_stages.py), through Airflow's own hook lineage
    collector and the converter the openlineage provider applies to ``file://`` assets."""
    import airflow.sdk.lineage as lineage
    from airflow.providers.openlineage.utils.utils import translate_airflow_asset
    from sqlqueue_stages import report_files  # the DAGs folder is on sys.path (tests/conftest.py)

    collector = lineage.HookLineageCollector()
    monkeypatch.setattr(lineage, "get_hook_lineage_collector", lambda: collector)
    raw = tmp_path / "orders 1.csv"
    messages = [{"body": {"path": str(raw)}}, {"body": {"path": str(raw)}}, {"body": "not a dict"}]
    report_files(messages, [{"path": "file:///data/out/clean/message=1"}, {"path": "/data/out/clean/message=2"}, 7])
    found = collector.collected_assets
    inputs = [translate_airflow_asset(a.asset, None) for a in found.inputs]
    outputs = [translate_airflow_asset(a.asset, None) for a in found.outputs]
    assert [(d.namespace, d.name) for d in inputs] == [("file", raw.as_uri().removeprefix("file://"))]  # once
    assert [d.name for d in outputs] == ["/data/out/clean/message=1", "/data/out/clean/message=2"]
