"""The ``sqlqueue`` data source class, as Spark instantiates it on the driver: without a JVM.

A hostile queue name is refused when the source is made, a missing queue when a writer is asked
for, and an overwrite always. The source on a cluster is in ``tests/test_spark_cluster.py``.
"""

from __future__ import annotations

import uuid

import pytest


def test_a_hostile_queue_name_is_refused_and_a_missing_queue_named(pg_uri):
    from airflow_provider_sqlqueue.spark import SqlQueueDataSource
    from airflow_provider_sqlqueue.transport.errors import InvalidQueueNameError, QueueNotFoundError

    with pytest.raises(InvalidQueueNameError):
        SqlQueueDataSource({"url": pg_uri, "queue": 'orders"; DROP TABLE x; --@"public'})
    source = SqlQueueDataSource({"url": pg_uri, "queue": f"missing_{uuid.uuid4().hex[:6]}"})
    with pytest.raises(QueueNotFoundError):
        source.writer(source.schema(), overwrite=False)
    with pytest.raises(ValueError, match="only appended to"):
        source.writer(source.schema(), overwrite=True)
