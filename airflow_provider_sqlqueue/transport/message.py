"""Messages as they travel through a queue table, in NServiceBus's wire format.

A row holds an id (uuid), an optional expiry, the headers as a flat JSON object of strings (values
may be null) and the body as bytes. NServiceBus endpoints read the same rows, so the header JSON
must stay a flat string map: anything else is refused on send and treated as a poison message on
receive.
"""

from __future__ import annotations

import base64
import inspect
import json
import math
import socket
import traceback
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from json.encoder import encode_basestring, encode_basestring_ascii
from types import MappingProxyType
from typing import Any

import msgspec

from . import defaults
from .addressing import checked_text
from .errors import ArgumentTypeError, InvalidArgumentError, InvalidHeadersError

Headers = dict[str, "str | None"]

MESSAGE_ID = "NServiceBus.MessageId"
CONTENT_TYPE = "NServiceBus.ContentType"
ENCLOSED_MESSAGE_TYPES = "NServiceBus.EnclosedMessageTypes"
TIME_SENT = "NServiceBus.TimeSent"
TIME_TO_BE_RECEIVED = "NServiceBus.TimeToBeReceived"
FAILED_QUEUE = "NServiceBus.FailedQ"
TIME_OF_FAILURE = "NServiceBus.TimeOfFailure"
EXCEPTION_TYPE = "NServiceBus.ExceptionInfo.ExceptionType"
EXCEPTION_MESSAGE = "NServiceBus.ExceptionInfo.Message"
EXCEPTION_SOURCE = "NServiceBus.ExceptionInfo.Source"
EXCEPTION_STACK_TRACE = "NServiceBus.ExceptionInfo.StackTrace"
#: Why a message was sent (``Send``, ``Publish``, ``Reply``); a published event says ``Publish``.
MESSAGE_INTENT = "NServiceBus.MessageIntent"
#: What NServiceBus's subscription table holds per row, at most (its varchar/nvarchar(200) columns).
SUBSCRIPTION_TEXT_LIMIT = 200
#: Where a delayed message goes when it is due: set by the store, read and removed by the mover.
FORWARD_DESTINATION = "NServiceBus.SqlServer.ForwardDestination"
DELIVERY_COUNT = "SqlQueue.DeliveryCount"
#: What NServiceBus adds to the copy of a processed message it sends to the audit queue.
PROCESSING_STARTED = "NServiceBus.ProcessingStarted"
PROCESSING_ENDED = "NServiceBus.ProcessingEnded"
PROCESSING_ENDPOINT = "NServiceBus.ProcessingEndpoint"
PROCESSING_MACHINE = "NServiceBus.ProcessingMachine"
HOST_ID = "$.diagnostics.hostid"
HOST_DISPLAY_NAME = "$.diagnostics.hostdisplayname"

#: Headers written when a message is moved to the error queue; removed again on retry.
FAILURE_HEADERS = (
    FAILED_QUEUE,
    TIME_OF_FAILURE,
    EXCEPTION_TYPE,
    EXCEPTION_MESSAGE,
    EXCEPTION_SOURCE,
    EXCEPTION_STACK_TRACE,
    DELIVERY_COUNT,
)


class TransactionMode(StrEnum):
    """How a receive relates to the code that handles the message.

    ``none``: the receive commits before the handler runs. At-most-once: a handler that fails or a
    process that dies while handling loses the message (a failing handler's message is copied to
    the error queue on a best-effort basis).

    ``native``: the handler runs on the receiving connection inside the receive transaction; the
    handler's own SQL on that connection commits or rolls back together with the receive.
    Exactly-once for work done in the same database; the transaction stays open while the handler
    runs, so handlers must be short.

    ``claim``: the receive moves the message to an in-flight store with a lease and commits at once,
    returning a claim token; ``ack`` removes it, ``nack`` or an expired lease makes it receivable
    again, and after ``max_deliveries`` deliveries it goes to the error queue. At-least-once across
    processes with no transaction held between receive and ack.
    """

    NONE = "none"
    NATIVE = "native"
    CLAIM = "claim"

    @classmethod
    def _missing_(cls, value: object) -> TransactionMode:
        raise InvalidArgumentError(
            f"transaction mode must be one of {', '.join(mode.value for mode in cls)}, got {value!r:.40}"
        )


