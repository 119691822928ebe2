"""Trace context on the wire, as NServiceBus carries it, and the spans around sends, receives and handlers.

NServiceBus (version 8 and later) propagates W3C Trace Context in three message headers --
``traceparent``, ``tracestate`` and ``baggage`` -- and says in a fourth,
``NServiceBus.OpenTelemetry.StartNewTrace`` (``True``/``False``), whether the receiver continues
the sender's trace or starts a new one linked to it: sends continue it, publishes and delayed
sends start a new one.
This module writes and reads those headers the same way, so a trace passes between this library
and NServiceBus endpoints in either direction.

OpenTelemetry is optional (the ``otel`` extra): only its API is used, imported the first time a
call asks for it. Without it, or with no tracer provider configured (the API's no-op default), every
function here returns at its first check: no header is written, no span made, no message copied --
a send or receive pays a function call and an ``isinstance``. One module for every caller, sync or
async: the operations call it from inside their generators (the statements they yield run in
between), the pump, ``hold_messages`` and the Spark reads around their work. Tracing only
observes: whatever it raises is logged at debug and the call goes on untraced.

Spans carry the messaging semantic conventions' attributes -- names, ids and counts, never a body,
a header's value or a connection's credentials.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Final, NamedTuple, Protocol

from .logs import logger
from .message import Message

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.propagators.textmap import TextMapPropagator
    from opentelemetry.trace import Link, Span, SpanKind, Tracer

log = logger("airflow_provider_sqlqueue.transport")

#: NServiceBus's header names (``NServiceBus.Headers`` and its diagnostics headers).
TRACEPARENT: Final = "traceparent"
TRACESTATE: Final = "tracestate"
BAGGAGE: Final = "baggage"
START_NEW_TRACE: Final = "NServiceBus.OpenTelemetry.StartNewTrace"

#: ``messaging.system``: no registered value fits queue tables in a database, so the library's own
#: name; ``db.system.name`` on the same span says which database.
SYSTEM: Final = "sqlqueue"

#: The instrumentation scope spans are made under.
SCOPE: Final = "airflow_provider_sqlqueue"

#: Receives and takes of a batch link to at most this many messages' contexts (the SDK's default
#: limit of links per span is 128; more would be dropped by it anyway, after costing their parsing).
MAX_LINKS: Final = 128


class Received(Protocol):
    """What a consumer span needs of a message: its id and headers (a :class:`~.message.ReceivedMessage`, a :class:`Carried`)."""

    @property
    def id(self) -> object: ...

    @property
    def headers(self) -> Mapping[str, str | None]: ...


class Carried(NamedTuple):
    """A message's id and headers, for readers that hold them apart from a :class:`~.message.ReceivedMessage`
    (a Spark read's columns, a task's message dicts)."""

    id: object
    headers: Mapping[str, str | None]


class _Otel:
    """The parts of the OpenTelemetry API this module uses, imported once."""

    def __init__(self) -> None:
        from opentelemetry import context, trace
        from opentelemetry.baggage.propagation import W3CBaggagePropagator
        from opentelemetry.context import Context
        from opentelemetry.propagators.composite import CompositePropagator
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        from .. import __version__

        self.trace = trace
        self.context = context
        self.version = __version__
        self.empty_context = Context
        # W3C's formats, whatever OTEL_PROPAGATORS says: the headers are NServiceBus's wire format.
        self.propagator: TextMapPropagator = CompositePropagator(
            [TraceContextTextMapPropagator(), W3CBaggagePropagator()]
        )
        self.idle = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)
        self.provider: object = None
        self.tracer: Tracer = trace.NoOpTracer()
        self.producer: SpanKind = trace.SpanKind.PRODUCER
        self.consumer: SpanKind = trace.SpanKind.CONSUMER
        self.internal: SpanKind = trace.SpanKind.INTERNAL

    def active(self) -> bool:
        """Whether a tracer provider is configured (the API's default one makes nothing); :attr:`tracer`
        is then its tracer, asked for again when the provider changes."""
        provider = self.trace.get_tracer_provider()
        if provider is not self.provider:
            self.provider = provider
            idle = isinstance(provider, self.idle)
            self.tracer = self.trace.NoOpTracer() if idle else provider.get_tracer(SCOPE, self.version)
        return not isinstance(self.tracer, self.trace.NoOpTracer)


_otel: _Otel | None = None
_loaded = False


def _api() -> _Otel | None:
    """The OpenTelemetry API when it is installed and a tracer provider is configured, else None."""
    global _otel, _loaded  # loaded once, on first use
    if not _loaded:
        try:
            _otel = _Otel()
        except ImportError:
            _otel = None
        _loaded = True
    return _otel if _otel is not None and _otel.active() else None


def clock() -> int:
    """When a receive starts (ns since the epoch), for the span made once its messages are known; 0 when not tracing."""
    return time.time_ns() if _api() is not None else 0


#: ``db.system.name`` of each dialect (by its name).
_DB_SYSTEMS: Final = {"postgres": "postgresql", "sqlserver": "microsoft.sql_server"}


def _attributes(
    operation: str, kind: str, destination: str, count: int, message_id: object | None, database: str | None
) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.operation.name": operation,
        "messaging.operation.type": kind,
        "messaging.destination.name": destination,
    }
    if count == 1 and message_id is not None:
        attributes["messaging.message.id"] = str(message_id)
    else:
        attributes["messaging.batch.message_count"] = count
    if database in _DB_SYSTEMS:
        attributes["db.system.name"] = _DB_SYSTEMS[database]
    return attributes


@contextmanager
def producing(
    operation: str,
    destination: Callable[[], str],
    messages: Sequence[Message],
    *,
    database: str | None = None,
    start_new_trace: bool = False,
) -> Iterator[Sequence[Message]]:
    """A PRODUCER span around one send call (``operation``: ``send`` or ``publish``), and the
    messages to write: each one without a ``traceparent`` gets the span's context (``traceparent``,
    ``tracestate``, ``baggage``) and, unless it has one, ``NServiceBus.OpenTelemetry.StartNewTrace``
    (``start_new_trace``: ``True`` for a publish or a delayed send, ``False`` for a send, as
    NServiceBus decides). A header a message
    already has is never replaced: a message passed on keeps the trace it came with.

    ``destination`` is called only when tracing (the address's text costs a formatting). Not
    tracing, the messages come back as given.
    """
    otel = _api()
    traced = (
        None
        if otel is None or not messages
        else _outgoing(otel, operation, destination, messages, database, start_new_trace)
    )
    if otel is None or traced is None:
        yield messages
        return
    span, outgoing = traced
    try:
        yield outgoing
    except GeneratorExit:  # the operation was abandoned before its statements ran: not a failure
        raise
    except BaseException as exc:
        _failed(otel, span, exc)
        raise
    finally:
        span.end()


def _outgoing(
    otel: _Otel,
    operation: str,
    destination: Callable[[], str],
    messages: Sequence[Message],
    database: str | None,
    start_new_trace: bool,
) -> tuple[Span, Sequence[Message]] | None:
    """:func:`producing`'s span and the messages with its context; None when that fails (logged at
    debug: a send never fails because of its tracing)."""
    try:
        where = destination()
        span = otel.tracer.start_span(
            f"{operation} {where}",
            kind=otel.producer,
            attributes=_attributes(operation, "send", where, len(messages), messages[0].id, database),
        )
        carrier: dict[str, str] = {}
        otel.propagator.inject(carrier, context=otel.trace.set_span_in_context(span))
    except Exception as exc:  # noqa: BLE001  # tracing is an observer: whatever it raises, the send goes on untraced
        log.debug("Not tracing a %s: %s: %s", operation, type(exc).__name__, exc)
        return None
    if not carrier:  # an invalid context (a sampler's or a disabled SDK's) without baggage
        return span, messages
    if TRACEPARENT in carrier:  # NServiceBus stamps the decision only beside a context
        carrier[START_NEW_TRACE] = "True" if start_new_trace else "False"
    return span, [m if TRACEPARENT in m.headers else _with_context(m, carrier) for m in messages]


def _with_context(message: Message, carrier: Mapping[str, str]) -> Message:
    """``message`` with the trace headers it lacks."""
    return Message(
        message.body, {**carrier, **message.headers}, id=message.id, time_to_be_received=message.time_to_be_received
    )


def consumed(
    operation: str,
    destination: Callable[[], str],
    messages: Sequence[Received],
    started: int,
    *,
    database: str | None = None,
) -> None:
    """The CONSUMER span of a receive that began at ``started`` (:func:`clock`) and returned ``messages``.

    One message: the span continues its sender's trace (or starts a new one linked to it, when
    the sender asked so); several: a span in the caller's trace linking to each message's context.
    A receive that found nothing makes no span (an idle consumer polls).
    """
    if not started or not messages:
        return
    otel = _api()
    if otel is None:
        return
    try:
        parent, links = _relation(otel, messages)
        where = destination()
        otel.tracer.start_span(
            f"{operation} {where}",
            context=parent,
            kind=otel.consumer,
            links=links,
            attributes=_attributes(operation, "receive", where, len(messages), messages[0].id, database),
            start_time=started,
        ).end()
    except Exception as exc:  # noqa: BLE001  # the messages are taken already: their tracing must not lose them
        log.debug("Not tracing a %s: %s: %s", operation, type(exc).__name__, exc)


@contextmanager
def processing(
    destination: Callable[[], str], messages: Sequence[Received], *, database: str | None = None
) -> Iterator[None]:
    """The CONSUMER ``process`` span around a handler, made the current span so that the spans
    the handler makes nest under it. Related to the messages as :func:`consumed` relates a receive.
    A handler's exception is recorded on the span and goes on."""
    otel = _api()
    if otel is None or not messages:
        yield
        return
    try:
        parent, links = _relation(otel, messages)
        where = destination()
        span = otel.tracer.start_span(
            f"process {where}",
            context=parent,
            kind=otel.consumer,
            links=links,
            attributes=_attributes("process", "process", where, len(messages), messages[0].id, database),
        )
    except Exception as exc:  # noqa: BLE001  # tracing is an observer: the handler runs untraced
        log.debug("Not tracing a handler: %s: %s", type(exc).__name__, exc)
        yield
        return
    with _current(otel, span):
        yield


