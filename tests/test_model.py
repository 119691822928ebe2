"""A model-based test of the transport core on a real PostgreSQL.

Hypothesis drives random sequences of operations -- sends with and without TTBR, receive, claim,
reserve, take and adopt, ack, nack, extend, leases running out, messages expiring, poison rows
inserted by SQL, purge, retry from the error queue, atomic forwards, delayed sends and moves from
sessions in several time zones (two movers at once among them), subscriptions and publishes, and
audited acknowledgements -- across three queues in two schemas, and after every step compares what
the database holds with a plain in-memory model of what each queue, its delayed messages, the
in-flight store, each error queue and each audit queue must hold. Time is not waited for: a lease
running out, a message expiring or a delay ending is a step that moves the row's clock.

CI runs it derandomized with a fixed budget; ``SQLQUEUE_MODEL_EXAMPLES=500`` runs it longer.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from dataclasses import dataclass, field
from types import SimpleNamespace

import psycopg
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test
from psycopg.conninfo import make_conninfo

from airflow_provider_sqlqueue.transport import LeaseLostError, Message, QueueAddress, QueueClient, defaults, heads
from tests.backends import drop_pg_schema

SCHEMAS = ("m_a", "m_b")
#: Session time zones of the clients that send and move delayed messages: Due must not depend on them.
ZONES = ("UTC", "Asia/Tokyo", "America/Los_Angeles", "Pacific/Chatham")
TOPICS = ("Shop.OrderPlaced", "Shop.OrderCancelled")
ROUTING = QueueAddress("SubscriptionRouting", "m_a")
QUEUES = (QueueAddress("orders", "m_a"), QueueAddress("invoices", "m_a"), QueueAddress("orders", "m_b"))
LONG = 600.0  # seconds: a lease that does not run out unless a step says so


@dataclass
class Item:
    """A message as the model sees it."""

    id: uuid.UUID
    body: str
    expiring: bool = False  # sent with a TTBR
    expired: bool = False
    poison: bool = False


@dataclass
class Claim:
    queue: QueueAddress
    item: Item
    deliveries: int
    reserved: bool  # held for a taker (no holder)
    lapsed: bool = False


@dataclass
class Model:
    waiting: dict[QueueAddress, list[Item]] = field(default_factory=lambda: {q: [] for q in QUEUES})
    claims: dict[uuid.UUID, Claim] = field(default_factory=dict)  # by token
    errors: dict[str, list[uuid.UUID]] = field(default_factory=lambda: {s: [] for s in SCHEMAS})
    retryable: dict[uuid.UUID, tuple[QueueAddress, Item]] = field(default_factory=dict)  # error rows with a FailedQ
    delayed: dict[QueueAddress, list[tuple[Item, bool]]] = field(default_factory=lambda: {q: [] for q in QUEUES})
    subscribed: dict[str, set[QueueAddress]] = field(default_factory=lambda: {t: set() for t in TOPICS})
    audited: dict[str, list[uuid.UUID]] = field(default_factory=lambda: {s: [] for s in SCHEMAS})


queues = st.sampled_from(QUEUES)


class QueueMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.uri = URI
        self.raw = psycopg.connect(self.uri, autocommit=True)
        for schema in SCHEMAS:
            drop_pg_schema(self.raw, schema, if_exists=True)
            self.raw.execute(f'CREATE SCHEMA "{schema}"')
        self.client = QueueClient.connect(self.uri)
        self.zoned = {
            zone: QueueClient.connect(make_conninfo(self.uri, options=f"-c TimeZone={zone}")) for zone in ZONES
        }
        self.auditing = QueueClient.connect(self.uri, audit_queue=True)
        for queue in QUEUES:
            self.auditing.create_queue(queue)  # with its delayed table and the schema's audit queue
        self.client.create_subscription_table(ROUTING)
        self.model = Model()
        self.counter = 0

    def teardown(self) -> None:
        for client in (self.client, self.auditing, *self.zoned.values()):
            client.close()
        self.raw.close()

    # -- helpers ---------------------------------------------------------------------------------

    def key(self, queue: QueueAddress) -> str:
        return self.client.session.dialect.format_address(queue)

    def walk(self, queue: QueueAddress, wanted: int) -> list[Item]:
        """What a receive or claim takes from the queue: the first ``wanted`` good messages; poison and
        expired rows met on the way are consumed (poison to the error queue of the schema)."""
        taken: list[Item] = []
        line = self.model.waiting[queue]
        met_expired = False
        while line and len(taken) < wanted:
            item = line.pop(0)
            if item.poison:
                self.model.errors[queue.schema].append(item.id)
            elif item.expired:
                met_expired = True
            else:
                taken.append(item)
        if met_expired:  # a receive that meets expired messages deletes every expired one of the queue, in bulk
            self.model.waiting[queue] = [item for item in line if not item.expired]
        return taken

    def lapsed_claims(self, queue: QueueAddress, limit: int) -> list[tuple[uuid.UUID, Claim]]:
        lapsed = [(t, c) for t, c in self.model.claims.items() if c.queue == queue and c.lapsed]
        return sorted(lapsed, key=lambda pair: self.seq_of(pair[1].item.id))[:limit]

    def seq_of(self, message_id: uuid.UUID) -> int:
        return self.sequence[message_id]

    # -- rules -----------------------------------------------------------------------------------

    @rule(queue=queues, count=st.integers(1, 3), ttbr=st.booleans())
    def send(self, queue: QueueAddress, count: int, ttbr: bool) -> None:
        messages = []
        for _ in range(count):
            self.counter += 1
            messages.append(Message(f"m{self.counter}", time_to_be_received=3600 if ttbr else None))
        self.client.send(queue, messages)
        self.model.waiting[queue].extend(Item(m.id, m.body.decode(), ttbr) for m in messages)

    @rule(queue=queues)
    def insert_poison(self, queue: QueueAddress) -> None:
        message_id = uuid.uuid4()
        self.raw.execute(
            f'INSERT INTO "{queue.schema}"."{queue.table}" (Id, Headers, Body) VALUES (%s, %s, %s)',
            (message_id, "not json", b"poison"),
        )
        self.model.waiting[queue].append(Item(message_id, "poison", poison=True))

    @rule(queue=queues)
    def expire_messages(self, queue: QueueAddress) -> None:
        """Every message of the queue sent with a TTBR expires (in the queue and in flight)."""
        past = "(now() AT TIME ZONE 'UTC') - interval '1 second'"
        self.raw.execute(f'UPDATE "{queue.schema}"."{queue.table}" SET Expires = {past} WHERE Expires IS NOT NULL')
        self.raw.execute(
            f'UPDATE "{queue.schema}".sqlqueue_inflight SET Expires = {past} WHERE Queue = %s AND Expires IS NOT NULL',
            (self.key(queue),),
        )
        for item in self.model.waiting[queue]:
            item.expired = item.expired or item.expiring
        for claim in self.model.claims.values():
            if claim.queue == queue:
                claim.item.expired = claim.item.expired or claim.item.expiring

    @rule(queue=queues)
    def purge_expired(self, queue: QueueAddress) -> None:
        self.client.purge_expired(queue)
        self.model.waiting[queue] = [i for i in self.model.waiting[queue] if not i.expired]

    @rule(queue=queues, count=st.integers(1, 4))
    def receive(self, queue: QueueAddress, count: int) -> None:
        got = self.client.receive(queue, count)
        expected = self.walk(queue, count)
        assert [m.id for m in got] == [i.id for i in expected]

    @rule(queue=queues, count=st.integers(1, 3), reserve=st.booleans())
    def claim(self, queue: QueueAddress, count: int, reserve: bool) -> None:
        lapsed = self.lapsed_claims(queue, count)  # before the claim: it deletes lapsed claims that expired
        got = self.client.reserve(queue, count, lease=LONG) if reserve else self.client.claim(queue, count, lease=LONG)
        counted = 0 if reserve else 1
        expected: list[tuple[Item, int]] = []
        for token, claim in lapsed:
            del self.model.claims[token]
            if claim.item.expired:
                continue
            if claim.deliveries >= defaults.MAX_DELIVERIES:
                self.model.errors[queue.schema].append(claim.item.id)
                self.model.retryable[claim.item.id] = (queue, claim.item)
                continue
            expected.append((claim.item, claim.deliveries + counted))
        for item in self.walk(queue, count - len(expected)):
            expected.append((item, counted))
        assert [(m.id, m.deliveries) for m in got] == [(i.id, d) for i, d in expected]
        for message, (item, deliveries) in zip(got, expected, strict=True):
            self.model.claims[message.claim_token] = Claim(queue, item, deliveries, reserved=reserve)

    @rule(queue=queues, limit=st.integers(1, 3))
    def adopt(self, queue: QueueAddress, limit: int) -> None:
        reserved = sorted(
            ((t, c) for t, c in self.model.claims.items() if c.queue == queue and c.reserved),
            key=lambda pair: self.seq_of(pair[1].item.id),
        )[:limit]  # before the take: it deletes reservations that expired
        got = self.client.take(queue, lease=LONG, limit=limit)
        self.apply_take(got, reserved)

    @rule(queue=queues)
    def take_by_token(self, queue: QueueAddress) -> None:
        mine = [t for t, c in self.model.claims.items() if c.queue == queue and c.reserved][:2]
        stale = [uuid.uuid4()]
        # Ordered before the take: it deletes reservations that expired.
        reserved = sorted(((t, self.model.claims[t]) for t in mine), key=lambda pair: self.seq_of(pair[1].item.id))
        got = self.client.take(queue, mine + stale, lease=LONG)
        self.apply_take(got, reserved)

    def apply_take(self, got, reserved) -> None:
        expected = []
        for token, claim in reserved:
            del self.model.claims[token]
            if not claim.item.expired:
                expected.append((claim.item, claim.deliveries + 1, claim.queue))
        assert [(m.id, m.deliveries) for m in got] == [(i.id, d) for i, d, _ in expected]
        for message, (item, deliveries, queue) in zip(got, expected, strict=True):
            self.model.claims[message.claim_token] = Claim(queue, item, deliveries, reserved=False)

    def pick(self, data: st.DataObject) -> uuid.UUID:
        """A claim the model holds (the rules that call this run only when there is one).

        Chosen by the message's name, not its token: tokens are random, and a replayed example
        must pick the same claim.
        """
        by_name = sorted(self.model.claims, key=lambda token: self.model.claims[token].item.body)
        return data.draw(st.sampled_from(by_name))

    @precondition(lambda self: self.model.claims)
    @rule(data=st.data())
    def ack(self, data) -> None:
        token = self.pick(data)
        claim = self.model.claims.pop(token)
        assert self.client.ack(claim.queue, token) is True

    @precondition(lambda self: self.model.claims)
    @rule(data=st.data())
    def nack(self, data) -> None:
        token = self.pick(data)
        claim = self.model.claims[token]
        assert self.client.nack(claim.queue, token, error=ValueError("model says no")) is True
        claim.lapsed = True

    @precondition(lambda self: self.model.claims)
    @rule(data=st.data())
    def lease_runs_out(self, data) -> None:
        token = self.pick(data)
        claim = self.model.claims[token]
        self.raw.execute(
            f"UPDATE \"{claim.queue.schema}\".sqlqueue_inflight SET LeaseUntil = (now() AT TIME ZONE 'UTC') "
            "- interval '1 second' WHERE Token = %s",
            (token,),
        )
        time_passes(1.0)
        claim.lapsed = True

    @precondition(lambda self: self.model.claims)
    @rule(data=st.data())
    def extend(self, data) -> None:
        token = self.pick(data)
        claim = self.model.claims[token]
        assert self.client.extend(claim.queue, token, LONG) is True
        claim.lapsed = False

    @precondition(lambda self: self.model.claims)
    @rule(data=st.data(), target_queue=queues, lose_one=st.booleans())
    def forward(self, data, target_queue: QueueAddress, lose_one: bool) -> None:
        token = self.pick(data)
        claim = self.model.claims[token]
        tokens = [token, uuid.uuid4()] if lose_one else [token]
        self.counter += 1
        result = Message(f"r{self.counter}")
        if lose_one:
            try:
                self.client.forward({claim.queue: tokens}, {target_queue: [result]})
            except LeaseLostError:
                return
            raise AssertionError("a forward with a claim that is not held went through")
        assert self.client.forward({claim.queue: tokens}, {target_queue: [result]}) == 1
        del self.model.claims[token]
        self.model.waiting[target_queue].append(Item(result.id, f"r{self.counter}"))

    @rule(queue=queues, zone=st.sampled_from(ZONES))
    def send_delayed(self, queue: QueueAddress, zone: str) -> None:
        """A message delayed an hour, sent from a session in ``zone``: not due until a step says so."""
        self.counter += 1
        message = Message(f"d{self.counter}")
        self.zoned[zone].send(queue, message, delay=3600)
        self.model.delayed[queue].append((Item(message.id, f"d{self.counter}"), False))

    @rule(queue=queues)
    def delays_end(self, queue: QueueAddress) -> None:
        """Two hours pass for the queue's delayed messages: all of them are due, in the order they were sent."""
        delayed = f'"{queue.schema}"."{queue.table}.Delayed"'
        self.raw.execute(f"UPDATE {delayed} SET Due = Due - interval '2 hours'")
        time_passes(2 * 3600.0)
        self.model.delayed[queue] = [(item, True) for item, _ in self.model.delayed[queue]]

    @rule(queue=queues, zone=st.sampled_from(ZONES))
    def move_due(self, queue: QueueAddress, zone: str) -> None:
        moved = self.zoned[zone].move_due(queue)
        self.apply_moves(queue, moved)

    @rule(queue=queues, zones=st.tuples(st.sampled_from(ZONES), st.sampled_from(ZONES)))
    def two_movers_at_once(self, queue: QueueAddress, zones: tuple[str, str]) -> None:
        """Two movers in other time zones: each due message is moved by one of them, once."""
        counts: list[int] = []
        movers = [QueueClient.connect(make_conninfo(self.uri, options=f"-c TimeZone={zone}")) for zone in zones]
        try:
            threads = [
                threading.Thread(target=lambda m=m: counts.append(m.move_due(queue, batch_size=1))) for m in movers
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        finally:
            for mover in movers:
                mover.close()
        self.apply_moves(queue, sum(counts), reorder=True)

    def apply_moves(self, queue: QueueAddress, moved: int, *, reorder: bool = False) -> None:
        due = [item for item, is_due in self.model.delayed[queue] if is_due]
        assert moved == len(due), (moved, len(due))  # every due one, none early, none twice
        self.model.delayed[queue] = [(item, False) for item, is_due in self.model.delayed[queue] if not is_due]
        if reorder:  # concurrent movers insert in the order their transactions ran: take the table's order
            rows = self.raw.execute(f'SELECT Id FROM "{queue.schema}"."{queue.table}" ORDER BY Seq').fetchall()
            place = {row[0]: n for n, row in enumerate(rows)}
            assert set(place) >= {item.id for item in due}
            due.sort(key=lambda item: place[item.id])
        self.model.waiting[queue].extend(due)

    @rule(queue=queues, topic=st.sampled_from(TOPICS))
    def subscribe(self, queue: QueueAddress, topic: str) -> None:
        self.client.subscribe(queue, topic, endpoint=f"{queue.schema}.{queue.table}", table=ROUTING)
        self.model.subscribed[topic].add(queue)

    @rule(queue=queues, topic=st.sampled_from(TOPICS))
    def unsubscribe(self, queue: QueueAddress, topic: str) -> None:
        self.client.unsubscribe(queue, topic, endpoint=f"{queue.schema}.{queue.table}", table=ROUTING)
        self.model.subscribed[topic].discard(queue)

    @rule(topic=st.sampled_from(TOPICS))
    def publish(self, topic: str) -> None:
        self.counter += 1
        event = Message(f"e{self.counter}")
        reached = self.client.publish(topic, event, table=ROUTING)
        assert {(q.schema, q.table) for q in reached} == {(q.schema, q.table) for q in self.model.subscribed[topic]}
        for queue in self.model.subscribed[topic]:  # one copy each, the same id everywhere
            self.model.waiting[queue].append(Item(event.id, f"e{self.counter}"))

    @precondition(lambda self: self.model.claims)
    @rule(data=st.data())
    def ack_audited(self, data) -> None:
        token = self.pick(data)
        claim = self.model.claims.pop(token)
        assert self.auditing.ack(claim.queue, token) is True
        self.model.audited[claim.queue.schema].append(claim.item.id)

    @rule(schema=st.sampled_from(SCHEMAS))
    def retry_errors(self, schema: str) -> None:
        moved = self.client.retry_errors(QueueAddress("error", schema))
        back = [m for m in self.model.errors[schema] if m in self.model.retryable]
        assert moved == len(back)
        for message_id in back:
            self.model.errors[schema].remove(message_id)
            queue, item = self.model.retryable.pop(message_id)
            self.model.waiting[queue].append(item)

    # -- what the database must hold -----------------------------------------------------------

    @property
    def sequence(self) -> dict[uuid.UUID, int]:
        rows = []
        for schema in SCHEMAS:
            rows += self.raw.execute(f'SELECT Id, Seq FROM "{schema}".sqlqueue_inflight').fetchall()
        return dict(rows)

    @invariant()
    def database_matches_the_model(self) -> None:
        for queue in QUEUES:
            rows = self.raw.execute(f'SELECT Id FROM "{queue.schema}"."{queue.table}" ORDER BY Seq').fetchall()
            assert [row[0] for row in rows] == [i.id for i in self.model.waiting[queue]], queue
        for queue in QUEUES:
            delayed = self.raw.execute(f'SELECT Headers FROM "{queue.schema}"."{queue.table}.Delayed"').fetchall()
            sent = {uuid.UUID(json.loads(row[0])["NServiceBus.MessageId"]) for row in delayed}
            assert sent == {item.id for item, _ in self.model.delayed[queue]}, queue
        for schema in SCHEMAS:
            rows = self.raw.execute(f'SELECT Id FROM "{schema}"."error" ORDER BY Seq').fetchall()
            assert sorted(row[0] for row in rows) == sorted(self.model.errors[schema]), schema
            rows = self.raw.execute(f'SELECT Headers FROM "{schema}"."audit"').fetchall()
            copies = sorted(uuid.UUID(json.loads(row[0])["NServiceBus.MessageId"]) for row in rows)
            assert copies == sorted(self.model.audited[schema]), schema  # a copy of its own, naming the original
            held = self.raw.execute(
                f'SELECT Token, Id, Deliveries, Holder IS NULL FROM "{schema}".sqlqueue_inflight'
            ).fetchall()
            expected = {
                (t, c.item.id, c.deliveries, c.reserved)
                for t, c in self.model.claims.items()
                if c.queue.schema == schema
            }
            assert set(held) == expected, schema


URI = ""

#: Seconds the rules moved the database's times back by: the time that passed, as the sessions'
#: heads (transport/heads.py) must see it too. Their looks by time reach back over what came due
#: or lapsed since the last look, which a time set back by SQL alone would have them miss.
PASSED = [0.0]


def time_passes(seconds: float) -> None:
    PASSED[0] += seconds + defaults.HEAD_FULL_RESCAN


@pytest.mark.postgres_only
def test_queues_behave_like_the_model(pg_uri: str, monkeypatch: pytest.MonkeyPatch) -> None:
    global URI
    URI = pg_uri
    clock = time.monotonic
    monkeypatch.setattr(heads, "time", SimpleNamespace(monotonic=lambda: clock() + PASSED[0]))
    examples = int(os.environ.get("SQLQUEUE_MODEL_EXAMPLES", "25"))
    budget = settings(
        max_examples=examples, stateful_step_count=40, deadline=None, derandomize=bool(os.environ.get("CI"))
    )
    try:
        run_state_machine_as_test(QueueMachine, settings=budget)
    finally:
        with psycopg.connect(pg_uri, autocommit=True) as connection:
            for schema in SCHEMAS:
                drop_pg_schema(connection, schema, if_exists=True)
