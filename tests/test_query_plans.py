"""Plans of the hot statements: each uses the index it was written for, on an aged queue.

The queue has many live rows and many dead ones (consumed while a REPEATABLE READ session held the
xmin horizon, so vacuum could remove none), a claim store full of settled claims and a delayed
table with moved messages. Plans are read twice: on statistics as they are when nobody has run
ANALYZE (autovacuum off, as on this machine's server) and after ANALYZE. On the configured server
and on the embedded PostgreSQL 18.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from airflow_provider_sqlqueue.transport import Message, QueueAddress, QueueClient

from .conftest import embedded_server

pytestmark = pytest.mark.postgres_only

LIVE = 20_000
CONSUMED = 20_000
CLAIMS = 5_000


@pytest.fixture(scope="module", params=["configured", "embedded"])
def server(request: pytest.FixtureRequest) -> Iterator[str]:
    if request.param == "configured":
        yield request.getfixturevalue("pg_uri")
        return
    with embedded_server() as uri:
        yield uri


class Aged:
    """An aged queue on one server: what a plan is asked for, and the session's head after the consumers."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.schema = f"plans_{uuid.uuid4().hex[:8]}"
        self.queue = QueueAddress("orders", self.schema)
        self.client = QueueClient.connect(uri)


@pytest.fixture(scope="module")
def aged(server: str) -> Iterator[Aged]:
    world = Aged(server)
    q = f'"{world.schema}"."orders"'
    with psycopg.connect(server, autocommit=True) as raw, world.client as client:
        raw.execute(f'CREATE SCHEMA "{world.schema}"')
        client.create_queue(world.queue)
        with psycopg.connect(server) as pin:
            pin.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            pin.execute("SELECT 1")  # the horizon stays here: nothing consumed below can be vacuumed
            raw.execute(
                f"INSERT INTO {q} (Id, Headers, Body) SELECT gen_random_uuid(), '{{}}', '' FROM generate_series(1, %s)",
                [CONSUMED],
            )
            while client.receive(world.queue, 1000):  # consumed: dead rows at the head of the Seq index
                pass
            for _ in range(CLAIMS // 500):  # settled claims: dead rows in the claim store
                client.send(world.queue, [Message("c") for _ in range(500)])
                got = client.claim(world.queue, 500, lease=0.001)
                client.ack(world.queue, [m.claim_token for m in got])
            client.send(world.queue, [Message("d") for _ in range(2000)], delay=0.001)
            client.move_due(world.queue)  # moved delayed messages: dead rows in the delayed table
            raw.execute(
                f"INSERT INTO {q} (Id, Headers, Body, Expires) SELECT gen_random_uuid(), '{{}}', '', "
                "CASE WHEN g %% 10 = 0 THEN (now() AT TIME ZONE 'UTC') + interval '1 day' END "
                "FROM generate_series(1, %s) AS g",
                [LIVE],
            )
            yield world
            pin.execute("ROLLBACK")
        raw.execute(f'DROP SCHEMA "{world.schema}" CASCADE')


def plan_nodes(uri: str, sql: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    """Every node of the plan of ``sql``, flattened."""
    with psycopg.connect(uri) as conn, conn.transaction(force_rollback=True):
        found = conn.execute("EXPLAIN (FORMAT JSON) " + sql, params).fetchone()
    plan = found[0] if isinstance(found[0], list) else json.loads(found[0])
    nodes, pending = [], [plan[0]["Plan"]]
    while pending:
        node = pending.pop()
        nodes.append(node)
        pending.extend(node.get("Plans", []))
    return nodes


def indexes_used(nodes: list[dict[str, Any]]) -> set[str]:
    return {node["Index Name"] for node in nodes if "Index Name" in node}


def scanned_whole(nodes: list[dict[str, Any]]) -> set[str]:
    return {node["Relation Name"] for node in nodes if node["Node Type"] == "Seq Scan"}


def statements(aged: Aged) -> dict[str, tuple[str, dict[str, Any], set[str], set[str]]]:
    """Name -> (SQL, parameters, indexes it must use, indexes it must not use)."""
    d = aged.client.session.dialect
    head = d.head(aged.queue)
    assert head is not None and head.mark >= CONSUMED
    key, after, tokens = d.claim_key(aged.queue), head.mark, [uuid.uuid4() for _ in range(50)]
    claim = {"deliveries": 1, "lease_ms": 60_000, "holder": "plans", "queue": key, "limit": 50}
    settle = {"tokens": tokens, "queue": key, "lease_ms": 60_000, "delay_ms": 0, "error": None}
    others = {"sqlqueue_inflight_lease", "sqlqueue_inflight_held", "sqlqueue_inflight_reserved"}
    return {
        "receive": (d.receive_sql(aged.queue), {"limit": 50, "after": after}, {"orders_seq_key"}, set()),
        "claim": (d.claim_sql(aged.queue), {**claim, "after": after}, {"orders_seq_key"}, set()),
        "peek": (d.peek_sql(aged.queue), {"after": after}, {"orders_seq_key"}, set()),
        "ack": (d.ack_sql(aged.queue), settle, {"sqlqueue_inflight_pkey"}, others),
        "nack": (d.nack_sql(aged.queue), settle, {"sqlqueue_inflight_pkey"}, others),
        "extend": (d.extend_sql(aged.queue), settle, {"sqlqueue_inflight_pkey"}, others),
        "reclaim": (d.reclaim_sql(aged.queue), {**claim, "lapsed_ms": 1000}, {"sqlqueue_inflight_lease"}, set()),
        "held": (
            d.held_sql(aged.queue),
            {"queue": key, "holder": "plans", "parts": 1, "part": 0},
            {"sqlqueue_inflight_held"},
            set(),
        ),
        "adopt": (d.adopt_sql(aged.queue), claim, {"sqlqueue_inflight_reserved"}, set()),
        "purge_expired": (d.purge_expired_sql(aged.queue), {"limit": 1000}, {"orders_Expires"}, set()),
        "move_due": (
            d.due_delayed_sql(aged.queue.delayed()),
            {"limit": 100, "due_ms": 1000},
            {"orders.Delayed_Due"},
            set(),
        ),
    }


@pytest.mark.parametrize("statistics", ["never analyzed", "analyzed"])
def test_each_hot_statement_uses_its_index_on_an_aged_queue(aged: Aged, statistics: str) -> None:
    if statistics == "analyzed":
        with psycopg.connect(aged.uri, autocommit=True) as raw:
            raw.execute(f'ANALYZE "{aged.schema}"."orders", "{aged.schema}".sqlqueue_inflight')
            raw.execute(f'ANALYZE "{aged.schema}"."orders.Delayed"')
    wrong = []
    for name, (sql, params, wanted, unwanted) in statements(aged).items():
        nodes = plan_nodes(aged.uri, sql, params)
        used, whole = indexes_used(nodes), scanned_whole(nodes)
        if not wanted <= used or used & unwanted or whole & {"orders", "sqlqueue_inflight", "orders.Delayed"}:
            wrong.append(f"{name}: indexes {sorted(used)}, whole-table scans {sorted(whole)}")
    assert not wrong, "\n".join(wrong)
