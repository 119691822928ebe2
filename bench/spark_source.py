"""The ``sqlqueue`` data source on a standalone Spark cluster, beside the plain helpers and JDBC.

One cluster (a master and a worker from the PySpark distribution), one application with two
executor cores, one PostgreSQL. The same 200,000 rows (``n``, ``name``, ``amount``) are

- written as messages by ``save_to_queue`` (the JVM path: each message built by Spark's SQL
  engine, each partition loaded by COPY from Arrow's CSV in one transaction with its ledger row),
  by the data source (Python workers, one transaction per partition, recorded in the write ledger), by ``send_rows`` (one
  transaction per partition, no ledger), and by Spark's JDBC writer twice: into a plain table of
  the same columns (no queue: the floor of getting rows into PostgreSQL), and into a queue table
  (``direct``), rows with an id, headers and a JSON body built by Spark, as a user writing the
  queue table with JDBC alone would (no guarantee: a retried task sends twice, no ledger);
- read back by the data source (browse, in Seq ranges across executors; claim mode; and
  ``claimed_from_queue``, the batch held by the driver's transaction), by ``read_queue`` (on the
  driver) and by Spark's JDBC reader of the queue table;
- relayed queue to queue by the streaming example (claims per micro-batch, acknowledged after
  the batch's write by ``batch_writer``, which takes the JVM path), in micro-batches of 5,000
  (the example's size) and of 100,000; and by ``relay_batch`` (the example's
  ``relay_orders_in_held_batches``: each batch held by the driver's transaction, sent on by COPY
  and acknowledged in it), in batches of the same sizes.

``--relays-only`` runs the relays alone, with the JDBC write they are measured against.

``--local`` runs the same in one JVM (``local[2]``: the driver's executor threads, two cores)
instead of on the cluster.

Each figure is the best of three runs, in rows per second, with its ratio to the JDBC figure of
the same run. JDBC needs PostgreSQL's driver (Debian's libpostgresql-jdbc-java, which bench/run
installs).

    .venv/bin/python bench/spark_source.py --json bench/spark.json
    .venv/bin/python bench/spark_source.py --local --json bench/spark-local.json
    .venv/bin/python bench/spark_source.py --local --reads-only --json /tmp/spark-local-tx.json
    .venv/bin/python bench/spark_source.py --local --relays-only --json /tmp/spark-local-relays.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "example_dags"))

import psycopg
from psycopg.conninfo import conninfo_to_dict

from airflow_provider_sqlqueue.spark import (
    NAME,
    ack_held,
    claimed_from_queue,
    read_queue,
    register,
    save_to_queue,
    send_rows,
)
from airflow_provider_sqlqueue.transport import Message, QueueClient
from bench.throughput import database
from demo.spark_cluster import JDBC_JAR, SparkCluster

ROWS = 200_000
RUNS = 3


def best(run: Callable[[], int], reset: Callable[[], None]) -> float:
    """Rows per second of the fastest of ``RUNS`` runs (``reset`` before each, not timed)."""
    rates = []
    for _ in range(RUNS):
        reset()
        started = time.perf_counter()
        rows = run()
        rates.append(rows / (time.perf_counter() - started))
    return max(rates)


def jdbc(uri: str) -> tuple[str, dict[str, str]]:
    params = conninfo_to_dict(uri)
    url = f"jdbc:postgresql://{params.get('host', 'localhost')}:{params.get('port', 5432)}/{params.get('dbname', 'postgres')}"
    props = {"user": str(params.get("user", "postgres")), "driver": "org.postgresql.Driver"}
    if params.get("password"):
        props["password"] = str(params["password"])
    return url, props


def main() -> None:
    global ROWS  # the one knob of a benchmark script
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pg-uri", default=os.environ.get("SQLQUEUE_BENCH_PG_URI"))
    parser.add_argument("--json", type=Path)
    parser.add_argument("--local", action="store_true", help="local[2] in one JVM instead of the standalone cluster")
    parser.add_argument("--rows", type=int, default=ROWS, help=f"rows each way (default {ROWS:,})")
    only = parser.add_mutually_exclusive_group()
    only.add_argument(
        "--writes-only", action="store_true", help="the writes alone (a few minutes), without reads and streams"
    )
    only.add_argument(
        "--reads-only", action="store_true", help="the reads alone (a few minutes), without writes and streams"
    )
    only.add_argument("--relays-only", action="store_true", help="the relays alone, beside the JDBC write")
    args = parser.parse_args()
    workloads = "writes" if args.writes_only else "reads" if args.reads_only else "all"
    workloads = "relays" if args.relays_only else workloads
    ROWS = args.rows
    with database(args.pg_uri) as uri, tempfile.TemporaryDirectory(prefix="sqlqueue-bench-spark-") as work:
        schema = f"bench_spark_{uuid.uuid4().hex[:6]}"
        queue, relayed = f'bench@"{schema}"', f'relayed@"{schema}"'
        with psycopg.connect(uri, autocommit=True) as raw:
            raw.execute(f'CREATE SCHEMA "{schema}"')
            raw.execute(f'CREATE TABLE "{schema}".plain (n bigint, name text, amount double precision)')
        with QueueClient.connect(uri) as client:
            client.create_queue(queue)
            client.create_queue(relayed)
            client.create_queue(f'direct@"{schema}"')
        url, props = jdbc(uri)
        try:
            if args.local:
                spark = local_session()
                results = {
                    "spark": "local[2]",
                    **measure(spark, uri, schema, queue, relayed, url, props, Path(work), workloads),
                }
                spark.stop()
            else:
                with SparkCluster(Path(work), cores=4, memory="4g") as cluster:
                    spark = cluster.session(
                        "sqlqueue-bench", {"spark.executor.memory": "2g", "spark.jars": str(JDBC_JAR)}
                    )
                    register(spark)
                    results = {
                        "spark": "standalone cluster, 2 executor cores",
                        **measure(spark, uri, schema, queue, relayed, url, props, Path(work), workloads),
                    }
                    spark.stop()
        finally:
            with psycopg.connect(uri, autocommit=True) as raw:
                raw.execute(f'DROP SCHEMA "{schema}" CASCADE')
    print(json.dumps(results, indent=2))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


def local_session() -> Any:
    """One JVM with two executor threads: the figures without the cluster's separate executors."""
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("sqlqueue-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", "3g")
        .config("spark.jars", str(JDBC_JAR))
        .getOrCreate()
    )
    register(spark)
    return spark


