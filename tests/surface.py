"""The public surface and the hostile catalogue the contract test runs against it.

Every public entry point is registered here: each public method of ``QueueClient``,
``AsyncQueueClient`` and ``SqlQueueHook``, each operator, each CLI command, each HTTP route and each
Spark option. The contract test discovers the surface from the code and fails when anything public
is missing here, so a new entry point is covered from its first commit.

Arguments are classified by their *name*: the project uses one name per concept across layers
(``queue``/``queue_name``, ``max_messages``, ``lease``, ``tokens``...), so a parameter name maps to
a kind of value, and each kind has its catalogue of hostile values. A new parameter whose name is
in no kind fails the test until it is classified.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from enum import Enum
from typing import Any

from airflow_provider_sqlqueue.transport import Message, QueueAddress, ReceivedMessage
from airflow_provider_sqlqueue.transport.operations import LockedBatch


class Kind(Enum):
    """What a parameter holds."""

    QUEUE = "a queue the call reads, writes or settles"
    NAME = "a name the call only parses (no table is touched)"
    QUEUES = "several queues"
    COUNT = "a positive count of messages or rows"
    SEQ = "a place in a queue (Seq), zero or more"
    PART = "a partition number"
    DURATION = "a timedelta or seconds"
    DUE = "an aware datetime"
    TOKENS = "claim tokens"
    SEQS = "places in an error queue"
    LABEL = "a holder, endpoint or machine name"
    SEARCH = "text to look for (empty: everything)"
    TOPICS = "event topics"
    MESSAGES = "messages to send"
    CSV = "queue rows (Id, Headers, Body) as CSV text, in chunks of bytes"
    RECEIVED = "a message received earlier"
    ERROR = "a failure to record (free text: made safe, never refused)"
    WRITE = "a write id"
    STARTED = "processing start times by message id"
    CLAIMS = "claim tokens by queue"
    SENDS = "messages by queue"
    GROUP = "a failure group (source queue, exception type)"
    MODE = "a transaction mode"
    FLAG = "a boolean switch"
    URI = "a connection target"
    AUDIT = "an audit queue switch or name"
    CONN_ID = "an Airflow connection id"
    SIZE = "a count that may be zero"
    POOL = "a pool of sessions for a pump"
    HANDLER = "an async function a pump hands messages to"
    METER = "where counts and timings are reported"
    OPENER = "a function opening a client"
    JOURNEY = "a message id or a trace id"
    LOCKED = "a batch locked by the caller's transaction"
    XID = "the id of a transaction holding a locked batch"


#: Parameter name -> kind, one entry per concept and name across the core and the hook.
KINDS: dict[str, Kind] = {
    "queue": Kind.QUEUE,
    "queue_name": Kind.QUEUE,
    "error_queue": Kind.QUEUE,
    "ledger": Kind.QUEUE,
    "table": Kind.QUEUE,
    "subscription_table": Kind.QUEUE,
    "name": Kind.NAME,
    "address": Kind.NAME,
    "queues": Kind.QUEUES,
    "queue_names": Kind.QUEUES,
    "max_messages": Kind.COUNT,
    "limit": Kind.COUNT,
    "batch_size": Kind.COUNT,
    "expired_limit": Kind.COUNT,
    "report_unreadable": Kind.FLAG,
    "preview": Kind.COUNT,
    "max_deliveries": Kind.COUNT,
    "parts": Kind.COUNT,
    "part": Kind.PART,
    "after": Kind.SEQ,
    "before": Kind.SEQ,
    "last": Kind.SEQ,
    "lease": Kind.DURATION,
    "delay": Kind.DURATION,
    "timeout": Kind.DURATION,
    "lock_wait": Kind.DURATION,
    "due": Kind.DUE,
    "tokens": Kind.TOKENS,
    "seqs": Kind.SEQS,
    "holder": Kind.LABEL,
    "endpoint": Kind.LABEL,
    "secondary": Kind.LABEL,
    "topics": Kind.TOPICS,
    "messages": Kind.MESSAGES,
    "chunks": Kind.CSV,
    "message": Kind.RECEIVED,
    "error": Kind.ERROR,
    "write": Kind.WRITE,
    "started": Kind.STARTED,
    "claims": Kind.CLAIMS,
    "sends": Kind.SENDS,
    "group": Kind.GROUP,
    "transaction_mode": Kind.MODE,
    "search": Kind.SEARCH,
    "offset": Kind.SEQ,
    "notify": Kind.FLAG,
    "include_claims": Kind.FLAG,
    "body_string": Kind.FLAG,
    "delayed": Kind.FLAG,
    "notify_on_insert": Kind.FLAG,
    "target": Kind.URI,
    "audit_queue": Kind.AUDIT,
    "sqlqueue_conn_id": Kind.CONN_ID,
    "conninfo": Kind.URI,
    "max_size": Kind.COUNT,
    "min_size": Kind.SIZE,
    "pool": Kind.POOL,
    "handler": Kind.HANDLER,
    "batch_handler": Kind.HANDLER,
    "max_concurrency": Kind.COUNT,
    "peek_batch_size": Kind.COUNT,
    "receive_batch_size": Kind.COUNT,
    "peek_interval": Kind.DURATION,
    "max_backoff": Kind.DURATION,
    "breaker_alarm": Kind.DURATION,
    "smallest_ttbr": Kind.DURATION,
    "move_delayed": Kind.FLAG,
    "wake_on_notify": Kind.FLAG,
    "meter": Kind.METER,
    "open_client": Kind.OPENER,
    "message_or_trace": Kind.JOURNEY,
    "scan": Kind.COUNT,
    "batch": Kind.LOCKED,
    "locked_by": Kind.XID,
}

#: Longer than any identifier either database holds (PostgreSQL 63 bytes, SQL Server 128 characters).
TOO_LONG = "q" * 129
MEGABYTE = "m" * 1_000_000
LONE_SURROGATE = "bad\udcffname"  # what os.fsdecode(b"bad\xffname") gives


@dataclass(frozen=True)
class Hostile:
    """One hostile value: ``label`` names it in failures; ``value`` is built from the test's world."""

    label: str
    value: Callable[[World], Any]


