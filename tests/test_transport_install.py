"""Unit behaviour of :mod:`airflow_provider_sqlqueue.transport.install`: what an installer creates, checked before it runs."""

from __future__ import annotations

import re
from typing import Any

import pytest

from airflow_provider_sqlqueue.transport import QueueAddress, QueueClient
from airflow_provider_sqlqueue.transport.client import Addressing
from airflow_provider_sqlqueue.transport.dialects import get_dialect
from airflow_provider_sqlqueue.transport.errors import NotAQueueError
from airflow_provider_sqlqueue.transport.install import TableKind


def test_a_queues_installation_lists_every_table_in_the_order_it_makes_them() -> None:
    plan = Addressing(get_dialect("postgres"), audit_queue=True).installation('orders@"shop"', secondary="m1")
    assert [(kind, address.table) for kind, address in plan.tables] == [
        (TableKind.QUEUE, "orders"),
        (TableKind.QUEUE, "error"),
        (TableKind.QUEUE, "audit"),
        (TableKind.QUEUE, "orders.m1"),
        (TableKind.INFLIGHT, get_dialect("postgres").inflight_table),
        (TableKind.DELAYED, "orders.Delayed"),
    ]
    assert [a.table for a in plan.queue_tables()] == ["orders", "error", "audit", "orders.m1"]
    assert any('CREATE TABLE IF NOT EXISTS "shop"."orders"' in line for line in plan.ddl())


def test_a_plan_naming_a_business_table_creates_none_of_its_tables(client: QueueClient, raw: Any, schema: str) -> None:
    raw.execute(f'CREATE TABLE "{schema}".invoices (id int)')
    with pytest.raises(NotAQueueError):
        client.create_queue(QueueAddress("orders", schema), error_queue=QueueAddress("invoices", schema))
    tables = raw.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", [schema]
    ).fetchall()
    assert tables == [("invoices",)]


@pytest.mark.parametrize(
    ("queue", "error_queue", "refusal"),
    [
        ("orders", "orders.Delayed", '"{schema}"."orders.Delayed" cannot be both a queue and a delayed-message table'),
        ("orders", "sqlqueue_inflight", "sqlqueue_inflight"),  # the claim store: refused as a name already
    ],
)
def test_a_queue_whose_tables_would_be_one_table_twice_creates_nothing(
    client: QueueClient, raw: Any, schema: str, queue: str, error_queue: str, refusal: str
) -> None:
    from airflow_provider_sqlqueue.transport import SqlQueueError

    with pytest.raises(SqlQueueError, match=re.escape(refusal.format(schema=schema))):
        client.create_queue(QueueAddress(queue, schema), error_queue=QueueAddress(error_queue, schema))
    tables = raw.execute("SELECT table_name FROM information_schema.tables WHERE table_schema = %s", [schema])
    assert tables.fetchall() == []


def test_plans_combined_refuse_one_table_as_two_kinds() -> None:
    from airflow_provider_sqlqueue.transport.errors import InvalidArgumentError
    from airflow_provider_sqlqueue.transport.install import Installation

    addressing = Addressing(get_dialect("postgres"))
    orders, delayed_name = addressing.installation('orders@"shop"'), addressing.installation('orders.Delayed@"shop"')
    with pytest.raises(InvalidArgumentError, match="cannot be both a delayed-message table and a queue"):
        Installation.combine([orders, delayed_name])
    with pytest.raises(InvalidArgumentError, match="cannot be both a queue and the write ledger"):
        orders.with_write_ledgers([QueueAddress("orders", "shop")])
    both = Installation.combine([orders, addressing.installation('invoices@"shop"')])  # shared tables once
    assert [a.table for a in both.queue_tables()] == ["orders", "error", "invoices"]


