"""The statements of a journey (:mod:`..operations.journey`): the rows a message or a trace left in
queue tables and claim stores, found by their headers' text.

Part of every dialect's interface (:class:`~.base.Dialect` derives from :class:`FindsJourneys`),
kept apart from the statements that move messages: none of these writes or locks a row.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, NamedTuple

from ..addressing import QueueAddress


class FoundRow(NamedTuple):
    """A row of :meth:`FindsJourneys.find_sql` and :meth:`FindsJourneys.find_by_id_sql`: a message a journey passes."""

    seq: int
    id: Any
    headers: str | None


class FoundClaimRow(NamedTuple):
    """A row of :meth:`FindsJourneys.find_claims_sql`: a claimed message a journey passes (its token stays private)."""

    queue: str  # the claim key of the queue it was claimed from
    seq: int  # its place in that queue
    id: Any
    headers: str | None
    holder: str | None  # None: a reservation nobody has taken yet
    deliveries: int


class FindsJourneys(ABC):
    """What a dialect runs to find a journey's rows: bounded scans of headers as text."""

    @abstractmethod
    def find_sql(self, address: QueueAddress) -> str:
        """Params scan, needle: rows (:class:`FoundRow`) among the newest ``scan`` rows whose
        lower-cased Headers text holds ``needle``, oldest first, unlocked. A bounded scan: the newest
        rows come off the Seq index, their headers are searched as text. Every match comes back (at
        most ``scan``): which of them a journey keeps is decided by their times, not a table's order."""

    def find_by_id_sql(self, address: QueueAddress) -> str | None:
        """Params id: the row (:class:`FoundRow`) whose Id is ``id``, through an index on Id; None where
        the table has none (a lookup would scan the table: :meth:`find_sql` finds the row by its
        ``NServiceBus.MessageId`` instead)."""
        return None

    @abstractmethod
    def scanned_all_sql(self, address: QueueAddress) -> str:
        """Params scan -> one row: whether the table holds no more than ``scan`` rows (:meth:`find_sql`
        searched all of them), counting at most ``scan + 1`` off the Seq index."""

    @abstractmethod
    def find_claims_sql(self, address: QueueAddress) -> str:
        """Params scan, needle: rows (:class:`FoundClaimRow`) of the claim store of ``address``'s
        schema among ``scan`` of its claims whose lower-cased Headers text holds ``needle``, unlocked."""

    @abstractmethod
    def claims_scanned_all_sql(self, address: QueueAddress) -> str:
        """Params scan -> one row: whether the claim store of ``address``'s schema holds no more than
        ``scan`` claims (:meth:`find_claims_sql` searched all of them), counting at most ``scan + 1``."""

    @abstractmethod
    def can_read_sql(self) -> str:
        """Params table (:meth:`~.base.Dialect.table_reference`) -> one row: whether the table exists and the connection may read it."""