@dataclass(frozen=True)
class World:
    """What a good call needs: the test's schema and its queues, with what they hold."""

    schema: str
    queue: QueueAddress
    error: QueueAddress
    delayed_queue: QueueAddress
    customers: QueueAddress  # an ordinary business table with rows: never a queue
    lookalike: QueueAddress  # a business table with a queue's column names but other types, with rows
    subscriptions: QueueAddress
    ledger: QueueAddress
    uri: str


def _names(world: World) -> list[tuple[str, Any]]:
    """Names no database can hold, or that must never reach SQL as text."""
    return [
        ("NUL", "ord\x00ers"),
        ("lone surrogate", LONE_SURROGATE),
        ("too long", TOO_LONG),
        ("megabyte", MEGABYTE),
        ("empty", ""),
        ("blank", "   "),
        ("not text", 42),
        ("bytes", b"orders"),
        ("unterminated quote", 'orders@"public'),
    ]


def _tables(world: World) -> list[tuple[str, Any]]:
    """Names that parse but reach a table that is no queue (or none)."""
    return [
        ("business table", world.customers),
        ("business table by name", f'customers@"{world.schema}"'),
        ("a queue's column names, other types", world.lookalike),
        ("catalog table", 'pg_authid@"pg_catalog"'),
        ("claim store", QueueAddress("sqlqueue_inflight", world.schema)),
        ("missing table", QueueAddress("no_such_queue", world.schema)),
        ("injection", QueueAddress('orders"; DROP TABLE customers; --', world.schema)),
        ("control characters", QueueAddress("ord\n\x1bers", world.schema)),
    ]


#: Names of tables that do not exist: an installer creates them, a drop finds nothing to do (quoted
#: as identifiers, never run as SQL: the business table stays).
ABSENT = {"missing table", "injection", "control characters"}


def _counts(world: World) -> list[tuple[str, Any]]:
    return [
        ("zero", 0),
        ("negative", -1),
        ("past bigint", 2**63),
        ("past any batch", 10**12),
        ("float", 1.5),
        ("NaN", float("nan")),
        ("text", "5"),
        ("bool", True),
    ]


def _seqs_values(world: World) -> list[tuple[str, Any]]:
    return [
        ("negative", -1),
        ("past bigint", 2**63),
        ("float", 2.5),
        ("text", "7"),
        ("bool", True),
    ]


def _durations(world: World) -> list[tuple[str, Any]]:
    return [
        ("negative", -5),
        ("NaN", float("nan")),
        ("infinity", float("inf")),
        ("text", "soon"),
        ("bool", True),
        ("a million years", timedelta(days=365 * 1_000_000)),
        ("past float seconds", 1e300),
    ]


def _dues(world: World) -> list[tuple[str, Any]]:
    return [
        ("naive", datetime(2030, 1, 1, 12, 0)),
        ("text", "2030-01-01T00:00:00Z"),
        ("year 9999 +14:00", datetime(9999, 12, 31, 23, 59, tzinfo=timezone(timedelta(hours=14)))),
        ("epoch number", 1_900_000_000),
    ]