def wire_timestamp(moment: datetime) -> str:
    """Format a time the way NServiceBus writes header timestamps: ``yyyy-MM-dd HH:mm:ss:ffffff Z``."""
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S:%f Z")


def parse_wire_timestamp(text: str | None) -> datetime | None:
    """A header timestamp as NServiceBus writes it (:func:`wire_timestamp`), as an aware UTC time; None when absent
    or not in that form (headers come from any sender, so a bad one is not an error here)."""
    if not text:
        return None
    try:
        return datetime.strptime(text.strip(), "%Y-%m-%d %H:%M:%S:%f Z").replace(tzinfo=UTC)
    except ValueError:
        return None


def shown_time(moment: datetime | str | None) -> str | None:
    """A time as people are shown it: ISO 8601 in UTC to the second (``2026-01-31T09:05:02Z``).

    ``moment`` is a time, or a header timestamp as NServiceBus writes it (``TimeOfFailure``), whose
    own form (``2026-01-31 09:05:02:123456 Z``) no reader or program takes for a time; a header in
    neither form is shown as its sender wrote it (it is theirs, not an error here). The one format of
    the ``sqlqueue`` command's times and of the Queues page's answers, which the page shows in the
    viewer's time zone.
    """
    if moment is None or isinstance(moment, datetime):
        when = moment
    else:
        when = parse_wire_timestamp(moment)
        if when is None:
            return moment
    return None if when is None else when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def wire_timespan(span: timedelta) -> str:
    """Format a duration as a .NET ``TimeSpan`` (``[d.]hh:mm:ss[.fffffff]``), as NServiceBus headers hold TTBR."""
    total_us = span.days * 86_400_000_000 + span.seconds * 1_000_000 + span.microseconds
    days, rest = divmod(total_us, 86_400_000_000)
    hours, rest = divmod(rest, 3_600_000_000)
    minutes, rest = divmod(rest, 60_000_000)
    seconds, micros = divmod(rest, 1_000_000)
    text = f"{hours:02d}:{minutes:02d}:{seconds:02d}"
    if days:
        text = f"{days}.{text}"
    if micros:
        text = f"{text}.{micros * 10:07d}"
    return text


def validate_headers(headers: object) -> Headers:
    """Check that ``headers`` is a flat mapping of ``str`` to ``str | None`` and return it as a dict."""
    if not isinstance(headers, dict):
        if not isinstance(headers, Mapping):
            raise InvalidHeadersError(f"headers must be a JSON object, got {type(headers).__name__}")
        headers = dict(headers)  # a read-only view (another message's headers), an ordered mapping
    # Fast path for what nearly every message has: string keys, string values, all ASCII.
    values = headers.values()
    if {*map(type, headers), *map(type, values)} <= {str} and ("".join(headers) + "".join(values)).isascii():
        return dict(headers)
    for key, value in headers.items():
        if not isinstance(key, str):
            raise InvalidHeadersError(f"header names must be strings, got {key!r}")
        if value is not None and not isinstance(value, str):
            raise InvalidHeadersError(
                f"header {key!r} must be a string or null, got {type(value).__name__}; "
                "NServiceBus headers are a flat string map, serialise structured values yourself"
            )
        for text in (key, value or ""):
            if text.isascii():  # the common case, and ASCII cannot hold a lone surrogate
                continue
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                raise InvalidHeadersError(
                    f"header {key!r:.80} holds text that is not valid Unicode (a lone surrogate); "
                    "decode it with errors='replace' or send it as bytes in the body"
                ) from None
    return dict(headers)


def encode_headers(headers: Headers, *, ascii_only: bool = False) -> str:
    """Serialise headers to the JSON text stored in the Headers column.

    ``ascii_only`` escapes every non-ASCII character (``\\u00e9``): for a legacy ``varchar``
    Headers column, which would otherwise store it as ``?``. Both spellings are the same JSON.
    """
    return _dumps(validate_headers(headers), ascii_only)


