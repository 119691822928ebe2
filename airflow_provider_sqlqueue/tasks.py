"""What a task does with the messages it works on: hold them while it works, give them back if it fails.

These run inside a task (``@task`` functions and the operators), where the Airflow context says
who holds a claim (the DAG run, task and try) and what failed (``dag_id.task_id``). The operators
that settle messages (:mod:`~airflow_provider_sqlqueue.operators.sqlqueue`) read message dicts
with the same helpers, so a sensor's output, an asset event's payload and :func:`hold_messages`'
yield are one kind of value everywhere.
"""

from __future__ import annotations

import copy
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import get_current_context

from .hooks.sqlqueue import SqlQueueHook
from .lineage import collect_inputs
from .transport import Failure, LeaseKeeper, LeaseLostError, QueueClient, ReceivedMessage, defaults
from .transport.errors import ArgumentTypeError, InvalidArgumentError
from .transport.message import check_positive, duration
from .transport.tracing import START_NEW_TRACE, Carried, continuing, current_context, processing

#: What a task author uses; the rest serves the operators.
__all__ = ["HeldMessages", "hold_messages"]


@contextmanager
def settling(client: QueueClient, claims: Mapping[str, list[str]], context: Any) -> Iterator[None]:
    """Around a step that settles ``claims`` (a forward, a publish): if it fails, the claims are given
    back with why; a lost lease is not given back, as the claim is no longer this task's."""
    try:
        yield
    except LeaseLostError:
        raise
    except Exception as exc:
        failure = Failure.of(exc, failure_source(context))
        for queue, tokens in claims.items():
            client.nack(queue, tokens, error=failure)
        raise


def as_dicts(client: QueueClient, queue: str, messages: Iterable[ReceivedMessage]) -> list[dict[str, Any]]:
    """Messages as the JSON-safe dicts XCom and trigger events carry, each naming its queue by the
    canonical address (what settling them later needs)."""
    address = client.canonical_address(queue)
    return [message.to_dict(address) for message in messages]


def failure_source(context: Any) -> str:
    """What failed, as the error queue's ``NServiceBus.ExceptionInfo.Source`` names it: ``dag_id.task_id``."""
    ti = context["ti"]
    return f"{ti.dag_id}.{ti.task_id}"


def claim_holder(context: Any) -> str:
    """Who holds a claim taken by a task: its DAG run, task and try."""
    ti = context["ti"]
    return f"{ti.dag_id}/{ti.run_id}/{ti.task_id}#{ti.try_number}"


def _check_callable(function: object) -> None:
    if not callable(function):
        raise ArgumentTypeError(f"function must be callable, got {type(function).__name__}")


def claimed_messages(messages: Any, context: Any) -> list[Mapping[str, Any]]:
    """Message dicts to acknowledge or give back.

    ``messages`` is a sensor's or :func:`hold_messages`' output (a list of message dicts, or a
    single one); None means the payloads of the asset events that triggered this DAG run.
    """
    if messages is None:
        found: list[Mapping[str, Any]] = []
        for events in (context.get("triggering_asset_events") or {}).values():
            for event in events:
                payload = (event.extra or {}).get("payload")
                if isinstance(payload, Mapping) and "claim_token" in payload and "queue" in payload:
                    found.append(payload)
        return found
    if isinstance(messages, Mapping):
        return [messages]
    if isinstance(messages, (str, bytes)):
        raise ArgumentTypeError(
            "messages must be message dicts (a sensor's output, passed as XComArg), not a rendered string"
        )
    if not isinstance(messages, Iterable):
        raise ArgumentTypeError(f"messages must be message dicts, got {type(messages).__name__}")
    return list(messages)