def _tokens(world: World) -> list[tuple[str, Any]]:
    return [
        ("not a uuid", "not-a-token"),
        ("NUL", "\x00"),
        ("number", 42),
        ("list with a number", [uuid.uuid4(), 7]),
        ("too many", [uuid.uuid4() for _ in range(100_001)]),
    ]


def _seq_lists(world: World) -> list[tuple[str, Any]]:
    return [
        ("past bigint", [2**63]),
        ("negative", [-1]),
        ("empty", []),
        ("text", ["1"]),
        ("bool", [True]),
        ("float", [1.5]),
        ("too many", list(range(1, 100_002))),
    ]


def _labels(world: World) -> list[tuple[str, Any]]:
    return [
        ("NUL", "host\x00one"),
        ("lone surrogate", LONE_SURROGATE),
        ("megabyte", MEGABYTE),
        ("empty", ""),
        ("not text", 42),
    ]


def _topics(world: World) -> list[tuple[str, Any]]:
    return [
        ("NUL", "Shop.Events.OrderPlaced\x00"),
        ("lone surrogate", LONE_SURROGATE),
        ("megabyte", MEGABYTE),
        ("empty", ""),
        ("none of them", []),
        ("not text", 42),
        ("a number among them", ["Shop.Events.OrderPlaced", 42]),
    ]


def _messages(world: World) -> list[tuple[str, Any]]:
    return [
        ("text", "a body, not a Message"),
        ("bytes", b"a body"),
        ("numbers", [1, 2]),
        ("none", None),
        ("a dict", {"body": "x"}),
    ]


def _csv_chunks(world: World) -> list[tuple[str, Any]]:
    """Rows a bulk loader could get wrong: each must fail the whole load and send nothing."""
    good = f'{uuid.uuid4()},"{{""a"":""b""}}",\\x41\n'.encode()
    return [
        ("text, not bytes", "a,b,c"),
        ("not iterable", 42),
        ("a number among them", [good, 42]),
        ("not an id", [good, b'not-a-uuid,"{}",\\x41\n']),
        ("one field too many", [good, f'{uuid.uuid4()},"{{}}",\\x41,more\n'.encode()]),
        ("no headers", [good, f"{uuid.uuid4()},,\\x41\n".encode()]),
        ("bad hex", [good, f'{uuid.uuid4()},"{{}}",\\xZZ\n'.encode()]),
        ("invalid UTF-8", [good, f'{uuid.uuid4()},"'.encode() + b'\xff",\\x41\n']),
        ("the same id twice", [good, good]),
        ("an unterminated quote", [good, f'{uuid.uuid4()},"{{}},\\x41\n'.encode()]),
    ]


def _received(world: World) -> list[tuple[str, Any]]:
    return [
        ("a claim token", uuid.uuid4()),
        ("text", "message"),
        ("none", None),
        ("a message never claimed", Message("never received")),
    ]


class _HostileText(Exception):
    """An exception whose text is everything a failure header must survive."""

    def __str__(self) -> str:
        return "bad \udcff byte, NUL \x00, \x1b[31m, " + "x" * 2_000_000


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("this exception cannot be printed")


def _errors(world: World) -> list[tuple[str, Any]]:
    return [
        ("lone surrogate", "failed on " + LONE_SURROGATE),
        ("NUL", "failed\x00here"),
        ("two megabytes", "e" * 2_000_000),
        ("exception with hostile text", _HostileText()),
        ("exception that cannot be printed", _Unprintable()),
        ("not text", 42),
    ]


def _writes(world: World) -> list[tuple[str, Any]]:
    return [("not a uuid", "not-a-write"), ("number", 42), ("none", None)]


def _started(world: World) -> list[tuple[str, Any]]:
    return [
        ("naive", {uuid.uuid4(): datetime(2030, 1, 1)}),
        ("text", {uuid.uuid4(): "yesterday"}),
        ("not a mapping", "yesterday"),
    ]


def _claims(world: World) -> list[tuple[str, Any]]:
    return [
        ("business table", {world.customers: [uuid.uuid4()]}),
        ("missing table", {QueueAddress("no_such_queue", world.schema): [uuid.uuid4()]}),
        ("not a token", {world.queue: ["not-a-token"]}),
        ("NUL name", {"ord\x00ers": [uuid.uuid4()]}),
        ("not a mapping", [uuid.uuid4()]),
    ]


