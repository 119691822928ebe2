"""``sqlqueue`` (and ``airflow sqlqueue``): scripts a DBA reviews before anything runs, and a look at live queues.

``ddl`` and ``grants`` print, without connecting, what ``create_queue`` would create for the
given queues and what a runtime role needs on it; ``health``, ``depths``, ``errors``, ``retry``, ``journey``,
``release-lapsed``, ``move-due``
and the subscription commands work on a database named by ``--conn`` (a URI, as ``QueueClient.connect`` takes; default
``$SQLQUEUE_CONN``) or, where Airflow is installed, by ``--conn-id`` (an Airflow connection).

The same commands are the console script ``sqlqueue`` for hosts without Airflow and, through
the provider's ``cli`` entry, ``airflow sqlqueue ...``. Arguments are declared once and handed to
argparse or to Airflow's CLI, so the two never differ. Errors of the library end the command
with its message and exit status 1; no credentials are printed. A command interrupted (Ctrl-C) says
so in one line and exits with status 130, as shells report a command ended by SIGINT; a command
that connects waits at most ``--lock-timeout`` seconds for a lock another session holds (a
migration, ``VACUUM FULL``), then names the locked table and exits with status 1 (``journey``
leaves the table out, names it and goes on).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NoReturn, TextIO

from . import __version__
from .exit_status import INTERRUPTED
from .transport import QueueAddress, QueueClient, defaults
from .transport import operations as ops
from .transport.arguments import lock_wait_span
from .transport.client import Addressing
from .transport.dialects import Dialect, get_dialect
from .transport.drivers import dialect_for, finish
from .transport.errors import InvalidArgumentError, SqlQueueError, one_line, printable
from .transport.install import Installation
from .transport.message import check_positive, shown_time, whole_ms

if TYPE_CHECKING:
    from .hooks.sqlqueue import SqlQueueHook

#: An argument: its flags and the keyword arguments argparse's add_argument takes (those Airflow's Arg takes too).
ArgSpec = tuple[tuple[str, ...], dict[str, Any]]

QUEUES: ArgSpec = (("queues",), {"nargs": "+", "metavar": "QUEUE", "help": "queues, in the database's address syntax"})
DIALECT: ArgSpec = (
    ("--dialect",),
    {"choices": ["postgres", "sqlserver"], "help": "the database the script is for (default: the connection's)"},
)
ERROR_QUEUE: ArgSpec = (
    ("--error-queue",),
    {"help": f"the error queue (default {defaults.ERROR_QUEUE!r} in each queue's schema)"},
)
AUDIT: ArgSpec = (("--audit",), {"action": "store_true", "help": f"include the audit queue ({defaults.AUDIT_QUEUE!r})"})
AUDIT_QUEUE: ArgSpec = (("--audit-queue",), {"help": "include the audit queue, by this name"})
SECONDARY: ArgSpec = (("--secondary",), {"metavar": "MACHINE", "help": "include the secondary queue <queue>.<MACHINE>"})
NO_DELAYED: ArgSpec = (("--no-delayed",), {"action": "store_true", "help": "leave out the delayed-message tables"})
BODY_STRING: ArgSpec = (("--body-string",), {"action": "store_true", "help": "add the computed BodyString column"})
NOTIFY_ON_INSERT: ArgSpec = (
    ("--notify-on-insert",),
    {
        "action": "store_true",
        "help": "add a trigger that wakes each queue's listeners on every insert, whoever makes it (PostgreSQL)",
    },
)
SUBSCRIPTIONS: ArgSpec = (
    ("--subscriptions",),
    {"action": "store_true", "help": f"include the subscription table ({defaults.SUBSCRIPTION_TABLE!r})"},
)
SUBSCRIPTION_TABLE: ArgSpec = (("--subscription-table",), {"help": "include the subscription table, by this name"})
WRITE_LEDGER: ArgSpec = (
    ("--write-ledger",),
    {
        "action": "store_true",
        "help": f"include the Spark data source's write ledger ({defaults.WRITE_LEDGER!r} in each queue's schema)",
    },
)
WRITE_LEDGER_TABLE: ArgSpec = (
    ("--write-ledger-table",),
    {"help": "include the write ledger, by this name (the data source's 'ledger' option)"},
)
ROLE: ArgSpec = (("--role",), {"required": True, "help": "the runtime role (user or database role) to grant to"})
CONN: ArgSpec = (("--conn",), {"help": "database URI (default: $SQLQUEUE_CONN)"})
CONN_ID: ArgSpec = (("--conn-id",), {"help": "an Airflow connection instead of --conn"})
SOME_QUEUES: ArgSpec = (("queues",), {"nargs": "+", "metavar": "QUEUE", "help": "queues to look at"})
ALL_QUEUES: ArgSpec = (
    ("queues",),
    {"nargs": "*", "metavar": "QUEUE", "help": "queues to look at (default: every queue the connection may read)"},
)
QUEUE_FILTER: ArgSpec = (
    ("--queue",),
    {"help": "only messages that failed in this queue (and its schema's error queue)"},
)
LIMIT: ArgSpec = (
    ("--limit",),
    {"type": int, "default": defaults.ERROR_SUMMARY_ROWS, "help": "most error messages read (newest first)"},
)
RETRY_LIMIT: ArgSpec = (
    ("--limit",),
    {"type": int, "default": defaults.RETRY_LIMIT, "help": "most error messages retried"},
)


def lock_wait_seconds(text: str) -> timedelta:
    """``--lock-timeout``: seconds, as the client's ``lock_wait`` takes them (more than none: 0 would
    mean "wait for ever" to the database); anything else is a usage error naming the option."""
    try:
        return lock_wait_span(float(text))
    except (ValueError, SqlQueueError):
        longest = defaults.LONGEST_LOCK_WAIT.total_seconds()
        raise argparse.ArgumentTypeError(f"give between 0.001 and {longest:,} seconds, got {text!r}") from None


LOCK_TIMEOUT: ArgSpec = (
    ("--lock-timeout",),
    {
        "type": lock_wait_seconds,
        "default": defaults.COMMAND_LOCK_TIMEOUT,
        "metavar": "SECONDS",
        "help": f"wait at most this long for a lock another session holds, then name the locked table and "
        f"exit 1 -- journey leaves it out and names it (default {defaults.COMMAND_LOCK_TIMEOUT.total_seconds():g})",
    },
)

PLAN_ARGS = [QUEUES, DIALECT, ERROR_QUEUE, AUDIT, AUDIT_QUEUE, SECONDARY, NO_DELAYED, BODY_STRING, SUBSCRIPTIONS]
PLAN_ARGS += [SUBSCRIPTION_TABLE, WRITE_LEDGER, WRITE_LEDGER_TABLE, NOTIFY_ON_INSERT, CONN, CONN_ID]


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    run: Callable[[argparse.Namespace, TextIO], int | None]  #: an exit status other than 0 when not None
    args: Sequence[ArgSpec]


def _dialect(args: argparse.Namespace) -> Dialect:
    """The dialect named, else the connection's (looked up, not connected to)."""
    if args.dialect:
        return get_dialect(args.dialect)
    if args.conn_id:
        return get_dialect(_hook(args).dialect_name)
    uri = args.conn or os.environ.get("SQLQUEUE_CONN")
    if not uri:
        raise SqlQueueError("say which database the script is for: --dialect, --conn or --conn-id")
    return dialect_for(uri)


