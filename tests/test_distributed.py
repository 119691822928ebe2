"""The Spark chains on a distributed Airflow: CeleryExecutor workers and a Spark cluster on hosts of their own.

Each Celery worker and the Spark standalone cluster (master and worker) run in a network namespace
of their own (demo/hosts.py), reaching everything else over a private subnet only: Redis (the
broker), PostgreSQL (Airflow's metadata database and the queues' database) and the api-server
(the execution API) listen on the bridge's address in this namespace, beside two schedulers, two
triggerers and the dag-processor. Spark is the production recipe's long-lived one: a Spark Connect
server on the cluster's host, its application on the cluster, reached by each Spark task over the
private subnet (``tests/test_spark_cluster_dags.py`` runs the chains with a driver per task). Datasets and outputs are on a
shared directory, as on a shared filesystem.

Faults, each while messages are in the chain and each followed by a count: a worker SIGKILLed in
the middle of a Spark job (its whole share of the work, tasks and drivers included, as in a
crash); a triggerer SIGKILLed right after it reserved messages (the other takes over); a scheduler
SIGKILLed (the other goes on); a worker's network cut for longer than the hand-off lease, then
restored. Every count: each dataset reported exactly once per chain (none lost, none twice), the
error queue and the in-flight store empty.
"""

from __future__ import annotations

import os
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest

from airflow_provider_sqlqueue.transport import QueueAddress, QueueClient
from demo import hosts
from demo.services import AirflowServices, metadata_database
from demo.spark_cluster import CONNECT_APP, SparkCluster
from tests.conftest import EXAMPLE_DAGS
from tests.test_airflow_services import (
    LEASE_SECONDS,
    QUEUES,
    Pipeline,
    inflight_rows,
    new_log_line,
    running_holder,
    wait_recovered,
)
from tests.test_airflow_services import SETTINGS as SERVICES_SETTINGS

pytestmark = pytest.mark.timeout(2400)

#: The services test's shortened lease and failure detection, so that recoveries fit a CI run.
SETTINGS = SERVICES_SETTINGS | {
    # Sending a task to the broker on a loaded machine can take longer than Celery's 1 s default.
    "AIRFLOW__CELERY__OPERATION_TIMEOUT": "15",
}
#: The two chains' files of example_dags/ (the DAGs folder holds links to them, nothing else: the
#: fan-out and streaming examples would only add load here).
DAG_FILES = ("sqlqueue_spark_chain.py", "sqlqueue_spark_events.py", "sqlqueue_stages.py", "spark_jobs.py")
STAGE_DAGS = [
    "sqlqueue_spark_clean",
    "sqlqueue_spark_summarise",
    "sqlqueue_spark_clean_events",
    "sqlqueue_spark_summarise_events",
]
WORKERS = ("w1", "w2")
#: A dead holder's messages are free again within the lease, plus a renewal interval and
#: scheduling on a busy machine.
LIMIT = LEASE_SECONDS + 15


