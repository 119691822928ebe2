"""The ``sqlqueue`` data source's options under hostile input.

These run the data source's own Python -- the classes Spark instantiates on the driver and in its
Python workers -- against the real database, without a JVM (the Spark jobs themselves are in
``tests/test_spark_cluster.py``). Every option the data source reads is registered here, discovered
from the code, and given hostile values: each must be refused with the library's own error before
any row changes, and no error may carry the connection's password.
"""

from __future__ import annotations

import inspect
import re
import traceback
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from airflow_provider_sqlqueue import spark
from airflow_provider_sqlqueue.transport import (
    ArgumentTypeError,
    InvalidArgumentError,
    QueueAddress,
    QueueClient,
    SqlQueueError,
    TransportUnavailableError,
)
from tests.test_contract import SECRET, checksums, with_password

pytestmark = pytest.mark.postgres_only

#: A value given to an option that is not one: refused for every option, never read as its default.
EMPTY = ["", " \t"]

#: Every option of the data source, with hostile values ({schema}: the test's schema), EMPTY added below.
OPTIONS: dict[str, list[str]] = {
    "url": [
        f"postgresql://app:{SECRET}@[::1/test",
        f"postgresql://app:{SECRET}%zz@127.0.0.1/test",
        f"postgresql://app:{SECRET}@127.0.0.1:99999/test",
        "mysql://app@127.0.0.1/test",
    ],
    "password": [],  # any other text is a password; it must only never be shown (checked with every url above)
    "queue": ['customers@"{schema}"', 'pg_authid@"pg_catalog"', 'missing@"{schema}"', "\udcff", "q" * 200],
    "errorQueue": ['customers@"{schema}"', "\x00", "q" * 200],
    "mode": ["sometimes", "CLAIM\x00"],
    "holder": [],  # free text naming the claims (checked by the core when it is used), not empty
    "numPartitions": ["0", "-1", "many", "1e999", "100000000"],
    "fetchSize": ["0", "-3", "nan", str(2**63)],
    "lease": ["0", "0.5", "-1", "nan", "inf", "forever", "1e12"],
    "maxDeliveries": ["0", "x"],
    "maxMessagesPerBatch": ["0", "-1", "1e9", "lots"],
    "batchSize": ["0", "2.5", str(2**63)],
    "messageType": [],  # free text, sent as a header, not empty
    "contentType": [],  # free text, sent as a header, not empty
    "timeToBeReceived": ["0", "-1", "nan", "1e20", "soon"],
    "ledger": ['customers@"{schema}"', 'orders@"{schema}"', "\x00"],
    "writeId": ["\udcff", "w" * 1_000, "\x00"],  # text, hashed into the ledger's key
    "engine": ["jvm", "JVM\x00", "fast", "jdbc"],  # jvm: save_to_queue's (tests/test_spark_functions.py)
    "lock": [  # <xid>:<after>:<last>, as claimed_from_queue writes it
        "1:0",
        "1:0:5:6",
        "x:0:5",
        "-1:0:5",
        "0:0:5",
        "1:5:0",
        f"{2**63}:0:1",
        "1:0:99999999999999999999",
        "1:0:5\n",
        " 1:0:5",
        "\u0661:0:5",  # an Arabic-Indic digit, which int() would take
        "1:0:5; DROP TABLE x",
    ],
}
for _values in OPTIONS.values():
    _values += EMPTY


def options_read_by_the_code() -> set[str]:
    source = inspect.getsource(spark.Options.parse)
    return set(re.findall(r'options(?:\.get)?\(\s*"([A-Za-z]+)"', source)) | set(
        re.findall(r'_(?:count|number|span)\(\s*options,\s*"([A-Za-z]+)"', source)
    )


def test_every_option_is_registered() -> None:
    assert options_read_by_the_code() == set(OPTIONS) == set(spark.OPTION_NAMES)
    both = set(spark.OPTION_NAMES) - spark.WRITE_OPTIONS - spark.READ_OPTIONS
    assert both == {"url", "password", "queue"} and not spark.WRITE_OPTIONS & spark.READ_OPTIONS


