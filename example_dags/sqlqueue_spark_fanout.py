"""One Spark stage's result fanned out to two downstream stages (Airflow DAGs) by publish/subscribe.

``fanout_ingest`` --> clean (Spark) --publishes SqlQueue.Demo.OrdersCleaned--> every subscriber:
  ``fanout_summary`` (subscribed) --> summarise (Spark) --(report)--> ``fanout_reports``
  ``fanout_quality`` (subscribed) --> check quality (Spark) --(quality report)--> ``fanout_reports``

The publishing stage does not know its consumers: the subscriber queues subscribe in setup
(``CreateQueueOperator(subscribe_to=...)`` in ``sqlqueue_setup``), in NServiceBus's
``SubscriptionRouting`` table, so an NServiceBus endpoint subscribed to the same event type gets it
too. The publish and the acknowledgement of the cleaned message are one transaction: each
subscriber gets each result once. Messages are those of ``sqlqueue_spark_chain``.
"""

from __future__ import annotations

from spark_jobs import clean_batch, quality_batch, summarise_batch  # the DAGs folder is on sys.path
from sqlqueue_stages import ORDERS_CLEANED, queue, stage

INGEST, SUMMARY, QUALITY, REPORTS = (queue(f"fanout_{n}") for n in ("ingest", "summary", "quality", "reports"))

clean_dag = stage("sqlqueue_fanout_clean", "clean", INGEST, clean_batch, ORDERS_CLEANED, publish=True, doc_md=__doc__)
summarise_dag = stage(
    "sqlqueue_fanout_summarise",
    "summarise",
    SUMMARY,
    summarise_batch,
    "SqlQueue.Demo.DatasetReport",
    target=REPORTS,
    doc_md=__doc__,
)
quality_dag = stage(
    "sqlqueue_fanout_quality",
    "check_quality",
    QUALITY,
    quality_batch,
    "SqlQueue.Demo.QualityReport",
    target=REPORTS,
    doc_md=__doc__,
)