def _installation(args: argparse.Namespace) -> Installation:
    """The plan for the queues named, refused (as the runtime would refuse it) when a queue is its own
    error queue, its audit queue is the queue or its error queue, or one table is planned as two kinds."""
    # A name given empty is refused as a name, not taken for "not given".
    audit: str | bool | None = args.audit_queue if args.audit_queue is not None else (True if args.audit else None)
    addressing = Addressing(_dialect(args), args.error_queue, audit)
    plans = []
    for queue in args.queues:
        address = addressing.address(queue)
        addressing.error_address(args.error_queue, address)  # the runtime's rules, so the script is one it can use
        addressing.audit_address(address)
        plans.append(
            addressing.installation(
                address,
                secondary=args.secondary,
                body_string=args.body_string,
                delayed=not args.no_delayed,
                notify_on_insert=args.notify_on_insert,
            )
        )
    plan = Installation.combine(plans)
    if args.subscriptions or args.subscription_table is not None:
        table = defaults.SUBSCRIPTION_TABLE if args.subscription_table is None else args.subscription_table
        plan = plan.with_subscriptions(addressing.address(table))
    if args.write_ledger or args.write_ledger_table is not None:
        ledger = defaults.WRITE_LEDGER if args.write_ledger_table is None else args.write_ledger_table
        plan = plan.with_write_ledgers([addressing.beside(ledger, addressing.address(queue)) for queue in args.queues])
    return plan


