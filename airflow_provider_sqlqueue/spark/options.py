"""The ``sqlqueue`` data source's options: parsed and checked once on the driver, before any task.

Spark hands every option over as text, case-insensitively, to a read and a write alike; here each
is matched to its documented name (an unknown one is refused, naming the nearest), checked (numbers,
durations, queue names, the ledger beside the queue) and refused in the direction that would
ignore it. :class:`Options` is what every Spark task of :mod:`.write`, :mod:`.read` and
:mod:`.stream` works from.
"""

from __future__ import annotations

import difflib
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Literal

from ..transport import QueueAddress, QueueClient, defaults
from ..transport.addressing import checked_text
from ..transport.client import Addressing
from ..transport.drivers import dialect_for
from ..transport.errors import ArgumentTypeError, InvalidArgumentError, SqlQueueError
from ..transport.message import duration

#: The format name: ``spark.read.format(NAME)``.
NAME = "sqlqueue"
#: Where the write ids given as text live: uuid5 of this namespace and the text.
WRITE_ID_NAMESPACE = uuid.UUID("6f0d5b3e-8d1c-4a57-9c4e-5a1f2b7c9e10")
#: Defaults of the options README lists (the lease and deliveries are the transport's).
PARTITIONS = 2
FETCH_SIZE = 10_000
MAX_MESSAGES_PER_BATCH = 10_000
BATCH_SIZE = 500
#: Who builds a write's messages (option ``engine``): Spark's SQL engine where it can (``auto``), only
#: it (``jvm``: refused where it cannot), or the data source's Python workers (``python``).
ENGINES = ("auto", "jvm", "python")
#: Every option the data source reads, as README spells them (Spark passes them case-insensitively,
#: and passes nothing of its own but ``path``, from ``load(path)``/``save(path)``): any other is refused.
OPTION_NAMES = (
    "url",
    "password",
    "queue",
    "errorQueue",
    "mode",
    "holder",
    "numPartitions",
    "fetchSize",
    "lease",
    "maxDeliveries",
    "maxMessagesPerBatch",
    "batchSize",
    "messageType",
    "contentType",
    "timeToBeReceived",
    "ledger",
    "writeId",
    "engine",
    "lock",
)
#: Options only a write reads, and options only a read (batch or streaming) reads; ``url``,
#: ``password`` and ``queue`` serve both. Spark hands a read and a write the same kind of options,
#: so an option given to the direction that ignores it would be dropped without a word (a
#: ``timeToBeReceived`` on a read, a ``lease`` on a write): it is refused instead.
WRITE_OPTIONS = frozenset(
    {"batchSize", "messageType", "contentType", "timeToBeReceived", "ledger", "writeId", "engine"}
)
READ_OPTIONS = frozenset(
    {
        "mode",
        "holder",
        "numPartitions",
        "fetchSize",
        "lease",
        "maxDeliveries",
        "maxMessagesPerBatch",
        "errorQueue",
        "lock",
    }
)
#: Read options that a read of a locked batch (option ``lock``) cannot use: the batch, its size and
#: its error queue are the locking transaction's (:func:`.functions.claimed_from_queue`), and it is
#: no claim, with no holder, lease or delivery count.
NOT_WITH_A_LOCK = ("mode", "holder", "lease", "maxDeliveries", "maxMessagesPerBatch", "errorQueue")
#: Option ``lock`` as claimed_from_queue writes it: ``<xid>:<after>:<last>``, ASCII digits only.
_LOCK = re.compile(r"([0-9]{1,19}):([0-9]{1,19}):([0-9]{1,19})")
#: What the options every direction needs hold, for the message refusing one given empty.
_REQUIRED = {
    "url": "a postgresql:// URI, a libpq or ODBC string",
    "queue": 'the queue\'s address, e.g. orders or orders@"sales"',
}


class InvalidOptionError(SqlQueueError, ValueError):
    """A ``sqlqueue`` data source option that is missing or cannot be used as given."""


