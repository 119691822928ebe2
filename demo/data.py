"""A small, realistic, reproducible orders dataset for the demo (generated, never downloaded).

Like real exports it has defects the cleaning job must handle: rows with no country, zero or
negative quantities, and orders exported twice. :func:`write_orders` returns the figures a
correct pipeline must report, computed here in plain Python, so the demo and the tests can check
Spark's answer instead of trusting it.
"""

from __future__ import annotations

import csv
import json
import random
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

COUNTRIES = {"DE": 30, "FR": 20, "NL": 12, "PL": 10, "ES": 10, "IT": 9, "SE": 5, "DK": 4}
CATALOGUE = {
    "books": [("paperback", 8.99), ("hardcover", 24.50), ("atlas", 39.00)],
    "electronics": [("headphones", 79.00), ("charger", 19.99), ("e-reader", 129.00)],
    "garden": [("hose", 29.95), ("seeds", 3.49), ("shears", 17.80)],
    "kitchen": [("kettle", 34.90), ("knife", 49.00), ("mug", 6.50)],
}


def write_orders(path: Path, rows: int = 20_000, seed: int = 2026) -> dict[str, Any]:
    """Write ``rows`` raw order lines to ``path`` (CSV) and return what cleaning and summarising must find."""
    rng = random.Random(seed)
    start = datetime(2026, 11, 1)
    countries, weights = zip(*COUNTRIES.items(), strict=True)
    written: list[list[Any]] = []
    valid: dict[str, tuple[str, float]] = {}
    for n in range(rows):
        if written and rng.random() < 0.005:  # exported twice
            written.append(list(rng.choice(written)))
            continue
        category = rng.choice(sorted(CATALOGUE))
        product, price = rng.choice(CATALOGUE[category])
        quantity = rng.choice([1, 1, 1, 2, 2, 3, 5])
        country = rng.choices(countries, weights)[0]
        defect = rng.random()
        if defect < 0.01:
            quantity = rng.choice([0, -1])
        elif defect < 0.015:
            country = ""
        order_id = f"O{n:07d}"
        ordered_at = start + timedelta(seconds=rng.randrange(30 * 86_400))
        written.append(
            [
                order_id,
                ordered_at.isoformat(sep=" "),
                f"C{rng.randrange(5000):05d}",
                country,
                category,
                product,
                quantity,
                price,
            ]
        )
        if quantity > 0 and country:
            valid[order_id] = (country, round(quantity * price, 2))
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        out = csv.writer(handle)
        out.writerow(
            ["order_id", "ordered_at", "customer_id", "country", "category", "product", "quantity", "unit_price"]
        )
        out.writerows(written)
    revenue_by_country: Counter[str] = Counter()
    for country, revenue in valid.values():
        revenue_by_country[country] += revenue
    return {
        "rows": len(written),
        "valid_orders": len(valid),
        "revenue": round(sum(revenue for _, revenue in valid.values()), 2),
        "top_country": revenue_by_country.most_common(1)[0][0],
    }


def insert_like_an_outside_sender(
    connection: Any, schema: str, queue: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> uuid.UUID:
    """Put a message on a PostgreSQL queue the way an NServiceBus endpoint, or any program, writes a row.

    Plain SQL on a psycopg connection, without this package: the pipelines are fed from outside.
    ``headers`` adds to NServiceBus's own (an endpoint's trace context: ``traceparent``...).
    """
    from psycopg import sql

    message_id = uuid.uuid4()
    headers = {
        "NServiceBus.MessageId": str(message_id),
        "NServiceBus.ContentType": "application/json",
        "NServiceBus.EnclosedMessageTypes": "Shop.Exports.DatasetLanded, Shop.Messages",
        "NServiceBus.TimeSent": datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S:%f Z"),
        **(headers or {}),
    }
    statement = sql.SQL("INSERT INTO {}.{} (Id, Expires, Headers, Body) VALUES (%s, NULL, %s, %s)").format(
        sql.Identifier(schema), sql.Identifier(queue)
    )
    connection.execute(statement, (message_id, json.dumps(headers), json.dumps(body).encode()))
    return message_id
