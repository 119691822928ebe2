"""Hosts on one machine (demo/hosts.py): namespaces that reach each other only over the subnet.

The distributed test relies on three things checked here with plain sockets: a process in a
host's namespace reaches another host and this namespace's bridge address; a cut host reaches
nothing until it is restored; and deleting the network leaves no namespace or link behind.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import psycopg
import pytest

from demo import hosts

SERVE_ONCE = (
    "import socket, sys; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
    "s.bind((sys.argv[1], 7777)); s.listen(); print('listening', flush=True)\n"
    "while True:\n    c, _ = s.accept(); c.sendall(b'hi'); c.close()"
)
ASK = "import socket, sys; print(socket.create_connection((sys.argv[1], 7777), timeout=3).recv(2).decode())"


@pytest.fixture
def network() -> Iterator[hosts.Network]:
    reason = hosts.available()
    if reason:
        pytest.skip(reason)
    with hosts.Network() as net:
        yield net


def ask(host: hosts.Host, address: str) -> str:
    """What a server at ``address`` answers a client on ``host`` ("" when it cannot be reached)."""
    done = subprocess.run(host.command([sys.executable, "-c", ASK, address]), capture_output=True, text=True)
    return done.stdout.strip()


def serve(argv: list[str]) -> subprocess.Popen[str]:
    server = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None and server.stdout.readline().strip() == "listening"
    return server


def test_hosts_reach_each_other_and_the_bridge_and_a_cut_host_reaches_nothing(network: hosts.Network) -> None:
    one, two = network.add_host("a"), network.add_host("b")
    assert len({network.address, one.address, two.address}) == 3
    on_two = serve(two.command([sys.executable, "-c", SERVE_ONCE, two.address]))
    on_bridge = serve([sys.executable, "-c", SERVE_ONCE, network.address])
    try:
        assert ask(one, two.address) == "hi"
        assert ask(one, network.address) == "hi"
        assert ask(one, "127.0.0.1") == ""  # this namespace's loopback is not the host's
        network.cut(one)
        assert ask(one, two.address) == ""
        assert ask(one, network.address) == ""
        network.restore(one)
        deadline = time.monotonic() + 30
        answers: list[str] = []
        while time.monotonic() < deadline and (not answers or answers[-1] != "hi"):
            answers.append(ask(one, two.address))
        assert answers[-1] == "hi"
    finally:
        on_two.kill()
        on_bridge.kill()
        on_two.wait()
        on_bridge.wait()


def test_deleting_the_network_leaves_no_namespace_or_link() -> None:
    reason = hosts.available()
    if reason:
        pytest.skip(reason)
    with hosts.Network() as net:
        net.add_host("a")
        names = [net.bridge, net.hosts["a"].link]
        namespace = net.hosts["a"].namespace
        assert namespace in hosts.ip("netns", "list")
    assert namespace not in hosts.ip("netns", "list")
    links = hosts.ip("-o", "link", "show")
    assert [name for name in names if name in links] == []


def test_servers_on_the_bridge_answer_hosts_on_the_subnet(network: hosts.Network) -> None:
    host = network.add_host("a")
    with hosts.postgres_on(network) as uri, hosts.redis_on(network) as url:
        with psycopg.connect(uri) as connection:
            assert connection.execute("SELECT 1").fetchone() == (1,)
        ping = f"import psycopg, redis; psycopg.connect({uri!r}).close(); print(redis.Redis.from_url({url!r}).ping())"
        done = subprocess.run(host.command([sys.executable, "-c", ping]), capture_output=True, text=True)
        assert done.stdout.strip() == "True", done.stderr


def test_a_host_knows_its_processes_and_a_crash_kills_them_all(network: hosts.Network) -> None:
    one, two = network.add_host("a"), network.add_host("b")
    # A process that leaves its session and rewrites its title, as Celery's and Airflow's do.
    sleeper = subprocess.Popen(one.command(["setsid", "sleep", "300"]))
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not one.runs(sleeper.pid):
            time.sleep(0.05)
        assert one.runs(sleeper.pid) and not two.runs(sleeper.pid)
        assert two.crash() == 0
        assert one.crash() == 1
        assert sleeper.wait(timeout=30) == -9
    finally:
        sleeper.kill()
        sleeper.wait()
