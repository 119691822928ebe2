"""The ``sqlqueue`` data source's options under hostile input, and its write ledger per queue.

These run the data source's own Python -- the classes Spark instantiates on the driver and in its
Python workers -- against the real database, without a JVM (the Spark jobs themselves are in
``tests/test_spark.py``). Every option the data source reads is registered here, discovered
from the code, and given hostile values: each must be refused with the library's own error before
any row changes, and no error may carry the connection's password.
"""

from __future__ import annotations

import base64
import inspect
import re
import traceback
import uuid
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from psycopg import sql
from pyspark.sql import Row
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
    DateType,
    DayTimeIntervalType,
    DecimalType,
    DoubleType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
    YearMonthIntervalType,
)

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
    """What Spark does with the options on the driver: the source, then each of its readers and its
    writer that the options are for (an option of one direction is refused in the other)."""
    source = spark.SqlQueueDataSource(options)
    if not options.keys() & spark.WRITE_OPTIONS:
        source.reader(source.schema())
        source.streamReader(source.schema())
    if not options.keys() & spark.READ_OPTIONS:
        source.writer(source.schema(), False)


@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_a_hostile_option_is_refused_before_anything_changes(option: str, shop, raw_pg) -> None:
    schema, uri = shop
    good = {"url": uri, "queue": f'orders@"{schema}"'}
    if option in spark.READ_OPTIONS:
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


def columns(**types: DataType) -> StructType:
    return StructType([StructField(name, kind) for name, kind in types.items()])


def write(options: dict[str, str], rows: list[Row], schema: StructType | None = None) -> Any:
    """One partition of a batch write, as a Spark task runs it (``schema``: the DataFrame's; by
    default a ``body`` string column)."""
    source = spark.SqlQueueDataSource(options)
    writer = source.writer(schema or columns(body=StringType()), False)
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
            write(
                {"url": uri, "queue": f'orders@"{schema}"'},
                [Row(id=1, score=1.5), Row(id=2, score=bad)],
                columns(id=IntegerType(), score=DoubleType()),
            )
    with QueueClient.connect(uri) as client:
        assert client.depth(QueueAddress("orders", schema)) == 0  # the partition is all or nothing


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
    "mode": "browse",
    "holder": "nightly",
    "numPartitions": "3",
    "fetchSize": "10",
    "lease": "30",
    "maxDeliveries": "3",
    "maxMessagesPerBatch": "10",
    "errorQueue": 'billing@"{schema}"',
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


# -- the written DataFrame's schema, checked before anything is sent ------------------------------


@pytest.mark.parametrize(
    ("schema", "error", "message"),
    [
        (columns(body=StringType(), ttbr=BooleanType()), ArgumentTypeError, "column 'ttbr'.*got boolean"),
        (columns(body=StringType(), ttbr=StringType()), ArgumentTypeError, "column 'ttbr'.*got string"),
        (columns(body=StringType(), ttbr=YearMonthIntervalType()), ArgumentTypeError, "column 'ttbr'.*interval"),
        (columns(body=StringType(), headers=StringType()), ArgumentTypeError, "column 'headers' must be a map"),
        (
            columns(body=StringType(), headers=ArrayType(StringType())),
            ArgumentTypeError,
            "column 'headers' must be a map",
        ),
        (
            columns(body=StringType(), headers=MapType(StringType(), IntegerType())),
            ArgumentTypeError,
            "column 'headers'",
        ),
        (columns(body=IntegerType()), ArgumentTypeError, "column 'body' must be binary or string"),
        (StructType([]), InvalidArgumentError, "has no columns"),
        (
            StructType([StructField("n", IntegerType()), StructField("n", StringType())]),
            InvalidArgumentError,
            "more than one column named 'n'",
        ),
        (columns(n=YearMonthIntervalType()), ArgumentTypeError, "column 'n' is interval"),
        # The message columns are found whatever their case, so a differently cased one meets their types...
        (
            columns(BODY=IntegerType()),
            ArgumentTypeError,
            "column 'BODY' must be binary or string.*taken as column 'body'",
        ),
        (columns(body=StringType(), Headers=StringType()), ArgumentTypeError, "column 'Headers' must be a map"),
        (columns(body=StringType(), TTBR=BooleanType()), ArgumentTypeError, "column 'TTBR'.*got boolean"),
        # ... and two names Spark would take for one column are refused, special or not.
        (columns(body=StringType(), Body=StringType()), InvalidArgumentError, "'body' and 'Body'.*differ only in case"),
        (columns(name=StringType(), NAME=LongType()), InvalidArgumentError, "'name' and 'NAME'.*differ only in case"),
        (columns(n=ArrayType(YearMonthIntervalType())), ArgumentTypeError, r"column 'n' \(its elements\)"),
        (columns(n=MapType(ArrayType(StringType()), StringType())), ArgumentTypeError, "a map's keys must be scalars"),
    ],
)
def test_a_written_column_that_cannot_be_sent_is_refused_before_anything_changes(
    schema: StructType, error: type[Exception], message: str, shop, raw_pg
) -> None:
    dataset, uri = shop
    before = checksums(raw_pg, dataset)
    source = spark.SqlQueueDataSource({"url": uri, "queue": f'orders@"{dataset}"'})
    with pytest.raises(error, match=message):
        source.writer(schema, False)
    assert checksums(raw_pg, dataset) == before  # nothing sent, and no ledger created


