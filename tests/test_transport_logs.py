"""The library's loggers (:mod:`airflow_provider_sqlqueue.transport.logs`): records shown as printable text."""

from __future__ import annotations

import logging

import pytest

from airflow_provider_sqlqueue.transport.logs import logger


def test_a_record_keeps_its_template_and_shows_its_arguments_escaped(caplog: pytest.LogCaptureFixture) -> None:
    log = logger("airflow_provider_sqlqueue.transport")
    with caplog.at_level(logging.INFO, logger=log.name):
        log.info("Queue %s: moved %d message(s) in %.1fs", "x\nPROBLEM forged\x1b[2K\u202e", 3, 0.25)
    [record] = caplog.records
    assert record.msg == "Queue %s: moved %d message(s) in %.1fs"  # handlers that group by it still can
    assert record.getMessage() == "Queue x\\nPROBLEM forged\\x1b[2K\\u202e: moved 3 message(s) in 0.2s"
