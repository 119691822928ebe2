"""The console script ``sqlqueue``: the commands of :mod:`.cli`, with Ctrl-C one line from the start.

A command interrupted while it runs says so in :mod:`.cli`; this catches what comes before --
importing the transport and its drivers takes a noticeable moment, and a Ctrl-C then would
otherwise print a traceback through the import machinery. Importing this module costs nothing.
"""

from __future__ import annotations

import sys

from .exit_status import INTERRUPTED


def main() -> int:
    """Entry point of the ``sqlqueue`` console script."""
    try:
        from .cli import main as run_command  # imported here, where Ctrl-C is caught

        return run_command()
    except KeyboardInterrupt:
        print("sqlqueue: interrupted", file=sys.stderr)
        return INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
