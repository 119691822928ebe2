"""A standalone Spark cluster on this machine, from the installed PySpark distribution.

A master, workers and (optionally) a Spark Connect server, each its own JVM started with
``spark-class`` as a cluster's hosts start them. Executors run Python with this interpreter, so the
project and its drivers are importable there as they must be on a real cluster's workers.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from . import reaper
from .services import free_port

#: The application name of a Spark Connect server started here, as the cluster's master lists it.
CONNECT_APP = "Spark Connect server"
#: PostgreSQL's JDBC driver as Debian packages it (libpostgresql-jdbc-java): given to the Spark
#: Connect server where it is installed, so that locked batches are read by Spark's JDBC reader.
JDBC_JAR = Path("/usr/share/java/postgresql.jar")


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


class SparkCluster:
    """``with SparkCluster(workdir) as cluster:`` a master and ``workers`` workers on 127.0.0.1.

    ``host`` and ``prefix`` put the cluster on another host (demo/hosts.py): its daemons are started
    with ``prefix`` before their command (``ip netns exec <ns>``) and bind to ``host``, the address
    drivers and the master's web UI are reached at.
    """

    def __init__(
        self,
        workdir: Path,
        *,
        workers: int = 1,
        cores: int = 4,
        memory: str = "3g",
        host: str = "127.0.0.1",
        prefix: Sequence[str] = (),
    ) -> None:
        self.workdir = workdir
        self.host = host
        self.prefix = list(prefix)
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self.port = free_port()
        self.ui_port = free_port()
        self.connect_port: int | None = None
        self.processes: list[subprocess.Popen[bytes]] = []
        self._logs: list[IO[bytes]] = []
        self.env = {
            **os.environ,
            "SPARK_HOME": str(spark_home()),
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
            "SPARK_LOCAL_IP": host,
            "SPARK_LOCAL_DIRS": str(workdir / "local"),
            "SPARK_WORKER_DIR": str(workdir / "work"),
            "SPARK_LOG_DIR": str(workdir / "logs"),
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        }

    @property
    def master(self) -> str:
        """The master URL an application (or ``spark_default``'s host) uses."""
        return f"spark://{self.host}:{self.port}"

    @property
    def remote(self) -> str | None:
        """The Spark Connect URL, once :meth:`start_connect` has started the server."""
        return None if self.connect_port is None else f"sc://{self.host}:{self.connect_port}"

    def session(self, app: str, conf: Mapping[str, str] | None = None) -> Any:
        """A SparkSession of this process on the cluster: two executor cores of 1 GiB unless ``conf`` says otherwise."""
        from pyspark.sql import SparkSession

        os.environ["PYSPARK_PYTHON"] = sys.executable  # Python workers beside the driver plan data source reads
        settings = {
            "spark.ui.enabled": "false",
            "spark.cores.max": "2",
            "spark.executor.memory": "1g",
            "spark.pyspark.python": sys.executable,
            **(conf or {}),
        }
        builder = SparkSession.builder.master(self.master).appName(app)
        for key, value in settings.items():
            builder = builder.config(key, value)
        return builder.getOrCreate()

    def _spawn(self, name: str, program: str, *args: str) -> subprocess.Popen[bytes]:
        (self.workdir / "logs").mkdir(parents=True, exist_ok=True)
        log = (self.workdir / "logs" / f"{name}.log").open("ab")
        self._logs.append(log)
        command = [*self.prefix, str(spark_home() / "bin" / program), *args]
        process = subprocess.Popen(
            command, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=self.workdir
        )
        reaper.track(process.pid)
        self.processes.append(process)
        return process

    def state(self) -> dict[str, Any]:
        """The master's view of the cluster (its web UI's JSON)."""
        with urllib.request.urlopen(f"http://{self.host}:{self.ui_port}/json/", timeout=5) as reply:
            return json.load(reply)  # type: ignore[no-any-return]

    def start(self, timeout: float = 120) -> SparkCluster:
        self._spawn(
            "master",
            "spark-class",
            "org.apache.spark.deploy.master.Master",
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--webui-port",
            str(self.ui_port),
        )
        for n in range(self.workers):
            self._spawn(
                f"worker-{n}",
                "spark-class",
                "org.apache.spark.deploy.worker.Worker",
                "--host",
                self.host,
                "--cores",
                str(self.cores),
                "--memory",
                self.memory,
                "--webui-port",
                str(free_port()),
                self.master,
            )

        def up() -> bool:
            return len([w for w in self.state().get("workers", []) if w.get("state") == "ALIVE"]) >= self.workers

        self._wait_for(up, timeout, "the Spark cluster did not come up", pause=0.5)
        return self

    def start_connect(self, timeout: float = 180) -> str:
        """Start a Spark Connect server whose applications run on this cluster; returns its URL."""
        self._start_connect(self.master, {"spark.cores.max": "2", "spark.executor.memory": "1g"}, timeout)
        return f"sc://{self.host}:{self.connect_port}"

    def _start_connect(self, master: str, conf: Mapping[str, str], timeout: float) -> None:
        """Start ``SparkConnectServer`` on ``master`` with ``conf``; :attr:`connect_port` once it listens.

        One JVM that outlives the applications' sessions: a client's ``session.stop()`` ends its own
        session, not the server, so a task pays for a gRPC connection instead of a JVM's start.
        """
        port = free_port()
        settings = {"spark.connect.grpc.binding.port": str(port), "spark.ui.enabled": "false", **conf}
        options = [item for key, value in settings.items() for item in ("--conf", f"{key}={value}")]
        self._spawn(
            "connect",
            "spark-submit",
            "--class",
            "org.apache.spark.sql.connect.service.SparkConnectServer",
            "--name",
            CONNECT_APP,
            "--master",
            master,
            *(("--jars", str(JDBC_JAR)) if JDBC_JAR.exists() else ()),
            *options,
            "spark-internal",
        )

        def listening() -> bool:
            with socket.create_connection((self.host, port), timeout=1):
                return True

        self._wait_for(listening, timeout, "Spark Connect did not listen")
        self.connect_port = port

    def _wait_for(self, ready: Callable[[], bool], timeout: float, failure: str, pause: float = 1) -> None:
        """Wait until ``ready()`` (an OSError counts as not yet), while every daemon stays alive."""
        deadline = time.monotonic() + timeout
        while True:
            self._check_alive()
            try:
                if ready():
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{failure} in {timeout:.0f} s; logs in {self.workdir}/logs")
            time.sleep(pause)

    def _check_alive(self) -> None:
        for process in self.processes:
            if process.poll() is not None:
                raise RuntimeError(f"{process.args} exited with {process.returncode}; logs in {self.workdir}/logs")

    def stop(self) -> None:
        for process in reversed(self.processes):
            if process.poll() is None:
                try:
                    os.killpg(process.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for process in self.processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                process.wait(timeout=20)
            reaper.forget(process.pid)
        for log in self._logs:
            log.close()

    def __enter__(self) -> SparkCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class SparkConnect(SparkCluster):
    """``with SparkConnect(workdir) as connect:`` one Spark Connect server running its jobs in ``local[cores]``.

    The long-lived Spark of a single host: Airflow tasks whose ``spark_default`` is
    :meth:`connection` share its JVM instead of starting one each.
    """

    def __init__(self, workdir: Path, *, cores: int = 2, host: str = "127.0.0.1") -> None:
        super().__init__(workdir, workers=0, cores=cores, host=host)

    def start(self, timeout: float = 180) -> SparkConnect:
        self._start_connect(f"local[{self.cores}]", {"spark.sql.shuffle.partitions": str(self.cores)}, timeout)
        return self

    def __enter__(self) -> SparkConnect:
        return self.start()

    def connection(self) -> dict[str, Any]:
        """``spark_default`` as an Airflow connection that sends each task's jobs to this server."""
        return {"conn_type": "spark_connect", "host": self.host, "port": self.connect_port}
