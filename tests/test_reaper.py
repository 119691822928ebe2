"""A run stopped from outside leaves no service or Spark daemon behind (demo/reaper.py).

The services and daemons run in sessions of their own, so they outlive the process that started
them unless it kills them. Each test here starts a stand-in daemon -- a process group of two
``sleep`` processes, as a service with a child -- the way the services are started, stops its
owner from outside, and checks that no process of the group is left.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.parallel import live_processes

ROOT = Path(__file__).resolve().parents[1]

OWNER = """
import signal, subprocess, sys, time
from demo import reaper

signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal, even if started with it ignored
reaper.interruptible()
daemon = subprocess.Popen(["sh", "-c", "sleep 300 & sleep 300; wait"], start_new_session=True)
reaper.track(daemon.pid)
print(daemon.pid, flush=True)
try:
    time.sleep(300)
finally:
    print("cleanup ran", flush=True)
"""


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of the group ``pgid``."""
    return [pid for pid, fields in live_processes() if int(fields[2]) == pgid]


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=lambda s: s.name)
def test_an_owner_stopped_by_a_signal_kills_the_groups_it_started(how: signal.Signals) -> None:
    owner = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(OWNER)], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        daemon = int(owner.stdout.readline())
        deadline = time.monotonic() + 30
        while len(group_members(daemon)) < 3 and time.monotonic() < deadline:  # sh and its two sleeps
            time.sleep(0.05)
        assert len(group_members(daemon)) == 3
        owner.send_signal(how)
        rest, _ = owner.communicate(timeout=60)
        assert "cleanup ran" in rest  # the signal unwound the owner as Ctrl-C does
        deadline = time.monotonic() + 10
        while group_members(daemon) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert group_members(daemon) == []
    finally:
        owner.kill()
        owner.wait()


MARKED_OWNER = """
import os, subprocess, sys, time
from demo import reaper

reaper.interruptible()
home = sys.argv[1]
env = {**os.environ, "AIRFLOW_HOME": home}
# A service whose child leaves the group for a session of its own, as Airflow's task processes do.
service = subprocess.Popen(["sh", "-c", "setsid sleep 301 & sleep 300; wait"], start_new_session=True, env=env)
reaper.track(service.pid)
reaper.mark("AIRFLOW_HOME", home)
print(service.pid, flush=True)
time.sleep(300)
"""


def marked(home: str) -> list[int]:
    """Live processes whose environment says AIRFLOW_HOME=home."""
    wanted, found = f"AIRFLOW_HOME={home}".encode(), []
    for entry in Path("/proc").iterdir():
        try:
            carries = entry.name.isdigit() and wanted in (entry / "environ").read_bytes().split(b"\0")
            if carries and (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def test_processes_that_left_the_group_are_found_by_their_mark(tmp_path: Path) -> None:
    home = str(tmp_path / "airflow-home")
    owner = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(MARKED_OWNER), home], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        int(owner.stdout.readline())
        deadline = time.monotonic() + 30
        while len(marked(home)) < 4 and time.monotonic() < deadline:  # sh, two sleeps, and setsid's sleep
            time.sleep(0.05)
        escaped = [pid for pid in marked(home) if os.getpgid(pid) == pid]  # the one in a session of its own
        assert escaped
        owner.send_signal(signal.SIGTERM)
        owner.communicate(timeout=60)
        deadline = time.monotonic() + 10
        while marked(home) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marked(home) == []
    finally:
        owner.kill()
        owner.wait()


@pytest.mark.parametrize("after_a_task", [False, True], ids=["first-test", "after-a-task-ran-in-process"])
def test_a_stopped_pytest_run_tears_down_and_kills_what_its_tests_started(tmp_path: Path, after_a_task: bool) -> None:
    """A CI timeout sends SIGTERM to pytest: the fixture's teardown runs and the group is gone -- also
    after a test ran an Airflow task in this process (``dag.test()``), whose runner leaves a SIGTERM
    handler of its own behind (modelled here by a test that sets one)."""
    (tmp_path / "conftest.py").write_text(
        "from tests.conftest import _stopped_by_sigterm_after_every_test, pytest_configure  # noqa: F401\n"
    )
    task = "def test_runs_a_task_in_process():\n    signal.signal(signal.SIGTERM, lambda *_: None)\n"
    (tmp_path / "test_long.py").write_text(
        (task if after_a_task else "")
        + textwrap.dedent(
            """
            import signal, subprocess, time
            import pytest
            from demo import reaper

            @pytest.fixture
            def daemon():
                process = subprocess.Popen(["sleep", "300"], start_new_session=True)
                reaper.track(process.pid)
                yield process
                print("TEARDOWN", flush=True)

            def test_runs_long(daemon):
                print("DAEMON", daemon.pid, flush=True)  # set up: the stop comes while the test runs
                time.sleep(300)
            """
        )
    )
    run = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-s", "-p", "no:cacheprovider", "-q", str(tmp_path / "test_long.py")],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        daemon = None
        for line in run.stdout:
            if "DAEMON" in line:  # after the progress dot of a test before it
                daemon = int(line.split("DAEMON")[1].split()[0])
                break
        assert daemon is not None
        run.send_signal(signal.SIGTERM)
        rest, _ = run.communicate(timeout=120)
        assert "TEARDOWN" in rest
        deadline = time.monotonic() + 10
        while group_members(daemon) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert group_members(daemon) == []
    finally:
        run.kill()
        run.wait()


