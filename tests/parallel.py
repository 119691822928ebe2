r"""How the suite runs on several workers (pytest-xdist, ``--dist loadfile``), as ``.ci/test`` runs it.

Tests are independent: each has its own schema, and the few that disturb a whole server (restarts,
session-kill storms) make a server of their own. What is *not* free is a module's expensive
fixtures (Airflow's services, a Spark cluster, a browser): a module's tests therefore stay together
on one worker (``loadfile``), so each such fixture starts once per run. The modules that run
Airflow's services with Spark jobs (:data:`STACKS`) are one unit of work, run one after the other
by the first worker from the start (:class:`tests.scheduler.StacksTogether`), and the heaviest other modules
(:data:`HEAVY`) are handed out first to the others, so that the workers finish at about the same
time instead of one starting the longest module when the others are done.

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
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import pytest

from demo import reaper

#: The run's directory, shared by the controller and its workers (set by the controller, inherited
#: by the workers it starts): where workers say they are done.
RUN_DIR = "SQLQUEUE_TEST_RUN_DIR"
#: Modules that run Airflow's services with Spark jobs (the example chains): each keeps a 2-core
#: machine busy by itself, and two at once starve each other's schedulers past their tests'
#: deadlines. They are one unit of work (:class:`tests.scheduler.StacksTogether`): one worker runs them in turn.
STACKS: tuple[str, ...] = ("test_airflow_services.py", "test_distributed.py", "test_spark_cluster_dags.py")

#: Modules that take minutes (building wheels, a browser, a Spark cluster, crash and chaos runs), the
#: longest first: started first so no worker is left alone with one at the end.
HEAVY: tuple[str, ...] = (
    "test_packaging.py",
    "test_queues_page.py",
    "test_spark_cluster.py",
    "test_spark_pipeline.py",
    "test_chaos.py",
    "test_contract.py",
    "test_spark_functions.py",
    "test_cli.py",
    "test_reaper.py",
    "test_db_faults.py",
    "test_docs.py",
    "test_crash_mid_receive.py",
    "test_competing_consumers.py",
    "test_extras.py",
)

#: How long a stopped controller waits for its workers to tear down (services stop gracefully in
#: well under this).
TEARDOWN_WAIT = 240.0


def schedule(items: list[pytest.Item]) -> None:
    """The stacks first (their unit is the first worker's), then the heaviest modules; the others keep their order."""
    rank = {name: n for n, name in enumerate(STACKS)} | {name: len(STACKS) + n for n, name in enumerate(HEAVY)}
    items.sort(key=lambda item: rank.get(item.path.name, len(STACKS) + len(HEAVY)))


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
