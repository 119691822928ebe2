"""The error queue (:mod:`.operations.error_queue`): a retry routes by FailedQ as NServiceBus writes it."""

from __future__ import annotations

import json
import uuid

from airflow_provider_sqlqueue.transport import QueueAddress
from airflow_provider_sqlqueue.transport import operations as ops
from airflow_provider_sqlqueue.transport.message import FAILED_QUEUE
from tests.operations_script import ERROR, QUEUE_COLUMNS, Script, dialect_with_known_tables, drive


def test_retry_matches_failedq_written_with_the_catalog_and_leaves_what_it_cannot_route():
    d = dialect_with_known_tables("sqlserver")
    ids = [uuid.uuid4() for _ in range(3)]
    rows = [
        (1, ids[0], json.dumps({FAILED_QUEUE: "orders@[sales]@[SHOPDB]", "x": "1"}), b"a"),
        (2, ids[1], json.dumps({"x": "no FailedQ"}), b"b"),
        (3, ids[2], json.dumps({FAILED_QUEUE: "orders@[sales]@[OtherDb]"}), b"c"),
    ]
    script = Script(
        d,
        {
            "error_headers": lambda step: [(seq, headers) for seq, _, headers, _ in rows],
            "error_rows": lambda step: [row for row in rows if row[0] in json.loads(step.params["seqs"])],
            "current_catalog": lambda step: ("ShopDb",),
            "queue_columns": lambda step: QUEUE_COLUMNS["sqlserver"],
            "insert_error": lambda step: 1,  # the retry's insert reports the row it wrote
        },
    )
    page = drive(ops.retry_from_error(d, ERROR, limit=10, scan=10, only_queue=QueueAddress("orders", "sales")), script)
    assert page == ops.RetryPage(1, 3, True)
    [locked] = [step.params["seqs"] for name, step in script.ran if name == "error_rows"]
    assert json.loads(locked) == [1]  # only the row whose FailedQ names the queue is locked and read whole
    inserted = [step.params for name, step in script.ran if name == "insert_error"]
    assert [p["id"] for p in inserted] == [ids[0]]
    assert json.loads(inserted[0]["headers"]) == {"x": "1"}  # failure headers removed
    assert [step.params["seq"] for name, step in script.ran if name == "delete_by_seq"] == [1]