@pytest.mark.parametrize(
    ("queue", "index_of"),
    [
        ("sqlqueue_inflight_holder", "sqlqueue_inflight"),  # the claim store's index dropped by name
        ("sqlqueue_inflight_lease", "sqlqueue_inflight"),
    ],
)
def test_a_queue_named_like_an_index_of_its_plan_creates_nothing(
    client: QueueClient, raw: Any, schema: str, queue: str, index_of: str
) -> None:
    from airflow_provider_sqlqueue.transport import SqlQueueError

    with pytest.raises(SqlQueueError, match=re.escape(f'it is the name of an index on "{schema}"."{index_of}"')):
        client.create_queue(QueueAddress(queue, schema), error_queue=QueueAddress("orders", schema))
    tables = raw.execute(
        "SELECT relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE nspname = %s", [schema]
    )
    assert tables.fetchall() == []


def test_plans_combined_refuse_a_table_named_like_another_tables_index() -> None:
    from airflow_provider_sqlqueue.transport.errors import InvalidArgumentError
    from airflow_provider_sqlqueue.transport.install import Installation

    addressing = Addressing(get_dialect("postgres"))
    with pytest.raises(
        InvalidArgumentError, match=re.escape('"shop"."x_Expires" cannot be a table: it is the name of an index')
    ):
        Installation.combine([addressing.installation('x@"shop"'), addressing.installation('x_Expires@"shop"')])
    sqlserver = Addressing(get_dialect("sqlserver"))  # index names are per table there: no clash
    Installation.combine([sqlserver.installation("x@dbo"), sqlserver.installation("x_Expires@dbo")])


def test_a_business_table_named_like_the_claim_store_is_refused_before_any_queue_is_made(
    client: QueueClient, raw: Any, schema: str
) -> None:
    raw.execute(f'CREATE TABLE "{schema}".sqlqueue_inflight (id int PRIMARY KEY, note text)')
    with pytest.raises(NotAQueueError, match="exists but is not a claim store"):
        client.create_queue(QueueAddress("orders", schema))
    tables = raw.execute("SELECT table_name FROM information_schema.tables WHERE table_schema = %s", [schema])
    assert tables.fetchall() == [("sqlqueue_inflight",)]
    columns = raw.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_schema = %s ORDER BY 1", [schema]
    )
    assert columns.fetchall() == [("id",), ("note",)]  # not altered either


@pytest.mark.parametrize("make", ["create_subscription_table", "create_writes"])
def test_no_other_table_takes_the_claim_stores_name(client: QueueClient, raw: Any, schema: str, make: str) -> None:
    from airflow_provider_sqlqueue.transport import SqlQueueError

    with pytest.raises(SqlQueueError, match="the name of each schema's claim store"):
        getattr(client, make)(QueueAddress("sqlqueue_inflight", schema))
    assert raw.execute(
        "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE nspname = %s", [schema]
    ).fetchone() == (0,)


def test_a_queue_whose_index_name_another_table_holds_is_refused_before_anything_is_made(
    client: QueueClient, raw: Any, schema: str
) -> None:
    from airflow_provider_sqlqueue.transport import SqlQueueError

    client.create_queue(QueueAddress("y_Expires", schema), delayed=False)
    before = raw.execute(
        "SELECT relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE nspname = %s ORDER BY 1",
        [schema],
    ).fetchall()
    refusal = re.escape(f'\'y_Expires\', the name of an index on "{schema}"."y", is already a table')
    with pytest.raises(SqlQueueError, match=refusal):
        client.create_queue(QueueAddress("y", schema))
    after = raw.execute(
        "SELECT relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE nspname = %s ORDER BY 1",
        [schema],
    ).fetchall()
    assert after == before


def test_an_auditing_client_makes_its_audit_queue_as_one_table(pg_uri: str, raw: Any, schema: str) -> None:
    with QueueClient.connect(pg_uri, audit_queue=True) as auditing:
        assert auditing.create_queue(QueueAddress("audit", schema)) == [
            QueueAddress("audit", schema),
            QueueAddress("error", schema),
        ]


