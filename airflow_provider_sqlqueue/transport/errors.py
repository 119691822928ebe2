"""Exceptions raised by the transport core.

Every error a caller can act on has its own class so that operators, sensors and user code can
tell "fix your configuration" (bad name, missing table, wrong permissions) apart from "the
database hiccupped, try again" (:class:`TransportUnavailableError`).
"""

from __future__ import annotations


class SqlQueueError(Exception):
    """Base class of every error raised by airflow-provider-sqlqueue."""


class InvalidArgumentError(SqlQueueError, ValueError):
    """An argument out of its range or of a form the library cannot use; nothing was sent."""


class ArgumentTypeError(SqlQueueError, TypeError):
    """An argument of the wrong type; nothing was sent."""


class InvalidQueueNameError(InvalidArgumentError):
    """A queue, schema or catalog name that cannot name a table safely."""


class InvalidHeadersError(InvalidArgumentError):
    """Headers that are not a flat JSON object of string keys to string-or-null values."""


#: The tables the library works with besides queues, by kind: what each is called, and what creates it.
_MADE_BY = {
    "delayed": ("the delayed-message table", "create_queue, which adds it beside an existing queue"),
    "subscriptions": ("the subscription table", "create_subscription_table, or `sqlqueue ddl --subscriptions`"),
    "writes": ("the write ledger", "create_writes"),
}


class QueueNotFoundError(SqlQueueError):
    """The queue's table does not exist (create it with the installer first), or its schema does not
    (create that first: the installer creates tables, not schemas). ``kind``: a table of another kind
    that the call needs (a delayed-message table, a subscription table, a write ledger), each made
    by a call of its own."""

    def __init__(
        self,
        address: str,
        detail: str = "",
        *,
        claim_store: str | None = None,
        schema_missing: bool = False,
        kind: str | None = None,
    ) -> None:
        self.address = address
        what, made_by = _MADE_BY.get(kind or "", ("queue table", "create_queue / CreateQueueOperator"))
        message = f"{what} {address} does not exist; create it first ({made_by})"
        if schema_missing:  # create_queue cannot help: it creates tables in a schema that must exist
            message = (
                f"the schema of {address} does not exist (or this role may not see it): create the schema first "
                "(CREATE SCHEMA, by a role allowed to); the library creates tables, never schemas"
            )
        if claim_store is not None:  # the queue is there; claim mode's store beside it is not
            message = (
                f"the claim store {claim_store} that claim mode keeps beside {address} does not exist: run "
                "create_queue (CreateQueueOperator, `sqlqueue create`) for the queue, which adds it and leaves an "
                "existing queue as it is"
            )
        if detail:
            message = f"{message}: {detail}"
        super().__init__(message)


class NotAQueueError(SqlQueueError, ValueError):
    """The table exists but is not a queue table (it lacks the columns NServiceBus reads, or it is one
    of this library's own stores): nothing is written to, deleted from or dropped with it."""


class DuplicateMessageError(SqlQueueError, ValueError):
    """A message with the same id is already in the queue (ids are the table's primary key)."""


class PermissionDeniedError(SqlQueueError):
    """The database refused the statement for lack of privileges."""


class TransportMisconfiguredError(SqlQueueError):
    """The connection cannot work as configured: the database refused its settings (unknown role
    or database, wrong password), or a borrowed connection is not in the mode the transport needs.

    Retrying cannot help: fix the connection. Pumps stop and sensors fail with this error rather
    than backing off forever.
    """


class ClientClosedError(SqlQueueError):
    """The client was closed (its ``with`` block ended, or ``close()`` was called): open a new one.

    A closed client does not open its connection again by itself, as it does when the server
    dropped it.
    """

    def __init__(self) -> None:
        super().__init__("the client is closed (its with block ended, or close() was called): open a new one")


class StatementRejectedError(SqlQueueError):
    """The database refused a statement for a reason that retrying cannot fix.

    ``number`` is the database's own error number (SQL Server's native error), when it gave one.
    """

    def __init__(self, message: str, number: int | None = None) -> None:
        self.number = number
        super().__init__(message)


class TransactionAbortedError(StatementRejectedError):
    """A block's transaction did not commit, and what was done in it is undone: a statement inside
    failed and the code around it went on; the code inside ended the transaction itself (COMMIT or
    ROLLBACK on the connection), so that the receive and its work did not commit together; or the
    work could not commit (a deferred constraint or trigger, a serialization failure, a session the
    server ended for idling in the transaction). In native mode this is a failed delivery (counted,
    moved to the error queue after ``max_deliveries``), never a success, and not an outage: the
    pump does not back off for it."""


class StorageFullError(StatementRejectedError):
    """The database has no space left to write the statement's rows: PostgreSQL's disk_full (SQLSTATE
    53100, a tablespace's disk), SQL Server's full filegroup (1101, 1105) or transaction log (9002).

    Nothing was written. It is no outage -- the database answers, and receives and acks, which need
    little or no new space, go on -- and no retry succeeds until an operator frees space or moves the
    table to a larger tablespace, so a sender is told at once instead of retrying for ever.
    """


class ObjectExistsError(StatementRejectedError):
    """Another installer created the same table or index a moment earlier (the installer re-checks)."""


class TransportUnavailableError(SqlQueueError):
    """The database could not be reached or dropped the connection; the operation may be retried."""


class LockTimeoutError(TransportUnavailableError):
    """Another session held a lock on the table longer than the call would wait (a migration, ``VACUUM
    FULL``, ``LOCK TABLE``): the connection is fine, and a later try may succeed."""


#: What a look at many tables (health, a journey) cannot go on from to the next one: the connection,
#: or the transaction it runs in, is gone. A locked table (LockTimeoutError, one of them) only holds
#: up that one, and is caught before these.
CALL_ENDING = (TransportUnavailableError, TransactionAbortedError, ClientClosedError)


class LeaseLostError(SqlQueueError):
    """Claims were no longer held: their lease ran out and the messages may be with another consumer.

    Raised by an atomic forward before anything is committed, so the stage's results were not sent.
    """

    def __init__(self, address: str, tokens: list[str]) -> None:
        self.address = address
        self.tokens = tokens
        super().__init__(
            f"{len(tokens)} claim(s) on {address} are no longer held (lease ran out; another consumer may have "
            f"the messages), so nothing was sent or acknowledged: {', '.join(tokens[:5])}"
            + (" ..." if len(tokens) > 5 else "")
        )


#: Longest error text a command line or an HTTP answer carries.
ONE_LINE_LIMIT = 2_000


def printable(text: str) -> str:
    """Text as a terminal or a log line shows it: control and format characters (a newline, an
    escape sequence, a right-to-left override) and text that is not valid Unicode escaped, never
    obeyed. Table names, headers and server messages may hold any of them, and whoever can create a
    table could otherwise forge lines or recolour a terminal."""
    if text.isprintable():  # nearly always: no copy
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def one_line(error: BaseException) -> str:
    """An error as one line of valid text: what the CLI prints and the HTTP API answers.

    The library's messages carry no secrets (connection errors have their password masked where
    they are raised); this only makes any message fit where it goes: whitespace runs folded into
    a space, what is not :func:`printable` escaped, the length bounded.
    """
    try:
        text = str(error)
    except Exception:  # noqa: BLE001  # an exception whose __str__ raises still gets a line
        text = ""
    text = printable(" ".join(text.split()) or type(error).__name__)
    return text if len(text) <= ONE_LINE_LIMIT else text[:ONE_LINE_LIMIT] + "..."
