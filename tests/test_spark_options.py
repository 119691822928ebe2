"""The ``sqlqueue`` data source's options under hostile input, and its write ledger per queue.

These run the data source's own Python -- the classes Spark instantiates on the driver and in its
Python workers -- against the real database, without a JVM (the Spark jobs themselves are in
``tests/test_spark_source.py``). Every option the data source reads is registered here, discovered
from the code, and given hostile values: each must be refused with the library's own error before
any row changes, and no error may carry the connection's password.
"""

from __future__ import annotations

import inspect
import re
import traceback
import uuid
from typing import Any

import psycopg
import pytest
from psycopg import sql
from pyspark.sql import Row

from airflow_provider_sqlqueue import spark
from airflow_provider_sqlqueue.transport import (
    InvalidArgumentError,
    QueueAddress,
    QueueClient,
    SqlQueueError,
    TransportUnavailableError,
)
from tests.test_contract import SECRET, checksums, with_password

pytestmark = pytest.mark.postgres_only

#: Every option of the data source, with hostile values ({schema}: the test's schema).
OPTIONS: dict[str, list[str]] = {
    "url": [
        f"postgresql://app:{SECRET}@[::1/test",
        f"postgresql://app:{SECRET}%zz@127.0.0.1/test",
        f"postgresql://app:{SECRET}@127.0.0.1:99999/test",
        "mysql://app@127.0.0.1/test",
        "",
    ],
    "password": [],  # any text is a password; it must only never be shown (checked with every url above)
    "queue": ['customers@"{schema}"', 'pg_authid@"pg_catalog"', 'missing@"{schema}"', "\udcff", "q" * 200, ""],
    "errorQueue": ['customers@"{schema}"', "\x00", "q" * 200],
    "mode": ["sometimes", "CLAIM\x00"],
    "holder": [],  # free text naming the claims; checked by the core when it is used
    "numPartitions": ["0", "-1", "many", "1e999", "100000000"],
    "fetchSize": ["0", "-3", "nan", str(2**63)],
    "lease": ["0", "-1", "nan", "inf", "forever", "1e12"],
    "maxDeliveries": ["0", "x"],
    "maxMessagesPerBatch": ["0", "-1", "1e9", "lots"],
    "batchSize": ["0", "2.5", str(2**63)],
    "messageType": [],  # free text, sent as a header
    "contentType": [],  # free text, sent as a header
    "timeToBeReceived": ["0", "-1", "nan", "1e20", "soon"],
    "ledger": ['customers@"{schema}"', 'orders@"{schema}"', "\x00"],
    "writeId": ["\udcff", "w" * 1_000, "\x00"],  # text, hashed into the ledger's key
}


def options_read_by_the_code() -> set[str]:
    source = inspect.getsource(spark.Options.parse)
    return set(re.findall(r'options(?:\.get)?\(\s*"([A-Za-z]+)"', source)) | set(
        re.findall(r'_(?:count|number|span)\(\s*options,\s*"([A-Za-z]+)"', source)
    )


def test_every_option_is_registered() -> None:
    assert options_read_by_the_code() == set(OPTIONS)


@pytest.fixture
def shop(pg_uri: str, raw_pg: psycopg.Connection[Any]):
    schema = f"spk_{uuid.uuid4().hex[:10]}"
    raw_pg.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    raw_pg.execute(
        sql.SQL("CREATE TABLE {} (Id int PRIMARY KEY, Name text)").format(sql.Identifier(schema, "customers"))
    )
    raw_pg.execute(sql.SQL("INSERT INTO {} VALUES (1, 'ada')").format(sql.Identifier(schema, "customers")))
    uri = with_password(pg_uri)
    with QueueClient.connect(uri) as client:
        for name in ("orders", "billing"):
            client.create_queue(QueueAddress(name, schema))
    try:
        yield schema, uri
    finally:
        raw_pg.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


@pytest.fixture(scope="module")
def raw_pg(pg_uri: str):
    with psycopg.connect(pg_uri, autocommit=True) as connection:
        yield connection


def open_everything(options: dict[str, str]) -> None:
    """What Spark does with the options on the driver: the source, then each of its readers and writers."""
    source = spark.SqlQueueDataSource(options)
    source.reader(source.schema())
    source.writer(source.schema(), False)
    source.streamReader(source.schema())


@pytest.mark.parametrize("option", sorted(name for name, values in OPTIONS.items() if values))
def test_a_hostile_option_is_refused_before_anything_changes(option: str, shop, raw_pg) -> None:
    schema, uri = shop
    good = {"url": uri, "queue": f'orders@"{schema}"', "mode": "claim", "holder": "contract"}
    open_everything(good)
    failures = []
    for value in OPTIONS[option]:
        hostile = value.replace("{schema}", schema)
        before = checksums(raw_pg, schema)
        try:
            open_everything({**good, option: hostile})
        except Exception as exc:
            text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            if not isinstance(exc, SqlQueueError) or isinstance(exc, TransportUnavailableError):
                failures.append(f"{option}={hostile[:40]!r}: {type(exc).__name__}: {exc!s:.200}")
            if SECRET in text:
                failures.append(f"{option}={hostile[:40]!r}: the password is in the error")
        else:
            failures.append(f"{option}={hostile[:40]!r}: accepted")
        if checksums(raw_pg, schema) != before:
            failures.append(f"{option}={hostile[:40]!r}: rows changed")
    assert not failures, "\n".join(failures)


def write(options: dict[str, str], rows: list[Row]) -> Any:
    """One partition of a batch write, as a Spark task runs it."""
    source = spark.SqlQueueDataSource(options)
    writer = source.writer(source.schema(), False)
    part = writer.write(iter(rows))
    writer.commit([part])
    return part


def test_one_write_id_to_two_queues_sends_to_both(shop) -> None:
    """The ledger used to key a write by its id alone: the second queue got nothing, silently."""
    schema, uri = shop
    rows = [Row(body=f"m{n}") for n in range(3)]
    for queue in ("orders", "billing"):
        write({"url": uri, "queue": f'{queue}@"{schema}"', "writeId": "nightly-2026-11-25"}, rows)
    again = write({"url": uri, "queue": f'orders@"{schema}"', "writeId": "nightly-2026-11-25"}, rows)
    assert again.sent is None  # the same write to the same queue, retried: sent once
    spelled = write(
        {"url": uri, "queue": f'orders@"{schema}"'.replace('"', '"', 1), "writeId": "nightly-2026-11-25"}, rows
    )
    assert spelled.sent is None
    with QueueClient.connect(uri) as client:
        for queue in ("orders", "billing"):
            assert sorted(m.text for m in client.receive(QueueAddress(queue, schema), 10)) == ["m0", "m1", "m2"]


def test_a_row_json_cannot_carry_is_refused_not_sent_as_invalid_json(shop) -> None:
    schema, uri = shop
    for bad in (float("nan"), float("inf"), float("-inf")):
        with pytest.raises(InvalidArgumentError, match="score"):
            write({"url": uri, "queue": f'orders@"{schema}"'}, [Row(id=1, score=1.5), Row(id=2, score=bad)])
    with QueueClient.connect(uri) as client:
        assert client.depth(QueueAddress("orders", schema)) == 0  # the partition is all or nothing
