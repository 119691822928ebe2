"""The functions over DataFrames: :func:`save_to_queue` (the data source's write, through the JVM
where it can), :func:`batch_writer`, the exactly-once sink of a ``foreachBatch``, and
:func:`claimed_from_queue`, a batch read whose messages are held by the driver's transaction.

:func:`save_to_queue` takes the data source's options and runs through Spark's JDBC writer
(:mod:`.jdbc`) where it can, else through ``format("sqlqueue")``, saying which once in the log.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING

from ..transport.addressing import checked_text
from ..transport.drivers import dialect_for
from ..transport.errors import ArgumentTypeError, SqlQueueError
from .jvm import jvm_reason, write_in_jvm
from .options import NAME, NOT_WITH_A_LOCK, OPTION_NAMES, InvalidOptionError, Lock, Options
from .source import register
from .write import RowLayout, forget_write, log

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: Options claimed_from_queue decides itself (``lock``) or that its read cannot use: it is no claim
#: (no mode, holder, lease or delivery count).
_NOT_CLAIMED_FROM_QUEUE = ("mode", "holder", "lease", "maxDeliveries", "lock")
#: Options of the driver's lock, not of the executors' read: the batch's size and its error queue.
_THE_LOCKS = {name.lower() for name in NOT_WITH_A_LOCK}


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
    if not isinstance(options, Mapping):
        raise ArgumentTypeError(
            f"batch_writer's options must be a mapping of option names to text, got {type(options).__name__}"
        )
    for name, value in options.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise ArgumentTypeError(f"batch_writer's options are text: option {name!r} is {type(value).__name__}")
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

    Options: the data source's read options ``url``, ``password``, ``queue``, ``numPartitions``,
    ``fetchSize``, ``maxMessagesPerBatch`` (the batch's size) and ``errorQueue``; ``mode``, ``holder``,
    ``lease``, ``maxDeliveries`` and ``lock`` are refused. PostgreSQL only: SQL Server is refused,
    saying why.
    """
    if getattr(spark, "dataSource", None) is None:  # a classic or Spark Connect session has it
        raise ArgumentTypeError(f"claimed_from_queue reads through a SparkSession, got {type(spark).__name__}")
    for name in OPTION_NAMES:  # in the documented order, so the option named is the same every time
        if name.lower() in {key.lower() for key in options} and name in _NOT_CLAIMED_FROM_QUEUE:
            raise InvalidOptionError(
                f"option {name!r} does not apply to claimed_from_queue: its batch is held by the driver's "
                "transaction, no claim (use mode 'claim' for claims), and it names the lock itself"
            )
    parsed = Options.parse(options)
    parsed.check_use("read")
    dialect_for(parsed.url).check_locked_batches()  # SQL Server says why not, before anything connects
    reading = {key: value for key, value in options.items() if key.lower() not in _THE_LOCKS}
    with parsed.connect() as client:
        parsed.check(client, claims=True)  # the queue, and an error queue that is not the queue itself
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
                    yield spark.read.format(NAME).options(**reading, lock=lock).load()
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
