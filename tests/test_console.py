"""The console script: a Ctrl-C while the commands are still being imported is one line too."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

from airflow_provider_sqlqueue.console import INTERRUPTED

#: Runs the console script's main with a real SIGINT delivered while ``airflow_provider_sqlqueue.cli``
#: (and the transport and drivers it pulls in) is being imported.
INTERRUPTED_DURING_IMPORT = textwrap.dedent(
    """
    import os, signal, sys
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal, even if started with it ignored
    from airflow_provider_sqlqueue.console import main

    class Interrupting:
        def find_spec(self, name, path=None, target=None):
            if name == "airflow_provider_sqlqueue.transport":
                os.kill(os.getpid(), signal.SIGINT)
            return None

    sys.meta_path.insert(0, Interrupting())
    sys.argv = ["sqlqueue", "ddl", "orders", "--dialect", "postgres"]
    sys.exit(main())
    """
)


def test_ctrl_c_while_the_commands_are_imported_is_one_line_and_status_130() -> None:
    done = subprocess.run(
        [sys.executable, "-c", INTERRUPTED_DURING_IMPORT], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == INTERRUPTED == 130
    assert done.stderr == "sqlqueue: interrupted\n" and done.stdout == ""


def test_the_console_script_is_this_entry_point_and_runs_a_command() -> None:
    project = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())
    assert project["project"]["scripts"]["sqlqueue"] == "airflow_provider_sqlqueue.console:main"
    done = subprocess.run(
        [sys.executable, "-m", "airflow_provider_sqlqueue.console", "ddl", "orders", "--dialect", "postgres"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and 'CREATE TABLE IF NOT EXISTS "public"."orders"' in done.stdout, done.stderr