@dataclass
class Distributed:
    """The running deployment, the hosts it runs on, and every dataset sent so far."""

    pipeline: Pipeline
    network: hosts.Network
    spark: SparkCluster
    expected: dict[str, dict[str, Any]] = field(default_factory=dict)
    sent: int = 0

    @property
    def services(self) -> AirflowServices:
        return self.pipeline.services

    def start_worker(self, name: str) -> None:
        host = self.network.hosts[name]
        # The driver of a Spark task runs in the worker's task: the cluster reaches it at this address.
        self.services.start_celery_worker(
            name, concurrency=2, prefix=host.command([]), env={"SPARK_LOCAL_IP": host.address}
        )

    def wait_worker_ready(self, name: str, runs: int = 1, timeout: float = 180) -> None:
        """Wait until the worker's log says it is ready for the ``runs``-th time (once per start)."""
        deadline = time.monotonic() + timeout
        while len(self.services.log_lines(f"celery-worker-{name}", " ready.")) < runs:
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"Celery worker {name} not ready within {timeout:.0f}s; logs in {self.services.logs}"
                )
            time.sleep(1)

    def send(self, count: int) -> None:
        """``count`` datasets into each chain's ingest queue, by plain SQL."""
        for _ in range(count):
            n = self.sent
            self.sent += 1
            for chain, queue in (("s", "ingest"), ("e", "ingest_events")):
                body, figures = self.pipeline.dataset(f"{chain}-{n:02d}", seed=n)
                self.expected[body["dataset"]] = figures
                self.pipeline.insert(queue, body)

    def worker_running(self) -> tuple[str, str, dict[uuid.UUID, tuple[uuid.UUID, str | None, bool]]]:
        """A Celery worker running a Spark task whose run holds claims: (worker, dag_id.task_id, claims)."""
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            task, pid, held = running_holder(self.pipeline, timeout=300)
            for name in WORKERS:
                if self.network.hosts[name].runs(pid):
                    return name, task, held
            time.sleep(0.5)
        raise AssertionError("no Spark task ran on a Celery worker's host")

    def state_of(self, task: str, held: dict[uuid.UUID, tuple[uuid.UUID, str | None, bool]]) -> str:
        """The state of task ``dag_id.task_id`` in the run whose claims ``held`` are (their holder
        is ``dag_id/run_id/task_id#try``)."""
        dag_id, task_id = task.split(".")
        holder = next(h for _, h, _ in held.values() if h)
        run_id = holder.split("/", 1)[1].rsplit("/", 1)[0]
        rows = self.services.metadata(
            "SELECT state FROM task_instance WHERE dag_id = %s AND run_id = %s AND task_id = %s",
            (dag_id, run_id, task_id),
        )
        return str(rows[0][0])

    def succeeded(self, worker: str) -> int:
        """How many Celery tasks the worker's log says it finished (every start of it)."""
        return len(self.services.log_lines(f"celery-worker-{worker}", "succeeded in"))

    def in_flight(self) -> int:
        return len(inflight_rows(self.pipeline))

    def settle(self, what: str) -> None:
        """Wait until every dataset sent is reported and nothing is left anywhere, then count."""
        pipeline, total = self.pipeline, len(self.expected)
        pipeline.wait_until(lambda: len(pipeline.reports()) >= total, 900, f"{total} reports ({what})")
        pipeline.wait_until(
            lambda: sum(pipeline.left().values()) == pipeline.left()["reports"] and self.in_flight() == 0,
            300,
            f"every queue drained ({what})",
        )
        time.sleep(5)  # a duplicate forwarded late would show up now
        reports = pipeline.reports()
        counts = Counter(report.json()["dataset"] for report in reports)
        assert counts == Counter(dict.fromkeys(self.expected, 1))  # every dataset once per chain: none lost, none twice
        for report in reports:
            body = report.json()
            assert body["orders"] == self.expected[body["dataset"]]["valid_orders"]
        left = pipeline.left()
        assert left["error"] == 0 and left["reports"] == total and sum(left.values()) == total
        assert self.in_flight() == 0


@pytest.fixture(scope="module")
def distributed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Distributed]:
    reason = hosts.available()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"the distributed test must run in CI: {reason}")
        pytest.skip(reason)
    home = tmp_path_factory.mktemp("distributed")
    dags = home / "dags"
    dags.mkdir()
    for name in DAG_FILES:
        (dags / name).symlink_to(Path(EXAMPLE_DAGS) / name)
    schema = f"dist_{uuid.uuid4().hex[:8]}"
    with hosts.Network() as network:
        for name in (*WORKERS, "spark"):
            network.add_host(name)
        spark_host = network.hosts["spark"]
        with hosts.postgres_on(network) as admin_uri, hosts.redis_on(network) as redis_url:
            with psycopg.connect(admin_uri, autocommit=True) as admin:
                admin.execute("CREATE DATABASE queues")
            queue_uri = admin_uri.rsplit("/", 1)[0] + "/queues"
            with psycopg.connect(queue_uri, autocommit=True) as connection:
                connection.execute(f'CREATE SCHEMA "{schema}"')
            with QueueClient.connect(queue_uri) as installer:
                for name in QUEUES:
                    installer.create_queue(QueueAddress(name, schema))
            spark = SparkCluster(
                home / "spark", workers=1, cores=6, memory="6g", host=spark_host.address, prefix=spark_host.command([])
            )
            spark.start()
            try:
                remote = spark.start_connect()
                with metadata_database(admin_uri) as metadata_uri:
                    services = AirflowServices(
                        home / "airflow",
                        metadata_uri,
                        queue_uri,
                        dags,
                        env=SETTINGS
                        | {
                            "SQLQUEUE_SCHEMA": schema,
                            "AIRFLOW__CELERY__BROKER_URL": f"{redis_url}/0",
                            "AIRFLOW__CELERY__RESULT_BACKEND": f"{redis_url}/1",
                        },
                        parallelism=8,
                        host=network.address,
                        executor="CeleryExecutor",
                        spark_connection={
                            "conn_type": "spark_connect",
                            "host": spark_host.address,
                            "port": int(remote.rsplit(":", 1)[1]),
                        },
                    )
                    try:
                        seconds = services.start_all(STAGE_DAGS, schedulers=2, triggerers=2)
                        deployment = Distributed(Pipeline(services, queue_uri, schema, home / "data"), network, spark)
                        for name in WORKERS:
                            deployment.start_worker(name)
                        for name in WORKERS:
                            deployment.wait_worker_ready(name)
                        print(f"\ndistributed Airflow up in {seconds:.0f}s (logs: {services.logs})")
                        yield deployment
                    finally:
                        services.stop()
            finally:
                spark.stop()