def _dumps(headers: Headers, ascii_only: bool, *tail: str) -> str:
    """Headers already known to be valid, as JSON text, with ``tail`` members (``"name":"value"``) appended.

    The same text as ``json.dumps(headers, ensure_ascii=ascii_only, separators=(",", ":"))``, built
    from the encoder's own string quoting: every value is a string or null, so no general encoder
    (built anew on every ``json.dumps`` call) is needed. A batched send spends most of its client
    time here.
    """
    quote = encode_basestring_ascii if ascii_only else encode_basestring
    members = [f"{quote(k)}:null" if v is None else f"{quote(k)}:{quote(v)}" for k, v in headers.items()]
    members += tail
    return "{" + ",".join(members) + "}"


_HEADERS_DECODER = msgspec.json.Decoder(dict[str, str | None])


def decode_headers(text: str | None) -> Headers:
    """Parse the Headers column; raise :class:`InvalidHeadersError` for anything NServiceBus could not read.

    Accepts every JSON spelling of the same strings (``\\/`` and ``/``, raw non-ASCII and ``\\u``
    escapes), as the wire format allows. Parsing and checking the shape (an object of strings or
    nulls, no lone surrogates) happen in one pass of msgspec's decoder: every received row goes
    through here, and it costs a fraction of ``json.loads`` plus a Python-level check.
    """
    if text is None:
        raise InvalidHeadersError("headers column is NULL")
    if text == "":  # NServiceBus reads an empty Headers column as no headers
        return {}
    try:
        return _HEADERS_DECODER.decode(text)
    except msgspec.ValidationError as exc:
        raise InvalidHeadersError(f"headers must be a JSON object of strings or nulls: {exc}") from None
    except msgspec.DecodeError as exc:
        raise InvalidHeadersError(f"headers are not valid JSON: {exc}") from None


def readable_headers(text: str | None) -> Headers | None:
    """The Headers column as :func:`decode_headers` reads it, or None when it cannot be read: for
    reports and routing that set such a row aside instead of failing on it."""
    try:
        return decode_headers(text)
    except InvalidHeadersError:
        return None


def uuid_value(what: str, value: object) -> uuid.UUID:
    """A UUID given as one or as its text (a message id, a claim token, a write id), or the library's
    error naming ``what`` it should have been."""
    if isinstance(value, uuid.UUID):
        return value
    if not isinstance(value, str):
        raise ArgumentTypeError(f"{what} must be a UUID or its text, got {type(value).__name__}")
    try:
        return uuid.UUID(value)
    except ValueError:
        raise InvalidArgumentError(f"{what} {value[:60]!r} is not a UUID") from None


def coerce_body(body: bytes | bytearray | memoryview | str | None) -> bytes:
    """Bodies are bytes on the wire; text is encoded as UTF-8, ``None`` is an empty body."""
    if body is None:
        return b""
    if isinstance(body, str):
        try:
            return body.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidArgumentError(
                f"message body text is not valid Unicode ({exc.reason} at {exc.start}); send bytes for binary data"
            ) from None
    if isinstance(body, (bytes, bytearray, memoryview)):
        return bytes(body)
    raise ArgumentTypeError(f"message body must be bytes or str, got {type(body).__name__}; serialise it first")


JSON_CONTENT_TYPE = "application/json"
TEXT_CONTENT_TYPE = "text/plain"


def encode_value(value: object) -> tuple[bytes, str | None]:
    """A message body and its content type from a Python value.

    Bytes are sent as they are (no content type: the sender knows what they hold), text as UTF-8
    ``text/plain``, anything else as JSON (``application/json``); a value JSON cannot represent is
    refused here rather than half-sent.
    """
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value), None
    try:
        if isinstance(value, str):
            return value.encode("utf-8"), TEXT_CONTENT_TYPE
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        return text.encode("utf-8"), JSON_CONTENT_TYPE
    except UnicodeEncodeError as exc:  # a lone surrogate (a file name decoded with surrogateescape)
        raise InvalidArgumentError(f"message body is not valid Unicode text: {exc.reason}") from None
    except (TypeError, ValueError) as exc:
        raise ArgumentTypeError(
            f"message body of type {type(value).__name__} is not JSON-serialisable: {exc}"
        ) from None


