"""The functions over DataFrames: :func:`save_to_queue` (the data source's write, through the JVM
where it can), :func:`batch_writer`, the exactly-once sink of a ``foreachBatch``,
:func:`claimed_from_queue`, a batch read whose messages are held by the driver's transaction, and
:func:`relay_batch`, such a batch sent on to another queue in that transaction.

:func:`save_to_queue` takes the data source's options and builds its messages in Spark's SQL engine
(:mod:`.jvm`) where it can, else writes through ``format("sqlqueue")``, saying which once in the
log; :func:`claimed_from_queue` and :func:`relay_batch` read their batch with Spark's JDBC reader
(:mod:`.jdbc`) where it can, else through the data source's reader, the same way.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, NamedTuple

from ..transport import Message, QueueClient
from ..transport.addressing import checked_text
from ..transport.arguments import same_table
from ..transport.drivers import dialect_for
from ..transport.errors import ArgumentTypeError, InvalidArgumentError, SqlQueueError
from ..transport.operations import LockedBatch
from .jdbc import JdbcTarget, jdbc_target, locked_rows
from .jvm import csv_chunks, jvm_reason, library_refusal, message_rows, write_in_jvm
from .options import NAME, NOT_WITH_A_LOCK, OPTION_NAMES, InvalidOptionError, Lock, Options
from .read import MESSAGE_SCHEMA
from .source import register
from .write import RowLayout, _option_headers, forget_write, log

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: Options claimed_from_queue decides itself (``lock``) or that its read cannot use: it is no claim
#: (no mode, holder, lease or delivery count).
_NOT_CLAIMED_FROM_QUEUE = ("mode", "holder", "lease", "maxDeliveries", "lock")
#: Options of the driver's lock, not of the executors' read (the batch's size and its error queue),
#: and the choice of reader.
_THE_LOCKS = {name.lower() for name in NOT_WITH_A_LOCK} | {"engine"}


def save_to_queue(df: DataFrame, **options: str) -> None:
    """``df.write.format("sqlqueue").options(**options).mode("append").save()``, through the JVM where it can.

    The options are the data source's write options (``url``, ``queue``, ``messageType``,
    ``writeId``...) and ``engine``. Either way each partition is one transaction recorded in the
    write ledger, so the two paths share a ``writeId``: a write repeated by either sends only the
    partitions that did not commit.
    """
    parsed = Options.parse(options)
    parsed.check_use("write")
    layout = RowLayout.of(df.schema)
    reason = None if parsed.engine == "python" else jvm_reason(parsed, layout)
    if parsed.engine != "python" and reason is None:
        write_in_jvm(df, parsed, layout)
        return
    if reason is not None:
        if parsed.engine == "jvm":
            raise InvalidOptionError(f"option 'engine' 'jvm': {reason}")
        log.info("Write to %s takes the Python path: %s", parsed.queue, reason)
    with parsed.connect() as client:  # a wrong target refused here in the library's words, not inside Spark's
        parsed.check_sink(client)
    register(df.sparkSession)
    df.write.format(NAME).options(**options).mode("append").save()


def batch_writer(options: Mapping[str, str], checkpoint: str) -> Callable[[DataFrame, int], None]:
    """A ``foreachBatch`` function writing each micro-batch to a queue exactly once.

    Each batch is written by :func:`save_to_queue` (through the JVM where it can). ``checkpoint``
    is the query's ``checkpointLocation``. Batch n is written with the ``writeId``
    ``<query id>:<n>``, the query id being the one Spark keeps in the checkpoint's ``metadata``
    (a deleted checkpoint starts a new query, whose batches share nothing with the old one's). A
    batch Spark replays after a restart therefore sends nothing that committed (only the partitions that did not commit)
    (the batch must be computed the same way again: no non-deterministic shuffles). Spark starts
    batch n only after committing n - 1, which can then never be replayed: its ledger rows are
    forgotten.
    """
    _text_options("batch_writer's options", options)
    if any(name.lower() == "writeid" for name in options):
        raise InvalidOptionError(
            "batch_writer names each batch's write itself (<query id>:<batch>): drop option 'writeId'"
        )
    try:
        checkpoint = checked_text("checkpoint", checkpoint)
    except SqlQueueError as exc:
        raise InvalidOptionError(f"batch_writer: {exc}") from None
    checked = Options.parse(options)
    checked.check_use("write")
    with checked.connect() as client:  # a wrong sink is refused now, before the query claims its first batch
        checked.check_sink(client)
    query: dict[str, str] = {}

    def write(batch: DataFrame, batch_id: int) -> None:
        if "id" not in query:  # written by Spark when the query first started, read through its filesystem
            try:
                metadata = batch.sparkSession.read.text(f"{checkpoint.rstrip('/')}/metadata").first()
            except Exception as exc:  # noqa: BLE001  # Spark's AnalysisException (no such path), worded for the caller
                raise InvalidOptionError(
                    f"cannot read the query metadata in checkpoint {checkpoint!r} ({type(exc).__name__}): pass the "
                    "query's checkpointLocation"
                ) from None
            if metadata is None:
                raise InvalidOptionError(f"no query metadata in checkpoint {checkpoint!r}: pass its checkpointLocation")
            query["id"] = str(json.loads(metadata[0])["id"])
        save_to_queue(batch, **options, writeId=f"{query['id']}:{batch_id}")
        if batch_id > 0:
            forget_write(checked.url, checked.queue, f"{query['id']}:{batch_id - 1}", ledger=checked.ledger)

    return write


@contextmanager
def claimed_from_queue(spark: SparkSession, **options: str) -> Iterator[DataFrame]:
    """The queue's oldest messages (up to ``maxMessagesPerBatch``), held by this process's transaction
    for the block, as a DataFrame of ``format("sqlqueue")``'s columns: acknowledged when the block ends
    normally, given back when it raises.

    ::

        with claimed_from_queue(spark, url=url, queue="orders") as df:
            df.write.parquet(path)  # the block ends once the job's output is committed

    The driver locks the batch in an open transaction (:meth:`~..transport.QueueClient.lock`) and
    the executors read exactly the rows it locked (option ``lock``), which nobody else can take
    meanwhile: NServiceBus's own transactional receive, for a Spark batch. Nothing is moved while
    the batch is held, where a claim read (``mode`` ``claim``) moves each message into the claim store
    and out again. Reading the DataFrame again inside the block returns the same messages.

    - **Acknowledged on a normal exit**: the messages are deleted in that transaction, which then
      commits. (The data source audits nothing; :meth:`~..transport.QueueClient.ack_locked` of a
      client made with ``audit_queue`` copies each message to the audit queue.)
    - **Given back when the block raises**, and when the driver dies or loses its connection: the
      transaction ends uncommitted and every message is back in the queue, as it was. No delivery is
      counted (``deliveries`` is null, ``maxDeliveries`` does not apply): where a message that fails
      every job must end in the error queue, or the batch must be settled from another process
      (after the driver died), use ``mode`` ``claim`` with :func:`.read.ack_held`.
    - **Poison** (headers nobody can read) is locked but never read, and moved, unchanged, to
      ``errorQueue`` either way. Expired messages are not taken.
    - **The open transaction** keeps PostgreSQL's xmin horizon for the job's length: vacuum removes no
      dead row anywhere in the database until the block ends. Keep jobs short beside busy queues, and
      keep the role's ``idle_in_transaction_session_timeout`` longer than a job.

    - **Read in the JVM** by Spark's JDBC reader where PostgreSQL's JDBC driver is on Spark's class
      path (:mod:`.jdbc`), else by the data source's reader, saying why once in the log; ``engine``
      chooses (``auto``, ``jvm``: refused where it cannot, ``python``). Either returns the same rows.

    Options: the data source's read options ``url``, ``password``, ``queue``, ``numPartitions``,
    ``fetchSize``, ``maxMessagesPerBatch`` (the batch's size) and ``errorQueue``, and ``engine``;
    ``mode``, ``holder``, ``lease``, ``maxDeliveries`` and ``lock`` are refused. PostgreSQL only: SQL
    Server is refused, saying why.
    """
    with _held(spark, options, "claimed_from_queue") as (_, _, _, df):
        yield df


class Relayed(NamedTuple):
    """What one :func:`relay_batch` did: the source's messages it took (its poison with them, moved
    to the error queue) and the messages it sent to the target."""

    taken: int
    sent: int


def relay_batch(
    spark: SparkSession,
    transform: Callable[[DataFrame], DataFrame],
    source: Mapping[str, str],
    target: Mapping[str, str],
) -> Relayed:
    """One batch from one queue to another of the same database, exactly once: the source's oldest
    messages, held by the driver's transaction as :func:`claimed_from_queue` holds them, go through
    ``transform`` (their DataFrame to the rows to send, as :func:`save_to_queue` takes them), and its
    rows are sent to the target **in that transaction**, which then acknowledges the source's
    messages and commits. So either both happen or neither: a job that raises, a driver killed or cut
    off at any point, leaves the source's messages where they were and sends nothing (a batch's
    poison, which no job can read, goes to the error queue when the job raises, as with
    :func:`claimed_from_queue`); a task Spark runs again reads the same locked rows. No write ledger and no claim store: NServiceBus's
    transactional receive, whose outgoing messages commit with the receive.

    ::

        while relay_batch(spark, enrich, {"url": url, "queue": "orders"}, {"queue": "billing"}).taken:
            pass  # until the source is empty

    Spark builds each message (as :func:`save_to_queue`'s JVM path does) and the driver loads the
    batch by ``COPY`` in its transaction, so a batch's rows pass through the driver: ``maxMessagesPerBatch``
    bounds its memory (about the rows' size as Arrow). ``source``: :func:`claimed_from_queue`'s
    options. ``target``: ``queue`` and optionally ``messageType`` and ``contentType`` -- the database is
    the source's (one transaction); the target may not be the source. PostgreSQL only.
    """
    if not callable(transform):
        raise ArgumentTypeError(f"relay_batch's transform is a function of a DataFrame, got {type(transform).__name__}")
    given = _text_options("relay_batch's source options", source)
    sent_to = _text_options("relay_batch's target options", target)
    for name in sent_to:
        if name.lower() not in _RELAY_TARGET:
            raise InvalidOptionError(
                f"option {name[:60]!r} does not apply to relay_batch's target: it takes queue, messageType and "
                "contentType, and sends into the source's database in the source's transaction (no writeId or ledger)"
            )
    url = Options.parse(given).url
    sink = Options.parse({**sent_to, "url": url})
    Message(b"", _option_headers(sink))  # the target's headers refused now, before anything is locked
    with _held(spark, given, "relay_batch", sink) as (client, _, batch, df):
        if batch.count == 0:
            return Relayed(0, 0)
        rows = transform(df)
        if not hasattr(rows, "toArrow"):
            raise ArgumentTypeError(f"relay_batch's transform must return a DataFrame, got {type(rows).__name__}")
        layout = RowLayout.of(rows.schema)
        reason = jvm_reason(sink, layout)
        if reason is not None:
            raise InvalidOptionError(f"relay_batch builds its messages in Spark, which it cannot here: {reason}")
        try:
            table = message_rows(rows, layout, sink).toArrow()
        except Exception as exc:
            refused = library_refusal(exc)  # NaN in a JSON row: the library's refusal, out of Spark's error
            if refused is not None:
                raise InvalidArgumentError(refused) from None
            raise
        sent = client.send_csv(sink.queue, csv_chunks(table.to_batches()))
        log.info("Relay of %d message(s) of %s: %d sent to %s", batch.count, batch.queue, sent, sink.queue)
    return Relayed(batch.count, sent)


#: What relay_batch's target takes (lower-cased): the rest is the source's (url, password) or has no use.
_RELAY_TARGET = {"queue", "messagetype", "contenttype"}


def _text_options(what: str, options: Mapping[str, str]) -> dict[str, str]:
    """``options`` checked to be a mapping of text to text (``what``: whose, for the refusal)."""
    if not isinstance(options, Mapping):
        raise ArgumentTypeError(f"{what} must be a mapping of option names to text, got {type(options).__name__}")
    for name, value in options.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise ArgumentTypeError(f"{what} are text: option {name!r} is {type(value).__name__}")
    return dict(options)


@contextmanager
def _held(
    spark: SparkSession, options: Mapping[str, str], caller: str, sink: Options | None = None
) -> Iterator[tuple[QueueClient, Options, LockedBatch, DataFrame]]:
    """The batch :func:`claimed_from_queue` holds, with the client whose transaction holds it:
    acknowledged when the block ends normally, given back (its poison moved) when it raises.
    ``sink``: a queue the block sends to, checked before anything is locked."""
    if getattr(spark, "dataSource", None) is None:  # a classic or Spark Connect session has it
        raise ArgumentTypeError(f"{caller} reads through a SparkSession, got {type(spark).__name__}")
    for name in OPTION_NAMES:  # in the documented order, so the option named is the same every time
        if name.lower() in {key.lower() for key in options} and name in _NOT_CLAIMED_FROM_QUEUE:
            raise InvalidOptionError(
                f"option {name!r} does not apply to {caller}: its batch is held by the driver's "
                "transaction, no claim (use mode 'claim' for claims), and it names the lock itself"
            )
    parsed = Options.parse(options)
    parsed.check_use("read", engine=True)
    dialect_for(parsed.url).check_locked_batches()  # SQL Server says why not, before anything connects
    target = None if parsed.engine == "python" else jdbc_target(parsed.url)
    if parsed.engine == "jvm" and isinstance(target, str):  # refused before anything is locked
        raise InvalidOptionError(f"option 'engine' 'jvm': {target}")
    reading = {key: value for key, value in options.items() if key.lower() not in _THE_LOCKS}
    with parsed.connect() as client:
        parsed.check(client, claims=True)  # the queue, and an error queue that is not the queue itself
        if sink is not None:
            sink.check(client)
            if same_table(client.dialect, client.address(sink.queue), client.address(parsed.queue)):
                raise InvalidOptionError(
                    f"{caller} cannot send to the queue it takes from ({sink.queue}): its messages would come "
                    "back to it for ever -- name another target queue"
                )
        register(spark)
        failed: BaseException | None = None
        try:
            with client.transaction():
                batch = client.lock(parsed.queue, parsed.max_messages_per_batch, error_queue=parsed.error_queue)
                lock = Lock(batch.xid, batch.after, batch.last).text()
                log.info(
                    "Locked %d message(s) of %s for a Spark read (transaction %s)", batch.count, parsed.queue, batch.xid
                )
                try:
                    yield client, parsed, batch, _locked_frame(spark, client, parsed, target, batch, reading, lock)
                except BaseException as exc:  # noqa: BLE001  # given back, poison moved: the block commits only that
                    failed = exc
                    client.nack_locked(parsed.queue, batch, error_queue=parsed.error_queue)
                else:
                    handled = client.ack_locked(parsed.queue, batch, error_queue=parsed.error_queue)
                    log.info("Acknowledged %d message(s) of %s read by Spark", handled, parsed.queue)
        except SqlQueueError as exc:
            if failed is None:
                raise
            # The give-back failed (the connection the job outlived, most likely): the transaction did
            # not commit, so the batch is back all the same, its poison with it. The job's error is the news.
            log.warning("The batch of %s came back uncommitted, its poison with it: %s", parsed.queue, exc)
        if failed is not None:
            raise failed


def _locked_frame(
    spark: SparkSession,
    client: QueueClient,
    parsed: Options,
    target: JdbcTarget | str | None,
    batch: LockedBatch,
    reading: Mapping[str, str],
    lock: str,
) -> DataFrame:
    """The locked batch's DataFrame: read by Spark's JDBC reader from ``target`` where it can (None:
    option ``engine`` is ``python``; text: why the url has none), else by the data source's reader,
    saying why once. A batch with nothing to read (none locked, or only poison) is an empty
    DataFrame, which neither reader is asked for."""
    if batch.count == len(batch.poison):
        return spark.createDataFrame([], MESSAGE_SCHEMA)
    if target is not None:
        frame = (
            target
            if isinstance(target, str)
            else locked_rows(spark, target, parsed, client.dialect, client.address(parsed.queue), batch)
        )
        if not isinstance(frame, str):
            log.info("The locked batch of %s is read by Spark's JDBC reader", parsed.queue)
            return frame
        if parsed.engine == "jvm":
            raise InvalidOptionError(f"option 'engine' 'jvm': {frame}")
        log.info("The locked batch of %s takes the Python path: %s", parsed.queue, frame)
    return spark.read.format(NAME).options(**reading, lock=lock).load()
