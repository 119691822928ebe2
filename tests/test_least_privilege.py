"""Installer vs runtime rights on PostgreSQL: a runtime role can use queues but not create them."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from airflow_provider_sqlqueue.transport import Message, PermissionDeniedError, QueueAddress, QueueClient


@pytest.fixture
def runtime_uri(pg_uri: str, schema: str, client: QueueClient, queue: QueueAddress) -> Iterator[str]:
    """A login role with only what the README lists for run time, on the test's queue tables."""
    role = f"sqlqueue_rt_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_uri, autocommit=True) as admin:
        admin.execute(f'CREATE ROLE "{role}" LOGIN')
        admin.execute(f'GRANT USAGE ON SCHEMA "{schema}" TO "{role}"')
        admin.execute(f'GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA "{schema}" TO "{role}"')
        admin.execute(f'GRANT USAGE ON ALL SEQUENCES IN SCHEMA "{schema}" TO "{role}"')
    try:
        yield make_conninfo(**{**conninfo_to_dict(pg_uri), "user": role})
    finally:
        with psycopg.connect(pg_uri, autocommit=True) as admin:
            admin.execute(f'DROP OWNED BY "{role}"')
            admin.execute(f'DROP ROLE "{role}"')


def test_runtime_role_sends_and_receives_in_every_mode(runtime_uri, queue, client):
    with QueueClient.connect(runtime_uri, error_queue=QueueAddress("error", queue.schema)) as runtime:
        runtime.send(queue, [Message(f"m{i}") for i in range(4)])
        assert runtime.peek(queue) == 4
        assert [m.text for m in runtime.receive(queue)] == ["m0"]
        with runtime.receive_native(queue) as message:
            assert message.text == "m1"
        [claimed] = runtime.claim(queue)
        assert runtime.nack(queue, claimed.claim_token)
        again, last = runtime.claim(queue, 2)
        assert (again.text, again.deliveries) == ("m2", 2) and runtime.ack(queue, again.claim_token)
        assert runtime.fail(queue, last, "bad")  # to the error queue
        assert runtime.retry_errors(queue=queue) == 1
        assert runtime.purge_expired(queue) == 0
        assert runtime.depth(queue) == 1
    assert client.depth(queue) == 1


def test_runtime_role_cannot_create_queues_and_is_told_why(runtime_uri, schema, client):
    with (
        QueueClient.connect(runtime_uri, error_queue=QueueAddress("error", schema)) as runtime,
        pytest.raises(PermissionDeniedError, match="Creating queues needs CREATE on the schema"),
    ):
        runtime.create_queue(QueueAddress("new_queue", schema))
    assert client.session.dialect.name == "postgres"
    with pytest.raises(Exception, match="does not exist"):
        client.check_queue(QueueAddress("new_queue", schema))  # nothing half-created