def flag(what: str, value: object) -> bool:
    """A switch: True or False, never a truthy string or number."""
    if not isinstance(value, bool):
        raise ArgumentTypeError(f"{what} must be True or False, got {type(value).__name__} {value!r:.40}")
    return value


def asynchronous(what: str, function: object) -> None:
    """A callback a loop awaits: an ``async def`` function (or an object whose ``__call__`` is one).

    Refused up front rather than failing every message it is given: a plain function's result
    cannot be awaited, and each message it failed would use up its deliveries.
    """
    if not callable(function):
        raise ArgumentTypeError(f"{what} must be an async function, got {type(function).__name__} {function!r:.40}")
    if not (inspect.iscoroutinefunction(function) or inspect.iscoroutinefunction(type(function).__call__)):
        raise ArgumentTypeError(f"{what} must be an async function (async def), got {function!r:.60}")


def check_positive(name: str, value: int, maximum: int = defaults.MAX_BATCH) -> int:
    """A count of messages or rows: a positive integer no larger than one statement can take (or ``maximum``)."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise ArgumentTypeError(f"{name} must be a positive integer, got {type(value).__name__} {value!r:.40}")
    if value < 1:
        raise InvalidArgumentError(f"{name} must be a positive integer, got {value!r}")
    if value > maximum:
        raise InvalidArgumentError(f"{name} must be at most {maximum:,}, got {value:,}; work in batches")
    return value


def duration(
    name: str, value: object, *, maximum: timedelta, minimum: timedelta = timedelta(milliseconds=1)
) -> timedelta:
    """A duration given as a timedelta or seconds, checked before anything is sent.

    Refuses what is not a number of seconds (text, booleans), NaN and infinities, and spans
    outside [minimum, maximum], saying which bound and why.
    """
    if isinstance(value, bool) or not isinstance(value, (timedelta, int, float)):
        raise ArgumentTypeError(
            f"{name} must be a timedelta or a number of seconds, got {type(value).__name__} {value!r:.40}"
        )
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidArgumentError(f"{name} must be a finite number of seconds, got {value}")
    given = f"{value.total_seconds() if isinstance(value, timedelta) else value:g} seconds"
    try:
        span = value if isinstance(value, timedelta) else timedelta(seconds=value)
    except OverflowError:
        raise InvalidArgumentError(f"{name} must be at most {maximum}, got {given}") from None
    if (value <= timedelta(0) if isinstance(value, timedelta) else value <= 0) and minimum > timedelta(0):
        raise InvalidArgumentError(f"{name} must be positive, got {given}")
    if span < minimum:
        raise InvalidArgumentError(f"{name} must be at least {minimum}, got {given}")
    if span > maximum:
        raise InvalidArgumentError(f"{name} must be at most {maximum}, got {given}")
    return span


def whole_ms(span: timedelta) -> int:
    """A positive span in the whole milliseconds the databases take (a lease, a delay, a lock wait, a
    TTBR), at least one: both read 0 as "none" or "for ever"."""
    return max(1, round(span / timedelta(milliseconds=1)))


def coerce_ttbr(ttbr: timedelta | float | int | None) -> timedelta | None:
    """Normalise a time-to-be-received; zero or negative would make a message born expired, so refuse it."""
    if ttbr is None:
        return None
    return duration("time_to_be_received", ttbr, maximum=defaults.MAX_TIME_TO_BE_RECEIVED)


def delivery_delay(delay: timedelta | float | None = None, due: datetime | None = None) -> timedelta | None:
    """How long a message must wait before it is delivered, from a delay or a due time; None: send now.

    A due time is turned into a delay against this machine's clock, as NServiceBus does; the
    database then adds the delay to its own clock. A delay of zero or a due time already past
    means no delay (the message is sent at once).
    """
    if delay is not None and due is not None:
        raise InvalidArgumentError("give a delay or a due time, not both")
    if due is not None:
        if not isinstance(due, datetime) or due.tzinfo is None:
            raise ArgumentTypeError(f"due must be a timezone-aware datetime, got {due!r:.60}")
        delay = max(due - datetime.now(UTC), timedelta(0))
    if delay is None:
        return None
    span = duration("delay", delay, maximum=defaults.MAX_DELAY, minimum=timedelta(0))
    return span if span > timedelta(0) else None


def subscription_text(kind: str, value: object) -> str:
    """A topic, endpoint name or queue address as NServiceBus's subscription table holds it, or a clear error."""
    return checked_text(kind, value, limit=SUBSCRIPTION_TEXT_LIMIT)


