"""Unit behaviour of :mod:`airflow_provider_sqlqueue.transport.errors`: what a caller may catch and retry."""

from __future__ import annotations

import inspect

from airflow_provider_sqlqueue.transport import errors
from airflow_provider_sqlqueue.transport.errors import (
    LeaseLostError,
    QueueNotFoundError,
    SqlQueueError,
    TransportUnavailableError,
    one_line,
)


def test_every_error_is_the_librarys_own_and_only_one_says_retry() -> None:
    classes = [c for _, c in inspect.getmembers(errors, inspect.isclass) if issubclass(c, BaseException)]
    assert classes and all(issubclass(c, SqlQueueError) for c in classes)
    retryable = {c for c in classes if issubclass(c, TransportUnavailableError)}
    # "retry later": the database unreachable, or a table locked by another session for now
    assert retryable == {TransportUnavailableError, errors.LockTimeoutError}


def test_errors_name_what_they_are_about() -> None:
    assert "orders" in str(QueueNotFoundError('orders@"shop"'))
    lost = LeaseLostError("orders", ["6f1d..."])
    assert "orders" in str(lost) and isinstance(lost, SqlQueueError)


def test_one_line_folds_bounds_and_escapes_any_message() -> None:
    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no text")

    assert one_line(ValueError("a\nb\r\n  c")) == "a b c"
    assert one_line(Unprintable()) == "Unprintable"
    assert one_line(ValueError("bad \udcff text")) == "bad \\udcff text"
    assert len(one_line(ValueError("x" * 10_000))) == errors.ONE_LINE_LIMIT + 3
