"""Unit behaviour of :mod:`airflow_provider_sqlqueue.tasks`: what a task does with the messages it holds.

``hold_messages`` inside real task runs is in the end-to-end suites; here it runs in-process on a
real queue with the part of the context it reads.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_provider_sqlqueue.tasks import claimed_messages, hold_messages, received_times, tokens_by_queue
from airflow_provider_sqlqueue.transport import Message, QueueAddress, QueueClient
from airflow_provider_sqlqueue.transport.errors import ArgumentTypeError


def context(events: dict[str, list[Any]] | None = None) -> dict[str, Any]:
    ti = SimpleNamespace(dag_id="shop", run_id="r1", task_id="work", try_number=1)
    return {"ti": ti, "triggering_asset_events": events or {}}


def test_claims_are_grouped_by_queue_and_none_mode_messages_have_none() -> None:
    messages = [
        {"queue": "a", "claim_token": "t1"},
        {"queue": "b", "claim_token": "t2"},
        {"queue": "a", "claim_token": "t3"},
        {"queue": "a", "claim_token": None},
    ]
    assert tokens_by_queue(messages) == {"a": ["t1", "t3"], "b": ["t2"]}
    with pytest.raises(ArgumentTypeError, match="not a received message dict"):
        tokens_by_queue([{"body": "no queue"}])


def test_messages_come_from_the_caller_or_from_the_runs_asset_events() -> None:
    payload = {"queue": "a", "claim_token": "t1"}
    events = {"orders": [SimpleNamespace(extra={"payload": payload}), SimpleNamespace(extra={"payload": "not one"})]}
    assert claimed_messages(None, context(events)) == [payload]
    assert claimed_messages(payload, context()) == [payload]
    with pytest.raises(ArgumentTypeError, match="rendered string"):
        claimed_messages("[{'queue': 'a'}]", context())


def test_received_times_skip_what_they_cannot_read() -> None:
    known = uuid.uuid4()
    times = received_times(
        [{"id": str(known), "received_at": "2026-11-25T10:00:00+00:00"}, {"id": "x"}, {"received_at": "never"}]
    )
    assert list(times) == [known] and times[known].utcoffset() == timedelta(0)


def test_held_messages_one_fails_on_are_given_back_alone(
    conn_id: str, client: QueueClient, queue: QueueAddress, schema: str
) -> None:
    client.send(queue, [Message("good"), Message("bad")])
    claimed = [m.to_dict(f'orders@"{schema}"') for m in client.claim(queue, 2)]

    def handle(message: dict[str, Any]) -> str:
        if message["body"] == "bad":
            raise ValueError("cannot handle this one")
        return str(message["body"]).upper()

    with hold_messages(claimed, sqlqueue_conn_id=conn_id, context=context()) as held:
        assert held.map(handle) == ["GOOD"]
        assert [m["body"] for m in held.messages] == ["good"]
    [again] = client.claim(queue, 5)  # only "bad" was given back; "good" is still held
    assert again.text == "bad" and again.deliveries == 2


@pytest.mark.parametrize("bad", [set(), {3}, {0, 7}, set(range(8))], ids=["none", "one", "two", "all"])
def test_a_batch_runs_once_for_all_and_gives_back_only_the_messages_it_fails_on(
    conn_id: str, client: QueueClient, queue: QueueAddress, schema: str, bad: set[int]
) -> None:
    client.send(queue, [Message(str(n)) for n in range(8)])
    claimed = [m.to_dict(f'orders@"{schema}"') for m in client.claim(queue, 8)]
    calls: list[list[int]] = []

    def job(messages: list[dict[str, Any]]) -> list[int]:
        numbers = [int(m["body"]) for m in messages]
        calls.append(numbers)
        if bad & set(numbers):
            raise ValueError(f"cannot handle {sorted(bad & set(numbers))}")
        return [n * 10 for n in numbers]

    with hold_messages(claimed, sqlqueue_conn_id=conn_id, context=context()) as held:
        results = held.batch(job)
        good = [n for n in range(8) if n not in bad]
        assert results == [n * 10 for n in good]  # in the messages' order
        assert [int(m["body"]) for m in held.messages] == good
    assert calls[0] == list(range(8))  # one call for the whole batch first
    assert len(calls) <= 1 + 2 * len(bad) * 3  # each failing message costs at most two calls per halving
    again = client.claim(queue, 8)  # only the failing messages were given back, each once
    assert sorted(int(m.text) for m in again) == sorted(bad) and {m.deliveries for m in again} <= {2}


def test_a_batch_function_must_return_one_result_per_message(
    conn_id: str, client: QueueClient, queue: QueueAddress, schema: str
) -> None:
    client.send(queue, [Message("a"), Message("b")])
    claimed = [m.to_dict(f'orders@"{schema}"') for m in client.claim(queue, 2)]
    with hold_messages(claimed, sqlqueue_conn_id=conn_id, context=context()) as held:
        assert held.batch(lambda messages: []) == []  # no message can be matched with a result
        assert held.messages == []
    assert sorted(m.text for m in client.claim(queue, 2)) == ["a", "b"]


def test_a_block_that_raises_gives_back_everything_it_held(
    conn_id: str, client: QueueClient, queue: QueueAddress, schema: str
) -> None:
    client.send(queue, [Message("one"), Message("two")])
    claimed = [m.to_dict(f'orders@"{schema}"') for m in client.claim(queue, 2)]
    with pytest.raises(RuntimeError), hold_messages(claimed, sqlqueue_conn_id=conn_id, context=context()):
        raise RuntimeError("the task failed")
    again = client.claim(queue, 5)
    assert sorted(m.text for m in again) == ["one", "two"] and {m.deliveries for m in again} == {2}


@pytest.mark.parametrize(
    "answer", [{"a": 1, "b": 2}, {1, 2}, "ab", iter([1, 2])], ids=["dict", "set", "str", "iterator"]
)
def test_a_batch_result_that_is_no_list_raises_and_everything_is_given_back(
    conn_id: str, client: QueueClient, queue: QueueAddress, schema: str, answer: Any
) -> None:
    """A dict keyed by id, a set or a string of the right length would pair results with the wrong messages."""
    client.send(queue, [Message("a"), Message("b")])
    claimed = [m.to_dict(f'orders@"{schema}"') for m in client.claim(queue, 2)]
    calls = []
    with (
        pytest.raises(ArgumentTypeError, match="list or tuple of results"),
        hold_messages(claimed, sqlqueue_conn_id=conn_id, context=context()) as held,
    ):
        held.batch(lambda messages: calls.append(messages) or answer)
    assert len(calls) == 1  # a mistake of the function, not of a message: not bisected
    again = client.claim(queue, 5)
    assert sorted(m.text for m in again) == ["a", "b"] and {m.deliveries for m in again} == {2}


def test_map_and_batch_refuse_what_is_not_a_function_and_hand_out_copies(
    conn_id: str, client: QueueClient, queue: QueueAddress, schema: str
) -> None:
    client.send(queue, [Message("a"), Message("b")])
    claimed = [m.to_dict(f'orders@"{schema}"') for m in client.claim(queue, 2)]

    def meddle(messages: list[dict[str, Any]]) -> list[str]:
        for message in messages:
            message["claim_token"] = str(uuid.uuid4())
            message["headers"]["NServiceBus.MessageId"] = "changed"
        return [m["body"] for m in messages]

    with hold_messages(claimed, sqlqueue_conn_id=conn_id, context=context()) as held:
        with pytest.raises(ArgumentTypeError, match="function must be callable"):
            held.batch(None)  # type: ignore[arg-type]
        with pytest.raises(ArgumentTypeError, match="function must be callable"):
            held.map("upper")  # type: ignore[arg-type]
        assert held.batch(meddle) == ["a", "b"]
        assert held.map(lambda m: meddle([m])[0]) == ["a", "b"]
        assert held.messages == claimed  # the claims forwarded are the ones taken
    assert client.claim(queue, 5) == []  # nothing was given back


def test_a_claim_another_consumer_took_during_the_work_is_dropped_with_its_result(
    conn_id: str, client: QueueClient, queue: QueueAddress, schema: str, pg_uri: str
) -> None:
    """A stalled worker's lease lapses and another consumer takes the message: the rest go on."""
    client.send(queue, [Message("kept"), Message("taken")])
    claimed = [m.to_dict(f'orders@"{schema}"') for m in client.claim(queue, 2)]
    taken_id = next(m["id"] for m in claimed if m["body"] == "taken")
    others: list[Any] = []

    def stall(messages: list[dict[str, Any]]) -> list[str]:
        client.connection.execute(  # the lease runs out while the work stalls ...
            f"UPDATE \"{schema}\".sqlqueue_inflight SET LeaseUntil = LeaseUntil - interval '1 day' WHERE Id = %s",
            (taken_id,),
        )
        with QueueClient.connect(pg_uri) as other:  # ... and another consumer takes the message
            others.extend(other.claim(queue, 5))
        return [str(m["body"]).upper() for m in messages]

    with hold_messages(claimed, sqlqueue_conn_id=conn_id, context=context()) as held:
        assert held.batch(stall) == ["KEPT"]
        assert [m["body"] for m in held.messages] == ["kept"]
    assert [m.text for m in others] == ["taken"]


