"""The package as a user installs it: the wheel alone, in a clean virtualenv, with only its declared dependencies.

The wheel is built from the repository, checked for what it must and must not hold, installed by
itself into a new virtualenv (dependencies resolved afresh from the index, not from uv.lock), and
used there as a newcomer would: the console script, the provider's registration with Airflow, and
a DAG that creates a queue, sends a message and senses it, under ``airflow dags test`` on the test
database. That install is made twice: with the newest versions the declared ranges allow, and with
uv's ``lowest-direct`` resolution, which takes every declared dependency at its floor. The floors'
install also runs the transport's and the Airflow layer's unit suites (the suite's own test
modules, with the installed dependencies), so a floor that is declared is a floor that is tested.
The newest versions' install also runs docs/quickstart.md's blocks as the page gives them, in one
shell (about a minute more): its connection made by ``airflow connections add``, its deferrable
sensor's trigger waiting on an empty queue under ``airflow dags test`` until a message comes.
"""

from __future__ import annotations

import contextlib
import email
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import psycopg
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version
from psycopg import sql

ROOT = Path(__file__).resolve().parents[1]


#: The suites the floors' install runs: the transport on PostgreSQL, and the hook, trigger, sensor
#: and operators under Airflow, and the Spark data source outside Spark (what an older dependency could break).
FLOOR_SUITES = (
    "tests/test_transport_client.py",
    "tests/test_transport_drivers_postgres.py",
    "tests/test_queue_behaviour.py",
    "tests/test_hooks_sqlqueue.py",
    "tests/test_triggers_sqlqueue.py",
    "tests/test_sensors_sqlqueue.py",
    "tests/test_operators_sqlqueue.py",
    "tests/test_spark_options.py",
    "tests/test_spark_read.py",
    "tests/test_spark_stream.py",
    "tests/test_spark_write.py",
)
#: What those suites import beyond the package (the dev group's tools, at their declared floors).
TEST_TOOLS = ("pytest>=8.3", "pytest-asyncio>=0.25", "pytest-timeout>=2.3", "hypothesis>=6.100", "sqlglot>=26")


