"""Every default of the transport, in one place; the Airflow layer takes its defaults from here too.

The lease is short on purpose. A claim is a promise that its holder is alive and working: a
holder renews it while it works (:class:`~airflow_provider_sqlqueue.transport.lease.LeaseKeeper`,
the pump, the provider's ``hold_messages``), so a long job keeps its messages however long it runs,
and a holder that dies -- a SIGKILLed worker, a triggerer killed between its receive and Airflow
storing the event -- gives them back within one lease instead of after the job's length.
"""

from __future__ import annotations

from datetime import timedelta

#: Name of the error queue; an error queue named without a schema lives in the queue's own schema.
ERROR_QUEUE = "error"

#: Name of the audit queue a client or pump copies processed messages to when auditing is on
#: (``audit_queue=True``); named without a schema, like the error queue, it is in the queue's schema.
AUDIT_QUEUE = "audit"

#: How long a claim stays reserved without being renewed (the hand-off lease).
LEASE = timedelta(minutes=2)

#: Renewals per lease: a holder renews every ``lease / RENEWALS_PER_LEASE`` while it works, so that
#: two renewals in a row may fail (a database restart, a pause) before the claim lapses.
RENEWALS_PER_LEASE = 3


def renewal_interval(lease: timedelta) -> float:
    """Seconds between renewals of a claim held for ``lease``: the one cadence of every holder."""
    return lease.total_seconds() / RENEWALS_PER_LEASE


#: Longest lease or give-back delay accepted: claims are renewed, so a longer one only hides a dead holder.
MAX_LEASE = timedelta(days=7)

#: Shortest lease a holder that renews it accepts (a keeper, a pump, ``hold_messages``, the
#: triggers' hand-off): renewing every third of a shorter one leaves no room for a round trip
#: under load, and the claim lapses to another consumer while its holder still works. A single
#: ``claim`` takes any positive lease: a claim nobody renews may be meant to lapse at once.
MIN_RENEWED_LEASE = timedelta(seconds=1)

#: Longest time-to-be-received accepted. ``Expires`` must stay a date that NServiceBus (.NET
#: ``DateTime``), SQL Server's ``datetime`` and Python can all read (before the year 10000).
MAX_TIME_TO_BE_RECEIVED = timedelta(days=365 * 1000)

#: Deliveries of one message to a handler (or an Airflow task) before it moves to the error queue.
MAX_DELIVERIES = 5

#: Expired messages deleted per transaction by ``purge_expired``.
PURGE_BATCH = 10_000

#: Seconds between peeks of an empty queue (pump, triggers, shared pollers), and the longest accepted
#: (more than 10 s is warned about: a queue peeked that rarely is slow to notice messages).
PEEK_INTERVAL = 1.0
MAX_PEEK_INTERVAL = timedelta(hours=1)
#: Outside this range of peek intervals (seconds) a loop warns: below, idle consumers load the
#: database; above, messages wait long before anyone looks.
MIN_RECOMMENDED_PEEK_INTERVAL = 0.1
MAX_RECOMMENDED_PEEK_INTERVAL = 10.0

#: Circuit breaker of every loop (pump, pollers, triggers): longest back-off, and when a lasting
#: outage is logged as an error rather than a warning.
MAX_BACKOFF_SECONDS = 30.0
BREAKER_ALARM_SECONDS = 120.0
#: Longest back-off and alarm delay a loop accepts: past these an outage goes unnoticed for too long.
MAX_BACKOFF_LIMIT = timedelta(hours=1)
BREAKER_ALARM_LIMIT = timedelta(days=1)

#: Past every Seq (bigint on both databases): the end of a range that has none, and "below the newest".
LAST_SEQ = 2**63 - 1

#: Most messages or rows one call receives, claims, browses or purges (a statement's LIMIT / TOP).
MAX_BATCH = 100_000
#: Most claims one holder may be made to hold at once (``hold``, a Spark claim read or micro-batch):
#: taken MAX_BATCH per statement.
MAX_HELD = 10 * MAX_BATCH

#: NServiceBus's delayed-message table of a queue is ``<queue>.<suffix>`` in the queue's schema.
DELAYED_TABLE_SUFFIX = "Delayed"
#: Due delayed messages moved per transaction, and seconds between looks for due ones (NServiceBus's defaults).
DELAYED_BATCH = 100
DELAYED_INTERVAL = 1.0
#: Longest delivery delay accepted: Due must stay a date every reader can hold (as for TTBR).
MAX_DELAY = timedelta(days=365 * 1000)

#: NServiceBus's subscription table (in the default schema unless given with one).
SUBSCRIPTION_TABLE = "SubscriptionRouting"

#: The Spark data source's write ledger (in the queue's schema unless given with one).
WRITE_LEDGER = "sqlqueue_writes"

#: Newest error queue rows read to group failures by source queue and exception type (headers only).
ERROR_SUMMARY_ROWS = 10_000

#: Error queue rows read per statement (headers only) while a retry looks for a source queue's
#: messages or a listing for one group's: each call does bounded work, however long the queue is.
ERROR_SCAN_ROWS = 5_000

#: Newest rows of each table a journey searches (headers only: a bounded scan, as headers have no
#: index), and most rows one journey shows.
JOURNEY_SCAN = 10_000
JOURNEY_LIMIT = 200