class HeldMessages:
    """The message dicts a task holds (:attr:`messages`), with :meth:`map` to work on them one by one
    and :meth:`batch` to work on them all at once.

    Built by :func:`hold_messages`; its leases are renewed while the block runs. Iterating gives
    the messages; pass :attr:`messages` on to :class:`~airflow_provider_sqlqueue.operators.sqlqueue.ForwardMessagesOperator` as its claims.
    """

    def __init__(
        self, messages: Iterable[dict[str, Any]], hook: SqlQueueHook, keeper: LeaseKeeper, source: str
    ) -> None:
        self.messages = list(messages)
        self._hook = hook
        self._keeper = keeper
        self._source = source

    def map(self, function: Callable[[dict[str, Any]], Any]) -> list[Any]:
        """``function`` of each message; a message it fails on is given back alone, with the exception.

        The others go on: their results are returned and only they remain held (and forwarded).
        The given-back message is delivered again, and after ``max_deliveries`` failures it moves to
        the error queue with this exception and ``dag_id.task_id`` in its headers. ``function``
        gets a copy of each message dict, so what it changes cannot alter the claims forwarded.
        """
        _check_callable(function)
        results, kept = [], []
        for message in self.messages:
            try:
                with _processing([message]):
                    results.append(function(copy.deepcopy(message)))
                    _record_context([message])
            except Exception as exc:  # noqa: BLE001  # one message's failure is its own: recoverability, not a crashed batch
                self.give_back([message], Failure.of(exc, self._source))
            else:
                kept.append(message)
        return self._still_held(kept, results)

    def batch(self, function: Callable[[list[dict[str, Any]]], Sequence[Any]]) -> list[Any]:
        """``function`` of all the messages at once (one Spark job over all their inputs), returning
        one result per message, in order, as a list or tuple; a message it fails on is still given
        back alone.

        When the call raises (or returns the wrong number of results), the batch is split in halves
        and each half tried again, down to single messages: one call when all succeed, and a single
        failing message is found in about ``2 log2(n)`` calls instead of ``n``; when every message
        fails, each ends up tried alone (``2n - 1`` calls in all). The others keep their results,
        and only the failing ones are given back with their exceptions. A result that is not a list
        or tuple (a dict, a set, a string) is a mistake in ``function``, not in a message: it raises
        at once, and the block gives every message back. ``function`` gets copies of the message
        dicts.
        """
        _check_callable(function)
        results: list[Any] = []
        kept: list[dict[str, Any]] = []
        pending = [self.messages] if self.messages else []
        while pending:
            part = pending.pop(0)
            try:
                with _processing(part):
                    answer = function(copy.deepcopy(part))
                    _record_context(part)
                counted = len(answer) if isinstance(answer, (list, tuple)) else len(part)
                if counted != len(part):
                    raise InvalidArgumentError(
                        f"a batch function must return one result per message: {counted} for {len(part)}"
                    )
            except Exception as exc:  # noqa: BLE001  # narrowed down to the message it belongs to
                if len(part) == 1:
                    self.give_back(part, Failure.of(exc, self._source))
                    continue
                middle = len(part) // 2
                pending[:0] = [part[:middle], part[middle:]]
                self._hook.log.warning(
                    "A batch of %d message(s) failed (%s); trying its halves of %d and %d",
                    len(part),
                    type(exc).__name__,
                    middle,
                    len(part) - middle,
                )
                continue
            if not isinstance(answer, (list, tuple)):
                raise ArgumentTypeError(
                    "a batch function must return a list or tuple of results, one per message in order, "
                    f"got {type(answer).__name__}"
                )
            results.extend(answer)
            kept.extend(part)
        return self._still_held(kept, results)

    def _still_held(self, kept: list[dict[str, Any]], results: list[Any]) -> list[Any]:
        """Keep the messages (and their results) whose claims are still this task's after the work.

        The lease is renewed once more now: a claim that lapsed while the work ran (a stalled
        worker, a cut network) and that another consumer took is dropped with its result, so the
        rest can still be forwarded (an atomic forward refuses the whole batch for one lost claim).
        """
        if kept:
            with self._hook.client() as client:
                self._keeper.renew(client)
        lost = {(queue, token) for queue, tokens in self._keeper.lost.items() for token in tokens}
        pairs = [
            (message, result)
            for message, result in zip(kept, results, strict=True)
            if (str(message["queue"]), uuid.UUID(str(message["claim_token"]))) not in lost
        ]
        if len(pairs) < len(kept):
            self._hook.log.error(
                "%d message(s) were taken by another consumer while this task worked on them; "
                "their results are dropped here",
                len(kept) - len(pairs),
            )
        self.messages = [message for message, _ in pairs]
        return [result for _, result in pairs]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.messages)

    def give_back(self, messages: Iterable[Mapping[str, Any]], failure: Failure) -> None:
        """Nack ``messages`` with ``failure`` and stop renewing them."""
        for queue, tokens in tokens_by_queue(messages).items():
            with self._hook.client() as client:
                given = len(client.nack(queue, tokens, error=failure))
            self._keeper.stop_renewing(queue, tokens)
            self._hook.log.error(
                "Queue %s: gave back %d message(s) after %s: %s", queue, given, failure.type, failure.message
            )