def topic_names(topics: str | Iterable[str]) -> list[str]:
    """One topic or several, checked; at least one."""
    if not isinstance(topics, (str, Iterable)) or isinstance(topics, (bytes, Mapping)):
        raise ArgumentTypeError(f"topics must be a topic or an iterable of topics, got {type(topics).__name__}")
    names = [subscription_text("topic", t) for t in ([topics] if isinstance(topics, str) else topics)]
    if not names:
        raise InvalidArgumentError("give at least one topic")
    return list(dict.fromkeys(names))


@dataclass(init=False)
class Message:
    """A message to send.

    ``headers`` get ``NServiceBus.MessageId`` and ``NServiceBus.TimeSent`` filled in when absent so
    that an NServiceBus endpoint receiving the row sees what it expects; the body is stored as is.
    ``time_to_be_received`` makes the database compute ``Expires`` from its own clock; an expired
    message is never delivered.

    The constructor accepts what callers have (text bodies, string ids, seconds) and checks it; the
    attributes hold the normalised values. A message cannot be changed once built (its attributes
    are read-only and ``headers`` is a read-only view): sends trust the constructor's checks, so a
    value changed afterwards would reach the table unchecked. Build a new message instead.
    """

    __slots__ = ("_headers", "body", "id", "time_to_be_received")

    _headers: Headers
    body: bytes
    id: uuid.UUID
    time_to_be_received: timedelta | None

    def __init__(
        self,
        body: bytes | bytearray | memoryview | str | None = b"",
        headers: Mapping[str, str | None] | None = None,
        id: uuid.UUID | str | None = None,  # noqa: A002  # NServiceBus's name for a message's id
        time_to_be_received: timedelta | float | None = None,
    ) -> None:
        settle = object.__setattr__
        settle(self, "body", coerce_body(body))
        checked = validate_headers({} if headers is None else headers)
        for default in (MESSAGE_ID, TIME_SENT):  # None asks for the default, as leaving it out does
            if default in checked and checked[default] is None:
                del checked[default]
        settle(self, "_headers", checked)
        settle(self, "id", uuid.uuid4() if id is None else uuid_value("message id", id))
        settle(self, "time_to_be_received", coerce_ttbr(time_to_be_received))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"a Message cannot be changed once built (setting {name}): build a new Message")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"a Message cannot be changed once built (deleting {name}): build a new Message")

    @property
    def headers(self) -> Mapping[str, str | None]:
        """The headers given (a read-only view; NServiceBus's defaults are added when the message is sent)."""
        return MappingProxyType(self._headers)

    def __reduce__(self) -> tuple[type[Message], tuple[Any, ...]]:
        """Pickled (to Spark's executors, to a process pool) as its constructor's arguments."""
        return (Message, (self.body, self._headers, self.id, self.time_to_be_received))

    def __repr__(self) -> str:  # never the body or the headers' values: a repr ends up in logs
        return f"Message(id={self.id}, {len(self.body)} byte(s), {len(self._headers)} header(s))"

    @classmethod
    def of(
        cls,
        value: object,
        headers: Headers | None = None,
        time_to_be_received: timedelta | float | None = None,
    ) -> Message:
        """A message whose body is ``value`` serialised by :func:`encode_value`, with its content type set."""
        body, content_type = encode_value(value)
        merged = dict(headers or {})
        if content_type is not None:
            merged.setdefault(CONTENT_TYPE, content_type)
        return cls(body, merged, time_to_be_received=time_to_be_received)

    def wire_headers(self, time_sent: str | None = None, *, ascii_only: bool = False) -> str:
        """The Headers column for this message, with the NServiceBus defaults filled in.

        ``time_sent`` is the wire timestamp of the send; a batch passes one for all its messages.
        ``ascii_only`` as in :func:`encode_headers`.
        """
        # The defaults are appended as JSON members (their names and values are ASCII needing no
        # escapes), in the order a dict's setdefault would have put them.
        given = self._headers
        appended: list[str] = []
        if MESSAGE_ID not in given:
            appended.append(f'"{MESSAGE_ID}":"{self.id}"')
        if TIME_SENT not in given:
            appended.append(f'"{TIME_SENT}":"{time_sent or wire_timestamp(datetime.now(UTC))}"')
        if self.time_to_be_received is not None and TIME_TO_BE_RECEIVED not in given:
            appended.append(f'"{TIME_TO_BE_RECEIVED}":"{wire_timespan(self.time_to_be_received)}"')
        return _dumps(given, ascii_only, *appended)  # validated by the constructor

    def ttbr_ms(self) -> int | None:
        """TTBR in whole milliseconds for the database to add to its clock (None: never expires)."""
        if self.time_to_be_received is None:
            return None
        return whole_ms(self.time_to_be_received)


