"""The library's loggers: each record they write shows its text as one line of printable text.

What they log names tables, and tables are named by whoever may create one; a delayed message's
destination comes from its headers; server messages span lines. A name holding a newline and a
forged ``PROBLEM ...`` line, or a terminal escape sequence, must reach an operator's log (and a
monitoring check reading ``2>&1``) as visible escapes, never as lines or colours of its own.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from .errors import printable


class _Printable(logging.Filter):
    """Escape what is not :func:`~.errors.printable` in a record's template and its arguments. The
    template stays a template (handlers that group records by it, such as error trackers, still
    can); an argument that is neither text nor a number is shown as its text, escaped."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = printable(record.msg)
        if isinstance(record.args, Mapping):
            record.args = {key: _escaped(value) for key, value in record.args.items()}
        elif isinstance(record.args, tuple):
            record.args = tuple(_escaped(value) for value in record.args)
        return True


def _escaped(value: object) -> object:
    """A log argument as its record shows it, escaped: numbers stay numbers for ``%d`` and ``%.3g``."""
    if isinstance(value, (int, float)):
        return value
    return printable(value if isinstance(value, str) else str(value))


_PRINTABLE = _Printable()


def logger(name: str) -> logging.Logger:
    """The logger ``name``, its records made printable (a filter on it: records of loggers below it
    are not filtered by it, so every module asks here for its own)."""
    log = logging.getLogger(name)
    if _PRINTABLE not in log.filters:
        log.addFilter(_PRINTABLE)
    return log
