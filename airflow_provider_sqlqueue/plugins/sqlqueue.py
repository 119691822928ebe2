"""The Queues page: a plugin that adds queue depths, claims and the error queue to Airflow's UI, with actions.

Three parts, registered as the ``airflow.plugins`` entry point ``sqlqueue`` (loaded by every Airflow
process, whatever ``[core] lazy_discover_providers`` says):

- an API (``fastapi_apps``, mounted at ``/sqlqueue`` in the api-server) whose every route asks
  Airflow's auth manager (whichever one Airflow runs) about the caller and the connection it names:

  - a queue's figures (depths, in flight, ages, error counts by source and exception type) need read
    access to the connection, *or* Airflow's permission to view Browse > Jobs (``is_authorized_view``
    with ``AccessView.JOBS``; Viewer and User have it under the simple and FAB auth managers), which
    lets a user without connection rights watch every queue connection the page lists, read only:
    claims' last errors and failures' exception messages are left out for them;
  - messages' headers and bodies, and a message's journey (read from its headers), need read access
    to the connection (GET);
  - retrying, purging, giving claims back and moving due delayed messages need edit access to the
    connection (PUT);

  a refusal is a 403 whose message names the permission missing;
- the page itself (``/sqlqueue/``: static HTML, CSS and JavaScript, no build step), which renders
  every value as text, never as markup, and shows at most a preview of a message body;
- an entry in Airflow's navigation (``external_views``) that shows the page inside Airflow.

No SQL here: every figure and action goes through :class:`~..hooks.sqlqueue.SqlQueueHook`, and
each action is recorded in Airflow's audit log with who did it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

from airflow.api_fastapi.auth.managers.models.resource_details import AccessView
from airflow.api_fastapi.core_api.security import GetUserDep
from airflow.plugins_manager import AirflowPlugin
from fastapi import Body, Depends, FastAPI, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse
from pydantic import BaseModel, Field

from ..hooks.sqlqueue import (
    DIALECT_OF_CONN_TYPE,
    ConnectionNotDefinedError,
    SqlQueueHook,
    UnsupportedConnectionError,
    configured_conn_ids,
)
from ..transport import QueueAddress, QueueClient, defaults
from ..transport.errors import (
    InvalidQueueNameError,
    QueueNotFoundError,
    SqlQueueError,
    TransportUnavailableError,
    one_line,
)
from ..transport.logs import logger
from ..transport.message import EXCEPTION_MESSAGE, TIME_OF_FAILURE, shown_time, storable_text
from ..transport.operations import ErrorGroup, FailedMessage, Horizon, QueueStats, Sighting

log = logger("airflow_provider_sqlqueue.plugins")

#: Where the API and the page are mounted in the api-server.
URL_PREFIX = "/sqlqueue"
PAGE = Path(__file__).parent / "queues_page"
#: Connection types whose connections the page lists (the types a queue can live behind).
QUEUE_CONN_TYPES = frozenset({SqlQueueHook.conn_type, *DIALECT_OF_CONN_TYPE})
#: Longest page of queues one request reads figures for (each queue costs one indexed query).
MAX_QUEUES_PER_PAGE = 200
#: The page sends nothing to be run: scripts, styles and frames come from the page's own origin.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "frame-ancestors 'self'; base-uri 'none'; form-action 'none'"
)

#: Airflow's view whose permission lets a user watch the queues' figures without rights on the connection.
MONITOR_VIEW = AccessView.JOBS
#: What each permission is called in refusals.
MONITOR_PERMISSION = "Airflow's permission to view Browse > Jobs"
READ_PERMISSION = "read access to the connection (GET on Connections)"
EDIT_PERMISSION = "edit access to the connection (PUT on Connections)"
NO_QUEUES_VISIBLE = (
    f"You may see no queues: the Queues page shows every queue connection's figures to users with "
    f"{MONITOR_PERMISSION}, and a connection's figures and messages to users with read access to it "
    "(GET on Connections); you have neither. Ask an Airflow admin for one of them."
)


# -- what the API answers ---------------------------------------------------------------------


class QueueFigures(BaseModel):
    address: str  #: the canonical address, what every other route takes as ``queue``
    schema_name: str
    table: str
    kind: str  #: ``queue``, ``error`` or ``audit``
    waiting: int
    oldest_sent: datetime | None
    oldest_age_seconds: float | None
    expired: int
    expired_capped: bool  #: more expired rows than were counted
    in_flight: int | None
    lapsed: int | None
    due_delayed: int | None  #: due delayed messages no mover has moved (None: no delayed table)
    due_delayed_capped: bool  #: more due delayed messages than were counted
    overdue_seconds: float | None  #: how long the earliest of them has been due
    dead_rows: int | None  #: dead rows vacuum has yet to remove (None: the database does not say)
    last_vacuum: datetime | None
    problems: list[str]  #: what ``sqlqueue health`` finds wrong with the queue


class HolderView(BaseModel):
    """A session, prepared transaction or replication slot holding the xmin horizon back."""

    holder: str
    application: str | None
    state: str | None
    since: datetime | None
    held_seconds: float | None
    xid_age: int | None


class HorizonView(BaseModel):
    """What holds back vacuum in the database (PostgreSQL's xmin horizon)."""

    holders: list[HolderView]  #: the oldest first; empty: nothing does
    complete: bool  #: whether other roles' sessions show their state and start (pg_read_all_stats)


class QueuePage(BaseModel):
    connection_id: str
    total: int  #: queues matching ``search``
    offset: int
    queues: list[QueueFigures]  #: the page's queues, those with problems first
    error_queues: list[str]  #: every error queue of the connection, those holding the most failures first
    horizon: HorizonView | None  #: None where the database keeps no xmin horizon (SQL Server)
    problems: list[str]  #: the database's problems (a long-held horizon), and queues that could not be measured


class Claim(BaseModel):
    id: str
    holder: str | None
    deliveries: int
    lease_left_seconds: float
    last_error: str | None  #: also None for a caller who may not read the connection's messages


class Group(BaseModel):
    source: str
    exception_type: str
    count: int
    newest_failure: str | None  #: ISO 8601 in UTC (:func:`~..transport.message.shown_time`)
    newest_message: str | None  #: None for a caller who may not read the connection's messages


class ErrorSummary(BaseModel):
    error_queue: str
    waiting: int  #: the peek estimate of the whole error queue
    window: int  #: how many of the newest messages the groups are read from
    groups: list[Group]


class FailedMessageView(BaseModel):
    seq: int
    id: str
    source: str
    exception_type: str
    exception_message: str | None
    time_of_failure: str | None  #: ISO 8601 in UTC, as ``newest_failure``
    headers: dict[str, str | None] | None  #: None: unreadable headers
    body_size: int | None
    body_preview: str  #: text, or hex when the body is not UTF-8
    body_encoding: str  #: ``text`` or ``hex``
    body_truncated: bool


class FailurePage(BaseModel):
    error_queue: str
    failures: list[FailedMessageView]
    next_before: int | None


class SightingView(BaseModel):
    """One row a message left, as the journey view shows it (times: ISO 8601 in UTC)."""

    message_id: str
    station: str  #: ``processed``, ``failed``, ``claimed``, ``waiting`` or ``unreadable`` (headers)
    stage: str  #: ``ProcessingEndpoint``, ``FailedQ``, the claimed queue, or the queue it waits in
    table: str  #: the canonical address of the table the row is in
    sent: str | None
    started: str | None  #: when the stage began processing it (an audit copy)
    ended: str | None  #: when the stage ended (an audit copy), or when it failed
    waited_seconds: float | None  #: from its send to the stage (or until now, waiting or held)
    processing_seconds: float | None
    trace_id: str | None
    parent_span_id: str | None  #: the sender's span, from ``traceparent``
    holder: str | None  #: who holds a claim
    exception: str | None  #: a failure's exception type and message, bounded


class JourneyView(BaseModel):
    kind: str  #: ``message`` or ``trace``: what the id was read as
    key: str  #: the id, lower-cased
    sightings: list[SightingView]  #: oldest first
    trace_ids: list[str]  #: the traces the rows belong to
    searched: int  #: tables searched
    partial: list[str]  #: tables holding more rows than were searched
    scan: int  #: newest rows of each table searched
    more: bool  #: more rows matched than are shown
    unreadable: int | None  #: queue tables the connection may not read, so not searched
    locked: list[str]  #: tables another session held locked past the journey's lock wait, not searched


class RetryRequest(BaseModel):
    error_queue: str
    source: str | None = Field(None, description="retry the failures of this queue (its address)")
    seqs: list[int] | None = Field(None, description="retry these messages (their seq in the error queue)")
    after: int = Field(0, ge=0, description="continue a retry of a source queue after this seq")


class Skipped(BaseModel):
    seq: int
    reason: str


class RetryAnswer(BaseModel):
    retried: int
    after: int
    done: bool
    skipped: list[Skipped]  #: messages left in the error queue, each with why it cannot be routed


class QueueRequest(BaseModel):
    queue: str


class Count(BaseModel):
    queue: str
    count: int


class ConnectionInfo(BaseModel):
    connection_id: str
    conn_type: str
    may_read_messages: bool  #: headers, bodies, exception messages (read access to the connection)
    may_act: bool  #: retry, purge, give claims back, move due messages (edit access to the connection)
    messages_refusal: str | None  #: why not, naming the missing permission (None: may)
    actions_refusal: str | None  #: why not, naming the missing permission (None: may)


# -- who may do what -----------------------------------------------------------------------------


class Access(BaseModel):
    """What the caller may do on one connection."""

    connection_id: str
    read: bool  #: read access to the connection: figures, headers and bodies
    edit: bool  #: edit access: actions
    monitor: bool  #: Airflow's permission to view Browse > Jobs: figures of queue connections

    def messages_refusal(self) -> str | None:
        if self.read:
            return None
        figures = "; you may see its queues' figures only" if self.monitor else ""
        return (
            f"reading the messages of connection {self._named()} (headers, bodies, exception messages) needs "
            f"{READ_PERMISSION}{figures}"
        )

    def actions_refusal(
        self, action: str = "retrying, purging, giving claims back and moving due messages"
    ) -> str | None:
        if self.edit:
            return None
        watching = "; you may only watch its queues" if self.read or self.monitor else ""
        return f"{action} on connection {self._named()} needs {EDIT_PERMISSION}{watching}"

    def _named(self) -> str:
        return repr(one_line(Exception(self.connection_id)))


def _may(user: Any, method: str, connection_id: str) -> bool:
    """Whether the auth manager grants ``method`` on the connection (with its team, as Airflow's own routes ask)."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import ConnectionDetails
    from airflow.configuration import conf

    team = None
    if conf.getboolean("core", "multi_team", fallback=False):
        from airflow.models.connection import Connection
        from sqlalchemy.exc import SQLAlchemyError

        try:
            team = Connection.get_team_name(connection_id)
        except (SQLAlchemyError, ValueError):  # an id the metadata database cannot hold (a NUL): never a 500
            raise HTTPException(404, f"connection {one_line(Exception(connection_id))!r} is not defined") from None
    details = ConnectionDetails(conn_id=connection_id, team_name=team)
    return bool(get_auth_manager().is_authorized_connection(method=method, details=details, user=user))  # type: ignore[arg-type]


def _monitors(user: Any) -> bool:
    from airflow.api_fastapi.app import get_auth_manager

    return bool(get_auth_manager().is_authorized_view(access_view=MONITOR_VIEW, user=user))


def _access(connection_id: str, user: Any) -> Access:
    return Access(
        connection_id=connection_id,
        read=_may(user, "GET", connection_id),
        edit=_may(user, "PUT", connection_id),
        monitor=_monitors(user),
    )


def see_figures(connection_id: str, user: GetUserDep) -> Access:
    """Figures: read access to the connection, or the monitoring view on a connection the page lists."""
    access = _access(connection_id, user)
    if access.read:
        return access
    named = repr(one_line(Exception(connection_id)))
    if not access.monitor:
        raise HTTPException(
            403, f"seeing the queues of connection {named} needs {READ_PERMISSION} or {MONITOR_PERMISSION}"
        )
    if connection_id not in queue_connections():
        raise HTTPException(
            403,
            f"connection {named} is not one of the queue connections the Queues page lists; seeing its queues "
            f"needs {READ_PERMISSION}",
        )
    return access


def read_messages(connection_id: str, user: GetUserDep) -> Access:
    access = _access(connection_id, user)
    refusal = access.messages_refusal()
    if refusal is not None:
        raise HTTPException(403, refusal)
    return access


def _edit(action: str) -> Any:
    def edit_connection(connection_id: str, user: GetUserDep) -> Access:
        access = _access(connection_id, user)
        refusal = access.actions_refusal(action)
        if refusal is not None:
            raise HTTPException(403, refusal)
        return access

    return Depends(edit_connection)


SeeFigures = Annotated[Access, Depends(see_figures)]
ReadMessages = Depends(read_messages)


# -- helpers ------------------------------------------------------------------------------------


@contextmanager
def _answering(connection_id: str) -> Iterator[None]:
    """The library's errors as HTTP answers with its message (never a connection string or a password)."""
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        yield
    except (AirflowNotFoundException, ConnectionNotDefinedError):
        raise HTTPException(404, f"connection {one_line(Exception(connection_id))!r} is not defined") from None
    except QueueNotFoundError as exc:
        raise HTTPException(404, one_line(exc)) from None
    except (InvalidQueueNameError, UnsupportedConnectionError, ValueError, TypeError) as exc:
        raise HTTPException(400, one_line(exc)) from None
    except TransportUnavailableError as exc:
        raise HTTPException(503, one_line(exc)) from None
    except SqlQueueError as exc:  # misconfigured, permission denied in the database: the database's answer
        raise HTTPException(502, one_line(exc)) from None


def _client(connection_id: str) -> QueueClient:
    """A client of the connection for one request (``with _client(...) as client:`` closes it)."""
    return SqlQueueHook(connection_id).client()


def _figures(address: str, kind: str, stats: QueueStats, now: datetime, problems: list[str]) -> QueueFigures:
    return QueueFigures(
        address=address,
        schema_name=stats.queue.schema or "",
        table=stats.queue.table,
        kind=kind,
        waiting=stats.waiting,
        oldest_sent=stats.oldest_sent,
        oldest_age_seconds=None if stats.oldest_sent is None else max(0.0, (now - stats.oldest_sent).total_seconds()),
        expired=stats.expired,
        expired_capped=stats.expired >= defaults.EXPIRED_COUNT_LIMIT,
        in_flight=stats.in_flight,
        lapsed=stats.lapsed,
        due_delayed=stats.due_delayed,
        due_delayed_capped=(stats.due_delayed or 0) >= defaults.EXPIRED_COUNT_LIMIT,
        overdue_seconds=None if stats.overdue is None else stats.overdue.total_seconds(),
        dead_rows=stats.dead_rows,
        last_vacuum=stats.last_vacuum,
        problems=problems,
    )


def _horizon(horizon: Horizon | None, now: datetime) -> HorizonView | None:
    if horizon is None:
        return None
    holders = []
    for h in horizon.holders:
        held = h.held_for(now)
        holders.append(
            HolderView(
                holder=h.holder,
                application=h.application,
                state=h.state,
                since=h.since,
                held_seconds=None if held is None else held.total_seconds(),
                xid_age=h.xid_age,
            )
        )
    return HorizonView(holders=holders, complete=horizon.complete)


def _preview(message: FailedMessage) -> tuple[str, str, bool]:
    """The body's start as text when it is UTF-8 (a character cut at the end is dropped), else as hex."""
    truncated = (message.body_size or 0) > len(message.body_preview)
    data = message.body_preview
    for cut in range(4 if truncated else 1):
        try:
            return data[: len(data) - cut].decode("utf-8"), "text", truncated
        except UnicodeDecodeError:
            continue
    return data.hex(" "), "hex", truncated


def _shown(text: str | None) -> str | None:
    """A header value as a page shows it: bounded, and valid text whatever the row holds."""
    return None if text is None else storable_text(text, defaults.HEADER_PREVIEW_CHARS)


def _group(group: ErrorGroup, may_read: bool) -> Group:
    """A group as the page shows it: its newest failure's time as every time (ISO 8601), its newest
    exception message only for a caller who may read the connection's messages."""
    return Group(
        source=group.source,
        exception_type=group.exception_type,
        count=group.count,
        newest_failure=shown_time(group.newest_failure),
        newest_message=group.newest_message if may_read else None,
    )


def _failure(message: FailedMessage) -> FailedMessageView:
    headers = {_shown(key) or "": _shown(value) for key, value in (message.headers or {}).items()}
    preview, encoding, truncated = _preview(message)
    source, exception_type = message.group
    return FailedMessageView(
        seq=message.seq,
        id=str(message.id),
        source=_shown(source) or "",
        exception_type=_shown(exception_type) or "",
        exception_message=headers.get(EXCEPTION_MESSAGE),
        time_of_failure=shown_time(headers.get(TIME_OF_FAILURE)),
        headers=None if message.headers is None else headers,
        body_size=message.body_size,
        body_preview=preview,
        body_encoding=encoding,
        body_truncated=truncated,
    )


def _sighting(seen: Sighting, table: str, now: datetime) -> SightingView:
    waited, processing, trace = seen.waited(now), seen.processing, seen.trace
    return SightingView(
        message_id=_shown(seen.message_id) or "",
        station=seen.station,
        stage=_shown(seen.queue) or "",
        table=table,
        sent=shown_time(seen.sent),
        started=shown_time(seen.started),
        ended=shown_time(seen.ended),
        waited_seconds=None if waited is None else waited.total_seconds(),
        processing_seconds=None if processing is None else processing.total_seconds(),
        trace_id=None if trace is None else trace[0],
        parent_span_id=None if trace is None else trace[1],
        holder=_shown(seen.holder),
        exception=_shown(seen.exception),
    )


def _record(user: Any, event: str, connection_id: str, **details: Any) -> None:
    """Who did what: the api-server's log and Airflow's audit log (Browse > Audit Log)."""
    name = user.get_name()
    log.info("Queues page: %s ran %s on connection %s: %s", name, event, connection_id, details)
    try:
        from airflow.models.log import Log
        from airflow.utils.session import create_session

        with create_session() as session:
            session.add(
                Log(
                    event=f"sqlqueue.{event}", owner=name, extra=json.dumps({"connection_id": connection_id, **details})
                )
            )
    except Exception:  # the action is done; a failing audit write must not report it as failed
        log.exception("Queues page: could not write %s by %s to Airflow's audit log", event, name)


def queue_connections() -> dict[str, str]:
    """conn_id -> conn_type of every connection a queue can live behind: those of the metadata database with a
    queue's connection type, and those named in ``[sqlqueue] connections`` (environment or secrets backends)."""
    from airflow.models.connection import Connection
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = session.execute(
            select(Connection.conn_id, Connection.conn_type).where(Connection.conn_type.in_(sorted(QUEUE_CONN_TYPES)))
        ).all()
    found = {str(conn_id): str(conn_type) for conn_id, conn_type in rows}
    for conn_id in configured_conn_ids():
        if conn_id not in found:
            found[conn_id] = "configured"
    return dict(sorted(found.items()))


# -- the app ------------------------------------------------------------------------------------


def create_app() -> FastAPI:
    app = FastAPI(title="SQL Queue", description="Queues of the SQL Queue provider's connections")

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        """FastAPI's own answer echoes the input, which JSON cannot always carry (a lone surrogate):
        say what is wrong with each field, without the value."""
        problems = [
            {
                "loc": [one_line(Exception(part)) for part in error.get("loc", ())],
                "msg": one_line(Exception(error.get("msg"))),
            }
            for error in exc.errors()
        ]
        return JSONResponse(status_code=422, content={"detail": problems})

    @app.get("/", include_in_schema=False)
    def page() -> FileResponse:
        return FileResponse(PAGE / "index.html", headers={"Content-Security-Policy": CONTENT_SECURITY_POLICY})

    @app.get("/static/{name}", include_in_schema=False)
    def static(name: str) -> FileResponse:
        files = {path.name: path for path in PAGE.iterdir() if path.suffix in (".js", ".css", ".svg")}
        if name not in files:
            raise HTTPException(404, "no such file")
        return FileResponse(files[name], headers={"Cache-Control": "no-cache"})

    @app.get("/api/connections")
    def connections(user: GetUserDep) -> list[ConnectionInfo]:
        """The connections a queue can live behind whose queues the caller may see, with what else they may do;
        403 naming the permissions when the caller may see none (an empty list: there are none to see)."""
        monitor = _monitors(user)
        listed = []
        for conn_id, conn_type in queue_connections().items():
            access = Access(
                connection_id=conn_id, read=_may(user, "GET", conn_id), edit=_may(user, "PUT", conn_id), monitor=monitor
            )
            if access.read or monitor:
                listed.append(
                    ConnectionInfo(
                        connection_id=conn_id,
                        conn_type=conn_type,
                        may_read_messages=access.read,
                        may_act=access.edit,
                        messages_refusal=access.messages_refusal(),
                        actions_refusal=access.actions_refusal(),
                    )
                )
        if not listed and not monitor:
            raise HTTPException(403, NO_QUEUES_VISIBLE)
        return listed

    @app.get("/api/connections/{connection_id}/queues", dependencies=[Depends(see_figures)])
    def queues(
        connection_id: str,
        offset: Annotated[int, Query(ge=0)] = 0,
        limit: Annotated[int, Query(ge=1, le=MAX_QUEUES_PER_PAGE)] = defaults.QUEUES_PAGE,
        search: str = "",
    ) -> QueuePage:
        """A page of the connection's queues with their figures; the list of names is one catalog query."""
        with _answering(connection_id):
            with _client(connection_id) as client:
                page = client.queue_page(search, offset=offset, limit=limit)
                health = client.health(page.queues, report_unreadable=True)
                kinds = {address: client.kind(address) for address in page.queues}
                # Error queues of every schema, for the error panel, the one holding the most failures
                # first, so the panel opens on it (one dropped meanwhile is left out, as the page leaves
                # out a queue it cannot measure).
                errors = client.health(client.error_queues(), report_unreadable=True).queues
                error_queues = [client.canonical_address(e.queue) for e in sorted(errors, key=lambda e: -e.waiting)]
                # The problems name the page's queues, and the error queues of theirs that hold failures.
                named_by_problems = [problem.queue for problem in health.problems if problem.queue is not None]
                texts = {address: client.canonical_address(address) for address in [*page.queues, *named_by_problems]}
            measured = {found.queue for found in health.queues}
            said: dict[QueueAddress | None, list[str]] = {}
            for problem in health.problems:
                if problem.queue is None or problem.queue in measured:
                    said.setdefault(problem.queue, []).append(problem.message)
                else:  # a queue with no row (not measured, or an error queue off the page): said with the database's
                    said.setdefault(None, []).append(f"{texts[problem.queue]}: {problem.message}")
            figures = [
                _figures(texts[found.queue], kinds[found.queue], found, health.checked_at, said.get(found.queue, []))
                for found in health.queues
            ]
            return QueuePage(
                connection_id=connection_id,
                total=page.total,
                offset=offset,
                queues=sorted(figures, key=lambda f: not f.problems),
                error_queues=error_queues,
                horizon=_horizon(health.horizon, health.checked_at),
                problems=said.get(None, []),
            )

    @app.get("/api/connections/{connection_id}/depth", dependencies=[Depends(see_figures)])
    def depth(connection_id: str, queue: str) -> Count:
        """The exact number of messages (a count over the table: asked for, not shown by default)."""
        with _answering(connection_id), _client(connection_id) as client:
            return Count(queue=queue, count=client.depth(queue))

    @app.get("/api/connections/{connection_id}/claims")
    def claims(
        connection_id: str,
        queue: str,
        access: SeeFigures,
        limit: Annotated[int, Query(ge=1, le=1000)] = defaults.CLAIMS_PAGE,
    ) -> list[Claim]:
        """The queue's claims; their last errors only for a caller who may read the connection's messages."""
        with _answering(connection_id), _client(connection_id) as client:
            return [
                Claim(
                    id=str(claim.id),
                    holder=claim.holder,
                    deliveries=claim.deliveries,
                    lease_left_seconds=claim.lease_left.total_seconds(),
                    last_error=claim.last_error if access.read else None,
                )
                for claim in client.claims(queue, limit)
            ]

    @app.get("/api/connections/{connection_id}/errors")
    def errors(connection_id: str, error_queue: str, access: SeeFigures) -> ErrorSummary:
        """The error queue by source queue and exception type, from its newest messages' headers (the newest
        exception message only for a caller who may read the connection's messages)."""
        with _answering(connection_id):
            with _client(connection_id) as client:
                waiting = client.peek(error_queue)
                groups = client.error_summary(error_queue)
            return ErrorSummary(
                error_queue=client.canonical_address(error_queue),
                waiting=waiting,
                window=defaults.ERROR_SUMMARY_ROWS,
                groups=[_group(group, access.read) for group in groups],
            )

    @app.get("/api/connections/{connection_id}/errors/messages", dependencies=[ReadMessages])
    def failures(
        connection_id: str,
        error_queue: str,
        before: Annotated[int | None, Query(ge=1)] = None,
        limit: Annotated[int, Query(ge=1, le=200)] = defaults.FAILED_PAGE,
        source: str | None = None,
        exception_type: str | None = None,
    ) -> FailurePage:
        """The newest failures (of one group when ``source`` and ``exception_type`` are given), with body previews."""
        group = None if source is None or exception_type is None else (source, exception_type)
        with _answering(connection_id):
            with _client(connection_id) as client:
                found, next_before = client.failed_messages(error_queue, before=before, limit=limit, group=group)
            return FailurePage(
                error_queue=client.canonical_address(error_queue),
                failures=[_failure(message) for message in found],
                next_before=next_before,
            )

    @app.get("/api/connections/{connection_id}/journey", dependencies=[ReadMessages])
    def journey(
        connection_id: str,
        id: Annotated[str, Query(max_length=200, description="a message id, a trace id or a traceparent")],  # noqa: A002
        scan: Annotated[int, Query(ge=1, le=defaults.MAX_BATCH)] = defaults.JOURNEY_SCAN,
    ) -> JourneyView:
        """Where a message went, or every message of a trace: the rows they left in the connection's
        queues, audit and error queues and claim stores, oldest first (headers are messages' content:
        read access to the connection)."""
        with _answering(connection_id):
            with _client(connection_id) as client:
                found = client.journey(id, scan=scan)
                names = {a: client.canonical_address(a) for a in (*found.searched, *found.partial, *found.locked)}
            return JourneyView(
                kind=found.kind,
                key=found.key,
                sightings=[_sighting(seen, names[seen.table], found.checked_at) for seen in found.sightings],
                trace_ids=list(found.trace_ids),
                searched=len(found.searched),
                partial=[names[a] for a in found.partial],
                scan=scan,
                more=found.more,
                unreadable=found.unreadable,
                locked=[names[a] for a in found.locked],
            )

    @app.post("/api/connections/{connection_id}/errors/retry", dependencies=[_edit("retrying failed messages")])
    def retry(connection_id: str, body: Annotated[RetryRequest, Body()], user: GetUserDep) -> RetryAnswer:
        """One bounded pass of a retry: selected messages, or a source queue's (call again from ``after``
        until ``done``). A message is sent back once however often this is called."""
        if (body.source is None) == (body.seqs is None):
            raise HTTPException(400, "give either source (a queue's address) or seqs (messages of the error queue)")
        with _answering(connection_id), _client(connection_id) as client:
            page = client.retry_errors_page(body.error_queue, queue=body.source, after=body.after, seqs=body.seqs)
        _record(
            user,
            "retry",
            connection_id,
            error_queue=body.error_queue,
            source=body.source,
            seqs=body.seqs,
            retried=page.retried,
        )
        skipped = [Skipped(seq=seq, reason=one_line(Exception(reason))) for seq, reason in page.skipped]
        return RetryAnswer(retried=page.retried, after=page.after, done=page.done, skipped=skipped)

    for path, action, run in QUEUE_ACTIONS:
        _add_queue_action(app, path, action, run)

    return app


#: The actions on one queue: the route (also the audit log's event), what the action is called in a
#: refusal, and the client's call, whose count the answer carries. Each is what a problem of the
#: queue (:mod:`~..transport.health`) names besides its ``sqlqueue`` command.
QUEUE_ACTIONS: list[tuple[str, str, Callable[[QueueClient, str], int]]] = [
    ("purge-expired", "purging expired messages", lambda client, queue: client.purge_expired(queue)),
    ("release-lapsed", "giving lapsed claims back", lambda client, queue: client.release_lapsed(queue)),
    ("move-due", "moving due delayed messages", lambda client, queue: client.move_due(queue)),
]


def _add_queue_action(app: FastAPI, path: str, action: str, run: Callable[[QueueClient, str], int]) -> None:
    """``POST /api/connections/{connection_id}/<path>`` with ``{"queue": ...}``: ``run`` on that queue,
    for a caller with edit access, recorded in the audit log; answered with how many messages it touched."""

    @app.post(f"/api/connections/{{connection_id}}/{path}", dependencies=[_edit(action)], name=path)
    def act(connection_id: str, body: Annotated[QueueRequest, Body()], user: GetUserDep) -> Count:
        with _answering(connection_id), _client(connection_id) as client:
            count = run(client, body.queue)
        _record(user, path.replace("-", "_"), connection_id, queue=body.queue, count=count)
        return Count(queue=body.queue, count=count)


def _page_href() -> str:
    """The page's URL under the api-server's base URL (``[api] base_url`` may put Airflow under a path)."""
    from urllib.parse import urlsplit

    from airflow.configuration import conf

    base = urlsplit(conf.get("api", "base_url", fallback="") or "").path.rstrip("/")
    return f"{base}{URL_PREFIX}/"


class SqlQueuePlugin(AirflowPlugin):
    """The Queues page in Airflow's navigation, and its API in the api-server."""

    # Airflow's plugin manager reads these class attributes as they are declared on AirflowPlugin.
    name = "sqlqueue"
    fastapi_apps = [  # noqa: RUF012
        {"app": create_app(), "url_prefix": URL_PREFIX, "name": "SQL Queue"}
    ]
    external_views = [  # noqa: RUF012
        {
            "name": "Queues",
            "href": _page_href(),
            "url_route": "sqlqueue",
            "destination": "nav",
            "category": "browse",
        }
    ]