def _processing(messages: Sequence[Mapping[str, Any]]) -> AbstractContextManager[None]:
    """The ``process`` span a task's work on message dicts runs in (:mod:`.transport.tracing`): the
    child of one message's sender, or linked to each of a batch's; the spans the work makes nest under it."""
    carried = [Carried(m.get("id"), m.get("headers") or {}) for m in messages]
    return processing(lambda: ", ".join(dict.fromkeys(str(m["queue"]) for m in messages)), carried)


#: The key of a message dict under which :class:`HeldMessages` records the context (W3C headers) of
#: the ``process`` span the task's work on the message ran in: where its results' trace goes on.
PROCESS_CONTEXT = "process_context"


def _record_context(messages: Sequence[dict[str, Any]]) -> None:
    """Record the current (``process``) span's context with each message, for the task that sends its results."""
    carrier = current_context()
    for message in messages:
        if carrier is None:
            message.pop(PROCESS_CONTEXT, None)
        else:
            message[PROCESS_CONTEXT] = carrier


def stage_context(message: Mapping[str, Any]) -> Mapping[str, str | None] | None:
    """The context a message's results are sent in: that of the span the stage processed it in (as
    :class:`HeldMessages` records it), else the message's own trace headers -- unless its sender asked
    for a new trace (``NServiceBus.OpenTelemetry.StartNewTrace``), which a stage's receive began."""
    recorded = message.get(PROCESS_CONTEXT)
    if isinstance(recorded, Mapping):
        return recorded
    headers = message.get("headers")
    if not isinstance(headers, Mapping) or str(headers.get(START_NEW_TRACE) or "").strip().lower() == "true":
        return None
    return headers


def stage_groups(claimed: Sequence[Mapping[str, Any]], results: Sequence[Any]) -> list[tuple[list[Any], list[Any]]]:
    """``claimed`` and the ``results`` made from them, as (messages, their results) groups whose
    messages share a :func:`stage_context`, so that each group is sent in its own: with one result per
    message (in order, as :meth:`HeldMessages.map` and :meth:`HeldMessages.batch` return them), each
    result goes with its message; otherwise all go together."""
    if len(claimed) != len(results) or len(claimed) < 2:
        return [(list(claimed), list(results))] if claimed or results else []
    groups: dict[str, tuple[list[Any], list[Any]]] = {}
    for message, result in zip(claimed, results, strict=True):
        key = str((stage_context(message) or {}).get("traceparent"))
        part, made = groups.setdefault(key, ([], []))
        part.append(message)
        made.append(result)
    return list(groups.values())


def sent_in_stage_context(queue: str, claimed: Sequence[Mapping[str, Any]]) -> AbstractContextManager[None]:
    """Around a send of results of ``claimed``: in their :func:`stage_context` (:func:`~.transport.tracing.continuing`),
    so each result continues the trace its message came with, as a message sent from an NServiceBus
    handler does (a child of the span the stage processed it in)."""
    return continuing(lambda: queue, [stage_context(message) for message in claimed])


