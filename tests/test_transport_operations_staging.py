"""Staged sends on the real database: rows a bulk loader staged become messages once, in one
transaction with the write ledger; what is not a stage is refused; stages of dead writes are swept."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from airflow_provider_sqlqueue.transport import (
    NotAQueueError,
    QueueAddress,
    QueueClient,
    SqlQueueError,
    TransportUnavailableError,
)
from airflow_provider_sqlqueue.transport.operations import STAGE_PREFIX

pytestmark = pytest.mark.postgres_only


@pytest.fixture
def shop(pg_uri: str) -> Iterator[tuple[QueueClient, QueueAddress, psycopg.Connection[Any]]]:
    schema = f"stg_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_uri, autocommit=True) as raw:
        raw.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        try:
            with QueueClient.connect(pg_uri) as client:
                queue = QueueAddress("orders", schema)
                client.create_queue(queue)
                client.create_writes(QueueAddress("sqlqueue_writes", schema))
                yield client, queue, raw
        finally:
            raw.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


def stage_rows(raw: psycopg.Connection[Any], stage: QueueAddress, rows: list[tuple[int, str, bytes]]) -> None:
    """Rows as a bulk loader puts them: (rowkey, headers, body), each with an id of its own."""
    raw.cursor().executemany(
        sql.SQL("INSERT INTO {} (rowkey, id, headers, body) VALUES (%s, %s, %s, %s)").format(
            sql.Identifier(stage.schema or "public", stage.table)
        ),
        [(key, str(uuid.uuid4()), headers, body) for key, headers, body in rows],
    )


def stages(raw: psycopg.Connection[Any], schema: str) -> list[str]:
    return [
        name
        for (name,) in raw.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = %s AND starts_with(tablename, %s)",
            (schema, STAGE_PREFIX),
        )
    ]


def test_a_row_staged_twice_is_sent_once_in_row_key_order_and_the_stage_is_gone(shop) -> None:
    client, queue, raw = shop
    stage = client.create_stage(queue)
    assert stage.schema == queue.schema and stages(raw, queue.schema) == [stage.table]
    # Row key 2 twice: a task Spark ran again after its first attempt had committed.
    stage_rows(raw, stage, [(2, '{"n":"2"}', b"two"), (1, '{"n":"1"}', b"one"), (2, '{"n":"2"}', b"two")])
    assert client.send_staged(queue, stage, uuid.uuid4()) == 2
    assert [m.body for m in client.browse(queue)] == [b"one", b"two"]
    assert stages(raw, queue.schema) == []


def test_a_write_sent_before_sends_nothing_and_drops_its_stage(shop) -> None:
    client, queue, raw = shop
    write = uuid.uuid4()
    for attempt in range(2):
        stage = client.create_stage(queue)
        stage_rows(raw, stage, [(1, "{}", b"x")])
        assert client.send_staged(queue, stage, write) == (1 if attempt == 0 else None)
    assert client.depth(queue) == 1 and stages(raw, queue.schema) == []


def test_a_malformed_staged_row_fails_the_move_and_sends_nothing(shop) -> None:
    client, queue, raw = shop
    stage = client.create_stage(queue)
    stage_rows(raw, stage, [(1, "{}", b"fine")])
    raw.execute(
        sql.SQL("INSERT INTO {} (rowkey, id, headers, body) VALUES (2, 'not a uuid', '{{}}', '')").format(
            sql.Identifier(queue.schema or "public", stage.table)
        )
    )
    with pytest.raises(SqlQueueError) as refused:
        client.send_staged(queue, stage, uuid.uuid4())
    assert "uuid" in str(refused.value) and not isinstance(refused.value, TransportUnavailableError)
    assert client.depth(queue) == 0 and stages(raw, queue.schema) == [stage.table]  # the caller drops it
    client.drop_stage(stage)
    assert stages(raw, queue.schema) == []


def test_what_is_not_a_stage_is_refused_and_kept(shop) -> None:
    client, queue, raw = shop
    with pytest.raises(NotAQueueError, match="is not a staging table"):
        client.send_staged(queue, queue, uuid.uuid4())
    with pytest.raises(NotAQueueError, match="is not a staging table"):
        client.drop_stage(queue)
    table = QueueAddress(f"{STAGE_PREFIX}{int(time.time())}_lookalike", queue.schema)
    raw.execute(sql.SQL("CREATE TABLE {} (rowkey bigint)").format(sql.Identifier(queue.schema or "", table.table)))
    with pytest.raises(NotAQueueError, match="is not a staging table of a bulk write"):
        client.drop_stage(table)
    assert client.depth(queue) == 0 and table.table in stages(raw, queue.schema)


def test_a_stage_a_day_old_is_swept_by_the_next_write_and_a_young_one_is_not(shop) -> None:
    client, queue, raw = shop
    young = client.create_stage(queue)
    old = QueueAddress(f"{STAGE_PREFIX}{int(time.time()) - 2 * 86_400}_deadbeef0000", queue.schema)
    raw.execute(
        sql.SQL("CREATE UNLOGGED TABLE {} (LIKE {})").format(
            sql.Identifier(queue.schema or "", old.table), sql.Identifier(queue.schema or "", young.table)
        )
    )
    newest = client.create_stage(queue)
    assert sorted(stages(raw, queue.schema)) == sorted([young.table, newest.table])
