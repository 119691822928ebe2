"""The write ledger (:mod:`.operations.ledger`): a partition recorded before is a re-run that sends nothing."""

from __future__ import annotations

import uuid

import pytest

from airflow_provider_sqlqueue.transport import NotAQueueError, QueueAddress
from airflow_provider_sqlqueue.transport import operations as ops
from tests.operations_script import DIALECTS, LEDGER, Script, dialect_with_known_tables, drive


@pytest.mark.parametrize("name", DIALECTS)
def test_a_partition_recorded_before_is_a_rerun(name):
    d = dialect_with_known_tables(name)
    write = uuid.uuid4()
    assert drive(ops.record_write(d, LEDGER, write, 3), Script(d, {"record_write": lambda step: 1})) is True
    script = Script(d, {"record_write": lambda step: 0})
    assert drive(ops.record_write(d, LEDGER, write, 3), script) is False
    assert script.ran[0][1].params == {"write": write, "part": 3}


@pytest.mark.parametrize("name", DIALECTS)
def test_a_queue_named_as_the_ledger_is_refused_before_anything_is_recorded(name):
    d = dialect_with_known_tables(name)
    columns = [("id", "uuid"), ("headers", "text"), ("body", "bytea")]
    script = Script(d, {"queue_columns": lambda step: columns})
    with pytest.raises(NotAQueueError, match="lacks column"):
        drive(ops.record_write(d, QueueAddress("orders_ledger", "sales"), uuid.uuid4(), 0), script)
    assert script.names() == ["queue_columns"]  # the catalog look only: no ledger statement ran
