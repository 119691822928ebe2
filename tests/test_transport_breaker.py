"""The circuit breaker (``transport/breaker.py``): how long loops wait after failures, and when they alarm."""

from __future__ import annotations

import logging

from airflow_provider_sqlqueue.transport.breaker import CircuitBreaker


def test_waits_double_after_each_failure_up_to_the_ceiling():
    breaker = CircuitBreaker(base_delay=0.5, max_backoff=4.0, alarm_after=3600)
    delays = [breaker.failure(RuntimeError("down"), "orders") for _ in range(6)]
    assert delays == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]


def test_a_success_starts_over_and_says_the_database_is_back(caplog):
    breaker = CircuitBreaker(base_delay=1.0, max_backoff=30.0, alarm_after=3600)
    breaker.failure(RuntimeError("down"), "orders")
    breaker.failure(RuntimeError("down"), "orders")
    with caplog.at_level(logging.INFO, logger="airflow_provider_sqlqueue.pump"):
        breaker.success()
    assert "reachable again after 2 failed attempt(s)" in caplog.text
    assert (breaker.failures, breaker.failing_since) == (0, None)
    assert breaker.failure(RuntimeError("down"), "orders") == 1.0


def test_failures_are_warnings_until_they_last_alarm_after_seconds_then_errors(caplog, monkeypatch):
    now = [1000.0]
    monkeypatch.setattr("airflow_provider_sqlqueue.transport.breaker.time.monotonic", lambda: now[0])
    breaker = CircuitBreaker(base_delay=1.0, max_backoff=30.0, alarm_after=120.0)
    with caplog.at_level(logging.WARNING, logger="airflow_provider_sqlqueue.pump"):
        breaker.failure(ConnectionError("refused"), "orders")
        now[0] += 119.0
        breaker.failure(ConnectionError("refused"), "orders")
        now[0] += 2.0
        breaker.failure(ConnectionError("refused"), "orders")
    levels = [record.levelno for record in caplog.records]
    assert levels == [logging.WARNING, logging.WARNING, logging.ERROR]
    assert (
        "Queue orders: database error (ConnectionError: refused); attempt 3 failed, 121s since the first" in caplog.text
    )