@pytest.mark.parametrize("audit", ["error"])
def test_an_audit_queue_that_is_the_error_queue_creates_nothing(pg_uri: str, raw: Any, schema: str, audit: str) -> None:
    from airflow_provider_sqlqueue.transport import SqlQueueError

    auditing = QueueClient.connect(pg_uri, audit_queue=QueueAddress(audit, schema))
    with auditing, pytest.raises(SqlQueueError, match="it is the queue or its error queue"):
        auditing.create_queue(QueueAddress("orders", schema), error_queue=QueueAddress("error", schema))
    tables = raw.execute("SELECT table_name FROM information_schema.tables WHERE table_schema = %s", [schema])
    assert tables.fetchall() == []


def test_sql_server_plans_compare_names_as_its_default_collation_does() -> None:
    from airflow_provider_sqlqueue.transport.errors import InvalidArgumentError
    from airflow_provider_sqlqueue.transport.install import Installation

    addressing = Addressing(get_dialect("sqlserver"))
    with pytest.raises(InvalidArgumentError, match="cannot be that queue itself"):
        addressing.installation("orders@dbo", error_queue="ORDERS@dbo")
    with pytest.raises(InvalidArgumentError, match="cannot be both a delayed-message table and a queue"):
        Installation.combine([addressing.installation("x@dbo"), addressing.installation("X.DELAYED@dbo")])
    with pytest.raises(InvalidArgumentError, match="the name of each schema's claim store"):
        addressing.installation("SQLQUEUE_INFLIGHT@dbo")
    with pytest.raises(InvalidArgumentError, match="is the name of the delayed-message table of"):
        addressing.installation("x@dbo", error_queue="X.DELAYED@dbo", delayed=False)
    one = Installation.combine([addressing.installation("orders@dbo"), addressing.installation("ORDERS@dbo")])
    assert [a.table for a in one.queue_tables()] == ["orders", "error"]  # one table, planned once


def test_a_queues_delayed_table_name_is_kept_for_it_even_when_no_delayed_table_is_made(
    client: QueueClient, raw: Any, schema: str
) -> None:
    from airflow_provider_sqlqueue.transport import SqlQueueError

    refusal = re.escape(f'"{schema}"."p.Delayed" is the name of the delayed-message table of "{schema}"."p"')
    with pytest.raises(SqlQueueError, match=refusal):
        client.create_queue(QueueAddress("p", schema), error_queue=QueueAddress("p.Delayed", schema), delayed=False)
    tables = raw.execute("SELECT table_name FROM information_schema.tables WHERE table_schema = %s", [schema])
    assert tables.fetchall() == []


@pytest.mark.parametrize("role", ["error_queue", "audit_queue"])
def test_a_queues_secondary_cannot_be_its_error_or_audit_queue(role: str) -> None:
    from airflow_provider_sqlqueue.transport.errors import InvalidArgumentError

    addressing = Addressing(get_dialect("postgres"), **({"audit_queue": 'b.m@"shop"'} if role == "audit_queue" else {}))
    chosen = {"error_queue": 'b.m@"shop"'} if role == "error_queue" else {}
    with pytest.raises(InvalidArgumentError, match="cannot be its error or audit queue"):
        addressing.installation('b@"shop"', secondary="m", **chosen)


def test_an_existing_queue_without_its_index_is_created_again_with_a_warning(
    client: QueueClient, raw: Any, schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    """What an earlier version made (queue y_Expires, then y, whose index was skipped) still works:
    create_queue over it warns instead of refusing."""
    client.create_queue(QueueAddress("y_Expires", schema), delayed=False)
    for statement in client.dialect.create_queue_sql(QueueAddress("y", schema)):
        raw.execute(statement)
    with caplog.at_level("WARNING", logger="airflow_provider_sqlqueue.transport"):
        client.create_queue(QueueAddress("y", schema), delayed=False)
    assert "lacks that index" in caplog.text
