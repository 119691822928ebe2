"""Queue addresses: which table a queue lives in.

A queue is one table. Its address is the table name plus an optional schema (and, on SQL Server,
catalog). Names are kept exactly as given -- case, dots, quotes and all -- and are only ever put
into SQL as quoted identifiers by a dialect, never formatted in as text. What makes a name too
long depends on the database, so length limits are checked by the dialect
(:meth:`~airflow_provider_sqlqueue.transport.dialects.Dialect.validate_address`).

The textual forms NServiceBus uses (``table@"schema"`` on PostgreSQL,
``table@[schema]@[catalog]`` on SQL Server) are parsed and produced by the dialects too.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import defaults
from .errors import InvalidArgumentError, InvalidQueueNameError


def checked_text(
    what: str,
    value: object,
    *,
    limit: int | None = None,
    invalid: type[InvalidArgumentError] = InvalidArgumentError,
    empty: bool = False,
) -> str:
    """Text a database can hold as a name or a column value: non-empty (unless ``empty``), no NUL, valid
    Unicode (no lone surrogates) and, given a ``limit``, at most that many characters; else ``invalid``
    naming ``what``."""
    if not isinstance(value, str):
        raise invalid(f"{what} must be text, got {type(value).__name__}")
    if not empty and not value.strip():
        raise invalid(f"{what} must not be empty or blank")
    if "\x00" in value:
        raise invalid(f"{what} {value[:60]!r} contains a NUL character")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise invalid(f"{what} {value[:60]!r} is not valid Unicode text: {exc.reason}") from None
    if limit is not None and len(value) > limit:
        raise invalid(f"{what} {value[:40]!r}... is {len(value):,} characters; at most {limit:,} are kept")
    return value


def check_name(kind: str, name: object) -> str:
    """Refuse a name no database can hold as an identifier, with a message naming the problem."""
    return checked_text(f"{kind} name", name, invalid=InvalidQueueNameError)


@dataclass(frozen=True)
class QueueAddress:
    """The table (and schema, catalog) that holds one queue.

    ``schema=None`` means the dialect's default (``public`` on PostgreSQL, ``dbo`` on SQL Server),
    resolved when the dialect quotes the name, so one address works on either database.
    """

    table: str
    schema: str | None = None
    catalog: str | None = None

    def __post_init__(self) -> None:
        check_name("queue table", self.table)
        if self.schema is not None:
            check_name("schema", self.schema)
        if self.catalog is not None:
            check_name("catalog", self.catalog)

    def secondary(self, machine: str) -> QueueAddress:
        """The per-instance queue ``Endpoint.Machine`` used for replies that must reach this instance."""
        check_name("machine", machine)
        return QueueAddress(f"{self.table}.{machine}", self.schema, self.catalog)

    def delayed(self, suffix: str = defaults.DELAYED_TABLE_SUFFIX) -> QueueAddress:
        """The queue's delayed-message table, ``<queue>.Delayed``, as NServiceBus names it."""
        check_name("delayed table suffix", suffix)
        return QueueAddress(f"{self.table}.{suffix}", self.schema, self.catalog)

    def sibling(self, table: str) -> QueueAddress:
        """Another queue in the same schema and catalog (e.g. the endpoint's error queue)."""
        return QueueAddress(table, self.schema, self.catalog)

    def __str__(self) -> str:
        parts = [p for p in (self.catalog, self.schema) if p is not None]
        return ".".join([*parts, self.table])


def split_outside(text: str, separator: str, opening: str, closing: str) -> list[str]:
    """Split ``text`` on ``separator`` wherever it is not inside an ``opening``/``closing`` quoted part.

    A doubled closing character inside a quoted part is an escaped literal, as both PostgreSQL
    (``""``) and SQL Server (``]]``) write them.
    """
    parts: list[str] = []
    current: list[str] = []
    inside = False
    i = 0
    while i < len(text):
        ch = text[i]
        if inside:
            if ch == closing:
                if i + 1 < len(text) and text[i + 1] == closing:
                    current.append(ch + ch)
                    i += 2
                    continue
                inside = False
            current.append(ch)
        elif ch == opening:
            inside = True
            current.append(ch)
        elif ch == separator:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
        i += 1
    if inside:
        raise InvalidQueueNameError(f"unterminated {opening}...{closing} quoting in address {text!r}")
    parts.append("".join(current))
    return parts


def unquote(part: str, opening: str, closing: str) -> str:
    """Remove ``opening``/``closing`` quoting from one address part and undouble escaped closers."""
    if len(part) >= 2 and part[0] == opening and part[-1] == closing:
        return part[1:-1].replace(closing + closing, closing)
    if opening in part or closing in part:
        raise InvalidQueueNameError(f"address part {part!r} has a stray {opening} or {closing}; quote the whole part")
    return part
