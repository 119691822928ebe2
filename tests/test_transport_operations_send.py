"""Sending (:mod:`.operations.send`): statements per batch, and a table's layout read once and written as it is."""

from __future__ import annotations

import pytest

from airflow_provider_sqlqueue.transport import Message
from airflow_provider_sqlqueue.transport import operations as ops
from airflow_provider_sqlqueue.transport.dialects import get_dialect
from tests.operations_script import DIALECTS, QUEUE, Script, dialect_with_known_tables, drive


def test_sqlserver_reads_a_tables_layout_once_and_writes_to_it_as_it_is():
    d = get_dialect("sqlserver")
    columns = [
        ("id", "uniqueidentifier"),
        ("expires", "datetime"),
        ("headers", "varchar"),
        ("body", "varbinary"),
        ("rowversion", "bigint"),
    ]
    script = Script(d, {"queue_columns": lambda step: columns})
    drive(ops.send(d, QUEUE, [Message(b"1", {"city": "Zürich"})]), script)
    drive(ops.send(d, QUEUE, [Message(b"2")]), script)
    assert script.names() == ["queue_columns", "send", "send"]
    sent = script.ran[1][1]
    assert "Recoverable" not in sent.sql
    assert sent.params["headers"].isascii() and "Z\\u00fcrich" in sent.params["headers"]


@pytest.mark.parametrize("name", DIALECTS)
def test_one_message_is_one_statement_and_a_batch_follows_the_dialects_batch_size(name):
    d = dialect_with_known_tables(name)
    assert ops.needs_no_transaction(ops.send(d, QUEUE, [Message(b"x")]))
    # The notification rides on the INSERT: a notified send of one message is still one statement.
    assert ops.needs_no_transaction(ops.send(d, QUEUE, [Message(b"x")], notify=True))
    big = [Message(b"\x01" * (600 * 1024)) for _ in range(5)]
    script = Script(d, {})
    assert drive(ops.send(d, QUEUE, big), script) == 5
    statements = script.names()
    assert set(statements) == {"send_batch"}
    # PostgreSQL sends any batch as arrays in one statement; SQL Server caps one by the bytes pymssql
    # inlines (hex: twice the body), so 3 of these fit under its 4 MiB and the other 2 follow.
    assert len(statements) == (1 if name == "postgres" else 2)


def test_a_postgres_batch_is_one_insert_and_needs_no_transaction_unlike_sql_servers():
    batch = [Message(b"x") for _ in range(50)]
    assert ops.needs_no_transaction(ops.send(dialect_with_known_tables("postgres"), QUEUE, batch))
    assert not ops.needs_no_transaction(ops.send(dialect_with_known_tables("sqlserver"), QUEUE, batch))