@dataclass(frozen=True)
class ReceivedMessage:
    """A message taken from a queue.

    ``claim_token`` is set in ``claim`` mode: pass it to ``ack`` or ``nack``. ``deliveries`` counts
    how many times the message has been handed out in ``claim`` mode (1 on first delivery).
    """

    id: uuid.UUID
    headers: Headers
    body: bytes
    claim_token: uuid.UUID | None = None
    deliveries: int = 1

    @property
    def text(self) -> str:
        """The body decoded as UTF-8 (invalid bytes replaced, so logging it never fails)."""
        return self.body.decode("utf-8", errors="replace")

    def json(self) -> object:
        """The body parsed as JSON."""
        return json.loads(self.body)

    def to_dict(self, queue: str) -> dict[str, object]:
        """A JSON-safe description of the message, for XCom, trigger events and asset events.

        ``body`` is the parsed JSON when the content type says JSON (and it parses), else the text
        when the bytes are UTF-8, else base64; ``body_encoding`` says which (``json``, ``text``,
        ``base64``). ``queue`` and ``claim_token`` are what ``ack``/``nack`` need later;
        ``received_at`` (ISO 8601, UTC: when the dict was made, right after the receive) becomes the
        audit copy's ``NServiceBus.ProcessingStarted``.
        """
        body: object
        try:
            text = self.body.decode("utf-8")
        except UnicodeDecodeError:
            body, encoding = base64.b64encode(self.body).decode("ascii"), "base64"
        else:
            body, encoding = text, "text"
            if "json" in (self.headers.get(CONTENT_TYPE) or "").lower():
                try:
                    body, encoding = json.loads(text), "json"
                except ValueError:
                    pass
        return {
            "queue": queue,
            "id": str(self.id),
            "headers": dict(self.headers),
            "body": body,
            "body_encoding": encoding,
            "claim_token": None if self.claim_token is None else str(self.claim_token),
            "deliveries": self.deliveries,
            "received_at": datetime.now(UTC).isoformat(),
        }