def test_the_guide_lists_each_option_for_the_direction_the_code_reads_it_in() -> None:
    """docs/guides/spark.md's option table says what each option is "for": ``all``, ``write``, or
    a kind of read (``batch read``, ``claim, stream``...); the code refuses it in the other direction."""
    guide = (Path(__file__).parents[1] / "docs" / "guides" / "spark.md").read_text()
    rows = dict(re.findall(r"^\| `(\w+)` \| ([^|]+?) \|", guide, re.MULTILINE))
    assert set(rows) == set(spark.OPTION_NAMES)
    assert {name for name, use in rows.items() if use == "write"} == spark.WRITE_OPTIONS
    assert {name for name, use in rows.items() if use not in ("all", "write")} == spark.READ_OPTIONS


@pytest.fixture(name="shop")  # a name of its own: the suites that import it take it as a parameter
def shop_fixture(pg_uri: str, raw_pg: psycopg.Connection[Any]):
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


@pytest.fixture(name="raw_pg", scope="module")
def raw_pg_fixture(pg_uri: str):
    with psycopg.connect(pg_uri, autocommit=True) as connection:
        yield connection


def open_everything(options: dict[str, str]) -> None:
    """What Spark does with the options on the driver: the source, then each of its readers and its
    writer that the options are for (an option of one direction is refused in the other)."""
    source = spark.SqlQueueDataSource(options)
    if not options.keys() & spark.WRITE_OPTIONS:
        source.reader(source.schema())
        if "lock" not in options:  # a stream claims its own batches (tested below)
            source.streamReader(source.schema())
    if not options.keys() & spark.READ_OPTIONS:
        source.writer(source.schema(), False)


@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_a_hostile_option_is_refused_before_anything_changes(option: str, shop, raw_pg) -> None:
    schema, uri = shop
    good = {"url": uri, "queue": f'orders@"{schema}"'}
    if option in spark.READ_OPTIONS - {"lock"}:  # a locked batch's read is no claim
        good |= {"mode": "claim", "holder": "contract"}
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


# -- options Spark passes: only the user's (plus ``path`` from load(path)); any other is a typo ------


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"maxMessagePerBatch": "1"}, "unknown option 'maxMessagePerBatch': did you mean 'maxMessagesPerBatch'"),
        ({"maxmessageperbatch": "1"}, "did you mean 'maxMessagesPerBatch'"),  # as Spark passes it: lower case
        ({"errorqueu": "dead"}, "did you mean 'errorQueue'"),
        ({"timeToBeRecieved": "5"}, "did you mean 'timeToBeReceived'"),
        ({"zzz": "1"}, "unknown option 'zzz'; known options: url, password, queue"),
        ({"path": "/data/orders"}, "takes no path"),
        ({"lease": "30", "LEASE": "60"}, "option 'lease' is given twice"),
    ],
)
def test_an_unknown_or_misspelt_option_is_refused_naming_the_nearest(extra: dict[str, str], message: str) -> None:
    with pytest.raises(spark.InvalidOptionError, match=re.escape(message)):
        spark.Options.parse({"url": "postgresql://db/x", "queue": "orders", **extra})


def test_options_are_known_in_any_case() -> None:
    """Spark hands options over lower-cased (a CaseInsensitiveDict); plain dicts may use any case."""
    from pyspark.sql.datasource import CaseInsensitiveDict

    given = {"URL": "postgresql://db/x", "Queue": "orders", "MAXMESSAGESPERBATCH": "7", "timetobereceived": "9"}
    for options in (given, CaseInsensitiveDict(given)):
        parsed = spark.Options.parse(options)
        assert parsed.max_messages_per_batch == 7 and parsed.time_to_be_received == timedelta(seconds=9)
    assert spark.Options.parse({**given, "lease": "30", "LEASE": "30"}).lease == timedelta(seconds=30)


# -- an option given empty, or to the direction that does not read it ------------------------------


@pytest.mark.parametrize("option", spark.OPTION_NAMES)
def test_an_option_given_empty_is_refused_naming_it(option: str) -> None:
    """An empty ``ledger``, ``writeId`` or ``messageType`` used to mean the default while an empty
    ``queue`` was refused: empty is now refused for every option, as Spark passes it too."""
    from pyspark.sql.datasource import CaseInsensitiveDict

    good = {"url": "postgresql://db/x", "queue": "orders"}
    for value in EMPTY:
        for options in ({**good, option: value}, CaseInsensitiveDict({**good, option.lower(): value})):
            with pytest.raises(spark.InvalidOptionError, match=f"option '{option}' is empty: give "):
                spark.Options.parse(options)


