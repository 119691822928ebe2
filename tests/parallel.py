r"""How the suite runs on several workers (pytest-xdist, ``--dist loadfile``), as ``.ci/test`` runs it.

Tests are independent: each has its own schema, and the few that disturb a whole server (restarts,
session-kill storms) make a server of their own. What is *not* free is a module's expensive
fixtures (Airflow's services, a Spark cluster, a browser): a module's tests therefore stay together
on one worker (``loadfile``), so each such fixture starts once per run. The heaviest modules
(:data:`HEAVY`) are handed out first, so that the workers finish at about the same time instead of
one starting the longest module when the others are done.

A run stopped from outside must still tear down what its tests started: SIGTERM reaches only the
controller, which runs no test, and Ctrl-C reaches every process of the group, where a second
interrupt would cut a teardown short. Workers therefore ignore SIGINT, and
:func:`stop_workers_before_the_controller` passes any stop on to them as one SIGTERM and waits
until each has unwound -- fixtures torn down and its reaper run, which it says
by a file of its own (:func:`worker_done`) -- before the controller stops: a controller stopping
first tells execnet to end its workers, which interrupts a teardown after 5 s and ``os._exit``\ s
the worker 10 s later, leaving its daemons running.
"""

from __future__ import annotations

import atexit
import fcntl
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import IO

import pytest

from demo import reaper

#: The run's directory, shared by the controller and its workers (set by the controller, inherited
#: by the workers it starts): where workers say they are done, and the stacks' lock.
RUN_DIR = "SQLQUEUE_TEST_RUN_DIR"
#: Modules that run Airflow's services with Spark jobs (the example chains): each keeps a 2-core
#: machine busy by itself, and two at once starve each other's schedulers past their tests'
#: deadlines. One runs at a time (:func:`one_stack_at_a_time`); the others run beside it.
STACKS: tuple[str, ...] = ("test_airflow_services.py", "test_distributed.py", "test_spark_cluster.py")

#: Modules that take minutes (a stack, building wheels, a browser, crash and chaos runs), the
#: longest first: started first so no worker is left alone with one at the end.
HEAVY: tuple[str, ...] = (
    "test_airflow_services.py",
    "test_packaging.py",
    "test_docs.py",
    "test_queues_page.py",
    "test_chaos.py",
    "test_spark_pipeline.py",
    "test_crash_mid_receive.py",
    "test_competing_consumers.py",
    "test_contract.py",
    "test_db_faults.py",
    "test_extras.py",
)

#: The other stacks, handed out last: a worker that takes one waits for the stack before it, so it
#: should find nothing else left to do.
LAST: tuple[str, ...] = ("test_distributed.py", "test_spark_cluster.py")

#: How long a stopped controller waits for its workers to tear down (services stop gracefully in
#: well under this).
TEARDOWN_WAIT = 240.0


def schedule(items: list[pytest.Item]) -> None:
    """Hand out the heaviest modules first and :data:`LAST` last; the others keep their order."""
    rank = {name: n for n, name in enumerate(HEAVY)} | {name: len(HEAVY) + 1 + n for n, name in enumerate(LAST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(HEAVY)))


def live_processes() -> Iterator[tuple[int, list[str]]]:
    """Each live (not zombie) process: its pid and the fields of ``/proc/<pid>/stat`` after its name
    (state, ppid, pgrp, ...)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        if fields[0] != "Z":
            yield int(entry.name), fields


def _workers() -> list[int]:
    """The controller's child processes: its workers (the controller itself runs no test)."""
    me = os.getpid()
    return [pid for pid, fields in live_processes() if int(fields[1]) == me]


def _stop(signum: int, frame: FrameType | None) -> None:
    for stop in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):  # once: a second signal must not cut the wait short
        signal.signal(stop, signal.SIG_IGN)
    workers = _workers()
    for pid in workers:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    done = Path(os.environ[RUN_DIR])
    deadline = time.monotonic() + TEARDOWN_WAIT
    while time.monotonic() < deadline:
        alive = {pid for pid, _ in live_processes()}  # one look at /proc per round, for every worker
        if not any(pid in alive and not (done / str(pid)).exists() for pid in workers):
            break
        time.sleep(0.1)
    raise KeyboardInterrupt(f"stopped by {signal.Signals(signum).name}")


def stop_workers_before_the_controller() -> None:
    """In the controller: SIGTERM, SIGHUP and SIGINT stop the workers first, then the controller."""
    done = tempfile.mkdtemp(prefix="sqlqueue-workers-")
    atexit.register(shutil.rmtree, done, ignore_errors=True)
    os.environ[RUN_DIR] = done
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, _stop)


_stack: list[IO[bytes]] = []  # the lock, while this worker runs a stack's module


@contextmanager
def one_stack_at_a_time(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Around each test's whole protocol (before its timeout starts): a worker takes the stacks' lock
    before the first test of a :data:`STACKS` module, whose setup starts the stack, and lets it go
    after the module's last test, whose teardown stops it. Outside a parallel run: nothing."""
    run = os.environ.get(RUN_DIR)
    if run is not None and item.path.name in STACKS and not _stack:
        lock = (Path(run) / "stack.lock").open("wb")
        fcntl.flock(lock, fcntl.LOCK_EX)
        _stack.append(lock)
    try:
        yield
    finally:
        if _stack and (nextitem is None or nextitem.path != item.path):
            _stack.pop().close()  # closing lets the lock go


def stopped_by_the_controller_only() -> None:
    """In a worker: ignore SIGINT. Ctrl-C signals the terminal's whole process group, the workers
    too; the controller passes the stop on as SIGTERM, once, so that a worker's teardown is
    interrupted by nothing."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def worker_done() -> None:
    """In a worker whose session is over (its fixtures torn down): kill what is left of what its
    tests started, and say so to a controller that waits for it."""
    done = os.environ.get(RUN_DIR)
    if done is None:
        return
    reaper.kill_all()
    (Path(done) / str(os.getpid())).touch()