def current_context() -> dict[str, str] | None:
    """The current span's context as the headers carry one (``traceparent``, ``tracestate``,
    ``baggage``): what a task records with the messages its work ran on, so that the task that sends
    their results continues it (:func:`continuing`). None when not tracing or no span is current."""
    otel = _api()
    if otel is None:
        return None
    try:
        carrier: dict[str, str] = {}
        otel.propagator.inject(carrier)
    except Exception as exc:  # noqa: BLE001  # tracing only observes
        log.debug("Not recording a trace context: %s: %s", type(exc).__name__, exc)
        return None
    return carrier if TRACEPARENT in carrier else None


@contextmanager
def continuing(destination: Callable[[], str], carriers: Sequence[Mapping[str, str | None] | None]) -> Iterator[None]:
    """Run a block that sends messages derived from others -- a stage's results -- in the context
    their work ran in, as NServiceBus sends from a handler inside its process span: each carrier is
    a context as headers hold it (:func:`current_context`, or a message's own headers).

    One context among them: it is made current, so the block's send spans are its children and the
    messages sent carry the trace on. Several: a ``forward`` span of its own is current, linked to
    each (at most :data:`MAX_LINKS`), as a consumer of several messages is. None readable: the block
    runs in the caller's context. Not tracing, the block just runs.
    """
    otel = _api()
    if otel is None:
        yield
        return
    try:
        contexts = _contexts(otel, carriers)
        if len(contexts) == 1:
            token = otel.context.attach(contexts[0])
            span = None
        elif contexts:
            links = [otel.trace.Link(otel.trace.get_current_span(c).get_span_context()) for c in contexts[:MAX_LINKS]]
            span = otel.tracer.start_span(
                f"forward {destination()}", kind=otel.internal, links=links, attributes={"messaging.system": SYSTEM}
            )
    except Exception as exc:  # noqa: BLE001  # tracing is an observer: the sends run in the caller's context
        log.debug("Not continuing a trace: %s: %s", type(exc).__name__, exc)
        yield
        return
    if not contexts:
        yield
    elif span is None:
        try:
            yield
        finally:
            otel.context.detach(token)
    else:
        with _current(otel, span):
            yield


