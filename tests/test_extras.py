"""Each driver extra alone, from the wheel, in a clean virtualenv: its driver loads and the library uses it.

``tests/test_packaging.py`` installs the wheel with no extra (where a SQL Server connection is
refused, naming the extra to install) and with every extra at once (at the floors). Here each of
``mssql``, ``odbc`` and ``spark`` is installed on its own, at the newest versions, so an extra that
misses a package only another extra brings is found. Each install takes well under a minute from
uv's cache, which the installs share with ``tests/test_packaging.py``'s (about 1-2 minutes for the
module on an idle machine, on its own xdist worker beside that module).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.test_packaging import uv, wheel_fixture  # noqa: F401 - the fixture wheel, shared

ROOT = Path(__file__).resolve().parents[1]

#: What each extra's install must do, run by the new venv's Python: the driver imports, and a
#: connection of the extra's type gets as far as the database (no server listens on port 1), never
#: to "install the extra".
CHECKS = {
    "mssql": """
        import pymssql
        from airflow.models.connection import Connection
        from airflow_provider_sqlqueue.hooks.sqlqueue import SqlQueueHook
        from airflow_provider_sqlqueue.transport import TransportUnavailableError

        conn = Connection(conn_id="sqlserver", conn_type="mssql", host="127.0.0.1", port=1, login="sa",
                          password="secret-pw", schema="test")
        try:
            SqlQueueHook("sqlserver", connection=conn).client()
        except TransportUnavailableError as exc:
            assert "extra" not in str(exc) and "secret-pw" not in str(exc), exc
        else:
            raise AssertionError("connected to nothing")
    """,
    "odbc": """
        import pyodbc
        from airflow.models.connection import Connection
        from airflow_provider_sqlqueue.hooks.sqlqueue import SqlQueueHook
        from airflow_provider_sqlqueue.transport import TransportMisconfiguredError

        conn = Connection(conn_id="sqlserver", conn_type="odbc", host="127.0.0.1", port=1, login="sa",
                          password="secret-pw", schema="test")
        try:
            SqlQueueHook("sqlserver", connection=conn).client()
        except TransportMisconfiguredError as exc:
            # pyodbc loaded and asked unixODBC's driver manager, which has no driver the connection names.
            assert "unixODBC" in str(exc) and "extra" not in str(exc), exc
        else:
            raise AssertionError("connected through a driver that does not exist")
    """,
    "spark": """
        import pyspark
        from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
        from airflow_provider_sqlqueue.spark import read_queue, register, save_to_queue

        assert pyspark.__version__ == "4.2.0", pyspark.__version__
    """,
}


@pytest.mark.timeout(900)  # an install on a loaded machine
@pytest.mark.parametrize("extra", sorted(CHECKS))
def test_the_extra_alone_installs_its_driver_and_the_library_uses_it(wheel: Path, tmp_path: Path, extra: str) -> None:
    venv = tmp_path / "venv"
    python = venv / "bin" / "python"
    uv("venv", "--quiet", "--python", sys.executable, str(venv))
    uv("pip", "install", "--quiet", "--python", str(python), f"{wheel}[{extra}]", timeout=900)
    listed = uv("pip", "list", "--python", str(python)).stdout.lower()
    others = {"mssql": "pymssql", "odbc": "pyodbc", "spark": "pyspark"}
    assert [name for key, name in others.items() if key != extra and f"\n{name} " in listed] == []
    done = subprocess.run(
        [str(python), "-c", textwrap.dedent(CHECKS[extra])],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env={"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path), "AIRFLOW_HOME": str(tmp_path / "airflow")},
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