def _sends(world: World) -> list[tuple[str, Any]]:
    return [
        ("business table", {world.customers: [Message("x")]}),
        ("missing table", {QueueAddress("no_such_queue", world.schema): [Message("x")]}),
        ("not messages", {world.queue: ["x"]}),
        ("lone surrogate name", {LONE_SURROGATE: [Message("x")]}),
        ("not a mapping", [Message("x")]),
    ]


def _groups(world: World) -> list[tuple[str, Any]]:
    return [("text", "orders"), ("numbers", (1, 2)), ("one part", ("orders",)), ("megabyte", (MEGABYTE, MEGABYTE))]


def _modes(world: World) -> list[tuple[str, Any]]:
    return [("unknown", "sometimes"), ("number", 3), ("NUL", "claim\x00")]


def _flags(world: World) -> list[tuple[str, Any]]:
    return [("text", "no"), ("number", 2)]


def _uris(world: World) -> list[tuple[str, Any]]:
    return [
        ("unterminated bracket", "postgresql://app:contract-s3cret@[::1/test"),
        ("bad percent escape", "postgresql://app:contract-s3cr%zzet@127.0.0.1/test"),
        ("port out of range", "postgresql://app:contract-s3cret@127.0.0.1:99999/test"),
        ("port not a number", "postgresql://app:contract-s3cret@127.0.0.1:abc/test"),
        ("bad sslmode", world.uri + ("&" if "?" in world.uri else "?") + "sslmode=bogus"),
        ("bad target_session_attrs", world.uri + ("&" if "?" in world.uri else "?") + "target_session_attrs=bogus"),
        ("unknown scheme", "mysql://app:contract-s3cret@127.0.0.1/test"),
        ("not text", 42),
    ]


def _audits(world: World) -> list[tuple[str, Any]]:
    return [
        ("the queue itself", world.queue),
        ("the error queue", world.error),
        ("NUL", "aud\x00it"),
        ("number", 42),
    ]


def _conn_ids(world: World) -> list[tuple[str, Any]]:
    return [
        ("empty", ""),
        ("not text", 42),
        ("undefined", "contract_nowhere"),
        ("not a database", "contract_http"),
        ("NUL", "con\x00tract"),
        ("lone surrogate", LONE_SURROGATE),
        ("a megabyte", MEGABYTE),
    ]


def _journeys(world: World) -> list[tuple[str, Any]]:
    """What is neither a message id nor a trace id, or would be SQL or a pattern if it reached the text search."""
    return [
        ("empty", ""),
        ("a queue's name", "orders"),
        ("W3C's invalid trace id", "0" * 32),
        ("a LIKE pattern", "%"),
        ("injection", "' OR 1=1 --"),
        ("NUL inside a trace id", "4bf92f35\x0077b34da6a3ce929d0e0e4736"),
        ("lone surrogates", "\udcff" * 32),
        ("megabyte", MEGABYTE),
        ("number", 42),
        ("bytes", b"4bf92f3577b34da6a3ce929d0e0e4736"),
    ]


def _locked_batches(world: World) -> list[tuple[str, Any]]:
    queue = f'orders@"{world.schema}"'  # the queue's address as a batch of it names it
    return [
        ("another queue's", LockedBatch(f'error@"{world.schema}"', 3, 0, 10, 1)),
        ("a queue that is no text", LockedBatch(42, 3, 0, 10, 1)),  # type: ignore[arg-type]
        ("text", "105593:0:11"),
        ("number", 42),
        ("none", None),
        ("another transaction's", LockedBatch(queue, 3, 0, 10, 1)),
        ("id zero", LockedBatch(queue, 0, 0, 10, 1)),
        ("id past bigint", LockedBatch(queue, 2**63, 0, 10, 1)),
        ("range backwards", LockedBatch(queue, 5, 10, 3, 0)),
        ("poison outside its range", LockedBatch(queue, 5, 0, 10, 1, (11,))),
        ("poison as a list", LockedBatch(queue, 5, 0, 10, 1, [3])),  # type: ignore[arg-type]
        ("more rows than its range", LockedBatch(queue, 5, 0, 10, 11)),
    ]


def _transaction_ids(world: World) -> list[tuple[str, Any]]:
    return [
        ("zero", 0),
        ("negative", -1),
        ("past bigint", 2**63),
        ("text", "105593"),
        ("bool", True),
        ("float", 1.5),
        ("an ended transaction", 3),
        ("in the future", 2**62),
    ]


@dataclass(frozen=True)
class LockedHere:
    """The good batch of a call that settles one: a batch of ``queue`` locked by the call's own
    transaction block just before the call (``tests/test_contract.py`` locks it)."""

    queue: QueueAddress


