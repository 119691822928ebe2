"""The databases the behaviour suite runs on, and the few inspections that differ between them.

The behaviour tests are written once and run against every backend here: PostgreSQL always, SQL
Server when ``SQLQUEUE_MSSQL_URI`` names one. Each test asserts the same thing on both; what
differs is only how the test looks behind the transport's back (catalog queries, NServiceBus's own
statements, session views), and that lives here, one method per need.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import timedelta
from typing import Any, ClassVar

from airflow_provider_sqlqueue.transport import QueueAddress, QueueClient
from airflow_provider_sqlqueue.transport.drivers import blocking_context, finish, open_session
from airflow_provider_sqlqueue.transport.drivers.sqlserver import execute_pymssql, execute_pyodbc
from airflow_provider_sqlqueue.transport.operations import Fetch, Step


class _HeldForTest(Exception):
    """Raised to roll back the transaction of :meth:`Backend.hold_oldest`."""


class Raw:
    """A plain autocommit connection: ``execute(sql, params)`` returns a cursor, for either driver."""

    def __init__(self, uri: str) -> None:
        self.session = finish(open_session(uri, blocking=True))

    def execute(self, sql: str, params: tuple[Any, ...] = ()) -> Any:
        return execute_on(self.session, sql, params)

    def transaction(self) -> AbstractContextManager[None]:
        """The session's transaction, for statements that must share one (a lock held while others wait)."""
        return blocking_context(self.session.transaction())

    def close(self) -> None:
        finish(self.session.close())


#: How long a test's ``DROP SCHEMA`` waits for a lock before it steps back and tries again. Shorter
#: than the server's ``deadlock_timeout`` (1 s): a survey of every schema that another test runs
#: meanwhile (``health``, the Queues page, metrics) locks tables in another order than the drop, and
#: the two would deadlock; with this, the drop yields its locks before the server looks for one.
DROP_LOCK_WAIT_MS = 200
DROP_ATTEMPTS = 150


def drop_pg_schema(connection: Any, name: str, *, if_exists: bool = False) -> None:
    """Drop a schema and all in it on a psycopg connection in autocommit, yielding to lock waits."""
    import psycopg

    exists = "IF EXISTS " if if_exists else ""
    for attempt in itertools.count(1):
        try:
            with connection.transaction():
                connection.execute(f"SET LOCAL lock_timeout = {DROP_LOCK_WAIT_MS}")
                connection.execute(f'DROP SCHEMA {exists}"{name}" CASCADE')
            return
        except psycopg.errors.LockNotAvailable:
            if attempt == DROP_ATTEMPTS:
                raise
            time.sleep(0.05)


def execute_on(session: Any, sql: str, params: tuple[Any, ...] = ()) -> Any:
    """Run test SQL (``%s`` placeholders) on a transport session's connection; returns the cursor."""
    return run_sql(session.connection, sql, params)


def run_sql(connection: Any, sql: str, params: tuple[Any, ...] = ()) -> Any:
    """Run test SQL (``%s`` placeholders, no other ``%``) on a psycopg, pymssql or pyodbc connection."""
    driver = type(connection).__module__.split(".", 1)[0]
    cursor = connection.cursor()
    if driver == "psycopg":
        cursor.execute(sql, params or None)  # without parameters, a literal % needs no escaping
    else:
        escaped = sql.replace("%s", "\x00").replace("%", "%%").replace("\x00", "%s")
        (execute_pymssql if driver == "pymssql" else execute_pyodbc)(cursor, escaped, tuple(params))
    return cursor


async def aexecute(connection: Any, sql: str, params: tuple[Any, ...] = ()) -> None:
    """Run test SQL on the connection a native-mode pump hands its handler.

    psycopg's is an asyncio connection; pymssql's and pyodbc's are blocking DB-API connections,
    whose calls go to a thread (the pump's own thread for the connection is idle meanwhile).
    """
    if type(connection).__module__.startswith("psycopg"):
        await connection.execute(sql, params or None)
    else:
        await asyncio.to_thread(lambda: run_sql(connection, sql, params).close())