def test_results_are_grouped_with_the_messages_whose_stage_context_they_continue() -> None:
    from airflow_provider_sqlqueue.tasks import PROCESS_CONTEXT, stage_context, stage_groups

    one, two = "00-" + "a" * 32 + "-" + "1" * 16 + "-01", "00-" + "b" * 32 + "-" + "2" * 16 + "-01"
    recorded = {"queue": "q", "claim_token": "t1", PROCESS_CONTEXT: {"traceparent": one}, "headers": {}}
    sent = {"queue": "q", "claim_token": "t2", "headers": {"traceparent": two}}
    published = {
        "queue": "q",
        "claim_token": "t3",
        "headers": {"traceparent": two, "NServiceBus.OpenTelemetry.StartNewTrace": "True"},
    }
    assert stage_context(recorded) == {"traceparent": one}  # the stage's process span
    assert stage_context(sent) == sent["headers"]  # no task recorded one: the sender's
    assert stage_context(published) is None  # its receive began a new trace: not the publisher's
    assert stage_groups([recorded, sent, published], ["r1", "r2", "r3"]) == [
        ([recorded], ["r1"]),
        ([sent], ["r2"]),
        ([published], ["r3"]),
    ]
    same = {**sent, "claim_token": "t4"}
    assert stage_groups([sent, same], ["r2", "r4"]) == [([sent, same], ["r2", "r4"])]
    assert stage_groups([recorded, sent], ["one result for both"]) == [([recorded, sent], ["one result for both"])]
    assert stage_groups([], ["sent alone"]) == [([], ["sent alone"])]
    assert stage_groups([], []) == []


def test_no_process_context_is_recorded_when_nothing_traces(conn_id, client, queue, schema) -> None:
    from airflow_provider_sqlqueue.tasks import PROCESS_CONTEXT

    client.send(queue, [Message("a")])
    claimed = [m.to_dict(f'orders@"{schema}"') for m in client.claim(queue, 1)]
    claimed[0][PROCESS_CONTEXT] = {"traceparent": "stale, from an earlier try"}
    with hold_messages(claimed, sqlqueue_conn_id=conn_id, context=context()) as held:
        held.map(lambda message: None)
        assert PROCESS_CONTEXT not in held.messages[0]
