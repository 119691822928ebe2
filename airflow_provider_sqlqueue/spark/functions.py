"""The functions over DataFrames: :func:`save_to_queue` (the data source's write, through the JVM
where it can) and :func:`batch_writer`, the exactly-once sink of a ``foreachBatch``.

:func:`save_to_queue` takes the data source's options and runs through Spark's JDBC writer
(:mod:`.jdbc`) where it can, else through ``format("sqlqueue")``, saying which once in the log.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from ..transport.addressing import checked_text
from ..transport.errors import ArgumentTypeError, SqlQueueError
from .jvm import jvm_reason, write_in_jvm
from .options import NAME, InvalidOptionError, Options
from .source import register
from .write import RowLayout, forget_write, log

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


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
