"""The transport core: queue tables as NServiceBus defines them, with no Airflow import.

It runs anywhere Python and a database driver run -- Airflow workers and triggerers, Spark
executors, plain scripts. Start with :class:`QueueClient` (blocking) or :class:`MessagePump`
(asyncio consumer loop).
"""

from .addressing import QueueAddress
from .client import AsyncQueueClient, QueueClient
from .drivers import AsyncPsycopgPool, AsyncPsycopgSession, PsycopgSession
from .errors import (
    InvalidHeadersError,
    InvalidQueueNameError,
    LeaseLostError,
    PermissionDeniedError,
    QueueNotFoundError,
    SqlQueueError,
    TransportUnavailableError,
)
from .lease import LeaseKeeper
from .message import Failure, Message, ReceivedMessage, TransactionMode
from .pump import MessagePump

__all__ = [
    "AsyncPsycopgPool",
    "AsyncPsycopgSession",
    "AsyncQueueClient",
    "InvalidHeadersError",
    "Failure",
    "InvalidQueueNameError",
    "LeaseKeeper",
    "LeaseLostError",
    "Message",
    "MessagePump",
    "PermissionDeniedError",
    "PsycopgSession",
    "QueueAddress",
    "QueueClient",
    "QueueNotFoundError",
    "ReceivedMessage",
    "SqlQueueError",
    "TransactionMode",
    "TransportUnavailableError",
]
