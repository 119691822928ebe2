"""Airflow's real services -- api-server, scheduler, dag-processor, triggerer -- run as separate processes.

The demo and the end-to-end tests run the example pipelines the way a deployment does: a
LocalExecutor scheduler whose task processes are its children, a triggerer running the sensors'
and watchers' triggers, a dag-processor parsing ``example_dags/``, an api-server serving the UI
and the execution API the tasks talk to, all on a PostgreSQL metadata database of their own.
Each process logs to its own file; :class:`AirflowServices` starts, kills (SIGKILL, to prove
recovery), restarts and stops them. The distributed test runs them with the CeleryExecutor
instead: several schedulers and triggerers, Celery workers started on other hosts (network
namespaces, demo/hosts.py), the api-server bound to an address those hosts reach.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from psycopg.conninfo import conninfo_to_dict, make_conninfo

from . import reaper

SERVICES = ("api-server", "scheduler", "dag-processor", "triggerer")

#: Spark for the example DAGs when no ``spark_default`` is configured: local, with the UI off.
LOCAL_SPARK = {
    "conn_type": "spark",
    "host": "local[2]",
    "extra": {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "4"},
}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def airflow_connection(uri: str, conn_type: str = "postgres", **extra: Any) -> str:
    """An Airflow connection in the JSON form ``AIRFLOW_CONN_*`` takes, for a PostgreSQL URI (socket URIs included).

    Settings beyond host, port, user, password and dbname (``target_session_attrs``,
    ``connect_timeout``, ``sslmode``...) go into the extra, where the hook passes them on to libpq;
    several hosts (``host=a,b``) share the one port an Airflow connection has.
    """
    params = conninfo_to_dict(uri)
    settings = {
        key: value for key, value in params.items() if key not in {"host", "port", "user", "password", "dbname"}
    }
    return json.dumps(
        {
            "conn_type": conn_type,
            "host": params.get("host"),
            "port": int(params["port"]) if params.get("port") else None,
            "login": params.get("user"),
            "password": params.get("password"),
            "schema": params.get("dbname"),
            "extra": settings | extra,
        }
    )


@contextmanager
def metadata_database(pg_uri: str) -> Iterator[str]:
    """A fresh database for Airflow's metadata on the server of ``pg_uri``, dropped afterwards; yields its SQLAlchemy URI."""
    import psycopg

    name = f"sqlqueue_airflow_{secrets.token_hex(4)}"
    with psycopg.connect(pg_uri, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    params = {**conninfo_to_dict(pg_uri), "dbname": name}
    host = params.get("host") or "localhost"
    port = params.get("port") or "5432"
    user = params.get("user") or "postgres"
    password = params.get("password")
    login = user if not password else f"{user}:{password}"
    if host.startswith("/"):  # a socket directory: SQLAlchemy takes it as a query parameter
        uri = f"postgresql+psycopg2://{login}@/{name}?host={host}&port={port}"
    else:
        uri = f"postgresql+psycopg2://{login}@{host}:{port}/{name}"
    try:
        yield uri
    finally:
        with psycopg.connect(pg_uri, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


class AirflowServices:
    """The four Airflow services over one AIRFLOW_HOME, metadata database and DAGs folder.

    :param home: AIRFLOW_HOME (configuration, logs of tasks) and ``services/`` (each service's log).
    :param metadata_uri: SQLAlchemy URI of the metadata database.
    :param queue_uri: the queues' PostgreSQL, as the ``sqlqueue_default`` connection.
    :param dags_folder: the DAGs to run (``example_dags/``).
    :param env: more environment for every service (e.g. ``SQLQUEUE_SCHEMA``): DAG files read it
        when the dag-processor parses them, tasks when the scheduler's LocalExecutor runs them.
    :param spark_connection: ``spark_default`` (local Spark unless given); None leaves it to the
        metadata database, where ``airflow connections`` can change it while the services run.
    :param host: the address the api-server binds to and tasks reach the execution API at: loopback
        for a LocalExecutor, an address the workers' hosts can reach for a distributed executor.
    :param executor: ``LocalExecutor``, or ``CeleryExecutor`` (its broker and result backend in
        ``env``; workers started by :meth:`start_celery_worker`).
    """

    def __init__(
        self,
        home: Path,
        metadata_uri: str,
        queue_uri: str,
        dags_folder: Path,
        *,
        port: int | None = None,
        env: Mapping[str, str] | None = None,
        parallelism: int = 4,
        spark_connection: Mapping[str, Any] | None = LOCAL_SPARK,
        host: str = "127.0.0.1",
        executor: str = "LocalExecutor",
    ) -> None:
        self.home = home
        self.host = host
        self.port = port or free_port()
        self.logs = home / "services"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self._log_files: dict[str, IO[bytes]] = {}
        self.env = {
            **os.environ,
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__EXECUTOR": executor,
            "AIRFLOW__CORE__PARALLELISM": str(parallelism),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": metadata_uri,
            "AIRFLOW__CORE__DAGS_FOLDER": str(dags_folder),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
            "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__API__HOST": host,
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://{host}:{self.port}/execution/",
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(32),
            "AIRFLOW__API__SECRET_KEY": secrets.token_hex(32),
            "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
            "AIRFLOW_CONN_SQLQUEUE_DEFAULT": airflow_connection(queue_uri),
            "PYSPARK_PYTHON": sys.executable,
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            **(env or {}),
        }
        if spark_connection is not None:
            self.env.setdefault("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps(spark_connection))
        else:  # spark_default lives in the metadata database, where `airflow connections` changes it
            self.env.pop("AIRFLOW_CONN_SPARK_DEFAULT", None)
        self.env.pop("AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST", None)  # parse the DAGs folder, nothing else
        self.metadata_uri = metadata_uri

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def airflow(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """Run an ``airflow`` command with the services' settings."""
        return subprocess.run(
            [sys.executable, "-m", "airflow", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=True,
        )

    def migrate(self) -> None:
        self.airflow("db", "migrate")

    def start(
        self,
        name: str,
        *,
        suffix: str = "",
        args: Sequence[str] = (),
        prefix: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start one service (``suffix`` names a second instance, e.g. a second triggerer).

        ``args`` go after the command (``celery worker ...``), ``prefix`` before it (``ip netns exec
        <ns>``: the service runs on another host), ``env`` adds to the services' environment.
        """
        key = name.replace(" ", "-") + suffix
        command = [*prefix, sys.executable, "-m", "airflow", *name.split(), *args]
        if name == "api-server":
            command += ["--workers", "1"]
        log = self._log_files.get(key) or (self.logs / f"{key}.log").open("ab")
        self._log_files[key] = log
        log.write(f"\n===== starting {key} at {time.strftime('%H:%M:%S')} =====\n".encode())
        log.flush()
        # A session of its own: a kill reaches the service and what it started (LocalExecutor workers).
        process = subprocess.Popen(
            command,
            env={**self.env, **(env or {})},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        reaper.track(process.pid)
        reaper.mark("AIRFLOW_HOME", self.env["AIRFLOW_HOME"])  # task processes leave the group: found by it
        self.processes[key] = process
        return process

    def start_celery_worker(
        self, name: str, *, concurrency: int = 2, prefix: Sequence[str] = (), env: Mapping[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        """Start ``airflow celery worker`` as service ``celery-worker-<name>``, Celery hostname
        ``<name>@<this machine>``; ``prefix`` runs it on another host (``ip netns exec <ns>``).

        Its log server is not started: task logs go to the shared AIRFLOW_HOME.
        """
        args = ["--celery-hostname", f"{name}@%h", "--concurrency", str(concurrency), "--skip-serve-logs"]
        return self.start("celery worker", suffix=f"-{name}", args=args, prefix=prefix, env=env)

    def start_all(self, dag_ids: list[str], *, schedulers: int = 1, triggerers: int = 1) -> float:
        """Migrate the metadata database, start the four services -- ``schedulers`` schedulers and
        ``triggerers`` triggerers, the second ones as ``scheduler-2`` and so on -- and wait until
        they are healthy and have parsed ``dag_ids``; returns how long that took, in seconds."""
        started = time.perf_counter()
        self.migrate()
        for name in SERVICES:
            self.start(name)
        for name, count in (("scheduler", schedulers), ("triggerer", triggerers)):
            for n in range(2, count + 1):
                self.start(name, suffix=f"-{n}")
        self.wait_healthy()
        self.wait_for_dags(dag_ids)
        return time.perf_counter() - started

    def kill(self, key: str, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to a service and everything it started, and wait for it to end."""
        process = self.processes[key]
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            pass
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
        reaper.forget(process.pid)

    def stop(self) -> None:
        """Stop every service: SIGTERM, then SIGKILL for what is still running after 20 s."""
        for process in self.processes.values():
            if process.poll() is None:
                try:
                    os.killpg(process.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 20
        for process in self.processes.values():
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                process.wait(timeout=30)
            reaper.forget(process.pid)
        # Task processes (sessions of their own) and their Spark JVMs outlive a stopped scheduler.
        left = reaper.kill_marked("AIRFLOW_HOME", self.env["AIRFLOW_HOME"])
        if left:
            print(f"stopped {left} process(es) the services' tasks had left running")
        for log in self._log_files.values():
            log.close()

    def health(self) -> dict[str, Any]:
        """The api-server's view of the services (``/api/v2/monitor/health``); {} while it is not answering."""
        try:
            with urllib.request.urlopen(f"{self.url}/api/v2/monitor/health", timeout=5) as answer:
                return dict(json.load(answer))
        except (urllib.error.URLError, OSError, ValueError):
            return {}

    def wait_healthy(self, timeout: float = 240) -> None:
        """Wait until the api-server answers and reports the scheduler, dag-processor and triggerer healthy."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for key, process in self.processes.items():
                if process.poll() is not None:
                    raise RuntimeError(
                        f"Airflow {key} exited with {process.returncode}; see {self.logs / (key + '.log')}"
                    )
            state = self.health()
            parts = ("metadatabase", "scheduler", "triggerer", "dag_processor")
            if state and all((state.get(part) or {}).get("status") == "healthy" for part in parts):
                return
            time.sleep(1)
        raise TimeoutError(f"Airflow services not healthy after {timeout:.0f}s: {self.health()}; logs in {self.logs}")

    def metadata(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Rows of a query on the metadata database (what the services recorded: runs, task instances, events)."""
        import psycopg

        uri = self.metadata_uri.replace("postgresql+psycopg2://", "postgresql://")
        if "?host=" in uri:  # socket form
            base, query = uri.split("?", 1)
            options = dict(part.split("=", 1) for part in query.split("&"))
            uri = make_conninfo(base, **options)
        with psycopg.connect(uri, autocommit=True) as connection:
            return connection.execute(sql, params).fetchall()

    def wait_for_dags(self, dag_ids: list[str], timeout: float = 180) -> None:
        """Wait until the dag-processor has parsed and stored these DAGs (unpaused, as configured)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            rows = self.metadata("SELECT dag_id FROM dag WHERE dag_id = ANY(%s) AND NOT is_paused", (dag_ids,))
            if {row[0] for row in rows} == set(dag_ids):
                return
            time.sleep(1)
        raise TimeoutError(f"DAGs {dag_ids} not parsed within {timeout:.0f}s; see {self.logs / 'dag-processor.log'}")

    def log_lines(self, key: str, needle: str) -> list[str]:
        """Lines of a service's log that contain ``needle``."""
        text = (self.logs / f"{key}.log").read_text(errors="replace")
        return [line for line in text.splitlines() if needle in line]
