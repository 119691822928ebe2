"""The dialects: every SQL statement the transport can run, one module per database.

:mod:`.base` is the interface every dialect implements, with the row types its statements return;
:mod:`.postgres` and :mod:`.sqlserver` are the SQL text. A dialect is chosen by name
(:func:`get_dialect`), and its module is imported only then: a PostgreSQL user never loads SQL
Server's.
"""

from __future__ import annotations

from ..errors import InvalidArgumentError
from .base import (
    BrowsedRow,
    ClaimedRow,
    ClaimRow,
    DelayedFiguresRow,
    Dialect,
    DueRow,
    ErrorRow,
    FailedRow,
    HeldRow,
    HorizonRow,
    QueueFiguresRow,
    ReceivedRow,
    SendRow,
    TableShape,
)
from .journeys import FoundClaimRow, FoundRow

__all__ = [
    "BrowsedRow",
    "ClaimRow",
    "ClaimedRow",
    "DelayedFiguresRow",
    "Dialect",
    "DueRow",
    "ErrorRow",
    "FailedRow",
    "FoundClaimRow",
    "FoundRow",
    "HeldRow",
    "HorizonRow",
    "QueueFiguresRow",
    "ReceivedRow",
    "SendRow",
    "TableShape",
    "get_dialect",
]


def get_dialect(name: str) -> Dialect:
    """The dialect for a name (``postgres``/``postgresql`` or ``sqlserver``/``mssql``)."""
    if name.lower() in ("postgres", "postgresql", "pg"):
        from .postgres import PostgresDialect

        return PostgresDialect()
    if name.lower() in ("sqlserver", "mssql"):
        from .sqlserver import SqlServerDialect

        return SqlServerDialect()
    raise InvalidArgumentError(f"unknown SQL dialect {name!r}; expected 'postgres' or 'sqlserver'")
