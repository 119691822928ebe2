"""The journey statements (:mod:`.dialects.journeys`): reads that lock nothing, bounded by ``scan``
however long the table, on PostgreSQL read off the indexes they are written for."""

from __future__ import annotations

import json
import uuid
from typing import Any

import psycopg
import pytest

from airflow_provider_sqlqueue.transport import Message, QueueAddress, QueueClient
from airflow_provider_sqlqueue.transport.dialects import get_dialect
from airflow_provider_sqlqueue.transport.dialects.journeys import FindsJourneys

ADDRESS = QueueAddress("orders", "sales")


def statements(name: str) -> dict[str, str]:
    d = get_dialect(name)
    found = {
        "find": d.find_sql(ADDRESS),
        "scanned_all": d.scanned_all_sql(ADDRESS),
        "find_claims": d.find_claims_sql(ADDRESS),
        "claims_scanned_all": d.claims_scanned_all_sql(ADDRESS),
        "can_read": d.can_read_sql(),
    }
    by_id = d.find_by_id_sql(ADDRESS)
    if by_id is not None:
        found["find_by_id"] = by_id
    return found


def test_every_journey_statement_is_named_here():
    assert {name.removesuffix("_sql") for name in vars(FindsJourneys) if name.endswith("_sql")} == set(
        statements("postgres")
    )


@pytest.mark.parametrize("name", ["postgres", "sqlserver"])
def test_journey_statements_read_only_and_lock_nothing(name):
    for label, sql in statements(name).items():
        upper = sql.upper()
        assert upper.startswith("SELECT "), label
        assert not any(word in upper for word in ("FOR UPDATE", "UPDLOCK", "DELETE", "INSERT", "UPDATE ")), label
        if label.startswith("find"):
            assert "BODY" not in upper, label  # headers only: a journey never reads a body


def test_only_postgres_finds_a_row_by_its_id_through_an_index():
    assert get_dialect("sqlserver").find_by_id_sql(ADDRESS) is None  # NServiceBus's heap indexes RowVersion only
    assert "WHERE Id = %(id)s" in (get_dialect("postgres").find_by_id_sql(ADDRESS) or "")


@pytest.fixture
def long_queue(pg_uri: str) -> Any:
    schema = f"jp_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_uri, autocommit=True) as raw:
        raw.execute(f'CREATE SCHEMA "{schema}"')
        try:
            queue = QueueAddress("orders", schema)
            with QueueClient.connect(pg_uri) as client:
                client.create_queue(queue)
                client.send(queue, [Message(str(n), {"n": str(n)}) for n in range(3000)])
            raw.execute(f'ANALYZE "{schema}"."orders"')
            yield raw, queue
        finally:
            raw.execute(f'DROP SCHEMA "{schema}" CASCADE')


def plan(raw: psycopg.Connection[Any], sql: str, params: dict[str, object]) -> dict[str, Any]:
    [[found]] = raw.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params).fetchall()
    return found[0]["Plan"]  # type: ignore[no-any-return]


def nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    return [node, *(n for child in node.get("Plans", []) for n in nodes(child))]


@pytest.mark.postgres_only
def test_on_postgres_a_search_reads_the_newest_rows_off_the_seq_index_and_no_more(long_queue):
    raw, queue = long_queue
    d = get_dialect("postgres")
    searched = nodes(plan(raw, d.find_sql(queue), {"scan": 100, "needle": "zzz", "limit": 10}))
    scans = [n for n in searched if n["Node Type"].endswith("Scan") and n.get("Relation Name") == "orders"]
    assert [n["Node Type"] for n in scans] == ["Index Scan"]
    assert scans[0]["Scan Direction"] == "Backward" and scans[0]["Actual Rows"] == 100
    counted = nodes(plan(raw, d.scanned_all_sql(queue), {"scan": 100}))
    assert max(n["Actual Rows"] for n in counted if n.get("Relation Name") == "orders") == 101
    some = raw.execute(f'SELECT Id FROM "{queue.schema}"."orders" LIMIT 1').fetchone()
    looked_up = nodes(plan(raw, d.find_by_id_sql(queue) or "", {"id": some[0]}))
    assert not any(n["Node Type"] == "Seq Scan" for n in looked_up), json.dumps(looked_up)[:300]
