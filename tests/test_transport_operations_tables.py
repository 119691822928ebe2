"""Installation (:mod:`.operations.tables`): an existing table is checked, never altered."""

from __future__ import annotations

import logging

import pytest

from airflow_provider_sqlqueue.transport import operations as ops
from airflow_provider_sqlqueue.transport.dialects import get_dialect
from tests.operations_script import DIALECTS, QUEUE, QUEUE_COLUMNS, Script, drive


@pytest.mark.parametrize("name", DIALECTS)
def test_the_installer_leaves_an_existing_table_alone_and_warns_of_a_missing_expires_index(name, caplog):
    d = get_dialect(name)
    columns = [*QUEUE_COLUMNS[name], ("extra", "integer")]  # the dialect's queue columns, and more
    script = Script(d, {"queue_columns": lambda step: columns, "has_expires_index": lambda step: (0,)})
    with caplog.at_level(logging.WARNING, logger="airflow_provider_sqlqueue"):
        drive(ops.create_queue(d, QUEUE), script)
    assert script.names() == ["install_lock", "queue_columns", "queue_columns", "has_expires_index"]
    assert d.expires_index_ddl_sql(QUEUE) in caplog.text