def _contexts(otel: _Otel, carriers: Sequence[Mapping[str, str | None] | None]) -> list[Context]:
    """The distinct readable contexts of ``carriers`` (by their ``traceparent``), in order."""
    found: dict[str, Context] = {}
    for carrier in carriers:
        parent = (carrier or {}).get(TRACEPARENT)
        if not parent or parent in found:
            continue
        context = otel.propagator.extract(carrier, context=otel.empty_context())
        if otel.trace.get_current_span(context).get_span_context().is_valid:
            found[parent] = context
    return list(found.values())


def _relation(otel: _Otel, messages: Sequence[Received]) -> tuple[Context | None, list[Link] | None]:
    """A consumer span's parent context and links, by NServiceBus's rule.

    One message with a readable ``traceparent``: its sender's span is the parent, unless
    ``NServiceBus.OpenTelemetry.StartNewTrace`` is ``True`` -- then the span starts a new trace
    and links to it. Several messages: the caller's context is the parent and each message's
    context is a link. A message without a readable ``traceparent`` relates to nothing (the
    caller's context is the parent). The message's ``tracestate`` and ``baggage`` travel with its context.
    """
    if len(messages) == 1:
        message = messages[0]
        remote = _remote(otel, message)
        if remote is None:
            return None, None
        if (message.headers.get(START_NEW_TRACE) or "").strip().lower() == "true":
            span_context = otel.trace.get_current_span(remote).get_span_context()
            root = otel.trace.set_span_in_context(otel.trace.INVALID_SPAN, remote)  # keeps the baggage
            return root, [otel.trace.Link(span_context)]
        return remote, None
    links = []
    for message in messages[:MAX_LINKS]:
        remote = _remote(otel, message)
        if remote is not None:
            links.append(otel.trace.Link(otel.trace.get_current_span(remote).get_span_context()))
    return None, links


