"""Process groups this process started, killed however it ends.

The Airflow services and the Spark daemons each run in a session of their own, so that a kill
reaches everything they started (LocalExecutor task processes, executors). The same makes them
outlive this process: a demo or test run stopped by SIGTERM or SIGHUP (a CI timeout, a closed
terminal) or ended by an uncaught exception would leave them running, holding ports and memory.

Some descendants leave the group: Airflow's task processes start sessions of their own, and the
Spark JVMs they start follow them. They keep the environment, though, so an owner also registers
a *mark* -- an environment variable only its descendants carry (the services' ``AIRFLOW_HOME``) --
and every process carrying it is killed with the groups.

So each group and mark is registered here while it lives. :func:`interruptible` turns SIGTERM and SIGHUP
into ``KeyboardInterrupt``, which unwinds the stack through every ``finally`` and fixture teardown
(services are stopped gracefully there); at interpreter exit whatever group is still registered is
killed. Only a SIGKILL of this process itself escapes both: nothing runs after it.

Network namespaces and links (demo/hosts.py) outlive their creator the same way -- they belong to
the machine, not to a process -- so they are registered too and deleted at exit, after the
processes inside them are killed.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
from pathlib import Path
from types import FrameType

_groups: set[int] = set()
_marks: set[str] = set()
_namespaces: set[str] = set()
_links: set[str] = set()


def track(pid: int) -> None:
    """Kill the process group led by ``pid`` when this process exits, unless :func:`forget` comes first."""
    _groups.add(pid)


def forget(pid: int) -> None:
    """The group led by ``pid`` was stopped by its owner."""
    _groups.discard(pid)


def mark(name: str, value: str) -> None:
    """Kill every process whose environment holds ``name=value`` when this process exits, unless
    :func:`kill_marked` comes first."""
    _marks.add(f"{name}={value}")


def track_namespace(name: str) -> None:
    """Delete the network namespace ``name`` when this process exits, unless :func:`forget_namespace` comes first."""
    _namespaces.add(name)


def forget_namespace(name: str) -> None:
    """The namespace ``name`` was deleted by its owner."""
    _namespaces.discard(name)


def track_link(name: str) -> None:
    """Delete the network link ``name`` (a bridge, a veth pair) of this namespace when this process
    exits, unless :func:`forget_link` comes first."""
    _links.add(name)


def forget_link(name: str) -> None:
    """The link ``name`` was deleted by its owner."""
    _links.discard(name)


def kill_marked(name: str, value: str) -> int:
    """SIGKILL every process but this one whose environment holds ``name=value``; returns how many."""
    wanted = f"{name}={value}".encode()
    _marks.discard(wanted.decode())
    return sum(_kill(pid) for pid in _carrying(wanted))


def _carrying(entry: bytes) -> list[int]:
    found = []
    for path in Path("/proc").iterdir():
        if not path.name.isdigit() or int(path.name) == os.getpid():
            continue
        try:
            if entry in (path / "environ").read_bytes().split(b"\0"):
                found.append(int(path.name))
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return found


def _kill(pid: int) -> bool:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def kill_all() -> None:
    """SIGKILL every group and every marked process still registered, then delete every namespace and
    link still registered (already gone: nothing to do)."""
    while _groups:
        try:
            os.killpg(_groups.pop(), signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for entry in list(_marks):
        name, _, value = entry.partition("=")
        kill_marked(name, value)
    # Processes first: a namespace deleted under a running process lives on until the process ends.
    while _namespaces:
        namespace = _namespaces.pop()
        inside = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True, check=False)
        for pid in inside.stdout.split():
            _kill(int(pid))
        subprocess.run(["ip", "netns", "delete", namespace], capture_output=True, check=False)
    while _links:
        subprocess.run(["ip", "link", "delete", _links.pop()], capture_output=True, check=False)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"stopped by {signal.Signals(signum).name}")


def interruptible() -> None:
    """Make SIGTERM and SIGHUP unwind this process as Ctrl-C does, so cleanup code runs."""
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _interrupt)


atexit.register(kill_all)
