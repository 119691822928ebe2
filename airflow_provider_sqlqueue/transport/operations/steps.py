"""The small core every operation is written in: a :class:`Step` (a statement, its parameters and
what to fetch), the :data:`Operation` generator that yields steps, and :func:`drive`, which runs
one with a session's ``execute``.

An operation decides *what* happens and the dialect says *how* in SQL; the drivers only run
steps. Whether an operation needs an enclosing transaction is declared here too
(:func:`autocommitted`), since it is a property of the operation, not of its caller.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Awaitable, Callable, Generator, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, ParamSpec, TypeVar

from ..heads import Head

T = TypeVar("T")


class Fetch(Enum):
    """What a step's result is: nothing, one row, all rows, or the affected row count."""

    NONE = "none"
    ONE = "one"
    ALL = "all"
    ROWCOUNT = "rowcount"
    #: All rows, as ALL, with uuid columns as their text where the driver can load them so (a bulk
    #: read that wants text ids, without a UUID object made and printed per row).
    ALL_UUID_TEXT = "all_uuid_text"
    #: COPY ... FROM STDIN of ``params["rows"]`` typed ``params["types"]``; the result is the row count.
    COPY = "copy"
    #: COPY ... FROM STDIN of ``params["chunks"]``, bytes already in the statement's format; the
    #: result is the row count.
    LOAD = "load"


@dataclass(frozen=True)
class Step:
    """One statement to run with its named parameters; ``target`` names the queue in error messages."""

    sql: str
    params: Mapping[str, Any]
    fetch: Fetch
    target: str


Operation = Generator[Step, Any, T]


P = ParamSpec("P")


class Autocommit(Generator[Step, Any, T]):
    """An operation whose statements need no enclosing transaction (see :func:`needs_no_transaction`)."""

    autocommit = True

    def __init__(self, op: Operation[T]) -> None:
        self._op = op

    def send(self, value: Any) -> Step:
        return self._op.send(value)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Step:
        return self._op.throw(typ, val, tb)


def autocommitted(make: Callable[P, Operation[T]]) -> Callable[P, Operation[T]]:
    """Declare that an operation's statements may each commit alone.

    Either it is a single statement (atomic by itself), or each of its statements is atomic and
    its guarantee does not need them to commit together -- a claim moves rows in flight in one
    statement, and whatever follows (dead-lettering, dropping expired claims) works on rows that
    are already safe in the in-flight table.
    """

    @functools.wraps(make)
    def declared(*args: P.args, **kwargs: P.kwargs) -> Operation[T]:
        return Autocommit(make(*args, **kwargs))

    return declared


def needs_no_transaction(op: Operation[Any]) -> bool:
    """Whether ``op`` may run with each statement committing by itself.

    True for single statements, and for operations whose statements are each atomic and whose
    guarantee does not need them to commit together. On an autocommit connection the drivers
    then send no BEGIN and COMMIT, which saves two round trips.
    """
    return getattr(op, "autocommit", False) is True


async def drive(op: Operation[T], execute: Callable[[Step], Awaitable[Any]]) -> T:
    """Run an operation step by step with a session's ``execute``; the caller owns the transaction."""
    try:
        step = next(op)
        while True:
            step = op.send(await execute(step))
    except StopIteration as done:
        result: T = done.value
        return result


def as_uuid(value: Any) -> uuid.UUID:
    """A uniqueidentifier from any driver: psycopg and pymssql return UUIDs, pyodbc returns text."""
    return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))


def after_head(head: Head | None) -> dict[str, int]:
    """Where a scan for live rows starts, as its parameter: after the session's head, where the
    dialect keeps one (:mod:`.heads`)."""
    return {} if head is None else {"after": head.start()}