def test_message_columns_are_found_whatever_their_case_by_rows_and_by_arrow(shop) -> None:
    """A ``Headers`` or ``TTBR`` column was sent as content (headers and expiry lost), and a lone
    ``BODY`` column as the JSON object ``{"BODY": ...}``; JSON content keeps its columns' names."""
    from pyspark.sql.pandas.types import to_arrow_schema

    schema, uri = shop
    text_map = MapType(StringType(), StringType())
    cases = [
        (columns(Body=StringType(), Headers=text_map, TTBR=IntegerType()), ("b", {"a": "1"}, 60)),
        (columns(BODY=BinaryType(), headers=text_map), (b"\x00b", {"a": "2"})),
        (columns(Name=StringType(), HEADERS=text_map, tTbR=DoubleType()), ("ada", {"a": "3"}, 1.5)),
    ]
    sent = []
    for row_schema, values in cases:
        layout = spark.RowLayout.of(row_schema)
        assert layout.takes_arrow()  # both paths apply: each must find the same columns
        assert set(layout.special()) == {name.lower() for name in row_schema.names} - {"name"}
        for arrow in (False, True):
            source = spark.SqlQueueDataSource({"url": uri, "queue": f'orders@"{schema}"'})
            writer = source.writer(row_schema, False)
            assert isinstance(writer, spark.QueueArrowWriter)
            if arrow:
                batch = pa.RecordBatch.from_pylist(
                    [dict(zip(row_schema.names, values, strict=True))], schema=to_arrow_schema(row_schema)
                )
                writer.commit([writer.write(iter([batch]))])
            else:
                writer.commit([writer.write(iter([Row(*values)]))])
            with QueueClient.connect(uri) as client:
                (message,) = client.receive(QueueAddress("orders", schema), 10)
            sent.append(
                (
                    message.body,
                    message.headers.get("a"),
                    message.headers.get("NServiceBus.TimeToBeReceived"),
                    message.headers.get("NServiceBus.ContentType"),
                )
            )
    assert sent == [
        *[(b"b", "1", "00:01:00", None)] * 2,
        *[(b"\x00b", "2", None, None)] * 2,
        *[(b'{"Name":"ada"}', "3", "00:00:01.5000000", "application/json")] * 2,
    ]


def test_a_ttbr_column_of_seconds_or_an_interval_sets_each_message(shop) -> None:
    schema, uri = shop
    rows = [Row(body="a", ttbr=Decimal("90.5")), Row(body="b", ttbr=None), Row(body="c", ttbr=7)]
    write(
        {"url": uri, "queue": f'orders@"{schema}"', "timeToBeReceived": "60"},
        rows,
        columns(body=StringType(), ttbr=DecimalType(10, 1)),
    )
    write(
        {"url": uri, "queue": f'orders@"{schema}"'},
        [Row(body="d", ttbr=timedelta(hours=1))],
        columns(body=StringType(), ttbr=DayTimeIntervalType()),
    )
    with QueueClient.connect(uri) as client:
        got = {
            m.text: m.headers["NServiceBus.TimeToBeReceived"] for m in client.browse(QueueAddress("orders", schema), 10)
        }
    assert got == {"a": "00:01:30.5000000", "b": "00:01:00", "c": "00:00:07", "d": "01:00:00"}
    with pytest.raises(ArgumentTypeError, match="column 'ttbr'"):  # a row built by hand still meets the core's rule
        write(
            {"url": uri, "queue": f'orders@"{schema}"'},
            [Row(body="e", ttbr=True)],
            columns(body=StringType(), ttbr=IntegerType()),
        )