class Backend:
    """One database under test."""

    name: str
    seq: str  # the FIFO column
    uuid_type: str
    text_type: str
    max_table_name: int  # longest queue table name the dialect accepts, and how it is measured
    too_long_message: str
    #: Columns (name, type, nullable) NServiceBus's table has, as the catalog reports them.
    queue_columns: ClassVar[list[tuple[str, str, str]]]

    def __init__(self, uri: str) -> None:
        self.uri = uri

    def client(self, schema: str) -> QueueClient:
        return QueueClient.connect(self.uri, error_queue=QueueAddress("error", schema))

    def raw(self) -> Raw:
        return Raw(self.uri)

    def table(self, schema: str, table: str) -> str:
        """The quoted table name, for test SQL."""
        raise NotImplementedError

    def create_schema(self, raw: Raw, name: str) -> None:
        raise NotImplementedError

    def drop_schema(self, raw: Raw, name: str) -> None:
        raise NotImplementedError

    def columns(self, raw: Raw, schema: str, table: str) -> list[tuple[str, str, str]]:
        rows = raw.execute(
            "SELECT lower(column_name), lower(data_type), is_nullable FROM information_schema.columns "
            "WHERE table_schema = %s AND table_name = %s ORDER BY ordinal_position",
            (schema, table),
        ).fetchall()
        return [tuple(row) for row in rows]

    def tables(self, raw: Raw, schema: str) -> set[str]:
        rows = raw.execute("SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (schema,))
        return {row[0] for row in rows.fetchall()}

    def nservicebus_send(
        self, raw: Raw, schema: str, table: str, message_id: uuid.UUID, headers: str, body: bytes
    ) -> None:
        """Insert a row the way an NServiceBus endpoint's own send statement does."""
        raise NotImplementedError

    def nservicebus_receive(self, raw: Raw, schema: str, table: str) -> tuple[Any, ...]:
        """Receive one row with NServiceBus's own statement: (id, expired, headers, body)."""
        raise NotImplementedError

    def drop_expires_index(self, raw: Raw, schema: str, table: str) -> str:
        """Drop the Expires index; returns the start of the statement the warning should quote."""
        raise NotImplementedError

    def expires_seconds_from_now(self, raw: Raw, schema: str, table: str) -> float:
        """How far in the future (server clock, UTC) the newest row's Expires lies."""
        raise NotImplementedError

    def open_transactions_of(self, raw: Raw, client: QueueClient) -> int:
        """Open transactions of the client's session, as the server sees them."""
        raise NotImplementedError

    @contextmanager
    def hold_oldest(self, address: QueueAddress, count: int) -> Iterator[None]:
        """Another receiver mid-receive: the transport's own receive, its transaction left open, then rolled back."""
        with QueueClient.connect(self.uri) as other:
            try:
                with other.transaction():
                    dialect = other.session.dialect
                    params = {"limit": count} if dialect.head(address) is None else {"limit": count, "after": 0}
                    finish(other.session.execute(Step(dialect.receive_sql(address), params, Fetch.ALL, "holder")))
                    yield
                    raise _HeldForTest
            except _HeldForTest:
                pass


class PostgresBackend(Backend):
    name = "postgres"
    seq = "seq"
    uuid_type = "uuid"
    text_type = "text"
    max_table_name = 55
    too_long_message = "56 bytes.*limited to 55"
    queue_columns: ClassVar[list[tuple[str, str, str]]] = [
        ("id", "uuid", "NO"),
        ("expires", "timestamp without time zone", "YES"),
        ("headers", "text", "NO"),
        ("body", "bytea", "YES"),
        ("seq", "integer", "NO"),
    ]

    def table(self, schema: str, table: str) -> str:
        return f'"{schema}"."{table}"'

    def create_schema(self, raw: Raw, name: str) -> None:
        raw.execute(f'CREATE SCHEMA "{name}"')

    def drop_schema(self, raw: Raw, name: str) -> None:
        drop_pg_schema(raw.session.connection, name)

    def nservicebus_send(
        self, raw: Raw, schema: str, table: str, message_id: uuid.UUID, headers: str, body: bytes
    ) -> None:
        raw.execute(
            f"INSERT INTO {self.table(schema, table)} (Id, Expires, Headers, Body) VALUES (%s, NULL, %s, %s)",
            (message_id, headers, body),
        )

    def nservicebus_receive(self, raw: Raw, schema: str, table: str) -> tuple[Any, ...]:
        t = self.table(schema, table)
        return raw.execute(
            f"DELETE FROM {t} rs WHERE rs.id = (SELECT id FROM {t} ORDER BY Seq LIMIT 1 FOR UPDATE SKIP LOCKED) "
            "RETURNING rs.id, CASE WHEN Expires IS NULL THEN 0 WHEN Expires > now() AT TIME ZONE 'UTC' THEN 0 ELSE 1 END "
            "Expired, rs.Headers, rs.Body"
        ).fetchone()

    def nservicebus_create_delayed(self, raw: Raw, schema: str, table: str) -> None:
        """NServiceBus's own DDL of a delayed table, with its UNIQUE index on Due."""
        t = self.table(schema, table)
        raw.execute(
            f"CREATE TABLE IF NOT EXISTS {t} (Id uuid NOT NULL DEFAULT gen_random_uuid() PRIMARY KEY, "
            "Headers text NOT NULL, Body bytea, Due timestamptz NOT NULL) "
            "WITH (fillfactor=100, autovacuum_enabled=off, toast.autovacuum_enabled=off)"
        )
        raw.execute(f'CREATE UNIQUE INDEX "{table}_Due" on {t}(Due)')

    def nservicebus_store_delayed(
        self, raw: Raw, schema: str, table: str, headers: str, body: bytes, due_after: timedelta
    ) -> None:
        """NServiceBus's StoreDelayedMessageText, parameters split as it splits a TimeSpan."""
        days, rest = due_after.days, due_after.seconds
        raw.execute(
            "WITH params (DueDate) as (values (timestamptz (now() AT TIME ZONE 'UTC') + (%s || ' days ')::INTERVAL "
            "+ (%s || ' hours ')::INTERVAL + (%s || ' mins ')::INTERVAL + (%s || ' s ')::INTERVAL "
            f"+ (%s || ' ms')::INTERVAL)) INSERT INTO {self.table(schema, table)} (Headers, Body, Due) "
            "SELECT %s, %s, DueDate FROM params",
            (
                days,
                rest // 3600,
                rest % 3600 // 60,
                rest % 60,
                due_after.microseconds // 1000,
                headers,
                body,
            ),
        )

    def nservicebus_move_due(self, raw: Raw, schema: str, delayed: str, queue: str, batch: int) -> None:
        """NServiceBus's MoveDueDelayedMessageText: due rows into the endpoint's own queue, Id kept."""
        d, q = self.table(schema, delayed), self.table(schema, queue)
        raw.execute(
            f"WITH message as (DELETE FROM {d} WHERE id in (SELECT id from {d} WHERE {d}.Due < now() AT TIME ZONE 'UTC' "
            f"LIMIT %s) RETURNING id, headers, body) INSERT into {q} (id, expires, headers, body) "
            "SELECT id, NULL, headers, body FROM message",
            (batch,),
        )

    def nservicebus_subscribe(self, raw: Raw, schema: str, address: str, endpoint: str, topic: str) -> None:
        """NServiceBus's SubscribeText on PostgreSQL."""
        raw.execute(
            f'INSERT INTO "{schema}"."SubscriptionRouting" (QueueAddress, Topic, Endpoint) VALUES (%s, %s, %s) '
            "ON CONFLICT (Endpoint, Topic) DO UPDATE SET QueueAddress = %s",
            (address, topic, endpoint, address),
        )

    def nservicebus_subscribers(self, raw: Raw, schema: str, topics: list[str]) -> set[str]:
        """NServiceBus's GetSubscribersText (its topic list is formatted in as parameters)."""
        marks = ", ".join(["%s"] * len(topics))
        rows = raw.execute(
            f'SELECT DISTINCT QueueAddress FROM "{schema}"."SubscriptionRouting" WHERE Topic IN ({marks})',
            tuple(topics),
        ).fetchall()
        return {row[0] for row in rows}

    def drop_expires_index(self, raw: Raw, schema: str, table: str) -> str:
        raw.execute(f'DROP INDEX "{schema}"."{table}_Expires"')
        return f'CREATE INDEX IF NOT EXISTS "{table}_Expires" ON "{schema}"."{table}" (Expires)'

    def expires_seconds_from_now(self, raw: Raw, schema: str, table: str) -> float:
        return raw.execute(
            f"SELECT EXTRACT(EPOCH FROM Expires - (now() AT TIME ZONE 'UTC')) FROM {self.table(schema, table)} "
            "ORDER BY seq DESC LIMIT 1"
        ).fetchone()[0]

    def open_transactions_of(self, raw: Raw, client: QueueClient) -> int:
        pid = client.connection.info.backend_pid
        state = raw.execute("SELECT state FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()[0]
        return 0 if state == "idle" else 1


class SqlServerBackend(Backend):
    name = "sqlserver"
    seq = "RowVersion"
    uuid_type = "uniqueidentifier"
    text_type = "nvarchar(max)"
    max_table_name = 128
    too_long_message = "129 characters; SQL Server names are limited to 128"
    queue_columns: ClassVar[list[tuple[str, str, str]]] = [
        ("id", "uniqueidentifier", "NO"),
        ("correlationid", "varchar", "YES"),
        ("replytoaddress", "varchar", "YES"),
        ("recoverable", "bit", "NO"),
        ("expires", "datetime", "YES"),
        ("headers", "nvarchar", "NO"),
        ("body", "varbinary", "YES"),
        ("rowversion", "bigint", "NO"),
    ]

    def table(self, schema: str, table: str) -> str:
        return "[" + schema.replace("]", "]]") + "].[" + table.replace("]", "]]") + "]"

    def create_schema(self, raw: Raw, name: str) -> None:
        raw.execute(f"CREATE SCHEMA [{name}]")

    def drop_schema(self, raw: Raw, name: str) -> None:
        tables = raw.execute(
            "SELECT t.name FROM sys.tables t JOIN sys.schemas s ON s.schema_id = t.schema_id WHERE s.name = %s", (name,)
        ).fetchall()
        for (table,) in tables:
            raw.execute(f"DROP TABLE {self.table(name, table)}")
        raw.execute(f"DROP SCHEMA [{name}]")

    def nservicebus_send(
        self, raw: Raw, schema: str, table: str, message_id: uuid.UUID, headers: str, body: bytes
    ) -> None:
        raw.execute(
            f"INSERT INTO {self.table(schema, table)} (Id, Recoverable, Expires, Headers, Body) "
            "VALUES (%s, 1, NULL, %s, %s)",
            (message_id, headers, body),
        )

    def nservicebus_receive(self, raw: Raw, schema: str, table: str) -> tuple[Any, ...]:
        row = raw.execute(
            f"WITH message AS (SELECT TOP(1) * FROM {self.table(schema, table)} WITH (UPDLOCK, READPAST, ROWLOCK) "
            "ORDER BY RowVersion) DELETE FROM message OUTPUT deleted.Id, "
            "CASE WHEN deleted.Expires IS NULL THEN 0 ELSE CASE WHEN deleted.Expires > GETUTCDATE() THEN 0 ELSE 1 END END, "
            "deleted.Headers, deleted.Body"
        ).fetchone()
        return (uuid.UUID(str(row[0])), *row[1:])

    def nservicebus_create_delayed(self, raw: Raw, schema: str, table: str) -> None:
        t = self.table(schema, table)
        raw.execute(
            f"CREATE TABLE {t} (Headers nvarchar(max) NOT NULL, Body varbinary(max), Due datetime NOT NULL, "
            "RowVersion bigint IDENTITY(1,1) NOT NULL)"
        )
        raw.execute(f"CREATE NONCLUSTERED INDEX [Index_Due] ON {t} ([Due])")

    def nservicebus_store_delayed(
        self, raw: Raw, schema: str, table: str, headers: str, body: bytes, due_after: timedelta
    ) -> None:
        days, rest = due_after.days, due_after.seconds
        raw.execute(
            "DECLARE @DueAfter DATETIME = GETUTCDATE(); SET @DueAfter = DATEADD(ms, %s, @DueAfter); "
            "SET @DueAfter = DATEADD(s, %s, @DueAfter); SET @DueAfter = DATEADD(n, %s, @DueAfter); "
            "SET @DueAfter = DATEADD(hh, %s, @DueAfter); SET @DueAfter = DATEADD(d, %s, @DueAfter); "
            f"INSERT INTO {self.table(schema, table)} (Headers, Body, Due) VALUES (%s, %s, @DueAfter)",
            (due_after.microseconds // 1000, rest % 60, rest % 3600 // 60, rest // 3600, days, headers, body),
        )

    def nservicebus_move_due(self, raw: Raw, schema: str, delayed: str, queue: str, batch: int) -> None:
        raw.execute(
            f"WITH message AS (SELECT TOP(%s) * FROM {self.table(schema, delayed)} WITH (UPDLOCK, READPAST, ROWLOCK) "
            "WHERE Due < GETUTCDATE()) DELETE FROM message OUTPUT NEWID(), NULL, NULL, 1, NULL, deleted.Headers, "
            f"deleted.Body INTO {self.table(schema, queue)} (Id, CorrelationId, ReplyToAddress, Recoverable, Expires, "
            "Headers, Body)",
            (batch,),
        )

    def nservicebus_subscribe(self, raw: Raw, schema: str, address: str, endpoint: str, topic: str) -> None:
        raw.execute(
            f"MERGE {self.table(schema, 'SubscriptionRouting')} WITH (HOLDLOCK, TABLOCK) AS target "
            "USING(SELECT %s AS Endpoint, %s AS QueueAddress, %s AS Topic) AS source "
            "ON target.Endpoint = source.Endpoint AND target.Topic = source.Topic "
            "WHEN MATCHED AND target.QueueAddress <> source.QueueAddress THEN UPDATE SET QueueAddress = source.QueueAddress "
            "WHEN NOT MATCHED THEN INSERT (QueueAddress, Topic, Endpoint) "
            "VALUES (source.QueueAddress, source.Topic, source.Endpoint);",
            (endpoint, address, topic),
        )

    def nservicebus_subscribers(self, raw: Raw, schema: str, topics: list[str]) -> set[str]:
        marks = ", ".join(["%s"] * len(topics))
        rows = raw.execute(
            f"SELECT DISTINCT QueueAddress FROM {self.table(schema, 'SubscriptionRouting')} WHERE Topic IN ({marks})",
            tuple(topics),
        ).fetchall()
        return {row[0] for row in rows}

    def drop_expires_index(self, raw: Raw, schema: str, table: str) -> str:
        raw.execute(f"DROP INDEX [Index_Expires] ON {self.table(schema, table)}")
        return f"CREATE NONCLUSTERED INDEX [Index_Expires] ON {self.table(schema, table)} (Expires)"

    def expires_seconds_from_now(self, raw: Raw, schema: str, table: str) -> float:
        return float(
            raw.execute(
                f"SELECT TOP 1 DATEDIFF_BIG(millisecond, GETUTCDATE(), Expires) / 1000.0 FROM {self.table(schema, table)} "
                "ORDER BY RowVersion DESC"
            ).fetchone()[0]
        )

    def open_transactions_of(self, raw: Raw, client: QueueClient) -> int:
        spid = execute_on(client.session, "SELECT @@SPID").fetchone()[0]
        return raw.execute(
            "SELECT open_transaction_count FROM sys.dm_exec_sessions WHERE session_id = %s", (spid,)
        ).fetchone()[0]


def backend_for(name: str, uri: str) -> Backend:
    return PostgresBackend(uri) if name == "postgres" else SqlServerBackend(uri)