def test_an_option_that_is_not_text_is_refused_naming_it() -> None:
    """Spark passes text; a plain dict of numbers would otherwise fail somewhere inside parsing."""
    with pytest.raises(ArgumentTypeError, match="option 'lease' must be text"):
        spark.Options.parse({"url": "postgresql://db/x", "queue": "orders", "lease": 30})  # type: ignore[dict-item]


#: A good value of each option that only one direction reads ({schema}: the test's schema).
ONE_WAY = {
    "batchSize": "5",
    "messageType": "Shop.OrderPlaced",
    "contentType": "text/plain",
    "timeToBeReceived": "60",
    "ledger": "sqlqueue_writes",
    "writeId": "nightly",
    "engine": "python",
    "mode": "browse",
    "holder": "nightly",
    "numPartitions": "3",
    "fetchSize": "10",
    "lease": "30",
    "maxDeliveries": "3",
    "maxMessagesPerBatch": "10",
    "errorQueue": 'billing@"{schema}"',
    "lock": "1:0:0",
}


def test_every_one_way_option_has_a_good_value() -> None:
    assert set(ONE_WAY) == spark.WRITE_OPTIONS | spark.READ_OPTIONS


@pytest.mark.parametrize("option", sorted(ONE_WAY))
def test_an_option_of_one_direction_is_refused_in_the_other_before_anything_changes(option: str, shop, raw_pg) -> None:
    """A ``timeToBeReceived`` on a read or a ``lease`` on a write was ignored without a word."""
    from pyspark.sql.datasource import CaseInsensitiveDict

    schema, uri = shop
    before = checksums(raw_pg, schema)
    given = {"url": uri, "queue": f'orders@"{schema}"', option: ONE_WAY[option].replace("{schema}", schema)}
    source = spark.SqlQueueDataSource(CaseInsensitiveDict(given))  # as Spark passes them: lower-cased
    if option in spark.WRITE_OPTIONS:
        refused = [lambda: source.reader(source.schema()), lambda: source.streamReader(source.schema())]
        message = f"option '{option}' applies only to writes (df.write), and this is a read"
    else:
        refused = [lambda: source.writer(source.schema(), False), lambda: spark.batch_writer(given, "/tmp/ck")]
        message = f"option '{option}' applies only to reads (spark.read, spark.readStream), and this is a write"
    for open_it in refused:
        with pytest.raises(spark.InvalidOptionError, match=re.escape(message)):
            open_it()
    assert checksums(raw_pg, schema) == before  # refused before the ledger was created or a claim taken
    open_everything(given)  # the direction it is for takes it


# -- a queue as its own error queue ---------------------------------------------------------------


@pytest.mark.parametrize("error_queue", ["orders", 'orders@"public"', '"orders"'])
def test_a_queue_is_not_its_own_error_queue(error_queue: str) -> None:
    with pytest.raises(InvalidArgumentError, match="cannot be its own error queue"):
        spark.Options.parse({"url": "postgresql://db/x", "queue": 'orders@"public"', "errorQueue": error_queue})


def test_a_claim_on_the_error_queue_needs_another_error_queue(shop) -> None:
    schema, uri = shop
    with QueueClient.connect(uri) as client:
        client.create_queue(QueueAddress("error", schema))
    options = {"url": uri, "queue": f'error@"{schema}"', "mode": "claim", "holder": "h"}
    source = spark.SqlQueueDataSource(options)
    with pytest.raises(InvalidArgumentError, match="its own error queue"):
        source.reader(source.schema())
    with pytest.raises(InvalidArgumentError, match="its own error queue"):
        source.streamReader(source.schema())
    browse = spark.SqlQueueDataSource({"url": uri, "queue": f'error@"{schema}"'})  # browsing it is fine
    browse.reader(browse.schema())
    other = spark.SqlQueueDataSource({**options, "errorQueue": "billing"})
    other.reader(other.schema())