def run_ddl(args: argparse.Namespace, out: TextIO) -> None:
    plan = _installation(args)
    out.write(
        f"-- Tables and indexes for {', '.join(map(repr, args.queues))} ({plan.dialect.name}), as create_queue makes them.\n"
    )
    out.write("-- Run as the installer (CREATE on the schema). Every statement leaves an existing table as it is.\n\n")
    out.write(plan.dialect.script(plan.ddl()))


def run_grants(args: argparse.Namespace, out: TextIO) -> None:
    plan = _installation(args)
    grants = plan.grants(args.role)  # a role no database can name is refused before anything is printed
    out.write(
        f"-- What role {args.role!r} needs to use {', '.join(map(repr, args.queues))} at run time, and no more.\n"
    )
    out.write("-- Run after the tables exist, as a role that may grant on them and on their schema (its owner).\n\n")
    out.write(plan.dialect.script(grants))


def _hook(args: argparse.Namespace) -> SqlQueueHook:
    """The hook of ``--conn-id``, its connection looked up as Airflow's own CLI looks one up: the
    environment, the secrets backends, then the metadata database (``airflow connections add``).
    A task's lookup (through the task supervisor) does not exist in a command-line process."""
    from airflow.models.connection import Connection
    from airflow.sdk.exceptions import AirflowNotFoundException

    from .hooks.sqlqueue import SqlQueueHook

    try:
        connection = Connection.get_connection_from_secrets(args.conn_id)
    except AirflowNotFoundException:
        raise SqlQueueError(
            f"no Airflow connection {args.conn_id!r} (looked for in the environment, the secrets backends and "
            "the metadata database); add it with 'airflow connections add' or pass --conn"
        ) from None
    return SqlQueueHook(args.conn_id, error_queue=getattr(args, "error_queue", None), connection=connection)


def _client(args: argparse.Namespace) -> QueueClient:
    """The client of ``--conn`` or ``--conn-id``, its session's lock waits bounded by ``--lock-timeout``."""
    if not isinstance(args.lock_timeout, timedelta):  # argparse passes "--lock-timeout=--" on unconverted
        raise InvalidArgumentError(f"--lock-timeout takes a number of seconds, got {args.lock_timeout!r}")
    if args.conn_id:
        client = _hook(args).get_conn()
    else:
        uri = args.conn or os.environ.get("SQLQUEUE_CONN")
        if not uri:
            raise SqlQueueError("say which database to use: --conn URI, $SQLQUEUE_CONN or --conn-id")
        client = QueueClient.connect(uri, error_queue=getattr(args, "error_queue", None))
    try:
        _bound_lock_waits(client, args.lock_timeout)
    except BaseException:
        client.close()
        raise
    return client


def _bound_lock_waits(client: QueueClient, lock_wait: timedelta) -> None:
    """Make every later statement of the client's session wait at most ``lock_wait`` for a lock (the
    dialect's statement; where it has none, waits stay unbounded)."""
    statement = client.dialect.session_lock_timeout_sql(whole_ms(lock_wait))
    if statement is not None:
        finish(client.session.run(_alone(ops.Step(statement, {}, ops.Fetch.NONE, "the session"))))


@ops.autocommitted
def _alone(step: ops.Step) -> ops.Operation[None]:
    yield step


