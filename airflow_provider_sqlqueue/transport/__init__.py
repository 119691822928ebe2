"""The transport core: queue tables as NServiceBus defines them, with no Airflow import.

It runs anywhere Python and a database driver run -- Airflow workers and triggerers, Spark
executors, plain scripts. Start with :class:`QueueClient` (blocking) or :class:`MessagePump`
(asyncio consumer loop).

The names below are imported on first use, so that importing one small module of the package
(:mod:`.defaults`, :mod:`.message`) does not load the rest: the Airflow triggerer imports trigger
modules on its event loop, where every millisecond of import blocks every trigger.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the same names, for type checkers (re-exported)
    from .addressing import QueueAddress as QueueAddress
    from .client import AsyncQueueClient as AsyncQueueClient
    from .client import QueueClient as QueueClient
    from .drivers import AsyncPsycopgPool as AsyncPsycopgPool
    from .drivers import PsycopgSession as PsycopgSession
    from .errors import ArgumentTypeError as ArgumentTypeError
    from .errors import ClientClosedError as ClientClosedError
    from .errors import DuplicateMessageError as DuplicateMessageError
    from .errors import InvalidArgumentError as InvalidArgumentError
    from .errors import InvalidHeadersError as InvalidHeadersError
    from .errors import InvalidQueueNameError as InvalidQueueNameError
    from .errors import LeaseLostError as LeaseLostError
    from .errors import LockTimeoutError as LockTimeoutError
    from .errors import NotAQueueError as NotAQueueError
    from .errors import ObjectExistsError as ObjectExistsError
    from .errors import PermissionDeniedError as PermissionDeniedError
    from .errors import QueueNotFoundError as QueueNotFoundError
    from .errors import SqlQueueError as SqlQueueError
    from .errors import StatementRejectedError as StatementRejectedError
    from .errors import StorageFullError as StorageFullError
    from .errors import TransactionAbortedError as TransactionAbortedError
    from .errors import TransportMisconfiguredError as TransportMisconfiguredError
    from .errors import TransportUnavailableError as TransportUnavailableError
    from .lease import LeaseKeeper as LeaseKeeper
    from .message import Failure as Failure
    from .message import Message as Message
    from .message import ReceivedMessage as ReceivedMessage
    from .message import TransactionMode as TransactionMode
    from .pump import MessagePump as MessagePump

_HOMES = {
    "QueueAddress": ".addressing",
    "AsyncQueueClient": ".client",
    "QueueClient": ".client",
    "AsyncPsycopgPool": ".drivers",
    "PsycopgSession": ".drivers",
    "ArgumentTypeError": ".errors",
    "DuplicateMessageError": ".errors",
    "InvalidArgumentError": ".errors",
    "InvalidHeadersError": ".errors",
    "InvalidQueueNameError": ".errors",
    "LeaseLostError": ".errors",
    "LockTimeoutError": ".errors",
    "NotAQueueError": ".errors",
    "ObjectExistsError": ".errors",
    "PermissionDeniedError": ".errors",
    "QueueNotFoundError": ".errors",
    "SqlQueueError": ".errors",
    "StatementRejectedError": ".errors",
    "StorageFullError": ".errors",
    "TransactionAbortedError": ".errors",
    "TransportMisconfiguredError": ".errors",
    "ClientClosedError": ".errors",
    "TransportUnavailableError": ".errors",
    "LeaseKeeper": ".lease",
    "Failure": ".message",
    "Message": ".message",
    "ReceivedMessage": ".message",
    "TransactionMode": ".message",
    "MessagePump": ".pump",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home, __name__), name)
    globals()[name] = value
    return value