def test_the_chain_runs_on_celery_workers_and_the_spark_cluster(distributed: Distributed) -> None:
    distributed.send(2)
    distributed.settle("first datasets")
    state = distributed.spark.state()
    # Spark Connect's is the cluster's one application: the four Spark tasks' jobs ran in it, on the
    # cluster's executors (a task's own Spark, local or not, would be an application of its own or none).
    assert [app["name"] for app in state.get("activeapps", [])] == [CONNECT_APP]
    assert state.get("completedapps", []) == []
    ran = {name: len(distributed.services.log_lines(f"celery-worker-{name}", "succeeded in")) for name in WORKERS}
    print(f"tasks each Celery worker ran: {ran}")
    assert sum(ran.values()) >= 8  # at least the four Spark tasks and the four forwards


def test_a_worker_sigkilled_mid_job_loses_nothing(distributed: Distributed) -> None:
    distributed.send(2)
    worker, task, held = distributed.worker_running()
    killed = distributed.network.hosts[worker].crash()  # the worker and its tasks
    distributed.services.kill(f"celery-worker-{worker}")
    assert killed >= 3  # at least the worker, a supervisor and the task
    seconds = wait_recovered(distributed.pipeline, held, LIMIT)
    print(f"worker {worker} killed running {task} holding {len(held)}: free again in {seconds:.1f}s")
    distributed.start_worker(worker)
    distributed.wait_worker_ready(worker, runs=2)
    distributed.settle(f"worker {worker} killed")
    assert distributed.state_of(task, held) == "failed"  # the dead run forwarded nothing: others did


def test_a_triggerer_sigkilled_after_reserving_is_replaced_by_the_other(distributed: Distributed) -> None:
    services = distributed.services
    triggerers = ["triggerer", "triggerer-2"]
    seen = sum(len(services.log_lines(key, "reserved")) for key in triggerers)
    distributed.send(2)
    key, line, _ = new_log_line(services, triggerers, "reserved", seen, timeout=300)
    ids = [uuid.UUID(text.strip(" ,)")) for text in line.split("(ids ", 1)[1].split(")")[0].split(",")]
    held = inflight_rows(distributed.pipeline, ids)
    services.kill(key)
    if held:
        seconds = wait_recovered(distributed.pipeline, held, LIMIT)
        print(f"{key} killed right after reserving {len(held)}: free again in {seconds:.1f}s")
    distributed.settle(f"{key} killed")
    services.start("triggerer", suffix=key.removeprefix("triggerer"))  # two again for what follows


def test_a_scheduler_sigkilled_leaves_the_other_to_go_on(distributed: Distributed) -> None:
    services = distributed.services
    distributed.send(2)
    distributed.worker_running()  # messages in the chain, a task on a worker
    reports_before = len(distributed.pipeline.reports())
    services.kill("scheduler")
    [(killed_at,)] = services.metadata("SELECT now()")
    distributed.pipeline.wait_until(
        lambda: len(distributed.pipeline.reports()) > reports_before, 600, "a report after a scheduler was killed"
    )
    distributed.settle("a scheduler killed")
    # Every task queued since was queued by the scheduler left: one scheduler job, still heartbeating.
    queued_by = services.metadata(
        "SELECT j.id, count(*), max(j.latest_heartbeat) > now() - interval '60 seconds' FROM task_instance t "
        "JOIN job j ON j.id = t.queued_by_job_id WHERE t.queued_dttm > %s GROUP BY j.id",
        (killed_at,),
    )
    print(f"tasks queued after the kill, per scheduler job (id, tasks, alive): {queued_by}")
    assert len(queued_by) == 1 and queued_by[0][1] > 0 and queued_by[0][2]


def test_a_worker_cut_off_for_longer_than_the_lease_sends_nothing_twice(distributed: Distributed) -> None:
    network = distributed.network
    distributed.send(2)
    worker, task, held = distributed.worker_running()
    host = network.hosts[worker]
    finished = distributed.succeeded(worker)
    network.cut(host)
    cut_at = time.monotonic()
    try:
        seconds = wait_recovered(distributed.pipeline, held, LIMIT)
        print(f"worker {worker} cut off running {task} holding {len(held)}: free again in {seconds:.1f}s")
        time.sleep(max(0.0, cut_at + LEASE_SECONDS + 15 - time.monotonic()))  # cut for longer than the lease
    finally:
        network.restore(host)
    print(f"worker {worker} cut off for {time.monotonic() - cut_at:.0f}s")
    distributed.settle(f"worker {worker} cut off")
    print(
        f"the cut-off {task} ended {distributed.state_of(task, held)}; "
        f"worker {worker} finished {distributed.succeeded(worker) - finished} task(s) since the cut"
    )