def _table(out: TextIO, header: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    cells = [list(header)] + [[printable(str(cell)) for cell in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    out.writelines(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() + "\n" for row in cells
    )


def run_depths(args: argparse.Namespace, out: TextIO) -> None:
    """Per queue: waiting (counted), in flight and lapsed (``-`` where the schema has no claim store,
    as in tables an NServiceBus endpoint made), and its own failures among the error queue's newest."""
    rows = []
    with _client(args) as client:
        for name in args.queues:
            queue = client.address(name)
            [stats] = client.queue_stats(queue, lock_wait=args.lock_timeout)
            canonical = client.canonical_address(queue)
            failed = sum(g.count for g in client.error_summary(queue=queue) if g.source == canonical)
            rows.append(
                [
                    canonical,
                    client.depth(queue),
                    "-" if stats.in_flight is None else stats.in_flight,
                    "-" if stats.lapsed is None else stats.lapsed,
                    failed,
                ]
            )
    newest = f"failed (of the newest {defaults.ERROR_SUMMARY_ROWS:,} failures)"
    _table(out, ["queue", "waiting", "in flight", "lapsed claims", newest], rows)


def _age(span: timedelta | None) -> str:
    return "-" if span is None else f"{max(0, int(span.total_seconds())):,}s"


#: ``sqlqueue health``'s exit status when it finds a problem (1 is an error, 2 argparse's usage error).
PROBLEMS_FOUND = 3


def run_health(args: argparse.Namespace, out: TextIO) -> int:
    """Figures of the queues named (else every queue the connection may read, those it cannot measure
    reported as problems) and of their database's xmin horizon, then the problems found
    (:mod:`~.transport.health`). Exit status 3 when there are any, for cron or a monitoring check."""
    with _client(args) as client:
        health = client.health(args.queues or None, report_unreadable=not args.queues, lock_wait=args.lock_timeout)
        queues = [s.queue for s in health.queues] + [p.queue for p in health.problems if p.queue is not None]
        names = {queue: printable(client.canonical_address(queue)) for queue in queues}
    horizon = health.horizon
    if horizon is None:
        out.write("xmin horizon: not kept by this database\n")
    elif horizon.oldest is None:
        out.write("xmin horizon: held by no other session, prepared transaction or replication slot\n")
    for n, holder in enumerate(() if horizon is None else horizon.holders):
        since = shown_time(holder.since) or "-"
        who = printable(
            f"{holder.holder} ({holder.application or 'no application name'}, {holder.state or 'state hidden'})"
        )
        out.write(
            f"{'xmin horizon: held by' if n == 0 else '         and also by'} {who} since {since} "
            f"({_age(holder.held_for(health.checked_at))}, {holder.xid_age or 0:,} transactions)\n"
        )
    if horizon is not None and not horizon.complete:
        out.write("  (the state and start of other roles' sessions are hidden: grant pg_read_all_stats to see them)\n")
    capped = defaults.EXPIRED_COUNT_LIMIT
    rows = [
        [
            names[s.queue],
            s.waiting,
            _age(None if s.oldest_sent is None else health.checked_at - s.oldest_sent),
            "-" if s.in_flight is None else s.in_flight,
            "-" if s.lapsed is None else s.lapsed,
            "-" if s.due_delayed is None else f"{s.due_delayed}{'+' if s.due_delayed >= capped else ''}",
            _age(s.overdue),
            f"{s.expired}{'+' if s.expired >= capped else ''}",
            "-" if s.dead_rows is None else s.dead_rows,
            shown_time(s.last_vacuum) or "never",
        ]
        for s in health.queues
    ]
    out.write("\n")
    header = ["queue", "waiting", "oldest", "in flight", "lapsed", "due delayed", "overdue", "expired"]
    _table(out, [*header, "dead rows", "last vacuum"], rows)
    out.write("\n")
    if not health.problems:
        out.write("no problems found\n")
        return 0
    for problem in health.problems:
        where = "database" if problem.queue is None else names[problem.queue]
        out.write(f"PROBLEM {problem.concern} ({where}): {printable(problem.message)}\n")
    return PROBLEMS_FOUND


def _error_queues(client: QueueClient, args: argparse.Namespace) -> list[QueueAddress] | None:
    """The error queues ``errors`` and ``retry`` read when neither ``--error-queue`` nor ``--queue`` says
    (None when one does: the client's rule then chooses, in ``--queue``'s schema): those of the
    database, found as ``health`` finds them -- in whichever schema the queues live, not only in the
    connection's default one."""
    if args.error_queue is not None or args.queue is not None:
        return None
    found = client.error_queues()
    if not found:
        raise SqlQueueError(
            "found no error queue among the tables the connection may read; name one with --error-queue"
        )
    return found


def run_errors(args: argparse.Namespace, out: TextIO) -> None:
    """The groups of each error queue; each is named first when none was (several schemas may have one)."""
    with _client(args) as client:
        found = _error_queues(client, args)
        summaries = [
            (
                None if error is None else client.canonical_address(error),
                client.error_summary(error, queue=args.queue, limit=args.limit),
            )
            for error in ([None] if found is None else found)
        ]
    for n, (name, groups) in enumerate(summaries):
        if name is not None:
            out.write(("\n" if n else "") + f"{printable(name)}:\n")
        rows = [
            [g.count, g.source, g.exception_type, shown_time(g.newest_failure) or "-", g.newest_message] for g in groups
        ]
        _table(out, ["count", "failed in", "exception", "newest failure", "newest message"], rows)
        if not rows:
            out.write("(the error queue is empty)\n")


def run_retry(args: argparse.Namespace, out: TextIO) -> None:
    """Retry in bounded passes, saying which messages stay in the error queue and why."""
    check_positive("limit", args.limit)
    retried, after = 0, 0
    left: list[tuple[int, str]] = []
    with _client(args) as client:
        found = _error_queues(client, args)
        if found is not None and len(found) > 1:
            raise SqlQueueError(
                f"the database has {len(found)} error queues ({', '.join(map(client.canonical_address, found))}); "
                "name the one to retry with --error-queue"
            )
        error = None if found is None else found[0]
        while True:
            page = client.retry_errors_page(error, queue=args.queue, after=after, limit=args.limit - retried)
            retried, after = retried + page.retried, page.after
            left += page.skipped
            if page.done or retried >= args.limit:
                break
    out.write(f"sent {retried} message(s) back to the queue(s) they failed in\n")
    out.writelines(f"left the message at seq {seq}: {one_line(Exception(reason))}\n" for seq, reason in left)


JOURNEY_KEY: ArgSpec = (
    ("message_or_trace",),
    {"metavar": "ID", "help": "a message id (a UUID), or a trace id (32 hex digits, or a whole traceparent header)"},
)
JOURNEY_QUEUES: ArgSpec = (
    ("--queue",),
    {
        "action": "append",
        "dest": "queues",
        "metavar": "QUEUE",
        "help": "search only this queue (repeat for more; default: every queue the connection may read)",
    },
)
SCAN: ArgSpec = (
    ("--scan",),
    {"type": int, "default": defaults.JOURNEY_SCAN, "help": "newest rows of each table searched (headers only)"},
)
JOURNEY_LIMIT: ArgSpec = (
    ("--limit",),
    {"type": int, "default": defaults.JOURNEY_LIMIT, "help": "most rows shown"},
)
#: Characters of a sender's header value a row of ``journey`` shows.
JOURNEY_CELL = 120
#: What each kind of row says happened to the message at its stage.
STATIONS = {
    "processed": "processed",
    "failed": "failed",
    "claimed": "in flight",
    "waiting": "waiting",
    "unreadable": "waiting, headers unreadable",
}


def _span(span: timedelta | None) -> str:
    """A stage's time as people read it: seconds to the millisecond (a pipeline's stages take less than one)."""
    return "-" if span is None else f"{span.total_seconds():,.3f}s"


def run_journey(args: argparse.Namespace, out: TextIO) -> None:
    """The rows a message or a trace left, oldest first: when it was sent, where, what happened and
    how long it waited and was processed; then what the search could not see."""
    with _client(args) as client:
        found = client.journey(
            args.message_or_trace, queues=args.queues, scan=args.scan, limit=args.limit, lock_wait=args.lock_timeout
        )
        names = {a: client.canonical_address(a) for a in (*found.searched, *found.partial, *found.locked)}
    rows = []
    for seen in found.sightings:  # header values are the senders': each cut to a column's width
        note = seen.exception or (f"held by {seen.holder}" if seen.holder else "")
        rows.append(
            [
                shown_time(seen.sent) or "-",
                seen.message_id[:JOURNEY_CELL],
                seen.queue[:JOURNEY_CELL],
                STATIONS[seen.station],
                _span(seen.waited(found.checked_at)),
                _span(seen.processing),
                names[seen.table],
                note[:JOURNEY_CELL],
            ]
        )
    what = "message" if found.kind == "message" else "trace"
    out.write(f"{what} {found.key}: {len(rows)} row(s), searched {len(found.searched)} table(s)\n")
    if rows:
        _table(out, ["sent", "message", "stage", "what", "waited", "took", "row in", ""], rows)
    else:
        out.write(f"(no row of this {what} in the tables searched)\n")
    if found.kind == "message" and found.trace_ids:
        traces = ", ".join(found.trace_ids)
        out.write(f"its trace: {traces} (sqlqueue journey {found.trace_ids[0]} shows every message of it)\n")
    if found.more:
        out.write(f"more rows matched than --limit {args.limit:,}: the first ones are shown\n")
    if found.partial:
        tables = ", ".join(printable(names[address]) for address in found.partial)
        out.write(f"only the newest {args.scan:,} rows were searched (--scan) of: {tables}\n")
    if found.unreadable:
        out.write(f"{found.unreadable} queue table(s) this connection may not read were not searched\n")
    if found.locked:
        tables = ", ".join(printable(names[address]) for address in found.locked)
        out.write(f"locked by another session past --lock-timeout, not searched: {tables}\n")


def run_release_lapsed(args: argparse.Namespace, out: TextIO) -> None:
    with _client(args) as client:
        for name in args.queues:
            released = client.release_lapsed(name)
            out.write(f"{client.canonical_address(name)}: gave {released} lapsed claim(s) back to the queue\n")


def run_move_due(args: argparse.Namespace, out: TextIO) -> None:
    with _client(args) as client:
        for name in args.queues:
            moved = client.move_due(name)
            wait = client.next_due(name)
            later = "none waiting" if wait is None else f"next due in {max(wait.total_seconds(), 0):.1f}s"
            out.write(f"{client.canonical_address(name)}: moved {moved} due delayed message(s); {later}\n")


def run_subscribe(args: argparse.Namespace, out: TextIO) -> None:
    with _client(args) as client:
        # NServiceBus's own table (SubscriptionRouting, in whichever schema) is made when missing, as
        # its installer makes it; a table named otherwise must exist: a misspelt name would
        # otherwise get a table no publisher reads.
        table = client.subscription_table(args.subscription_table)
        if table.table == defaults.SUBSCRIPTION_TABLE:
            client.create_subscription_table(table)
        client.subscribe(args.queue, args.topics, endpoint=args.endpoint, table=table)
        out.write(f"{client.canonical_address(args.queue)} subscribed to {', '.join(args.topics)}\n")


def run_unsubscribe(args: argparse.Namespace, out: TextIO) -> None:
    with _client(args) as client:
        client.unsubscribe(args.queue, args.topics, endpoint=args.endpoint, table=args.subscription_table)
        out.write(f"{client.canonical_address(args.queue)} unsubscribed from {', '.join(args.topics)}\n")


def run_subscribers(args: argparse.Namespace, out: TextIO) -> None:
    with _client(args) as client:
        found = client.subscribers(args.topics, table=args.subscription_table)
    out.write("".join(f"{address}\n" for address in found) or "(no subscribers)\n")


SUBSCRIBER: ArgSpec = (("queue",), {"help": "the subscribing queue"})
TOPICS: ArgSpec = (("topics",), {"nargs": "+", "metavar": "TOPIC", "help": "event type names"})
ENDPOINT: ArgSpec = (("--endpoint",), {"help": "the subscriber's endpoint name (default: the queue's table name)"})
SUBSCRIBE_ARGS = [SUBSCRIBER, TOPICS, ENDPOINT, SUBSCRIPTION_TABLE, CONN, CONN_ID, LOCK_TIMEOUT]

COMMANDS = [
    Command("ddl", "print the installer's DDL for queues (no connection needed)", run_ddl, PLAN_ARGS),
    Command("grants", "print the least-privilege GRANTs for a runtime role", run_grants, [*PLAN_ARGS, ROLE]),
    Command(
        "depths",
        "waiting, in-flight and failed messages of queues",
        run_depths,
        [SOME_QUEUES, CONN, CONN_ID, ERROR_QUEUE, LOCK_TIMEOUT],
    ),
    Command(
        "health",
        "figures and problems of queues and their database (xmin horizon, lapsed claims, unmoved delayed "
        "messages, dead rows, failures); exit status 3 when a problem is found",
        run_health,
        [ALL_QUEUES, CONN, CONN_ID, ERROR_QUEUE, LOCK_TIMEOUT],
    ),
    Command(
        "errors",
        "the error queue grouped by source queue and exception type",
        run_errors,
        [CONN, CONN_ID, ERROR_QUEUE, QUEUE_FILTER, LIMIT, LOCK_TIMEOUT],
    ),
    Command(
        "retry",
        "send error messages back to the queues they failed in",
        run_retry,
        [CONN, CONN_ID, ERROR_QUEUE, QUEUE_FILTER, RETRY_LIMIT, LOCK_TIMEOUT],
    ),
    Command(
        "journey",
        "the queues, stages and times a message (by its id) or every message of a trace (by its trace id) "
        "passed, from the audit and error queues, claims and waiting rows",
        run_journey,
        [JOURNEY_KEY, JOURNEY_QUEUES, SCAN, JOURNEY_LIMIT, CONN, CONN_ID, LOCK_TIMEOUT],
    ),
    Command(
        "release-lapsed",
        "give lapsed claims (their holders died or stalled) back to their queues, where every receiver finds them",
        run_release_lapsed,
        [SOME_QUEUES, CONN, CONN_ID, LOCK_TIMEOUT],
    ),
    Command(
        "move-due",
        "move due delayed messages into their queues (where no pump runs the mover: cron, a maintenance DAG)",
        run_move_due,
        [SOME_QUEUES, CONN, CONN_ID, LOCK_TIMEOUT],
    ),
    Command("subscribe", "subscribe a queue to event types", run_subscribe, SUBSCRIBE_ARGS),
    Command("unsubscribe", "end a queue's subscriptions to event types", run_unsubscribe, SUBSCRIBE_ARGS),
    Command(
        "subscribers",
        "the queues subscribed to any of the event types",
        run_subscribers,
        [TOPICS, SUBSCRIPTION_TABLE, CONN, CONN_ID, LOCK_TIMEOUT],
    ),
]


#: The exit status of a command whose output's reader closed the pipe: a shell's for SIGPIPE.
PIPE_CLOSED = 128 + 13


def _run(command: Command, args: argparse.Namespace) -> int:
    """Run a command, turning the library's own errors into a message and exit status 1."""
    try:
        status = command.run(args, sys.stdout)
    except KeyboardInterrupt:  # Ctrl-C: the user knows why it stopped; a traceback tells them nothing
        print(f"sqlqueue {command.name}: interrupted", file=sys.stderr)
        return INTERRUPTED
    except BrokenPipeError:  # the reader went away (| head): no error of the command's, nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit's flush cannot fail again
        return PIPE_CLOSED
    except (SqlQueueError, ValueError) as exc:
        print(f"sqlqueue {command.name}: {one_line(exc)}", file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001  # anything else (Airflow's lookups, a bug): still one line, never a traceback
        print(f"sqlqueue {command.name}: {type(exc).__name__}: {one_line(exc)}", file=sys.stderr)
        return 1
    return status or 0


#: What ``sqlqueue --help`` and ``airflow sqlqueue --help`` say first, naming every command of
#: :data:`COMMANDS` (so neither can leave one out): plain text, as a terminal shows it.
DESCRIPTION = (
    f"SQL queues from the command line: {', '.join(c.name for c in COMMANDS)}. The scripts a DBA reviews "
    "(ddl, grants) need no connection; the others connect with --conn URI (default $SQLQUEUE_CONN) or, "
    "where Airflow is installed, --conn-id."
)


class _Parser(argparse.ArgumentParser):
    """argparse's parser, but a bad argument is one line and exit status 1, as every other refusal
    of the command is (argparse prints its usage and exits 2); ``--help`` still shows the usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(1, f"{self.prog}: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="sqlqueue", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        sub = commands.add_parser(command.name, help=command.help, description=command.help)
        for flags, options in command.args:
            sub.add_argument(*flags, **options)
        sub.set_defaults(command_object=command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The console script ``sqlqueue``."""
    args = build_parser().parse_args(argv)
    return _run(args.command_object, args)


def airflow_commands() -> list[Any]:
    """The ``airflow sqlqueue`` commands (the provider's ``cli`` entry): the same commands and arguments."""
    from airflow.cli.cli_config import ActionCommand, Arg, GroupCommand

    def action(command: Command) -> Any:
        def func(args: argparse.Namespace) -> None:
            status = _run(command, args)
            if status:
                raise SystemExit(status)

        func.__name__ = f"sqlqueue_{command.name}"
        return ActionCommand(
            name=command.name,
            help=command.help,
            func=func,
            args=[Arg(flags, **options) for flags, options in command.args],
        )

    return [
        GroupCommand(
            name="sqlqueue",
            help="SQL queues: the sqlqueue command's scripts and looks at live queues",
            description=DESCRIPTION,
            subcommands=[action(c) for c in COMMANDS],
        )
    ]