def _sync_handler(message: Any, connection: Any) -> None:
    """A handler written without ``async``: the pump could only fail every message with it."""


def _not_a_client() -> Any:
    return "a client"


#: Kind -> its hostile values. Every call given one of them must fail with the library's own error
#: (never "unavailable, retry") and change nothing -- except ERROR, whose values must be recorded
#: safely or refused.
CATALOGUE: dict[Kind, Callable[[World], list[tuple[str, Any]]]] = {
    Kind.QUEUE: lambda w: _names(w) + _tables(w),
    Kind.NAME: _names,
    Kind.QUEUES: lambda w: [(label, [value]) for label, value in _names(w) + _tables(w)] + [("not a list", 42)],
    Kind.COUNT: _counts,
    Kind.SEQ: _seqs_values,
    Kind.PART: lambda w: [("negative", -1), ("past an integer column", 2**31), ("text", "0"), ("bool", True)],
    Kind.DURATION: _durations,
    Kind.DUE: _dues,
    Kind.TOKENS: _tokens,
    Kind.SEQS: _seq_lists,
    Kind.LABEL: _labels,
    Kind.SEARCH: lambda w: [(label, value) for label, value in _labels(w) if label != "empty"],
    Kind.TOPICS: _topics,
    Kind.MESSAGES: _messages,
    Kind.CSV: _csv_chunks,
    Kind.RECEIVED: _received,
    Kind.ERROR: _errors,
    Kind.WRITE: _writes,
    Kind.STARTED: _started,
    Kind.CLAIMS: _claims,
    Kind.SENDS: _sends,
    Kind.GROUP: _groups,
    Kind.MODE: _modes,
    Kind.FLAG: _flags,
    Kind.URI: _uris,
    Kind.AUDIT: _audits,
    Kind.CONN_ID: _conn_ids,
    Kind.SIZE: _seqs_values,
    Kind.POOL: lambda w: [("none", None), ("a URI", w.uri), ("number", 42)],
    Kind.HANDLER: lambda w: [("not callable", 42), ("not async", _sync_handler)],
    Kind.METER: lambda w: [("number", 42), ("text", "statsd")],
    Kind.OPENER: lambda w: [("not callable", 42), ("opens no client", _not_a_client)],
    Kind.JOURNEY: _journeys,
    Kind.LOCKED: _locked_batches,
    Kind.XID: _transaction_ids,
}


def good_value(kind: Kind, parameter: str, world: World) -> Any:
    """A value of ``kind`` that a call accepts, so that only the hostile argument can fail it."""
    if parameter == "error_queue":
        return world.error
    if parameter in ("table", "subscription_table"):
        return world.subscriptions
    if parameter == "ledger":
        return world.ledger
    return {
        Kind.QUEUE: world.queue,
        Kind.NAME: world.queue,
        Kind.QUEUES: [world.queue],
        Kind.COUNT: 1,
        Kind.SEQ: 0,
        Kind.PART: 0,
        Kind.DURATION: timedelta(seconds=30),
        Kind.DUE: datetime.now(UTC) + timedelta(hours=1),
        Kind.TOKENS: [uuid.uuid4()],
        Kind.SEQS: [1],
        Kind.LABEL: "contract-holder",
        Kind.SEARCH: "ord",
        Kind.TOPICS: ["Contract.Events.Nothing"],
        Kind.MESSAGES: [Message("contract")],
        Kind.CSV: [f'{uuid.uuid4()},"{{}}",\\x41\n'.encode()],
        Kind.RECEIVED: ReceivedMessage(uuid.uuid4(), {}, b"", uuid.uuid4(), 1),
        Kind.ERROR: "boom",
        Kind.WRITE: uuid.uuid4(),
        Kind.STARTED: {},
        Kind.CLAIMS: {},
        Kind.SENDS: {world.queue: [Message("contract")]},
        Kind.GROUP: ("orders", "ValueError"),
        Kind.MODE: "claim",
        Kind.FLAG: False,
        Kind.URI: world.uri,
        Kind.AUDIT: None,
        Kind.CONN_ID: "contract",
        Kind.SIZE: 0,
        Kind.JOURNEY: "4bf92f3577b34da6a3ce929d0e0e4736",
        Kind.LOCKED: LockedHere(world.queue),
    }[kind]


#: Public methods that take no hostile input: they are called with no arguments.
NO_INPUT = {"close", "queues", "connection", "database", "get_conn", "async_client", "client", "conninfo"}
NO_INPUT |= {"test_connection", "aconnection", "dialect_name", "error_queue", "audit_queue", "transaction"}
NO_INPUT |= {"horizon", "meter", "error_queues"}