def measure(
    spark: Any,
    uri: str,
    schema: str,
    queue: str,
    relayed: str,
    url: str,
    props: dict[str, str],
    work: Path,
    workloads: str,
) -> dict[str, Any]:
    """The workloads (``all``, ``writes`` or ``reads``), each the best of RUNS, with their ratios to JDBC."""
    df = spark.range(ROWS, numPartitions=2).selectExpr("id AS n", "concat('name-', id) AS name", "id * 0.5 AS amount")
    df = df.cache()
    df.count()

    def empty() -> None:
        with QueueClient.connect(uri) as client:
            client.purge(queue)
            client.purge(f'direct@"{schema}"')
        with psycopg.connect(uri, autocommit=True) as raw:
            raw.execute(f'TRUNCATE "{schema}".plain')

    def sink() -> int:
        df.write.format(NAME).option("url", uri).option("queue", queue).mode("append").save()
        return ROWS

    def helper() -> int:
        return send_rows(df, uri, queue)

    def plain_jdbc() -> int:
        df.write.jdbc(url, f'"{schema}".plain', mode="append", properties={**props, "batchsize": "1000"})
        return ROWS

    def jdbc_into_queue() -> int:
        rows = df.selectExpr(
            "uuid() AS id",
            """concat('{"NServiceBus.ContentType":"application/json","NServiceBus.MessageId":"', uuid(), '"}') AS headers""",
            "encode(to_json(struct(n, name, amount)), 'UTF-8') AS body",
        )
        properties = {**props, "batchsize": "1000", "stringtype": "unspecified"}  # text into the uuid column
        rows.write.jdbc(url, f'"{schema}".direct', mode="append", properties=properties)
        return ROWS

    def jvm_sink() -> int:
        save_to_queue(df, url=uri, queue=queue, engine="jvm")
        return ROWS

    write: dict[str, float] = {}
    write_ratios: dict[str, Any] = {}
    if workloads == "relays":
        write = {"jdbc": best(plain_jdbc, empty)}
    elif workloads != "reads":
        write = {
            "jdbc": best(plain_jdbc, empty),
            "jdbc_into_queue_table": best(jdbc_into_queue, empty),
            "save_to_queue": best(jvm_sink, empty),
            "send_rows": best(helper, empty),
            "sqlqueue": best(sink, empty),
        }
        write_ratios = {
            "write": {k: round(v / write["jdbc"], 2) for k, v in write.items()},
            "write_vs_jdbc_into_queue_table": {
                k: round(v / write["jdbc_into_queue_table"], 2) for k, v in write.items()
            },
        }
    if workloads == "writes":
        return {"rows": ROWS, "rows_per_second": {"write": _rounded(write)}, "ratio_to_jdbc": write_ratios}

    def fill() -> None:
        with QueueClient.connect(uri) as client:
            client.purge(queue)
            client.purge(relayed)
            for start in range(0, ROWS, 10_000):
                events = [
                    Message.of({"order_id": f"o{n}", "country": "NL", "quantity": n % 7 + 1, "unit_price": 2.5})
                    for n in range(start, start + 10_000)
                ]
                client.send(queue, events)

    def consumed(df: Any) -> int:
        """Rows of ``df`` with every body read (a bare count would let JDBC read no column at all)."""
        from pyspark.sql import functions as F

        row = df.agg(F.count("*").alias("rows"), F.sum(F.length("body")).alias("bytes")).first()
        assert row["bytes"] > 0
        return int(row["rows"])

    def browse() -> int:
        return consumed(spark.read.format(NAME).option("url", uri).option("queue", queue).load())

    def helper_read() -> int:
        return consumed(read_queue(spark, uri, queue, limit=min(ROWS, 100_000)))  # the helper reads at most 100,000

    def jdbc_read() -> int:
        return consumed(spark.read.jdbc(url, f'"{schema}".bench', properties=props))

    holder = uuid.uuid4().hex

    def claim() -> int:
        reader = spark.read.format(NAME).option("url", uri).option("queue", queue).option("mode", "claim")
        count = consumed(reader.option("holder", holder).option("maxMessagesPerBatch", str(ROWS)).load())
        ack_held(uri, queue, holder)
        return count

    def claimed() -> int:
        with claimed_from_queue(spark, url=uri, queue=queue, maxMessagesPerBatch=str(ROWS)) as df:
            return consumed(df)  # locked, read, then acknowledged as the block ends

    read: dict[str, float] = {}
    read_ratios: dict[str, float] = {}
    if workloads != "relays":
        read = {
            "jdbc": best(jdbc_read, fill),
            "read_queue": best(helper_read, fill),
            "sqlqueue_browse": best(browse, fill),
        }
        read["sqlqueue_claim"] = best(claim, fill)
        read["sqlqueue_claimed_from_queue"] = best(claimed, fill)
        read_ratios = {k: round(v / read["jdbc"], 2) for k, v in read.items()}
    if workloads == "reads":
        return {"rows": ROWS, "rows_per_second": {"read": _rounded(read)}, "ratio_to_jdbc": {"read": read_ratios}}

    streamed = relays(spark, uri, queue, relayed, work, fill)
    rate = {"write": write, "read": read, "stream_relay": streamed}
    ratios = {
        **write_ratios,
        "read": read_ratios,
        "stream_relay_vs_jdbc_write": {k: round(v / write["jdbc"], 2) for k, v in streamed.items()},
    }
    return {"rows": ROWS, "rows_per_second": {k: _rounded(v) for k, v in rate.items()}, "ratio_to_jdbc": ratios}


def relays(spark: Any, uri: str, queue: str, relayed: str, work: Path, fill: Callable[[], None]) -> dict[str, float]:
    """Rows per second of the relays, queue to queue: the streaming example, and relay_batch."""
    from spark_jobs import relay_orders, relay_orders_in_held_batches

    def stream(max_per_batch: int) -> Callable[[], int]:
        def relay() -> int:
            checkpoint = str(work / f"checkpoint-{uuid.uuid4().hex}")
            outcome = relay_orders(spark, uri, queue, relayed, checkpoint, max_per_batch=max_per_batch)
            return int(outcome["events"])

        return relay

    def held(max_per_batch: int) -> Callable[[], int]:
        def relay() -> int:
            outcome = relay_orders_in_held_batches(spark, uri, queue, relayed, max_per_batch=max_per_batch)
            assert outcome["events"] == ROWS, outcome
            return int(outcome["events"])

        return relay

    streamed = {f"batches_of_{size}": best(stream(size), fill) for size in (5_000, 100_000)}
    streamed |= {f"relay_batch_of_{size}": best(held(size), fill) for size in (5_000, 100_000)}
    return streamed


def _rounded(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: round(v) for k, v in value.items()}
    return round(value)


if __name__ == "__main__":
    main()
