"""The library's loggers: each record they write is one line of printable text.

What they log names tables, and tables are named by whoever may create one; a delayed message's
destination comes from its headers; server messages span lines. A name holding a newline and a
forged ``PROBLEM ...`` line, or a terminal escape sequence, must reach an operator's log (and a
monitoring check reading ``2>&1``) as visible escapes, never as lines or colours of its own.
"""

from __future__ import annotations

import logging

from .errors import printable


class _Printable(logging.Filter):
    """Escape what is not :func:`~.errors.printable` in a record's message (its arguments merged in)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001  # a malformed call: left to the handler, which reports it as logging does
            return True
        record.msg, record.args = printable(message), None
        return True


_PRINTABLE = _Printable()


def logger(name: str) -> logging.Logger:
    """The logger ``name``, its records made printable (a filter on it: records of loggers below it
    are not filtered by it, so every module asks here for its own)."""
    log = logging.getLogger(name)
    if _PRINTABLE not in log.filters:
        log.addFilter(_PRINTABLE)
    return log
