"""Keeping claims alive while their holder works.

A lease is short (:data:`~airflow_provider_sqlqueue.transport.defaults.LEASE`) so that messages of
a holder that died come back quickly; a holder that is alive renews it. :class:`LeaseKeeper` does
that from a background thread for blocking code -- a Spark job, an Airflow task -- on a connection
of its own, so the work itself never has to stop to renew.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterable, Mapping
from datetime import timedelta
from types import TracebackType

from . import defaults
from .arguments import Token, as_tokens
from .client import QueueClient
from .errors import ArgumentTypeError
from .logs import logger
from .message import duration

log = logger("airflow_provider_sqlqueue.lease")


class LeaseKeeper:
    """Renew claims every third of their lease until the block ends.

    ``with LeaseKeeper(open_client, {"orders": tokens}) as keeper:`` renews once on entry (so
    :attr:`held` says at once which claims are still this holder's), then every ``lease / 3`` from
    a thread, and once more on a normal exit, which leaves the next step -- an acknowledgement or
    an atomic forward -- a whole lease to run in. A claim found taken by someone else is dropped
    from :attr:`held` and logged; the work on it must not be passed on (an atomic forward refuses
    it anyway). A database outage is logged and retried at the next renewal.

    :param open_client: opens a new client for the keeper each time it is called (a client is not
        shared across threads); the keeper closes what it returns, so it must not hand back a
        client its caller goes on using.
    :param claims: the tokens to renew, by queue.
    :param lease: the lease each renewal grants.
    """

    def __init__(
        self,
        open_client: Callable[[], QueueClient],
        claims: Mapping[str, Token | Iterable[Token]],
        lease: timedelta | float = defaults.LEASE,
    ) -> None:
        if not callable(open_client):
            raise ArgumentTypeError(
                f"open_client must be a function opening a QueueClient, got {type(open_client).__name__}"
            )
        if not isinstance(claims, Mapping):
            raise ArgumentTypeError(f"claims must map queues to claim tokens, got {type(claims).__name__}")
        self._open_client = open_client
        self.lease = duration("lease", lease, maximum=defaults.MAX_LEASE, minimum=defaults.MIN_RENEWED_LEASE)
        self.held: dict[str, set[uuid.UUID]] = {queue: set(as_tokens(tokens)) for queue, tokens in claims.items()}
        self.lost: dict[str, set[uuid.UUID]] = {}
        self.renewals = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def renew(self, client: QueueClient) -> None:
        """Renew every claim still held, once; claims someone else took move to :attr:`lost`."""
        with self._lock:
            for queue, tokens in self.held.items():
                if not tokens:
                    continue
                still = client.extend(queue, list(tokens), self.lease)
                gone = tokens - still
                if gone:
                    log.error(
                        "Queue %s: %d claim(s) are no longer held here (their lease ran out and another consumer "
                        "took them, or they were settled or never existed); their work here will not be passed on",
                        queue,
                        len(gone),
                    )
                    self.lost.setdefault(queue, set()).update(gone)
                    tokens -= gone
            self.renewals += 1

    def stop_renewing(self, queue: str, tokens: Iterable[Token]) -> None:
        """Stop renewing claims the holder has settled or given back."""
        with self._lock:
            self.held.get(queue, set()).difference_update(as_tokens(tokens))

    def _client(self) -> QueueClient:
        client = self._open_client()
        if not isinstance(client, QueueClient):
            raise ArgumentTypeError(f"open_client must return a QueueClient, got {type(client).__name__}")
        return client

    def __enter__(self) -> LeaseKeeper:
        with self._client() as client:
            self.renew(client)
        self._thread = threading.Thread(target=self._run, name="sqlqueue-lease-keeper", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if exc_type is None:
            with self._client() as client:
                self.renew(client)

    def _run(self) -> None:
        every = defaults.renewal_interval(self.lease)
        client: QueueClient | None = None
        try:
            while not self._stop.wait(every):
                try:
                    if client is None:
                        client = self._client()
                    self.renew(client)
                    log.debug("Renewed %d claim(s) for %s", sum(map(len, self.held.values())), self.lease)
                except Exception as exc:  # noqa: BLE001  # an outage must not end the renewals: the next one may succeed
                    log.warning("Could not renew claims (will retry in %.0fs): %s", every, exc)
                    if client is not None:
                        client.close()
                        client = None
        finally:
            if client is not None:
                client.close()