def test_json_rows_carry_binary_times_and_intervals_faithfully(shop) -> None:
    schema, uri = shop
    instant = datetime(2020, 1, 1, 12, 30, tzinfo=UTC)
    row_schema = columns(
        raw=BinaryType(),
        at=TimestampType(),
        wall=TimestampNTZType(),
        day=DateType(),
        price=DecimalType(10, 2),
        took=DayTimeIntervalType(),
        nested=StructType(
            [StructField("blobs", ArrayType(BinaryType())), StructField("by_day", MapType(DateType(), LongType()))]
        ),
    )
    row = Row(
        raw=b"\x00\xff",
        at=instant.astimezone().replace(tzinfo=None),  # as PySpark hands a TIMESTAMP over: naive local time
        wall=datetime(2020, 1, 1, 12, 30),
        day=date(2020, 2, 29),
        price=Decimal("12.50"),
        took=-timedelta(days=1, seconds=3661, microseconds=500_000),
        nested=Row(blobs=[b"ab", None], by_day={date(2020, 1, 2): 3}),
    )
    write({"url": uri, "queue": f'orders@"{schema}"'}, [row], row_schema)
    with QueueClient.connect(uri) as client:
        (message,) = client.browse(QueueAddress("orders", schema), 10)
    assert message.headers["NServiceBus.ContentType"] == "application/json"
    assert message.json() == {
        "raw": base64.b64encode(b"\x00\xff").decode(),
        "at": "2020-01-01T12:30:00+00:00",
        "wall": "2020-01-01T12:30:00",
        "day": "2020-02-29",
        "price": "12.50",
        "took": "-P1DT1H1M1.5S",
        "nested": {"blobs": ["YWI=", None], "by_day": {"2020-01-02": 3}},
    }


@pytest.mark.parametrize(
    ("span", "text"),
    [
        (timedelta(0), "PT0S"),
        (timedelta(days=2), "P2D"),
        (timedelta(seconds=90), "PT1M30S"),
        (timedelta(microseconds=250_000), "PT0.25S"),
        (-timedelta(seconds=5), "-PT5S"),
        (timedelta(days=1, hours=2, microseconds=1), "P1DT2H0.000001S"),
    ],
)
def test_intervals_are_iso_8601_durations(span: timedelta, text: str) -> None:
    assert spark._iso_duration(span) == text


# -- batch_writer checks its arguments and its sink before a query claims anything ------------------


@pytest.mark.parametrize(
    ("options", "checkpoint", "error", "message"),
    [
        ({"url": "postgresql://db/x", "queue": "q"}, None, spark.InvalidOptionError, "checkpoint must be text"),
        ({"url": "postgresql://db/x", "queue": "q"}, "  ", spark.InvalidOptionError, "checkpoint must not be empty"),
        ([("url", "x")], "/ck", ArgumentTypeError, "must be a mapping"),
        ({"url": "postgresql://db/x", "queue": "q", "batchSize": 5}, "/ck", ArgumentTypeError, "'batchSize' is int"),
        (
            {"url": "postgresql://db/x", "queue": "q", "writeId": "w"},
            "/ck",
            spark.InvalidOptionError,
            "drop option 'writeId'",
        ),
        (
            {"url": "postgresql://db/x", "queue": "q", "lease": "30"},
            "/ck",
            spark.InvalidOptionError,
            "option 'lease' applies only to reads",
        ),
        (
            {"url": "postgresql://db/x", "queue": "q", "ledger": " "},
            "/ck",
            spark.InvalidOptionError,
            "option 'ledger' is empty",
        ),
        (
            {"url": "postgresql://db/x", "queue": "q", "batchsise": "5"},
            "/ck",
            spark.InvalidOptionError,
            "did you mean 'batchSize'",
        ),
    ],
)
def test_batch_writer_refuses_bad_arguments(
    options: Any, checkpoint: Any, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        spark.batch_writer(options, checkpoint)


def test_batch_writer_refuses_a_sink_that_is_not_a_queue_when_it_is_built(shop, raw_pg) -> None:
    schema, uri = shop
    before = checksums(raw_pg, schema)
    for options in (
        {"url": uri, "queue": f'customers@"{schema}"'},
        {"url": uri, "queue": f'orders@"{schema}"', "ledger": f'customers@"{schema}"'},
        {"url": uri, "queue": f'orders@"{schema}"', "ledger": f'billing@"{schema}"'},
    ):
        with pytest.raises(SqlQueueError):
            spark.batch_writer(options, "/tmp/checkpoint")
    assert checksums(raw_pg, schema) == before
    assert callable(spark.batch_writer({"url": uri, "queue": f'orders@"{schema}"'}, "/tmp/checkpoint"))


@pytest.mark.parametrize("write_id", ["w\x00", 5, "w" * 2_000, ""])
def test_forget_write_checks_the_write_id(write_id: Any, shop) -> None:
    schema, uri = shop
    with pytest.raises(SqlQueueError):
        spark.forget_write(uri, f'orders@"{schema}"', write_id)