#: Bytes of a failed message's body shown with it: enough to recognise it, never the whole body.
BODY_PREVIEW_BYTES = 512

#: Expired messages counted per queue by ``queue_stats`` (more shows as that many: the count stays cheap).
EXPIRED_COUNT_LIMIT = 10_000

#: Lapsed claims given back to their queue per statement by ``release_lapsed``.
RELEASE_BATCH = 1_000

#: Most reservations an Airflow run adopts at once (event-driven DAGs).
ADOPT_LIMIT = 100


#: Seconds a PostgreSQL connection attempt may take before the database counts as unreachable
#: (when the connection string does not set ``connect_timeout``).
CONNECT_TIMEOUT_SECONDS = 10
#: How long a blocking call that was interrupted (an exception from a signal handler) waits for the
#: server to accept the cancel of the statement it left running.
CANCEL_TIMEOUT_SECONDS = 5

#: Longest holder or machine name accepted (claims show who holds them; a name is no place for data).
MAX_LABEL = 255

#: Longest exception message and stack trace kept in failure headers (characters each; the rest is
#: cut, saying how much): a failure is recorded whatever its size, and headers stay readable.
MAX_FAILURE_TEXT = 16_384

#: Characters of each header value a page of failed messages shows (the rest is cut, saying how
#: much): a failure's stack trace or a hostile header never makes a page megabytes long.
HEADER_PREVIEW_CHARS = 2_048

# -- page and batch sizes of calls that take one (every layer takes its default from here) -------

#: Messages one receive, claim or reservation takes unless told otherwise.
RECEIVE_BATCH = 1
#: Messages a sensor or trigger waits for and hands over at once.
SENSOR_BATCH = 10
#: Messages ``browse`` shows at once, and failed messages one ``retry_errors`` call sends back.
BROWSE_LIMIT = 1000
RETRY_LIMIT = 1000
#: Rows per page of the error queue's listing, of a queue's claims, and of the Queues page's listing.
FAILED_PAGE = 50
CLAIMS_PAGE = 100
QUEUES_PAGE = 50
#: Shares a holder's claims are read in: one, the whole (Spark's readers ask for more).
HELD_PARTS = 1
#: Handlers a pump runs at once, and messages each peek looks for.
MAX_CONCURRENCY = 1
PEEK_BATCH = 50
#: Connections a pump's pool opens before it is used.
POOL_MIN_SIZE = 1
#: Message ids a pump remembers the failures of (the oldest forgotten first).
FAILURE_MEMORY = 10_000
#: Rows ``spark.send_rows`` sends per statement, and the most ``spark.read_queue`` reads.
SPARK_SEND_BATCH = 500
SPARK_READ_LIMIT = 10_000

#: How often a receive looks again over the rows its session skipped lately (see
#: :mod:`~airflow_provider_sqlqueue.transport.heads`): a sender that committed after a newer message
#: was taken waits at most this long beyond its commit.
HEAD_RECENT_RESCAN = 0.25
#: How far back that look goes, in seconds of the session's progress: longer than a sender's
#: transaction usually stays open.
HEAD_RECENT_WINDOW = 2.0
#: How often a receive scans a queue from its start (each time walking every dead row version the
#: xmin horizon keeps): the longest a message skipped for any other reason waits.
HEAD_FULL_RESCAN = 10.0

# -- health (transport/health.py): when a figure becomes a problem an operator is told about --------

#: A transaction holding the xmin horizon this long is reported: meanwhile vacuum removes no dead
#: row of any queue of the database (at 1,000 messages a second, 300,000 of them in 5 minutes).
HORIZON_WARNING = timedelta(minutes=5)
#: Holders of the xmin horizon shown, the oldest first.
HORIZON_HOLDERS = 5
#: A replication slot (which has no start time) is reported once it holds back this many transactions.
HORIZON_WARNING_XIDS = 1_000_000
#: Due delayed messages still unmoved after this long: their mover is not running.
OVERDUE_WARNING = timedelta(minutes=1)
#: Dead rows in one queue table reported as a problem (vacuum is off, or held back).
DEAD_ROWS_WARNING = 100_000
#: Longest wait of a watcher (queue figures, health) for a lock another session holds on a table.
WATCH_LOCK_TIMEOUT = timedelta(seconds=5)
#: The same for the rest of a survey once one table was found locked (a schema's claim store,
#: locked, would otherwise cost every queue of the schema the whole wait).
WATCH_LOCK_TIMEOUT_AFTER_ONE = timedelta(milliseconds=50)
#: The longest lock wait either database takes: PostgreSQL's lock_timeout and SQL Server's
#: LOCK_TIMEOUT are milliseconds in a 32-bit integer.
LONGEST_LOCK_WAIT = timedelta(milliseconds=2**31 - 1)
#: How long a ``sqlqueue`` command waits for a locked table (``--lock-timeout``): long enough for a
#: busy queue's short row locks, short enough that a migration's lock is reported, not hung on.
COMMAND_LOCK_TIMEOUT = timedelta(seconds=10)
#: Seconds between the queue gauges a triggerer sends for each connection its triggers wait on
#: (``[sqlqueue] health_metrics_interval``; 0: none), so the gauges flow while nothing is scheduled.
HEALTH_METRICS_INTERVAL = 60.0
#: The shortest interval taken from that setting (a smaller positive one is raised to it).
MIN_HEALTH_METRICS_INTERVAL = 5.0
