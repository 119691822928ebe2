"""The example DAGs on a real standalone Spark cluster under Airflow's real services (api-server,
scheduler, dag-processor, triggerer): the chain and the streaming example with ``spark_default``
pointing at the cluster's master, then at Spark Connect on it. A stack of its own
(``tests/parallel.py``): the services and the cluster keep a 2-core machine busy.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from airflow_provider_sqlqueue.transport import Message, QueueAddress, QueueClient
from demo.data import insert_like_an_outside_sender, write_orders
from demo.services import AirflowServices, metadata_database
from demo.spark_cluster import SparkCluster
from tests.conftest import EXAMPLE_DAGS

pytestmark = pytest.mark.timeout(1800)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    # Cores are shared out by applications (Airflow's tasks, Spark Connect's), not by the machine's two CPUs.
    with SparkCluster(tmp_path_factory.mktemp("spark-cluster"), cores=6, memory="6g") as running:
        yield running


def spark_apps(cluster: SparkCluster) -> list[str]:
    state = cluster.state()
    return [app["name"] for app in state.get("activeapps", []) + state.get("completedapps", [])]


def test_example_dags_run_on_the_cluster_by_changing_only_spark_default(cluster, pg_uri, tmp_path_factory):
    """The chain and the streaming example under the real services, Spark on the cluster; then the
    chain again with spark_default pointing at Spark Connect."""
    schema = f"cl_{uuid.uuid4().hex[:8]}"
    home = tmp_path_factory.mktemp("airflow-cluster")
    data = home / "data"
    names = ("ingest", "cleaned", "reports", "order_events", "order_revenue")
    with psycopg.connect(pg_uri, autocommit=True) as admin:
        admin.execute(f'CREATE SCHEMA "{schema}"')
    with QueueClient.connect(pg_uri) as installer:
        for name in names:
            installer.create_queue(QueueAddress(name, schema))
        for n in range(2_000):  # order events waiting for the streaming example's first run
            installer.send(
                QueueAddress("order_events", schema),
                Message.of({"order_id": f"e{n}", "country": "DE", "quantity": 2, "unit_price": 1.25}),
            )
    connection = {
        "conn_type": "spark",
        "host": cluster.master,
        "extra": {"spark.ui.enabled": "false", "spark.cores.max": "2", "spark.executor.memory": "1g"},
    }
    env = {
        "SQLQUEUE_SCHEMA": schema,
        "SQLQUEUE_CHECKPOINTS": str(home / "checkpoints"),
        "SQLQUEUE_LEASE_SECONDS": "60",
    }

    def depth(name: str) -> int:
        with QueueClient.connect(pg_uri) as client:
            return client.depth(QueueAddress(name, schema))

    def wait(done: Callable[[], bool], what: str, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            assert time.monotonic() < deadline, f"{what} within {timeout:.0f}s; logs in {home}/services"
            time.sleep(2)

    def run_chain(dataset: str, seed: int) -> dict:
        path = data / f"{dataset}.csv"
        expected = write_orders(path, rows=500, seed=seed)
        reports = depth("reports")
        with psycopg.connect(pg_uri, autocommit=True) as raw:
            body = {"dataset": dataset, "path": str(path), "output_root": str(data / "out")}
            insert_like_an_outside_sender(raw, schema, "ingest", body)
        wait(lambda: depth("reports") > reports, f"the report of {dataset}")
        with QueueClient.connect(pg_uri) as client:
            [report] = [
                m.json() for m in client.browse(QueueAddress("reports", schema), 100) if m.json()["dataset"] == dataset
            ]  # type: ignore[index]
        assert report["orders"] == expected["valid_orders"]
        return report

    try:
        with metadata_database(pg_uri) as metadata_uri:
            services = AirflowServices(home, metadata_uri, pg_uri, Path(EXAMPLE_DAGS), env=env, spark_connection=None)
            try:
                services.migrate()
                services.airflow("connections", "add", "spark_default", "--conn-json", json.dumps(connection))
                services.start_all(["sqlqueue_spark_clean", "sqlqueue_spark_summarise", "sqlqueue_spark_stream"])
                run_chain("on-cluster", seed=11)
                wait(lambda: depth("order_revenue") == 2_000, "the streaming example's 2,000 revenue events")
                apps = spark_apps(cluster)
                assert {"sqlqueue_spark_clean-clean", "sqlqueue_spark_summarise-summarise"} <= set(apps)
                assert "sqlqueue_spark_stream-relay" in apps

                remote = cluster.start_connect()
                services.airflow("connections", "delete", "spark_default")
                port = remote.rsplit(":", 1)[1]
                services.airflow(
                    "connections", "add", "spark_default", "--conn-type", "spark_connect",
                    "--conn-host", "127.0.0.1", "--conn-port", port,
                )  # fmt: skip
                before = spark_apps(cluster).count("sqlqueue_spark_clean-clean")
                run_chain("through-connect", seed=12)
                # No new application: the job ran in Spark Connect's.
                assert spark_apps(cluster).count("sqlqueue_spark_clean-clean") == before
                assert depth("ingest") == depth("cleaned") == 0 and depth("reports") == 2

                # The streaming example through Connect, from the checkpoint the cluster run left.
                more = [
                    Message.of({"order_id": f"c{n}", "country": "FR", "quantity": 1, "unit_price": 3.0})
                    for n in range(1_000)
                ]
                with QueueClient.connect(pg_uri) as client:
                    client.send(QueueAddress("order_events", schema), more)
                services.airflow("dags", "trigger", "sqlqueue_spark_stream")
                wait(lambda: depth("order_revenue") == 3_000, "1,000 more revenue events through Spark Connect")

                def settled() -> bool:  # the run's source acknowledges its last batch after the sink wrote it
                    with QueueClient.connect(pg_uri) as client:
                        return client.in_flight(QueueAddress("order_events", schema)) == 0

                wait(settled, "the streaming run's last claims acknowledged")
                with QueueClient.connect(pg_uri) as client:
                    revenue = client.browse(QueueAddress("order_revenue", schema), 10_000)
                    assert len({m.json()["order_id"] for m in revenue}) == 3_000  # type: ignore[index]
            finally:
                services.stop()
    finally:
        with psycopg.connect(pg_uri, autocommit=True) as admin:
            admin.execute(f'DROP SCHEMA "{schema}" CASCADE')
