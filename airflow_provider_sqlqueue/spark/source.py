"""``format("sqlqueue")``: the data source class Spark instantiates, and :func:`register`.

It parses the options once (:mod:`.options`) and hands Spark the reader, writer or stream reader
asked for (:mod:`.read`, :mod:`.write`, :mod:`.stream`), each checking first that the options
given are the ones that direction reads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, DataSourceWriter
from pyspark.sql.types import StructType

from .options import NAME, InvalidOptionError, Options
from .read import MESSAGE_SCHEMA, QueueReader
from .stream import QueueStreamReader
from .write import QueueArrowWriter, QueueWriter, RowLayout

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class SqlQueueDataSource(DataSource):
    """``format("sqlqueue")``: queue tables as a Spark source (batch and streaming) and sink (batch)."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.parsed = Options.parse(options)

    def _python_engine(self) -> None:
        """Refuse ``engine`` ``jvm``: Spark hands a Python data source's rows to Python workers, so
        ``format("sqlqueue")`` cannot build messages in the JVM; :func:`.functions.save_to_queue` can."""
        if self.parsed.engine == "jvm":
            raise InvalidOptionError(
                "option 'engine' 'jvm': format('sqlqueue') builds messages in Spark's Python workers; "
                "save_to_queue(df, ...) builds them in Spark's SQL engine"
            )

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        return MESSAGE_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        self.parsed.check_use("read")
        return QueueReader(self.parsed)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            raise InvalidOptionError("a queue is only appended to: use mode('append')")
        self.parsed.check_use("write")
        self._python_engine()
        layout = RowLayout.of(schema)
        if layout.takes_arrow():
            return QueueArrowWriter(self.parsed, layout)
        return QueueWriter(self.parsed, layout)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        self.parsed.check_use("read")
        if self.parsed.lock is not None:
            raise InvalidOptionError(
                "option 'lock' names a batch locked for one batch read (claimed_from_queue); a stream claims "
                "its own micro-batches: leave it out of spark.readStream"
            )
        return QueueStreamReader(self.parsed)


def register(spark: SparkSession) -> None:
    """Make ``format("sqlqueue")`` known to ``spark`` (a classic or a Spark Connect session)."""
    spark.dataSource.register(SqlQueueDataSource)