def uv(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """uv from the dev group, installed beside this interpreter."""
    command = [str(Path(sys.executable).with_name("uv"))]
    done = subprocess.run([*command, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT, check=False)
    assert done.returncode == 0, f"uv {' '.join(args)}:\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module", name="wheel")  # a name of its own: tests/test_extras.py imports it
def wheel_fixture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built once per module from this checkout."""
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
    # SQL Server's drivers are extras; the test tools are a dependency group, not an extra.
    assert metadata.get_all("Provides-Extra") == ["mssql", "odbc", "otel", "spark"]
    core = {r.name for r in map(Requirement, metadata.get_all("Requires-Dist")) if r.marker is None}
    assert not core & {"pymssql", "pyodbc", "apache-airflow-providers-microsoft-mssql", "apache-airflow-providers-odbc"}
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


#: Every extra the wheel has: the floors' install takes them all, so every declared floor is installed.
EXTRAS = ("mssql", "odbc", "otel", "spark")


def requirements(wheel: Path, extras: tuple[str, ...] = ()) -> list[str]:
    """The dependencies the wheel declares, with those of ``extras``, as requirement lines without markers."""
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = email.message_from_string(archive.read(name).decode())
    lines = []
    for requirement in map(Requirement, metadata.get_all("Requires-Dist")):
        marker = requirement.marker
        if marker is None or any(marker.evaluate({"extra": extra}) for extra in extras):
            extras = f"[{','.join(sorted(requirement.extras))}]" if requirement.extras else ""
            lines.append(f"{requirement.name}{extras}{requirement.specifier}")
    return lines


def floors(wheel: Path, extras: tuple[str, ...] = ()) -> dict[str, Version]:
    """The lower bound of each dependency the wheel declares (a pin is its own floor)."""
    found = {}
    for requirement in map(Requirement, requirements(wheel, extras)):
        [floor] = [spec.version for spec in requirement.specifier if spec.operator in (">=", "==")]
        found[canonicalize_name(requirement.name)] = Version(floor)
    return found


def newest_python(wheel: Path) -> str:
    """The interpreter of the newest Python version the wheel's classifiers declare, on this
    machine's PATH or under pyenv; the test is skipped, saying so, where it has none."""
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = email.message_from_string(archive.read(name).decode())
    versions = [
        c.rsplit(" :: ", 1)[1]
        for c in metadata.get_all("Classifier")
        if c.startswith("Programming Language :: Python :: 3.")
    ]
    newest = max(versions, key=Version)
    candidates = [str(p) for p in sorted(Path.home().glob(f".pyenv/versions/{newest}*/bin/python{newest}"))]
    on_path = shutil.which(f"python{newest}")  # may be a pyenv shim that does not run
    for candidate in [*candidates, *([on_path] if on_path else [])]:
        if subprocess.run([candidate, "-c", "pass"], capture_output=True, timeout=60, check=False).returncode == 0:
            return candidate
    pytest.skip(f"no Python {newest} here (the newest the package declares) to install the newest versions on")


#: The quick start's install block, line by line: the lines the test's venv stands for (it holds the
#: wheel built from this checkout, installed with its dependencies as ``pip install .`` does), and
#: the one it runs.
QUICK_START_INSTALL = {
    "git clone <repository-url> airflow-provider-sqlqueue": None,
    "cd airflow-provider-sqlqueue": None,
    "python3 -m venv .venv": None,
    ". .venv/bin/activate": ". .venv/bin/activate",
    "pip install .": None,
}
#: What ``airflow dags test`` logs when a task has deferred and it runs the trigger in its process.
TRIGGER_RUNS = "[DAG TEST] running trigger in line"


def quick_start_script(pg_uri: str, schema: str) -> str:
    """docs/quickstart.md as a shell script: its blocks in order, as a reader runs them in one shell,
    then its last step (another message, the DAG again) with the sensor deferred on an empty queue first.

    The blocks are the page's own (a change to the page changes what runs): the install block's
    lines stand for the test's venv (:data:`QUICK_START_INSTALL`), the database and schema are this
    test's, and the connection is the one ``airflow connections add`` makes, not an ``AIRFLOW_CONN_*``.
    """
    from tests.test_docs import FENCE, MARKER

    text = (ROOT / "docs" / "quickstart.md").read_text(encoding="utf-8")
    blocks = []
    for match in FENCE.finditer(text):
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = MARKER.search(before)
        blocks.append((match["lang"], match["code"], marker["arg"] if marker and marker["kind"] == "dag" else None))
    assert [lang for lang, _, _ in blocks] == ["bash", "bash", "python", "python", "bash", "python", "bash"], blocks
    (_, install, _), (_, where, _), (_, first, _), (_, second, _), (_, airflow, _), (_, dag, dag_id), (_, run, _) = (
        blocks
    )
    assert list(install.splitlines()) == list(QUICK_START_INSTALL), install
    assert (
        dag_id == "first_sensor" and "dags/first_sensor.py" in text and run.strip() == "airflow dags test first_sensor"
    )

    def python(code: str) -> str:
        return f"python - <<'QUICK_START_PY'\n{code}QUICK_START_PY\n"

    return "\n".join(
        [
            "set -euo pipefail",
            *[line for line in QUICK_START_INSTALL.values() if line],
            where,
            f"export SQLQUEUE_CONN={pg_uri!r} SQLQUEUE_SCHEMA={schema!r}  # this test's database and schema",
            python(first),
            python(second),
            airflow,
            "cat > dags/first_sensor.py <<'QUICK_START_DAG'",
            dag + "QUICK_START_DAG",
            run,
            # "Send another message (step 3) and run the DAG again", the run first: its sensor finds
            # the queue empty and defers, and the message is sent while the trigger waits.
            "airflow dags test first_sensor > again.log 2>&1 &",
            "again=$!",
            f"until grep -qF {TRIGGER_RUNS!r} again.log; do kill -0 $again || {{ cat again.log; exit 1; }}; sleep 1; done",
            python(first),
            "wait $again || { cat again.log; exit 1; }",
        ]
    )


def run_quick_start(venv: Path, tmp_path: Path, pg_uri: str, schema: str) -> None:
    """docs/quickstart.md in a folder of its own, its ``.venv`` the test's venv; every process it
    starts is in one process group, stopped at the end whatever happened."""
    folder = tmp_path / "quickstart"
    folder.mkdir()
    (folder / ".venv").symlink_to(venv)
    script = folder / "quickstart.sh"
    script.write_text(quick_start_script(pg_uri, schema), encoding="utf-8")
    shell = subprocess.Popen(
        ["bash", str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=folder,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},  # no AIRFLOW_* : the page sets what it needs
        start_new_session=True,
    )
    try:
        output, _ = shell.communicate(timeout=900)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(shell.pid, signal.SIGTERM)  # a background run left by a failed step
        shell.wait()
    assert shell.returncode == 0, output[-6000:]
    assert "airflow-provider-sqlqueue" in output  # `airflow providers list | grep sqlqueue`
    again = (folder / "again.log").read_text()
    assert "received " in output and TRIGGER_RUNS in again and "{'hello': 'world'}" in again  # `show` printed each
    with psycopg.connect(pg_uri, autocommit=True) as connection:
        waiting = connection.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(schema, "greetings")))
        assert waiting.fetchone() == (0,)  # each run received and acknowledged what was waiting


