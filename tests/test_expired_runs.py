"""A run of expired messages at the head of a queue costs a receive a few statements, not one each.

Regression test: with 50,000 expired rows ahead of one live message, ``receive``, ``claim`` and
``receive_native`` ran one statement per expired row (14-56 s a call). Statements are counted
here, not timed; ``bench/expired.py`` measures the time.
"""

from __future__ import annotations

import pytest

from airflow_provider_sqlqueue.transport import Message

pytestmark = pytest.mark.postgres_only

EXPIRED = 50_000


def expire_a_run(raw, schema: str, table: str, count: int) -> None:
    """``count`` messages whose time to be received ran out an hour ago, as a stopped consumer leaves them."""
    raw.execute(
        f'INSERT INTO "{schema}"."{table}" (Id, Expires, Headers, Body) '
        "SELECT gen_random_uuid(), (now() AT TIME ZONE 'UTC') - interval '1 hour', '{}', ''::bytea "
        "FROM generate_series(1, %s)",
        (count,),
    )


@pytest.mark.parametrize("how", ["receive", "claim", "receive_native"])
def test_a_run_of_expired_messages_costs_a_few_statements(raw, client, queue, schema, monkeypatch, how):
    expire_a_run(raw, schema, queue.table, EXPIRED)
    client.send(queue, Message("live"))
    statements: list[str] = []
    execute = client.session.execute

    async def counting(step):
        statements.append(step.sql)
        return await execute(step)

    monkeypatch.setattr(client.session, "execute", counting)
    if how == "receive_native":
        with client.receive_native(queue) as message:
            assert message is not None
            got = [message.text]
    else:
        got = [m.text for m in getattr(client, how)(queue, 1)]
    monkeypatch.undo()
    assert got == ["live"]
    assert len(statements) <= 12, f"{len(statements)} statements for one message behind {EXPIRED:,} expired"
    assert client.depth(queue) == 0  # the expired run is gone, in bulk
