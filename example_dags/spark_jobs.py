"""The Spark work of the example pipelines (example_dags/): clean raw orders, then summarise them or check them.

Plain PySpark functions, called from the example DAGs' ``@task.pyspark`` tasks with the session
the Spark provider built from the Spark connection (``local[*]`` by default). Outputs are written
under a path derived from the message id, so a redelivered message rewrites the same output
instead of adding a second copy.
"""

from __future__ import annotations

from typing import Any

ORDER_COLUMNS = "order_id STRING, ordered_at TIMESTAMP, customer_id STRING, country STRING, category STRING, product STRING, quantity INT, unit_price DOUBLE"


def clean_orders(spark: Any, source: str, target: str) -> dict[str, Any]:
    """Read a raw orders CSV, drop rows that cannot be sold (missing fields, non-positive quantity or price), write Parquet."""
    from pyspark.sql import functions as F

    raw = spark.read.csv(source, header=True, schema=ORDER_COLUMNS, mode="PERMISSIVE")
    valid = raw.where(
        F.col("order_id").isNotNull()
        & F.col("ordered_at").isNotNull()
        & F.col("country").isNotNull()
        & (F.col("quantity") > 0)
        & (F.col("unit_price") > 0)
    ).dropDuplicates(["order_id"])
    cleaned = valid.withColumn("revenue", F.round(F.col("quantity") * F.col("unit_price"), 2)).withColumn(
        "order_date", F.to_date("ordered_at")
    )
    cleaned.write.mode("overwrite").parquet(target)
    total = raw.count()
    kept = spark.read.parquet(target).count()
    return {"path": target, "rows": kept, "rejected": total - kept}


def summarise_orders(spark: Any, source: str, target: str) -> dict[str, Any]:
    """Aggregate cleaned orders into a report: totals, revenue by country and category, top products."""
    from pyspark.sql import functions as F

    orders = spark.read.parquet(source)
    totals = orders.agg(
        F.count("*").alias("orders"),
        F.round(F.sum("revenue"), 2).alias("revenue"),
        F.countDistinct("customer_id").alias("customers"),
        F.min("order_date").alias("first_day"),
        F.max("order_date").alias("last_day"),
    ).first()

    def top(column: str, n: int) -> list[dict[str, Any]]:
        rows = (
            orders.groupBy(column)
            .agg(F.round(F.sum("revenue"), 2).alias("revenue"), F.count("*").alias("orders"))
            .orderBy(F.desc("revenue"), F.asc(column))
            .limit(n)
            .collect()
        )
        return [{column: row[column], "revenue": row["revenue"], "orders": row["orders"]} for row in rows]

    report = {
        "orders": totals["orders"],
        "revenue": totals["revenue"],
        "customers": totals["customers"],
        "first_day": str(totals["first_day"]),
        "last_day": str(totals["last_day"]),
        "by_country": top("country", 5),
        "by_category": top("category", 10),
        "top_products": top("product", 3),
    }
    orders.groupBy("country", "category").agg(
        F.round(F.sum("revenue"), 2).alias("revenue"), F.count("*").alias("orders")
    ).coalesce(1).write.mode("overwrite").json(target)
    return {**report, "path": target}


def check_quality(spark: Any, source: str) -> dict[str, Any]:
    """What a data-quality consumer of cleaned orders looks at: rows per country, and orders without a customer."""
    from pyspark.sql import functions as F

    orders = spark.read.parquet(source)
    per_country = {
        row["country"]: row["rows"] for row in orders.groupBy("country").agg(F.count("*").alias("rows")).collect()
    }
    return {
        "rows": sum(per_country.values()),
        "rows_per_country": dict(sorted(per_country.items())),
        "without_customer": orders.where(F.col("customer_id").isNull()).count(),
    }


def clean_message(spark: Any, message: dict[str, Any]) -> dict[str, Any]:
    """Handle an ``ingest`` message: clean its dataset; the result is the next stage's message."""
    body = message["body"]
    target = f"{body['output_root']}/clean/{message['id']}"
    result = clean_orders(spark, body["path"], target)
    print(f"cleaned {body['dataset']}: {result['rows']} rows kept, {result['rejected']} rejected -> {target}")
    return {**result, "dataset": body["dataset"], "output_root": body["output_root"]}


def summarise_message(spark: Any, message: dict[str, Any]) -> dict[str, Any]:
    """Handle a ``cleaned`` message: summarise the clean data; the result is the report message."""
    body = message["body"]
    report = summarise_orders(spark, body["path"], f"{body['output_root']}/reports/{message['id']}")
    print(f"summarised {body['dataset']}: {report['orders']} orders, revenue {report['revenue']}")
    return {**report, "dataset": body["dataset"]}


def quality_message(spark: Any, message: dict[str, Any]) -> dict[str, Any]:
    """Handle a cleaned-orders event: check the clean data; the result is the quality report message."""
    body = message["body"]
    quality = check_quality(spark, body["path"])
    print(f"checked {body['dataset']}: {quality['rows']} rows in {len(quality['rows_per_country'])} countries")
    return {**quality, "dataset": body["dataset"]}


ORDER_EVENT = "order_id STRING, country STRING, quantity INT, unit_price DOUBLE"


def order_stream(spark: Any, url: str, source: str, target: str, checkpoint: str, *, max_per_batch: int = 5_000) -> Any:
    """Start a Structured Streaming query from queue ``source`` to queue ``target``; returns it.

    Each order event (JSON ``{order_id, country, quantity, unit_price}``) becomes a revenue event
    (the same fields and ``revenue``) on ``target``. Messages are claimed per micro-batch and
    acknowledged once Spark committed it; each batch is written with the write ledger under
    ``<checkpoint>:<batch>``, so a batch replayed after a crash sends only what did not commit.
    ``checkpoint`` must be on storage the driver reaches after a restart (shared storage on a cluster).
    """
    from pyspark.sql import functions as F

    from airflow_provider_sqlqueue.spark import NAME, batch_writer, register

    register(spark)
    events = (
        spark.readStream.format(NAME)
        .option("url", url)
        .option("queue", source)
        .option("maxMessagesPerBatch", str(max_per_batch))
        .load()
    )
    orders = events.select(F.from_json(F.col("body").cast("string"), ORDER_EVENT).alias("o")).select("o.*")
    revenue = orders.withColumn("revenue", F.round(F.col("quantity") * F.col("unit_price"), 2))
    sink = {"url": url, "queue": target, "messageType": "SqlQueue.Demo.OrderRevenue"}
    return (
        revenue.writeStream.foreachBatch(batch_writer(sink, checkpoint))
        .option("checkpointLocation", checkpoint)
        .start()
    )


def relay_orders(
    spark: Any, url: str, source: str, target: str, checkpoint: str, *, max_per_batch: int = 5_000
) -> dict[str, Any]:
    """Run :func:`order_stream` until every waiting order event has gone through, then stop it."""
    query = order_stream(spark, url, source, target, checkpoint, max_per_batch=max_per_batch)
    try:
        query.processAllAvailable()
        progress = query.recentProgress  # read while the query runs: Spark Connect forgets it once stopped
    finally:
        query.stop()
    # Classic sessions report progress as dicts; Spark Connect as StreamingQueryProgress, whose
    # top-level count may be missing and is then the sum of its sources'.
    counts = [int(p.numInputRows if hasattr(p, "numInputRows") else p["numInputRows"]) for p in progress]
    batches = [count for count in counts if count]
    rows = sum(batches)
    print(f"relayed {rows} order events from {source} to {target} in {len(batches)} micro-batches")
    return {"events": rows, "batches": len(batches)}
