"""Unit behaviour of :mod:`airflow_provider_sqlqueue.transport.drivers`: which session serves a connection target."""

from __future__ import annotations

import psycopg
import pytest

from airflow_provider_sqlqueue.transport.drivers import (
    PsycopgSession,
    ThreadSession,
    dialect_for,
    finish,
    open_session,
    session_over,
)
from airflow_provider_sqlqueue.transport.errors import ArgumentTypeError


@pytest.mark.parametrize(
    ("target", "dialect"),
    [
        ("postgresql://u@h/db", "postgres"),
        ("host=h dbname=db", "postgres"),
        ("mssql://sa:pw@h:1433/db", "sqlserver"),
        ("mssql+pyodbc://sa:pw@h/db?driver=FreeTDS", "sqlserver"),
        ("DRIVER={FreeTDS};SERVER=h;DATABASE=db", "sqlserver"),
    ],
)
def test_a_target_names_its_database(target: str, dialect: str) -> None:
    assert dialect_for(target).name == dialect


def test_a_target_of_no_known_driver_is_refused() -> None:
    with pytest.raises(ArgumentTypeError):
        dialect_for(object())


async def test_asyncio_sessions_are_native_for_psycopg(pg_uri: str) -> None:
    session = await open_session(pg_uri, blocking=False)
    try:
        assert isinstance(session, PsycopgSession) and not session.blocking
    finally:
        await session.close()


def test_a_borrowed_connection_stays_the_callers(pg_uri: str) -> None:
    with psycopg.connect(pg_uri, autocommit=True) as connection:
        session = session_over(connection, owned=False)
        finish(session.close())
        assert not connection.closed  # borrowed: closing the session leaves it open
    owned = psycopg.connect(pg_uri)
    session = session_over(owned, owned=True)
    assert owned.autocommit  # the transport ends its own transactions
    finish(session.close())
    assert owned.closed


async def test_a_thread_session_runs_a_blocking_session_off_the_event_loop(pg_uri: str) -> None:
    session = await ThreadSession.open(lambda: finish(open_session(pg_uri, blocking=True)))
    try:
        assert not session.blocking and session.dialect.name == "postgres"
    finally:
        await session.close()