NETWORK_OWNER = """
import time
from demo import hosts, reaper

reaper.interruptible()
net = hosts.Network().create()  # no `with`: only the reaper deletes it
host = net.add_host("a")
print(host.namespace, net.bridge, host.link, flush=True)
time.sleep(300)
"""


def test_an_owner_stopped_by_a_signal_deletes_the_namespaces_and_links_it_made() -> None:
    from demo import hosts

    reason = hosts.available()
    if reason:
        pytest.skip(reason)
    owner = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(NETWORK_OWNER)], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        namespace, *links = owner.stdout.readline().split()
        assert namespace in hosts.ip("netns", "list")
        owner.send_signal(signal.SIGTERM)
        owner.communicate(timeout=60)
        assert namespace not in hosts.ip("netns", "list")
        present = hosts.ip("-o", "link", "show")
        assert [link for link in links if f" {link}:" in present or f" {link}@" in present] == []
    finally:
        owner.kill()
        owner.wait()


@pytest.mark.parametrize(
    ("how", "to_the_group"),
    [(signal.SIGTERM, False), (signal.SIGINT, True), (signal.SIGINT, False)],
    ids=["TERM-controller", "INT-group", "INT-controller"],
)
def test_a_stopped_parallel_run_tears_down_on_every_worker_before_it_ends(
    tmp_path: Path, how: signal.Signals, to_the_group: bool
) -> None:
    """``.ci/test`` runs the suite on several workers (pytest-xdist). A CI timeout (SIGTERM, or
    ``timeout -s INT``) signals only the controller, which runs no test; Ctrl-C signals the whole
    process group. Each way each worker's fixtures are torn down, once, and what its tests started
    is gone when the run ends -- a controller ending first would have execnet end its workers
    mid-teardown, leaving their daemons running."""
    (tmp_path / "conftest.py").write_text(
        "from tests.conftest import (  # noqa: F401\n"
        "    _stopped_by_sigterm_after_every_test, pytest_configure, pytest_sessionfinish,\n"
        ")\n"
    )
    for name in ("a", "b"):  # two modules: each module's tests stay on one worker
        (tmp_path / f"test_long_{name}.py").write_text(
            textwrap.dedent(
                f"""
                import os, subprocess, time
                import pytest
                from demo import reaper

                @pytest.fixture
                def daemon():
                    process = subprocess.Popen(["sleep", "300"], start_new_session=True)
                    reaper.track(process.pid)
                    yield process
                    time.sleep(12)  # longer than xdist gives a worker before it kills it
                    with open(os.path.join({str(tmp_path)!r}, f"teardown-{{process.pid}}"), "w"):
                        pass

                def test_runs_long(daemon):
                    with open(os.path.join({str(tmp_path)!r}, f"daemon-{{daemon.pid}}"), "w"):
                        pass
                    time.sleep(300)
                """
            )
        )
    run = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pytest",
            "-n",
            "2",
            "--dist",
            "loadfile",
            "-p",
            "no:cacheprovider",
            "-q",
            str(tmp_path),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        start_new_session=True,  # a process group of its own, as a terminal's foreground job
    )
    try:
        deadline = time.monotonic() + 120
        daemons: list[int] = []
        while len(daemons) < 2 and time.monotonic() < deadline and run.poll() is None:
            daemons = [int(path.name.split("-")[1]) for path in tmp_path.glob("daemon-*")]
            time.sleep(0.1)
        assert len(daemons) == 2, run.communicate(timeout=60)[0] if run.poll() is not None else "no daemon"
        if to_the_group:
            os.killpg(run.pid, how)  # Ctrl-C: the terminal signals the foreground group
        else:
            run.send_signal(how)  # a CI timeout: the controller alone
        run.communicate(timeout=300)
        assert sorted(int(path.name.split("-")[1]) for path in tmp_path.glob("teardown-*")) == sorted(daemons)
        assert [pid for pid in daemons if group_members(pid)] == []
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
        run.wait()