def _number(options: Mapping[str, str], name: str, default: float, *, whole: bool = False) -> float:
    text = options.get(name)
    if text is None:
        return default
    try:
        value = int(text) if whole else float(text)
    except ValueError:
        raise InvalidOptionError(f"option {name!r} must be a {'whole ' if whole else ''}number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise InvalidOptionError(f"option {name!r} must be positive, got {text!r}")
    return value


def _span(
    options: Mapping[str, str],
    name: str,
    default: timedelta | None,
    maximum: timedelta,
    minimum: timedelta = timedelta(milliseconds=1),
) -> timedelta:
    """A duration option in seconds, within what the core accepts (a lease up to ``MAX_LEASE``...)."""
    seconds = _number(options, name, 0 if default is None else default.total_seconds())
    try:
        return duration(name, seconds, maximum=maximum, minimum=minimum)
    except SqlQueueError as exc:
        raise InvalidOptionError(f"option {name!r}: {exc}") from None


def _text(options: Mapping[str, str], name: str) -> str:
    """A text option the data source stores or hashes: text a database can hold."""
    try:
        return checked_text(f"option {name!r}", options.get(name), limit=defaults.MAX_LABEL)
    except SqlQueueError as exc:
        raise InvalidOptionError(str(exc)) from None


def _count(options: Mapping[str, str], name: str, default: int, maximum: int = defaults.MAX_BATCH) -> int:
    value = int(_number(options, name, default, whole=True))
    if value > maximum:
        raise InvalidOptionError(f"option {name!r} must be at most {maximum:,}, got {value:,}")
    return value


@dataclass(frozen=True)
class Lock:
    """Option ``lock``: the batch a transaction holds locked (``xid``), the rows with ``after`` < Seq
    <= ``last`` of it, as :func:`.functions.claimed_from_queue` hands it to the readers."""

    xid: int
    after: int
    last: int

    def text(self) -> str:
        return f"{self.xid}:{self.after}:{self.last}"


def _lock(text: str | None) -> Lock | None:
    """Option ``lock``, read strictly: three whole numbers in their ranges, nothing around them."""
    if text is None:
        return None
    match = _LOCK.fullmatch(text)
    if match is not None:
        xid, after, last = (int(part) for part in match.groups())
        if 1 <= xid <= defaults.LAST_SEQ and after <= last <= defaults.LAST_SEQ:
            return Lock(xid, after, last)
    raise InvalidOptionError(
        f"option 'lock' must be <transaction id>:<after>:<last>, as claimed_from_queue writes it, got {text[:60]!r}"
    )


def _known(options: Mapping[str, str]) -> dict[str, str]:
    """The options keyed by their README names, whatever case they came in; an unknown (misspelt)
    option is refused, naming the nearest known one, rather than silently left at its default.

    So is an option given with no value (empty or blank), whichever it is: an empty
    ``option("ledger", os.environ.get(...))`` more likely lost its value than meant the default,
    and reading it as the default would write somewhere the caller did not name. An option meant
    to be left at its default is left out.
    """
    names = {name.lower(): name for name in OPTION_NAMES}
    known: dict[str, str] = {}
    for key, value in options.items():
        if not isinstance(key, str):
            raise InvalidOptionError(f"option names are text, got {type(key).__name__}")
        name = names.get(key.lower())
        if name is None:
            if key.lower() == "path":
                raise InvalidOptionError(
                    "the sqlqueue data source takes no path (load(path) / save(path)): name the queue with option 'queue'"
                )
            near = difflib.get_close_matches(key.lower(), list(names), n=1, cutoff=0.6)
            hint = f": did you mean {names[near[0]]!r}?" if near else f"; known options: {', '.join(OPTION_NAMES)}"
            raise InvalidOptionError(f"unknown option {key[:60]!r}{hint}")
        if value is None or (isinstance(value, str) and not value.strip()):
            need = _REQUIRED.get(name)
            raise InvalidOptionError(
                f"option {name!r} is empty: give {need}"
                if need
                else f"option {name!r} is empty: give it a value, or leave the option out to use its default"
            )
        if not isinstance(value, str):
            raise ArgumentTypeError(
                f"option {name!r} must be text, as Spark passes options, got {type(value).__name__}"
            )
        if name in known and known[name] != value:  # two spellings of one option (a plain dict)
            raise InvalidOptionError(f"option {name!r} is given twice, with different values")
        known[name] = value
    return known


@dataclass(frozen=True)
class Options:
    """The data source's options, checked once on the driver; what every Spark task works from.

    Spark passes options case-insensitively; the names README lists are the camel-case ones.
    """

    url: str = field(repr=False)
    queue: str
    error_queue: str | None
    mode: str
    holder: str | None
    partitions: int
    fetch_size: int
    lease: timedelta
    max_deliveries: int
    max_messages_per_batch: int
    batch_size: int
    message_type: str | None
    content_type: str | None
    time_to_be_received: timedelta | None
    ledger: str
    write_id: str | None
    engine: str
    lock: Lock | None
    #: The options given, by their documented names: what :meth:`check_use` holds against a direction.
    given: frozenset[str] = field(default=frozenset(), compare=False)

    @classmethod
    def parse(cls, given: Mapping[str, str]) -> Options:
        options = _known(given)
        url = options.get("url")
        if not url:
            raise InvalidOptionError("option 'url' is required: a postgresql:// URI, a libpq or ODBC string")
        if options.get("password") is not None:
            url = _with_password(url, options["password"])
        queue = options.get("queue")
        if not queue:
            raise InvalidOptionError("option 'queue' is required: the queue's address, e.g. orders or orders@\"sales\"")
        mode = options.get("mode", "browse").lower()
        if mode not in ("browse", "claim"):
            raise InvalidOptionError(f"option 'mode' must be browse or claim, got {mode!r}")
        holder = options.get("holder")
        ttbr = options.get("timeToBeReceived")
        engine = options.get("engine", "auto").lower()
        if engine not in ENGINES:
            raise InvalidOptionError(f"option 'engine' must be one of {', '.join(ENGINES)}, got {engine[:60]!r}")
        try:
            addressing = Addressing(dialect_for(url))  # names are checked here, before any task runs
        except ValueError as exc:
            raise InvalidOptionError(f"option 'url': {exc}") from None
        address = addressing.address(queue)
        ledger = addressing.beside(options.get("ledger", defaults.WRITE_LEDGER), address)
        error_queue = options.get("errorQueue")
        if error_queue is not None:
            _not_its_own_error_queue(addressing, address, addressing.beside(error_queue, address))
        lock = _lock(options.get("lock"))
        if lock is not None:
            addressing.dialect.check_locked_batches()  # SQL Server says why not, before anything connects
        return cls(
            url=url,
            queue=queue,
            error_queue=error_queue,
            mode=mode,
            holder=holder,
            partitions=_count(options, "numPartitions", PARTITIONS, maximum=10_000),
            fetch_size=_count(options, "fetchSize", FETCH_SIZE),
            lease=_span(options, "lease", defaults.LEASE, defaults.MAX_LEASE, defaults.MIN_RENEWED_LEASE),  # renewed
            max_deliveries=_count(options, "maxDeliveries", defaults.MAX_DELIVERIES),
            max_messages_per_batch=_count(
                options, "maxMessagesPerBatch", MAX_MESSAGES_PER_BATCH, maximum=defaults.MAX_HELD
            ),
            batch_size=_count(options, "batchSize", BATCH_SIZE),
            message_type=options.get("messageType"),
            content_type=options.get("contentType"),
            time_to_be_received=None
            if ttbr is None
            else _span(options, "timeToBeReceived", None, defaults.MAX_TIME_TO_BE_RECEIVED),
            ledger=addressing.dialect.format_address(ledger),
            write_id=None if options.get("writeId") is None else _text(options, "writeId"),
            engine=engine,
            lock=lock,
            given=frozenset(options),
        )

    def check_use(self, use: Literal["read", "write"], *, engine: bool = False) -> None:
        """Refuse an option that ``use`` ignores, before the database is touched: the data source
        parses its options before Spark says whether it reads or writes, and an option given to the
        direction that does not read it would be dropped without a word. ``engine``: the read takes
        option ``engine`` (a locked batch's, which Spark's JDBC reader can read)."""
        if use == "read":
            ignored = WRITE_OPTIONS - {"engine"} if engine else WRITE_OPTIONS
            applies_to = "writes (df.write)"
        else:
            ignored, applies_to = READ_OPTIONS, "reads (spark.read, spark.readStream)"
        for name in OPTION_NAMES:  # in the documented order, so the option named is the same every time
            if name in self.given and name in ignored:
                raise InvalidOptionError(
                    f"option {name!r} applies only to {applies_to}, and this is a {use}: leave it out of the "
                    f"{use}'s options"
                )
        if use == "read" and self.lock is not None:
            for name in NOT_WITH_A_LOCK:
                if name in self.given:
                    raise InvalidOptionError(
                        f"option {name!r} does not apply to a read of a locked batch (option 'lock'): the batch, its "
                        "size and its error queue are the locking transaction's, and it is no claim -- leave it out"
                    )
        # Asked of reads only: a write given mode 'claim' is told that mode is a read option.
        if use == "read" and self.mode == "claim" and self.holder is None:
            raise InvalidOptionError(
                "mode 'claim' needs option 'holder': the name the claims are taken under, which ack_held "
                "and nack_held settle once the job's output is committed"
            )

    def connect(self) -> QueueClient:
        return QueueClient.connect(self.url, error_queue=self.error_queue)

    def check(self, client: QueueClient, *, claims: bool = False) -> None:
        """On the driver, before any task: the queue and the error queue are queue tables; a read that
        claims (whose poison goes to the error queue) may not use the queue as its own error queue."""
        client.check_queue(self.queue)
        queue = client.address(self.queue)
        if self.error_queue is not None or claims:
            error_queue = client.beside(self.error_queue or defaults.ERROR_QUEUE, queue)
            _not_its_own_error_queue(client, queue, error_queue)
            if self.error_queue is not None:
                client.check_queue(error_queue)

    def check_sink(self, client: QueueClient) -> None:
        """On the driver, before anything is sent: the queue is a queue table and the ledger a write
        ledger (created the first time)."""
        self.check(client)
        client.create_writes(self.ledger)

    def write_key(self, write_id: str | None) -> uuid.UUID:
        """The ledger key of a write: of ``write_id`` *to this queue* (the same id written to two queues
        is two writes, each sent once), or a fresh one for a write that cannot be repeated."""
        if write_id is None:
            return uuid.uuid4()
        addressing = Addressing(dialect_for(self.url))
        queue = addressing.dialect.claim_key(addressing.address(self.queue))  # one key however it is written
        return uuid.uuid5(WRITE_ID_NAMESPACE, f"{write_id}\n{queue}")


def _not_its_own_error_queue(addressing: Addressing, queue: QueueAddress, error_queue: QueueAddress) -> None:
    qualified = addressing.dialect.qualified_name
    if qualified(error_queue) == qualified(queue):
        raise InvalidArgumentError(
            f"queue {qualified(queue)} cannot be its own error queue (its poison would come back to it for ever): "
            "name another one with option 'errorQueue'"
        )


def _with_password(url: str, password: str) -> str:
    """``url`` with ``password`` added, in the url's own syntax (libpq or URI, ODBC, mssql URI)."""
    if dialect_for(url).name == "postgres":
        from psycopg.conninfo import make_conninfo

        return make_conninfo(url, password=password)
    if "://" not in url:  # an ODBC connection string
        return f"{url.rstrip(';')};PWD={{{password.replace('}', '}}')}}}"
    raise InvalidOptionError("option 'password' works with PostgreSQL and ODBC strings; put it in an mssql:// url")
