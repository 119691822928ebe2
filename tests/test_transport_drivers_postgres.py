"""Unit behaviour of :mod:`airflow_provider_sqlqueue.transport.drivers.postgres`: psycopg connections as the transport needs them."""

from __future__ import annotations

from typing import Any

import pytest
from psycopg.conninfo import make_conninfo

from airflow_provider_sqlqueue.transport import AsyncPsycopgPool, Message, QueueAddress, QueueClient
from airflow_provider_sqlqueue.transport.drivers import PsycopgSession, finish
from airflow_provider_sqlqueue.transport.errors import (
    InvalidArgumentError,
    TransportMisconfiguredError,
    TransportUnavailableError,
)


def test_connections_autocommit_and_bound_their_connect_wait(pg_uri: str) -> None:
    session = finish(PsycopgSession.connect(pg_uri, blocking=True))
    try:
        assert session.connection.autocommit
        assert session.connection.info.get_parameters()["connect_timeout"] == "10"
    finally:
        finish(session.close())


def test_a_refused_connection_never_quotes_the_password() -> None:
    with pytest.raises(TransportUnavailableError) as caught:
        finish(PsycopgSession.connect("postgresql://app:pw-never-shown@127.0.0.1:1/test", blocking=True))
    assert "pw-never-shown" not in str(caught.value) and caught.value.__context__ is None


def test_a_string_libpq_cannot_read_is_a_setting_to_fix() -> None:
    with pytest.raises(TransportMisconfiguredError):
        finish(PsycopgSession.connect("postgresql://app:secret@127.0.0.1/test?sslmode=bogus", blocking=True))


def test_an_owned_connection_the_server_dropped_is_opened_again(pg_uri: str, queue: QueueAddress, raw: Any) -> None:
    with QueueClient.connect(pg_uri) as client:
        client.send(queue, Message("x"))
        raw.execute("SELECT pg_terminate_backend(%s)", [client.connection.info.backend_pid])
        with pytest.raises(TransportUnavailableError):
            client.depth(queue)
        assert client.depth(queue) == 1


def test_a_connection_lost_inside_a_transaction_block_is_not_replaced_mid_block(
    pg_uri: str, queue: QueueAddress, raw: Any
) -> None:
    with QueueClient.connect(pg_uri) as client:
        with pytest.raises(TransportUnavailableError), client.transaction():  # noqa: PT012 - the block loses its connection between two sends
            client.send(queue, Message("first"))
            raw.execute("SELECT pg_terminate_backend(%s)", [client.connection.info.backend_pid])
            client.send(queue, Message("second"))  # would commit alone on a new connection
        assert client.depth(queue) == 0


def test_startup_settings_the_server_refuses_are_a_setting_to_fix(pg_uri: str, raw: Any) -> None:
    """No SQLSTATE comes back for these: the server's texts are recognised, as for an unknown role."""
    changes = [{"options": "-c search_path=public host=elsewhere"}]
    if raw.execute("SHOW ssl").fetchone()[0] == "off":
        changes.append({"sslmode": "require"})
    for change in changes:
        with pytest.raises(TransportMisconfiguredError, match="retrying will not help"):
            finish(PsycopgSession.connect(make_conninfo(pg_uri, **change), blocking=True))


@pytest.mark.parametrize("given", [{"autocommit": False}, {"row_factory": dict}, {"cursor_factory": object}])
async def test_connection_arguments_the_session_sets_itself_are_refused(pg_uri: str, given: dict[str, Any]) -> None:
    """A pool built with autocommit=False used to fail at its first session with a raw TypeError."""
    [name] = given
    with pytest.raises(InvalidArgumentError, match=f"{name} cannot be given"):
        AsyncPsycopgPool(pg_uri, 2, **given)
    with pytest.raises(InvalidArgumentError, match=f"{name} cannot be given"):
        await PsycopgSession.connect(pg_uri, **given)


def test_a_native_receive_begun_with_its_statement_is_guarded_as_psycopgs_own_blocks(
    pg_uri: str, queue: QueueAddress, raw: Any
) -> None:
    """BEGIN travels with the receive (no block of psycopg's is open), and the block is still
    guarded as psycopg guards its own."""
    import psycopg

    from airflow_provider_sqlqueue.transport.errors import StatementRejectedError

    with QueueClient.connect(pg_uri) as client:
        client.send(queue, [Message(str(n)) for n in range(5)])
        sent: list[str] = []
        client.connection.add_notice_handler(lambda notice: sent.append(notice.message_primary))
        # The handler may not end the transaction itself: psycopg refuses, and the message stays.
        for end in ("commit", "rollback"):
            with pytest.raises(StatementRejectedError), client.receive_native(queue) as message:  # noqa: PT012 - the handler's own call
                assert message is not None
                getattr(client.connection, end)()
        assert client.depth(queue) == 5
        # psycopg's quiet rollback of a block: no error, the message stays.
        with client.receive_native(queue) as message:
            assert message is not None
            raise psycopg.Rollback()
        assert client.depth(queue) == 5
        # A block opened inside, and a call inside, nest as savepoints; the whole commits once.
        with client.receive_native(queue) as message, client.connection.transaction():
            client.connection.execute("SELECT 1")
        assert client.depth(queue) == 4
        # Its own SQL's errors are the library's.
        with pytest.raises(TransportUnavailableError), client.receive_native(queue) as message:  # noqa: PT012 - the connection dies in the handler
            raw.execute("SELECT pg_terminate_backend(%s)", [client.connection.info.backend_pid])
            client.connection.execute("SELECT 1")
        assert client.depth(queue) == 4
        assert sent == []  # no "there is already a transaction in progress", no "no transaction in progress"
