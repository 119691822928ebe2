"""Two Spark jobs chained through queue tables, one sensor-driven Airflow DAG per stage.

``ingest`` --(dataset path)--> clean (Spark) --(clean data path)--> ``cleaned``
``cleaned`` --> summarise (Spark) --(report)--> ``reports``

How a stage hands messages on, and what happens when a job or a worker fails, is in
``sqlqueue_stages.py``. Messages: ``ingest`` takes ``{"dataset": name, "path": csv, "output_root":
dir}``; paths must be readable by the Spark cluster (a shared filesystem or object store once
Spark is not local).
"""

from __future__ import annotations

from spark_jobs import clean_batch, summarise_batch  # example_dags/: the DAGs folder is on sys.path
from sqlqueue_stages import queue, stage

INGEST, CLEANED, REPORTS = queue("ingest"), queue("cleaned"), queue("reports")

clean_dag = stage(
    "sqlqueue_spark_clean",
    "clean",
    INGEST,
    clean_batch,
    "SqlQueue.Demo.DatasetCleaned",
    target=CLEANED,
    doc_md=__doc__,
)
summarise_dag = stage(
    "sqlqueue_spark_summarise",
    "summarise",
    CLEANED,
    summarise_batch,
    "SqlQueue.Demo.DatasetReport",
    target=REPORTS,
    doc_md=__doc__,
)