@dataclass(frozen=True)
class Failure:
    """Why a message failed: what NServiceBus's ``ExceptionInfo`` headers say, kept until the message moves.

    ``source`` names what failed -- an Airflow task (``dag_id.task_id``) or a handler -- so the error
    queue says where to look. A claim given back with a failure keeps it (as :meth:`to_text`) until
    the message succeeds or moves to the error queue, whose headers then carry the real exception
    rather than the name of whatever noticed the failure.
    """

    type: str
    message: str
    source: str = "airflow-provider-sqlqueue"
    stack_trace: str = ""

    def __post_init__(self) -> None:
        # The one place failure text is made safe: every header written from a Failure (error
        # queue, give-back, LastError) can then be stored, whatever the handler's exception held.
        for name in ("type", "message", "source", "stack_trace"):
            object.__setattr__(self, name, storable_text(getattr(self, name), defaults.MAX_FAILURE_TEXT))

    @classmethod
    def of(cls, error: BaseException | str | Failure | None, source: str | None = None) -> Failure:
        """The failure an exception, a text or nothing (an unacknowledged lease) describes.

        Never fails on the exception itself: one whose ``__str__`` raises is described as such.
        """
        if isinstance(error, Failure):
            return error if source is None else cls(error.type, error.message, source, error.stack_trace)
        default_source = source or cls.source
        if error is not None and not isinstance(error, (BaseException, str)):
            raise ArgumentTypeError(f"a failure is an exception, a text or a Failure, got {type(error).__name__}")
        if isinstance(error, BaseException):
            kind = f"{type(error).__module__}.{type(error).__qualname__}"
            text = error_text(error)
            try:
                trace = "".join(traceback.format_exception(type(error), error, error.__traceback__))
            except Exception:  # noqa: BLE001  # a traceback that cannot be formatted: its frames stand in
                trace = "".join(traceback.format_tb(error.__traceback__)) + kind
            return cls(kind, text, default_source, trace)
        return cls("airflow_provider_sqlqueue.HandlerFailure", error or "message failed", default_source, error or "")

    def to_text(self) -> str:
        """The form stored with a claim (``LastError``)."""
        return json.dumps(
            {"type": self.type, "message": self.message, "source": self.source, "stack_trace": self.stack_trace},
            ensure_ascii=False,
        )

    @classmethod
    def from_text(cls, text: str | None) -> Failure | None:
        """Read a stored failure back; plain text (written by older versions) becomes the message."""
        if not text:
            return None
        try:
            data = json.loads(text)
            return cls(str(data["type"]), str(data["message"]), str(data["source"]), str(data.get("stack_trace", "")))
        except (ValueError, TypeError, KeyError):
            return cls.of(text)


def error_text(error: BaseException) -> str:
    """An exception's text, for a log line or a header, even when its ``__str__`` raises."""
    try:
        return str(error)
    except Exception as unprintable:  # noqa: BLE001  # its __str__ raised: say so instead
        return f"({type(error).__qualname__} whose text cannot be read: {type(unprintable).__name__})"


def storable_text(text: str, limit: int) -> str:
    """``text`` as any header column can store it: lone surrogates and NUL written as escapes (text
    and JSON cannot hold them), and at most ``limit`` characters, saying how many were cut."""
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    if len(text) > limit:
        text = f"{text[:limit]}... ({len(text) - limit:,} characters cut)"
    return text


def failure_headers(headers: Headers, source_address: str, error: BaseException | str | Failure | None) -> Headers:
    """Headers for a message moved to the error queue, as NServiceBus's recoverability writes them."""
    failure = Failure.of(error)
    result = dict(headers)
    result[FAILED_QUEUE] = source_address
    result[TIME_OF_FAILURE] = wire_timestamp(datetime.now(UTC))
    result[EXCEPTION_TYPE] = failure.type
    result[EXCEPTION_MESSAGE] = failure.message
    result[EXCEPTION_SOURCE] = failure.source
    result[EXCEPTION_STACK_TRACE] = failure.stack_trace
    return result


def processing_headers(endpoint: str) -> Headers:
    """Who processed a message, as NServiceBus's auditing says it: ``endpoint`` (an NServiceBus
    endpoint is named after its input queue) and this host, so ServiceControl groups the copies by
    endpoint instance as it does NServiceBus's own. The same for every copy a batch makes."""
    machine = socket.gethostname()
    return {
        PROCESSING_ENDPOINT: endpoint,
        PROCESSING_MACHINE: machine,
        HOST_ID: str(uuid.uuid5(uuid.NAMESPACE_DNS, machine)),
        HOST_DISPLAY_NAME: machine,
    }


def audit_headers(headers: Headers, processing: Headers, started: datetime, ended: str) -> Headers:
    """Headers of the audit copy of a processed message: its own, :func:`processing_headers`, and
    when its processing started and ended (``ended`` already in wire form, one for a batch)."""
    return {**headers, PROCESSING_STARTED: wire_timestamp(started), PROCESSING_ENDED: ended, **processing}


def without_failure_headers(headers: Headers) -> Headers:
    """Headers of a message sent back from the error queue to the queue it failed in."""
    return {k: v for k, v in headers.items() if k not in FAILURE_HEADERS}