def installed(python: Path) -> dict[str, Version]:
    listed = json.loads(uv("pip", "list", "--format", "json", "--python", str(python)).stdout)
    return {canonicalize_name(item["name"]): Version(item["version"]) for item in listed}


@pytest.mark.timeout(900)  # resolving and installing a venv takes minutes on a loaded machine (300 s was cut short)
@pytest.mark.parametrize("resolution", ["highest", "lowest-direct"])
def test_the_wheel_alone_installs_registers_and_runs_a_dag_in_a_clean_virtualenv(
    wheel: Path, tmp_path: Path, pg_uri: str, schema: str, resolution: str
) -> None:
    venv = tmp_path / "venv"
    python = venv / "bin" / "python"
    # The floors on the oldest Python the package declares (the suite's), the newest versions on the newest.
    uv(
        "venv",
        "--quiet",
        "--python",
        sys.executable if resolution == "lowest-direct" else newest_python(wheel),
        str(venv),
    )
    install = ("pip", "install", "--quiet", "--resolution", resolution, "--python", str(python))
    if resolution == "highest":
        uv(*install, str(wheel), timeout=900)
    else:
        # lowest-direct lowers what the command names: the wheel's declared dependencies (with every
        # extra's) are named too. A floor written as a series (psycopg 3.3) may resolve to a
        # later release of that series where the first has no wheel for this platform.
        declared = tmp_path / "declared.txt"
        declared.write_text("".join(f"{line}\n" for line in requirements(wheel, EXTRAS)))
        uv(*install, f"{wheel}[{','.join(EXTRAS)}]", "-r", str(declared), timeout=900)
        lowest, versions = floors(wheel, EXTRAS), installed(python)
        assert {n: versions[n].release[: len(f.release)] for n, f in lowest.items()} == {
            n: f.release for n, f in lowest.items()
        }
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

    if resolution == "highest":  # the wheel alone: no SQL Server driver, and a clear word where one is needed
        assert not {"pymssql", "pyodbc"} & set(installed(python))
        refused = subprocess.run(
            ["sqlqueue", "health", "--conn", "mssql://sa:secret-pw@127.0.0.1:1433/test"],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
            cwd=tmp_path,
            check=False,
        )
        assert refused.returncode == 1 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
        assert "airflow-provider-sqlqueue[mssql]" in refused.stderr and "secret-pw" not in refused.stderr
    assert run("sqlqueue", "--version").strip().startswith("sqlqueue ")
    assert "sqlqueue" in run("sqlqueue", "--help")
    run("airflow", "db", "migrate")
    assert "airflow-provider-sqlqueue" in run("airflow", "providers", "list")
    run("airflow", "dags", "test", "sqlqueue_smoke")
    with psycopg.connect(pg_uri, autocommit=True) as connection:
        waiting = connection.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(schema, "orders")))
        assert waiting.fetchone() == (0,)  # created, sent, and taken by the sensor
    assert os.path.isdir(venv / "lib")
    if resolution == "highest":
        run_quick_start(venv, tmp_path, pg_uri, schema)
    if resolution == "lowest-direct":
        before = installed(python)
        uv("pip", "install", "--quiet", "--python", str(python), *TEST_TOOLS, timeout=900)
        after = installed(python)
        assert {n: after[n] for n in lowest} == {n: before[n] for n in lowest}  # the tools moved no floor
        suites = subprocess.run(
            [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", *FLOOR_SUITES],
            capture_output=True,
            text=True,
            timeout=1200,
            cwd=ROOT,
            # Airflow's settings of this run stay out: the suites' conftest gives them a home of their own.
            env={k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")} | {"SQLQUEUE_TEST_PG_URI": pg_uri},
            check=False,
        )
        assert suites.returncode == 0, suites.stdout[-5000:] + suites.stderr[-2000:]
        assert " passed" in suites.stdout.splitlines()[-1]