# -- bad input is refused before any task runs; a password option is never shown -------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"queue": "orders"}, "option 'url' is required"),
        ({"url": "postgresql://db/x"}, "option 'queue' is required"),
        ({"url": "http://db/x", "queue": "orders"}, "option 'url': cannot tell the database"),
        ({"url": "postgresql://db/x", "queue": "orders", "mode": "consume"}, "must be browse or claim"),
        ({"url": "postgresql://db/x", "queue": "orders", "numPartitions": "two"}, "must be a whole number"),
        ({"url": "postgresql://db/x", "queue": "orders", "lease": "-5"}, "must be positive"),
        ({"url": "postgresql://db/x", "queue": "orders", "maxMessagesPerBatch": "0"}, "must be positive"),
        ({"url": "postgresql://db/x", "queue": "orders", "batchSize": "200000"}, "must be at most 100,000"),
        ({"url": "mssql://sa@db/x", "queue": "orders", "password": "pw"}, "put it in an mssql:// url"),
        (
            {"url": "postgresql://db/x", "queue": "orders", "maxMessagePerBatch": "1"},
            "did you mean 'maxMessagesPerBatch'",
        ),
    ],
)
def test_bad_options_are_refused_with_the_library_error(options, message):
    from airflow_provider_sqlqueue.spark import InvalidOptionError, SqlQueueDataSource

    with pytest.raises(InvalidOptionError, match=message):
        SqlQueueDataSource(options)


def test_claim_mode_without_a_holder_is_refused_for_a_read_and_named_a_read_option_for_a_write():
    from airflow_provider_sqlqueue.spark import InvalidOptionError, Options

    parsed = Options.parse({"url": "postgresql://db/x", "queue": "orders", "mode": "claim"})
    with pytest.raises(InvalidOptionError, match="needs option 'holder'"):
        parsed.check_use("read")
    with pytest.raises(InvalidOptionError, match="option 'mode' applies only to reads"):
        parsed.check_use("write")


def test_a_password_option_joins_the_url_and_never_shows_in_the_options_repr(pg_uri):
    from airflow_provider_sqlqueue.spark import Options

    parsed = Options.parse({"url": "host=db dbname=shop user=app", "password": "s3cr3t", "queue": "orders"})
    assert "password=s3cr3t" in parsed.url and "s3cr3t" not in repr(parsed)


# -- a read of a locked batch (option lock): what claimed_from_queue hands the executors ------------


@pytest.mark.parametrize("option", spark.options.NOT_WITH_A_LOCK)
def test_a_locked_read_refuses_the_options_of_a_claim_and_of_the_lock_itself(option: str, shop, raw_pg) -> None:
    schema, uri = shop
    before = checksums(raw_pg, schema)
    given = {"url": uri, "queue": f'orders@"{schema}"', "lock": "7:0:9", option: ONE_WAY[option]}
    source = spark.SqlQueueDataSource({**given, option: ONE_WAY[option].replace("{schema}", schema)})
    with pytest.raises(spark.InvalidOptionError, match=f"option '{option}' does not apply to a read of a locked batch"):
        source.reader(source.schema())
    assert checksums(raw_pg, schema) == before


def test_a_stream_refuses_a_lock_and_a_read_splits_the_locks_range(shop) -> None:
    schema, uri = shop
    source = spark.SqlQueueDataSource(
        {"url": uri, "queue": f'orders@"{schema}"', "lock": "7:10:30", "numPartitions": "4"}
    )
    with pytest.raises(spark.InvalidOptionError, match="a stream claims its own micro-batches"):
        source.streamReader(source.schema())
    assert source.parsed.lock == spark.options.Lock(7, 10, 30) and source.parsed.lock.text() == "7:10:30"
    ranges = source.reader(source.schema()).partitions()  # from the lock alone: Seqs 11 to 30
    assert [(r.after, r.last) for r in ranges] == [(10, 15), (15, 20), (20, 25), (25, 30)]
    empty = spark.SqlQueueDataSource({"url": uri, "queue": f'orders@"{schema}"', "lock": "7:0:0"})
    assert [(r.after, r.last) for r in empty.reader(empty.schema()).partitions()] == [(0, 0)]