@contextmanager
def hold_messages(
    messages: Any = None,
    *,
    sqlqueue_conn_id: str = SqlQueueHook.default_conn_name,
    lease: timedelta | float = defaults.LEASE,
    limit: int = defaults.ADOPT_LIMIT,
    context: Any = None,
) -> Iterator[HeldMessages]:
    """The messages a task works on, kept claimed while it works; given back, with the error, if it fails.

    ::

        @task(multiple_outputs=True)
        def work(messages):
            with hold_messages(messages) as held:
                results = held.map(handle)      # a message handle() fails on is given back alone
                return {"claims": held.messages, "results": results}

    ``messages`` is a :class:`~airflow_provider_sqlqueue.sensors.sqlqueue.SqlQueueSensor`'s
    output. With None, in a DAG run started by an ``AssetWatcher``, the task takes every
    reservation waiting on the queues its triggering events came from (up to ``limit`` per queue):
    Airflow may fold several events into one run and attach others to later runs, so a run
    handles whatever is reserved when it starts, and a later run whose events name messages
    already taken has nothing to do.

    The leases are renewed every third of ``lease`` from a background thread while the block runs
    (a SIGKILLed task stops renewing and its messages come back within one lease) and once more
    when it ends, leaving the next task -- :class:`~airflow_provider_sqlqueue.operators.sqlqueue.ForwardMessagesOperator` -- a full lease. Only
    messages still held are yielded. If the block raises, every message still held is given back
    at once with the exception (type, message, traceback, ``dag_id.task_id``) as its failure,
    which is what the error queue's headers show if it ends there.
    """
    # Refused before anything is taken; a lease may be given in seconds, as everywhere.
    lease = duration("lease", lease, maximum=defaults.MAX_LEASE, minimum=defaults.MIN_RENEWED_LEASE)
    check_positive("limit", limit)
    context = context or get_current_context()
    hook = SqlQueueHook(sqlqueue_conn_id)
    hook.connection  # noqa: B018  # a connection that is not defined fails the task now, holding nothing
    taken = take_reserved(hook, context, lease, limit) if messages is None else claimed_messages(messages, context)
    claims = tokens_by_queue(taken)  # refuses messages that are no claims' dicts
    collect_inputs(hook, claims)
    with LeaseKeeper(hook.client, claims, lease) as keeper:
        held = HeldMessages(
            (dict(m) for m in taken if uuid.UUID(str(m["claim_token"])) in keeper.held.get(str(m["queue"]), ())),
            hook,
            keeper,
            failure_source(context),
        )
        try:
            yield held
        except BaseException as exc:
            held.give_back(held.messages, Failure.of(exc, failure_source(context)))
            raise


def take_reserved(hook: SqlQueueHook, context: Any, lease: timedelta, limit: int) -> list[dict[str, Any]]:
    """Take every reservation waiting on the queues the run's triggering asset events came from.

    Not only the events' own messages: Airflow folds events into runs as they arrive, so this run
    may be the only one coming for messages whose events it was not given.
    """
    holder = claim_holder(context)
    queues = dict.fromkeys(str(m["queue"]) for m in claimed_messages(None, context))
    taken: list[dict[str, Any]] = []
    for queue in queues:
        with hook.client() as client:
            adopted = as_dicts(client, queue, client.take(queue, None, lease=lease, holder=holder, limit=limit))
        hook.log.info("Queue %s: took %d reserved message(s) for %s", queue, len(adopted), holder)
        taken.extend(adopted)
    return taken


def received_times(messages: Iterable[Mapping[str, Any]]) -> dict[uuid.UUID, datetime]:
    """When each message dict was received (by message id): where an audit copy's processing started."""
    times: dict[uuid.UUID, datetime] = {}
    for message in messages:
        try:
            times[uuid.UUID(str(message["id"]))] = datetime.fromisoformat(str(message["received_at"]))
        except (KeyError, ValueError):  # a dict from an older version, or hand-made: the ack's time stands in
            continue
    return times


def tokens_by_queue(messages: Iterable[Mapping[str, Any]]) -> dict[str, list[str]]:
    """Claim tokens grouped by the queue they were claimed from; messages received in none mode have none."""
    grouped: dict[str, list[str]] = defaultdict(list)
    for message in messages:
        try:
            queue, token = message["queue"], message["claim_token"]
        except (KeyError, TypeError):
            raise ArgumentTypeError(f"not a received message dict: {message!r:.200}") from None
        if token is not None:
            grouped[queue].append(token)
    return dict(grouped)
