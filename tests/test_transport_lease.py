"""Unit behaviour of :mod:`airflow_provider_sqlqueue.transport.lease`: claims kept alive while their holder works."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest

from airflow_provider_sqlqueue.transport import LeaseKeeper, Message, QueueAddress, QueueClient
from airflow_provider_sqlqueue.transport.errors import InvalidArgumentError


def test_a_keeper_renews_claims_while_the_block_runs(pg_uri: str, client: QueueClient, queue: QueueAddress) -> None:
    client.send(queue, Message("slow work"))
    [message] = client.claim(queue, lease=timedelta(seconds=3))
    with LeaseKeeper(
        lambda: QueueClient.connect(pg_uri), {str(queue): [message.claim_token]}, timedelta(seconds=3)
    ) as keeper:
        time.sleep(4)  # past the first lease: only renewals keep the claim
        assert keeper.renewals >= 2 and keeper.held[str(queue)] == {message.claim_token}
    assert client.claims(queue)[0].lease_left > timedelta(
        seconds=2
    )  # renewed once more on the way out: the next step has a whole lease
    assert client.ack(queue, [message.claim_token]) == {message.claim_token}


def test_a_claim_someone_else_took_is_dropped_and_reported(
    pg_uri: str, client: QueueClient, queue: QueueAddress
) -> None:
    client.send(queue, Message("x"))
    [message] = client.claim(queue, lease=timedelta(milliseconds=50))
    time.sleep(0.2)
    [again] = client.claim(queue)  # the lease ran out: another consumer has it now
    with LeaseKeeper(lambda: QueueClient.connect(pg_uri), {str(queue): [message.claim_token]}) as keeper:
        assert keeper.held[str(queue)] == set() and keeper.lost[str(queue)] == {message.claim_token}
    assert again.id == message.id


@pytest.mark.parametrize("lease", [timedelta(0), timedelta(milliseconds=1), 0.999])
def test_a_keeper_refuses_a_lease_too_short_to_renew(pg_uri: str, lease: timedelta | float) -> None:
    """Renewing every third of a millisecond lease cannot keep up: another consumer would take the
    claim while its holder still works (a pump, hold_messages and the triggers refuse it too)."""
    with pytest.raises(InvalidArgumentError, match="lease must be"):
        LeaseKeeper(lambda: QueueClient.connect(pg_uri), {}, lease)
    assert LeaseKeeper(lambda: QueueClient.connect(pg_uri), {}, 1).lease == timedelta(seconds=1)
