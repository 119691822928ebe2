"""The Spark work of the example pipelines (example_dags/): clean raw orders, then summarise them or check them.

Plain PySpark functions, called from the example DAGs' tasks with the session built from the Spark
connection (``local[*]`` by default). Each handles a batch of messages in one Spark job -- one
DataFrame over all their inputs, each row tagged with its message -- and returns one result per
message, in order (``HeldMessages.batch``: a batch that fails is split until the failing message
is found and given back alone). Outputs are written per message, in a partition named by the
message id, so a redelivered message rewrites its own output instead of adding a second copy.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote, urlsplit

ORDER_COLUMNS = "order_id STRING, ordered_at TIMESTAMP, customer_id STRING, country STRING, category STRING, product STRING, quantity INT, unit_price DOUBLE"


def _tagged(spark: Any, messages: list[dict[str, Any]], read: Callable[[list[str]], Any]) -> Any:
    """One DataFrame over every message's input (``read`` of the bodies' paths), each row tagged with
    its message's id in column ``message``: what lets one Spark job serve a whole batch.

    The inputs are read at once, as one relation, and each file's rows go to the message(s) whose
    path is that file or a directory holding it (two messages naming one input both get its rows):
    a read per message cost a file listing and a task per message in every action, ten times the
    time at 64 messages. A message none of whose files showed up in that read (an input with no
    rows, a path written in a form Spark reports otherwise) is read on its own, as before. The frame
    is cached: each job reads it several times.
    """
    from pyspark.sql import functions as F

    frame = read(list(dict.fromkeys(m["body"]["path"] for m in messages))).withColumn("_file", F.input_file_name())
    files = [row[0] for row in frame.select("_file").distinct().collect()]
    owners = [(file, str(m["id"])) for m in messages for file in files if _holds(m["body"]["path"], file)]
    tagged = frame.join(F.broadcast(spark.createDataFrame(owners, "_file string, message string")), "_file")
    tagged = tagged.drop("_file")
    found = {message for _, message in owners}
    for m in messages:
        if str(m["id"]) not in found:
            tagged = tagged.unionByName(read([m["body"]["path"]]).withColumn("message", F.lit(str(m["id"]))))
    return tagged.cache()


def _holds(path: str, file: str) -> bool:
    """Whether ``file`` (as Spark's input_file_name() names it) is ``path`` or lies under it."""
    place, found = _location(path), _location(file)
    return found == place or found.startswith(place.rstrip("/") + "/")


def _location(path: str) -> str:
    """A path or URI in one form: local paths absolute, ``file:`` URIs as paths, percent-escapes of a
    URI undone (Spark's file names are URIs; a plain path's ``%`` is a character of its name)."""
    parts = urlsplit(path)
    if not parts.scheme:
        return os.path.abspath(path)
    if parts.scheme == "file":
        return os.path.abspath(unquote(parts.path))
    return unquote(path)


def _write_per_message(
    frame: Any, messages: list[dict[str, Any]], folder: str, write: Callable[[Any, str], None]
) -> dict[str, str]:
    """Write ``frame`` under ``<output_root>/<folder>/message=<id>``, one partition per message
    (replacing only that message's partition, so a redelivered message rewrites its own output);
    returns each message's output path by id."""
    from pyspark.sql import functions as F

    paths = {}
    by_root: dict[str, list[str]] = {}
    for m in messages:
        by_root.setdefault(m["body"]["output_root"], []).append(str(m["id"]))
    for root, ids in by_root.items():
        part = frame.where(F.col("message").isin(ids))
        write(
            part.write.partitionBy("message").mode("overwrite").option("partitionOverwriteMode", "dynamic"),
            f"{root}/{folder}",
        )
        paths.update({i: f"{root}/{folder}/message={i}" for i in ids})
    return paths


def _by_message(rows: Any) -> dict[str, Any]:
    return {row["message"]: row for row in rows}


def clean_batch(spark: Any, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Handle ``ingest`` messages in one Spark job: read each raw orders CSV, drop rows that cannot be
    sold (missing fields, non-positive quantity or price), write Parquet per message. The results,
    one per message in order, are the next stage's messages."""
    from pyspark.sql import functions as F

    raw = _tagged(
        spark, messages, lambda paths: spark.read.csv(paths, header=True, schema=ORDER_COLUMNS, mode="PERMISSIVE")
    )
    sellable = (
        F.col("order_id").isNotNull()
        & F.col("ordered_at").isNotNull()
        & F.col("country").isNotNull()
        & (F.col("quantity") > 0)
        & (F.col("unit_price") > 0)
    )
    valid = raw.where(sellable).dropDuplicates(["message", "order_id"])
    cleaned = valid.withColumn("revenue", F.round(F.col("quantity") * F.col("unit_price"), 2)).withColumn(
        "order_date", F.to_date("ordered_at")
    )
    paths = _write_per_message(cleaned, messages, "clean", lambda writer, path: writer.parquet(path))
    # Rows read and kept per message in one action (kept: the valid rows' distinct order ids, which
    # is what dropDuplicates leaves): each action costs a Spark job's fixed time.
    counts = _by_message(
        raw.groupBy("message")
        .agg(F.count("*").alias("rows"), F.countDistinct(F.when(sellable, F.col("order_id"))).alias("kept"))
        .collect()
    )
    results = []
    for m in messages:
        body, key = m["body"], str(m["id"])
        rows = counts[key]["kept"] if key in counts else 0
        rejected = (counts[key]["rows"] if key in counts else 0) - rows
        print(f"cleaned {body['dataset']}: {rows} rows kept, {rejected} rejected -> {paths[key]}")
        results.append(
            {
                "path": paths[key],
                "rows": rows,
                "rejected": rejected,
                "dataset": body["dataset"],
                "output_root": body["output_root"],
            }
        )
    return results


def _tops(orders: Any, wanted: dict[str, int]) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """Per column of ``wanted`` and per message, the ``n`` values of that column with the most
    revenue (ties by value), in one Spark action: each action costs a job's fixed time, which at a
    few hundred rows a message is most of a stage's time."""
    from functools import reduce

    from pyspark.sql import Window
    from pyspark.sql import functions as F

    grouped = [
        orders.groupBy("message", column)
        .agg(F.round(F.sum("revenue"), 2).alias("revenue"), F.count("*").alias("orders"))
        .select("message", F.lit(column).alias("dimension"), F.col(column).alias("value"), "revenue", "orders")
        for column in wanted
    ]
    limit = reduce(
        lambda otherwise, c: F.when(F.col("dimension") == c, F.lit(wanted[c])).otherwise(otherwise), wanted, F.lit(0)
    )
    ranked = (
        reduce(lambda a, b: a.unionByName(b), grouped)
        .withColumn(
            "rank",
            F.row_number().over(Window.partitionBy("message", "dimension").orderBy(F.desc("revenue"), F.asc("value"))),
        )
        .where(F.col("rank") <= limit)
        .orderBy("dimension", "message", "rank")
        .collect()
    )
    tops: dict[str, dict[str, list[dict[str, Any]]]] = {column: {} for column in wanted}
    for row in ranked:
        tops[row["dimension"]].setdefault(row["message"], []).append(
            {row["dimension"]: row["value"], "revenue": row["revenue"], "orders": row["orders"]}
        )
    return tops


def summarise_batch(spark: Any, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Handle ``cleaned`` messages in one Spark job: aggregate each message's clean orders into a
    report (totals, revenue by country and category, top products). The results are the reports."""
    from pyspark.sql import functions as F

    orders = _tagged(spark, messages, lambda paths: spark.read.parquet(*paths))
    totals = _by_message(
        orders.groupBy("message")
        .agg(
            F.count("*").alias("orders"),
            F.round(F.sum("revenue"), 2).alias("revenue"),
            F.countDistinct("customer_id").alias("customers"),
            F.min("order_date").alias("first_day"),
            F.max("order_date").alias("last_day"),
        )
        .collect()
    )
    tops = _tops(orders, {"country": 5, "category": 10, "product": 3})
    by_country, by_category, top_products = tops["country"], tops["category"], tops["product"]
    breakdown = orders.groupBy("message", "country", "category").agg(
        F.round(F.sum("revenue"), 2).alias("revenue"), F.count("*").alias("orders")
    )
    paths = _write_per_message(
        breakdown.repartition("message"), messages, "reports", lambda writer, path: writer.json(path)
    )
    reports = []
    for m in messages:
        body, key = m["body"], str(m["id"])
        row = totals[key]
        report = {
            "orders": row["orders"],
            "revenue": row["revenue"],
            "customers": row["customers"],
            "first_day": str(row["first_day"]),
            "last_day": str(row["last_day"]),
            "by_country": by_country.get(key, []),
            "by_category": by_category.get(key, []),
            "top_products": top_products.get(key, []),
            "path": paths[key],
            "dataset": body["dataset"],
        }
        print(f"summarised {body['dataset']}: {report['orders']} orders, revenue {report['revenue']}")
        reports.append(report)
    return reports


def quality_batch(spark: Any, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Handle cleaned-orders events in one Spark job: what a data-quality consumer looks at, per
    message -- rows per country, and orders without a customer."""
    from pyspark.sql import functions as F

    orders = _tagged(spark, messages, lambda paths: spark.read.parquet(*paths))
    per_country: dict[str, dict[str, int]] = {}
    for row in orders.groupBy("message", "country").agg(F.count("*").alias("rows")).collect():
        per_country.setdefault(row["message"], {})[row["country"]] = row["rows"]
    missing = _by_message(
        orders.groupBy("message").agg(F.sum(F.col("customer_id").isNull().cast("int")).alias("without")).collect()
    )
    results = []
    for m in messages:
        body, key = m["body"], str(m["id"])
        countries = per_country.get(key, {})
        quality = {
            "rows": sum(countries.values()),
            "rows_per_country": dict(sorted(countries.items())),
            "without_customer": int(missing[key]["without"] or 0) if key in missing else 0,
            "dataset": body["dataset"],
        }
        print(f"checked {body['dataset']}: {quality['rows']} rows in {len(countries)} countries")
        results.append(quality)
    return results


ORDER_EVENT = "order_id STRING, country STRING, quantity INT, unit_price DOUBLE"
REVENUE_EVENT = "SqlQueue.Demo.OrderRevenue"


def order_stream(spark: Any, url: str, source: str, target: str, checkpoint: str, *, max_per_batch: int = 5_000) -> Any:
    """Start a Structured Streaming query from queue ``source`` to queue ``target``; returns it.

    Each order event (JSON ``{order_id, country, quantity, unit_price}``) becomes a revenue event
    (the same fields and ``revenue``) on ``target``. Messages are claimed per micro-batch and
    acknowledged once Spark committed it; each batch is written with the write ledger under
    ``<checkpoint>:<batch>``, so a batch replayed after a crash sends only what did not commit.
    ``checkpoint`` must be on storage the driver reaches after a restart (shared storage on a cluster).
    """
    from airflow_provider_sqlqueue.spark import NAME, batch_writer, register

    register(spark)
    events = (
        spark.readStream.format(NAME)
        .option("url", url)
        .option("queue", source)
        .option("maxMessagesPerBatch", str(max_per_batch))
        .load()
    )
    sink = {"url": url, "queue": target, "messageType": REVENUE_EVENT}
    return (
        order_revenue(events)
        .writeStream.foreachBatch(batch_writer(sink, checkpoint))
        .option("checkpointLocation", checkpoint)
        .start()
    )


def order_revenue(events: Any) -> Any:
    """Order events (messages' ``body``: JSON ``{order_id, country, quantity, unit_price}``) as
    revenue events: the same fields and ``revenue``."""
    from pyspark.sql import functions as F

    orders = events.select(F.from_json(F.col("body").cast("string"), ORDER_EVENT).alias("o")).select("o.*")
    return orders.withColumn("revenue", F.round(F.col("quantity") * F.col("unit_price"), 2))


def relay_orders_in_held_batches(
    spark: Any, url: str, source: str, target: str, *, max_per_batch: int = 5_000
) -> dict[str, Any]:
    """Relay every waiting order event of ``source`` to ``target`` as a revenue event, a batch at a
    time, each batch held by the driver's transaction and sent on in it (``relay_batch``): exactly
    once with no checkpoint and no ledger, what a scheduled task (rather than a query that runs on)
    wants. Returns how many events were taken and sent, in how many batches."""
    from airflow_provider_sqlqueue.spark import relay_batch

    source_options = {"url": url, "queue": source, "maxMessagesPerBatch": str(max_per_batch)}
    target_options = {"queue": target, "messageType": REVENUE_EVENT}
    taken = sent = batches = 0
    while (done := relay_batch(spark, order_revenue, source_options, target_options)).taken:
        taken, sent, batches = taken + done.taken, sent + done.sent, batches + 1
    print(f"relayed {sent} of {taken} order events from {source} to {target} in {batches} held batches")
    return {"events": sent, "taken": taken, "batches": batches}


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
