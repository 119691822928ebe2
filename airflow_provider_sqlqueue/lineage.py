"""Queue tables as lineage: what OpenLineage and Airflow's hook lineage see a task read and write.

A queue is a table, so it is named as the database providers name their tables -- the namespace
``postgres://host:port`` (``mssql://`` for SQL Server) and the name ``database.schema.table`` --
and a queue a stage writes and a SQL task reads are one dataset. The operators and the sensor
report theirs through ``get_openlineage_facets_on_complete`` (called by the openlineage provider
when it is installed and configured); the task helpers, which run inside a user's task, add them
to Airflow's hook lineage collector, which the openlineage provider reads for such tasks.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from .hooks.sqlqueue import dialect_of
from .transport.dialects import get_dialect

if TYPE_CHECKING:
    from .hooks.sqlqueue import SqlQueueHook

#: The port each database listens on unless the connection names one, as its provider assumes.
DEFAULT_PORTS = {"postgres": 5432, "sqlserver": 1433}
#: The scheme of each database's tables in OpenLineage's naming and in Airflow's asset URIs.
SCHEMES = {"postgres": "postgres", "sqlserver": "mssql"}


def table_names(hook: SqlQueueHook, queue: str) -> tuple[str, str, str, str]:
    """``queue``'s table on the hook's connection: (namespace, database, schema, table).

    The database is the connection's (``default`` where it names none, as the providers' asset
    URIs have it); the schema the queue's, else the database's default one.
    """
    conn = hook.connection
    dialect = get_dialect(dialect_of(conn))
    address = dialect.parse_address(queue)
    namespace = f"{SCHEMES[dialect.name]}://{conn.host or 'localhost'}:{conn.port or DEFAULT_PORTS[dialect.name]}"
    return namespace, conn.schema or "default", address.schema or dialect.default_schema, address.table


def queue_lineage(hook: SqlQueueHook, inputs: Iterable[str], outputs: Iterable[str]) -> Any:
    """An ``OperatorLineage`` of the queues a task read (``inputs``) and wrote (``outputs``)."""
    from airflow.providers.common.compat.openlineage.facet import Dataset
    from airflow.providers.openlineage.extractors import OperatorLineage

    def dataset(queue: str) -> Any:
        namespace, *parts = table_names(hook, queue)
        return Dataset(namespace=namespace, name=".".join(parts))

    return OperatorLineage(
        inputs=[dataset(queue) for queue in dict.fromkeys(inputs)],
        outputs=[dataset(queue) for queue in dict.fromkeys(outputs)],
    )


def collect_inputs(hook: SqlQueueHook, queues: Iterable[str]) -> None:
    """Tell Airflow's hook lineage collector that the running task read ``queues`` (as asset URIs
    the database providers turn into the same OpenLineage datasets); nothing happens where no
    lineage reader is installed."""
    from airflow.sdk.lineage import get_hook_lineage_collector

    collector = get_hook_lineage_collector()
    for queue in dict.fromkeys(queues):
        namespace, *parts = table_names(hook, queue)
        collector.add_input_asset(context=hook, uri=namespace + "".join("/" + quote(part, safe="") for part in parts))
