"""The package as a user installs it: the wheel alone, in a clean virtualenv, with only its declared dependencies.

The wheel is built from the repository, checked for what it must and must not hold, installed by
itself into a new virtualenv (dependencies resolved afresh from the index, not from uv.lock), and
used there as a newcomer would: the console script, the provider's registration with Airflow, and
a DAG that creates a queue, sends a message and senses it, under ``airflow dags test`` on the test
database.
"""

from __future__ import annotations

import email
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

ROOT = Path(__file__).resolve().parents[1]


def uv(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """uv as .ci/setup.sh installs it (into the system's python3), else the one on PATH."""
    found = subprocess.run(["python3", "-m", "uv", "--version"], capture_output=True, check=False).returncode == 0
    command = ["python3", "-m", "uv"] if found else [shutil.which("uv") or "uv"]
    done = subprocess.run([*command, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT, check=False)
    assert done.returncode == 0, f"uv {' '.join(args)}:\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    uv("build", "--wheel", "--out-dir", str(out))
    [built] = out.glob("airflow_provider_sqlqueue-*.whl")
    return built


def test_the_wheel_holds_the_package_its_license_and_honest_metadata(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = email.message_from_string(
            archive.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        )
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert "airflow_provider_sqlqueue/py.typed" in names
    assert not [n for n in names if n.split("/")[0] in ("tests", "example_dags", "bench", "demo", "docs")]
    assert metadata["License-Expression"] == "Apache-2.0"
    assert "Framework :: Apache Airflow :: Provider" in metadata.get_all("Classifier")
    assert metadata.get_all("Provides-Extra") == ["spark"]  # the test tools are a dependency group, not an extra
    tested = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert metadata["Requires-Python"] == f">={tested}"  # the floor is what the suite runs on
    assert f"Programming Language :: Python :: {tested}" in metadata.get_all("Classifier")


SMOKE_DAG = """
from datetime import datetime

from airflow.sdk import DAG

from airflow_provider_sqlqueue.operators.sqlqueue import CreateQueueOperator, SendMessageOperator
from airflow_provider_sqlqueue.sensors.sqlqueue import SqlQueueSensor

with DAG("sqlqueue_smoke", start_date=datetime(2026, 1, 1), schedule=None, catchup=False):
    (
        CreateQueueOperator(task_id="create", queue_name={queue})
        >> SendMessageOperator(task_id="send", queue_name={queue}, body="hello from a clean install")
        >> SqlQueueSensor(task_id="sense", queue_name={queue}, transaction_mode="none", poke_interval=1, timeout=120)
    )
"""


def test_the_wheel_alone_installs_registers_and_runs_a_dag_in_a_clean_virtualenv(
    wheel: Path, tmp_path: Path, pg_uri: str, schema: str
) -> None:
    venv = tmp_path / "venv"
    uv("venv", "--quiet", "--python", sys.executable, str(venv))
    uv("pip", "install", "--quiet", "--python", str(venv / "bin" / "python"), str(wheel), timeout=900)
    home, dags = tmp_path / "airflow", tmp_path / "dags"
    dags.mkdir()
    (dags / "smoke.py").write_text(textwrap.dedent(SMOKE_DAG).replace("{queue}", repr(f'orders@"{schema}"')))
    env = {
        "PATH": f"{venv / 'bin'}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW_CONN_SQLQUEUE_DEFAULT": pg_uri,
    }

    def run(*command: str) -> str:
        done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
        assert done.returncode == 0, f"{' '.join(command)}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        return done.stdout

    assert run("sqlqueue", "--version").strip().startswith("sqlqueue ")
    assert "sqlqueue" in run("sqlqueue", "--help")
    run("airflow", "db", "migrate")
    assert "airflow-provider-sqlqueue" in run("airflow", "providers", "list")
    run("airflow", "dags", "test", "sqlqueue_smoke")
    with psycopg.connect(pg_uri, autocommit=True) as connection:
        waiting = connection.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(schema, "orders")))
        assert waiting.fetchone() == (0,)  # created, sent, and taken by the sensor
    assert os.path.isdir(venv / "lib")
