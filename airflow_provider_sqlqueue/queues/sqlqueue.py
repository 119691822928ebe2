"""common-messaging integration: ``MessageQueueTrigger(scheme="sqlqueue", ...)`` watches a queue table.

::

    Asset("orders", watchers=[AssetWatcher(
        name="orders_watcher",
        trigger=MessageQueueTrigger(scheme="sqlqueue", sqlqueue_conn_id="shop_db", queue_name="orders"),
    )])

The keyword arguments are those of
:class:`~airflow_provider_sqlqueue.triggers.sqlqueue.SqlQueueEventTrigger` (``queue_name``, not
``queue``, which MessageQueueTrigger reserves).
"""

from __future__ import annotations

from airflow.providers.common.messaging.providers.base_provider import BaseMessageQueueProvider

from ..triggers.sqlqueue import SqlQueueEventTrigger


class SqlQueueMessageQueueProvider(BaseMessageQueueProvider):
    """Routes the ``sqlqueue`` scheme to :class:`SqlQueueEventTrigger` (one event per message)."""

    scheme = "sqlqueue"

    def trigger_class(self) -> type[SqlQueueEventTrigger]:
        return SqlQueueEventTrigger
