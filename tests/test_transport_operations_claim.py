"""Claim mode (:mod:`.operations.claim`) with fixed rows: delivery counts, lapsed claims."""

from __future__ import annotations

import json
import uuid

import pytest

from airflow_provider_sqlqueue.transport import operations as ops
from airflow_provider_sqlqueue.transport.message import DELIVERY_COUNT, FAILED_QUEUE, Failure
from tests.operations_script import DIALECTS, ERROR, QUEUE, Script, dialect_with_known_tables, drive


@pytest.mark.parametrize("name", DIALECTS)
def test_a_claim_delivered_max_deliveries_times_goes_to_the_error_queue_with_its_last_failure(name):
    d = dialect_with_known_tables(name)
    token, message_id = uuid.uuid4(), uuid.uuid4()
    failure = Failure.of(ValueError("bad row 7"), "etl.clean").to_text()
    script = Script(
        d,
        {
            "reclaim": lambda step: [(token, message_id, 0, '{"k":"v"}', b"b", 6, failure, 9)],
            "claim": lambda step: [],
        },
    )
    assert drive(ops.claim(d, QUEUE, ERROR, 1, 60_000, 5, "me"), script) == []
    assert script.names() == ["reclaim", "claim_to_error", "claim"]
    headers = json.loads(script.ran[1][1].params["headers"])
    assert headers["NServiceBus.ExceptionInfo.ExceptionType"] == "builtins.ValueError"
    assert headers["NServiceBus.ExceptionInfo.Message"] == "bad row 7"
    assert headers[FAILED_QUEUE] == d.format_address(QUEUE)
    assert headers[DELIVERY_COUNT] == "5"  # delivered five times before this lapse
    assert script.ran[1][1].params["token"] == token
    assert headers["k"] == "v"


@pytest.mark.parametrize("name", DIALECTS)
def test_a_claim_told_there_are_no_lapsed_claims_skips_looking_for_them(name):
    d = dialect_with_known_tables(name)
    script = Script(d, {"claim": lambda step: []})
    assert drive(ops.claim(d, QUEUE, ERROR, 5, 60_000, 5, "me", reclaim=False), script) == []
    assert script.names() == ["claim"]
    script = Script(d, {"reclaim": lambda step: [], "claim": lambda step: []})
    drive(ops.claim(d, QUEUE, ERROR, 5, 60_000, 5, "me"), script)
    assert script.names() == ["reclaim", "claim"]