def _remote(otel: _Otel, message: Received) -> Context | None:
    """The context a message's headers carry, or None: no ``traceparent``, or one W3C's format
    rejects (logged at debug: a sender's malformed header is the sender's, never the receiver's failure)."""
    headers = message.headers
    if TRACEPARENT not in headers:
        return None
    context = otel.propagator.extract(headers, context=otel.empty_context())
    if not otel.trace.get_current_span(context).get_span_context().is_valid:
        log.debug("Message %s: its traceparent header is not W3C Trace Context; ignored", message.id)
        return None
    return context


@contextmanager
def _current(otel: _Otel, span: Span) -> Iterator[None]:
    """``span`` current for the block and ended after it; an exception leaving the block marks it failed."""
    with otel.trace.use_span(span, end_on_exit=True, record_exception=False, set_status_on_exception=False):
        try:
            yield
        except BaseException as exc:
            _failed(otel, span, exc)
            raise


def _failed(otel: _Otel, span: Span, exc: BaseException) -> None:
    """Mark ``span`` failed with the exception's type only: its text may hold data (a body, a value)."""
    span.set_attribute("error.type", f"{type(exc).__module__}.{type(exc).__qualname__}")
    span.set_status(otel.trace.Status(otel.trace.StatusCode.ERROR))
