"""Unit behaviour of :mod:`airflow_provider_sqlqueue.hooks.sqlqueue` that needs a process of its own."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid

import pytest

pytestmark = pytest.mark.postgres_only

#: Run in a fresh interpreter where ``import pyodbc`` fails as it does on a host without unixODBC.
WITHOUT_ODBC = textwrap.dedent(
    """
    import sys

    class NoOdbc:
        def find_spec(self, name, path=None, target=None):
            if name == "pyodbc":
                raise ImportError("libodbc.so.2: cannot open shared object file: No such file or directory")
            return None

    sys.meta_path.insert(0, NoOdbc())

    import airflow_provider_sqlqueue.cli
    import airflow_provider_sqlqueue.operators.sqlqueue
    import airflow_provider_sqlqueue.plugins.sqlqueue
    import airflow_provider_sqlqueue.sensors.sqlqueue
    import airflow_provider_sqlqueue.triggers.sqlqueue
    from airflow_provider_sqlqueue.hooks.sqlqueue import SqlQueueHook, UnsupportedConnectionError
    from airflow_provider_sqlqueue.transport import Message

    queue = 'orders@"' + sys.argv[1] + '"'
    hook = SqlQueueHook("queue_db")
    hook.create_queue(queue)
    hook.send(queue, Message("without odbc"))
    print("RESULT", [m.text for m in hook.receive(queue, 5)])
    hook.drop_queue(queue)
    try:
        SqlQueueHook("odbc_db").depth(queue)
    except UnsupportedConnectionError as exc:
        print("RESULT odbc:", exc)
    assert "pyodbc" not in sys.modules
    """
)


def test_a_host_without_unixodbc_runs_postgresql_queues_and_says_what_an_odbc_connection_lacks(pg_uri, raw) -> None:
    schema = f"t_{uuid.uuid4().hex[:12]}"
    raw.execute(f'CREATE SCHEMA "{schema}"')
    env = {
        **os.environ,
        "PYTHONPATH": os.getcwd(),
        "AIRFLOW_CONN_QUEUE_DB": pg_uri,
        "AIRFLOW_CONN_ODBC_DB": "odbc://sa:pw@127.0.0.1:1433/test",
    }
    try:
        run = subprocess.run(
            [sys.executable, "-c", WITHOUT_ODBC, schema], capture_output=True, text=True, timeout=300, env=env
        )
    finally:
        raw.execute(f'DROP SCHEMA "{schema}" CASCADE')
    assert run.returncode == 0, run.stderr[-3000:]
    lines = [line.removeprefix("RESULT ") for line in run.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines[0] == "['without odbc']"
    assert lines[1].startswith("odbc: connection 'odbc_db' needs pyodbc") and "unixodbc" in lines[1], lines[1]
