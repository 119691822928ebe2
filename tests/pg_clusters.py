"""PostgreSQL 15 clusters a test makes for itself, and removes however it ends.

The database-fault tests (``tests/test_db_faults.py``) crash, promote, restart and starve servers:
none of that may touch the server the rest of the suite shares. Each test makes its clusters in a
fresh directory (``initdb`` as the ``postgres`` OS user, which initdb requires instead of root), on
free ports, with its own socket directory. Every server started, tmpfs mounted and directory made
is registered at once; the registered work is undone by :func:`clean_up` in the test's ``finally``
and, if that never ran (an interrupt, an exception in the fixture), at interpreter exit. SIGTERM and
SIGHUP already unwind the stack as a KeyboardInterrupt (``demo/reaper.py``, set by the conftest),
so only a SIGKILL of the test process leaves anything behind.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg

BIN = Path("/usr/lib/postgresql/15/bin")
#: Settings every test cluster starts with: small, quick to start, its log kept for counting.
BASE_SETTINGS = {
    "max_connections": "40",
    "shared_buffers": "16MB",
    "fsync": "on",  # a crash must behave as on a real server
    "logging_collector": "off",
    "log_line_prefix": "'%m [%p] '",
    "wal_level": "replica",
    "max_wal_senders": "4",
    "hot_standby": "on",
    "wal_keep_size": "64MB",
}

_cleanups: list[tuple[str, Callable[[], None]]] = []


def _undo(key: str, action: Callable[[], None]) -> None:
    _cleanups.append((key, action))


def clean_up() -> None:
    """Undo everything registered, newest first: servers stopped, tmpfs unmounted, directories deleted."""
    while _cleanups:
        _, action = _cleanups.pop()
        with contextlib.suppress(Exception):
            action()


atexit.register(clean_up)


def skip_reason() -> str | None:
    """Why this machine cannot run the tests (None: it can)."""
    if os.geteuid() != 0:
        return "needs root: the clusters run as the postgres OS user (runuser) and the full-disk test mounts a tmpfs"
    if not (BIN / "initdb").exists():
        return f"needs PostgreSQL 15's server binaries in {BIN} (apt-get install postgresql-15)"
    if shutil.which("runuser") is None or _uid("postgres") is None:
        return "needs runuser and a postgres OS user to run initdb and the servers as"
    return None


def _uid(user: str) -> int | None:
    import pwd

    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def as_postgres(*args: str | Path, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["runuser", "-u", "postgres", "--", *map(str, args)],
        check=check,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def chown_postgres(path: Path) -> None:
    uid = _uid("postgres")
    assert uid is not None
    import pwd

    os.chown(path, uid, pwd.getpwnam("postgres").pw_gid)


@contextlib.contextmanager
def workspace() -> Iterator[Path]:
    """A fresh directory for a test's clusters, its contents removed (servers, mounts included) at the end."""
    root = Path(tempfile.mkdtemp(prefix="sqlqueue-faults-"))
    root.chmod(0o755)
    _undo(str(root), lambda: shutil.rmtree(root, ignore_errors=True))
    try:
        yield root
    finally:
        clean_up()


class Cluster:
    """One PostgreSQL 15 server: its data directory, port and log."""

    def __init__(self, root: Path, name: str, port: int | None = None, host: str = "127.0.0.1") -> None:
        self.name = name
        self.host = host
        self.data = root / name
        self.port = port or free_port()
        self.log = root / f"{name}.log"
        self.sockets = root / f"{name}-sockets"

    @property
    def uri(self) -> str:
        return f"host={self.host} port={self.port} user=postgres dbname=postgres"

    def init(self, **settings: str) -> Cluster:
        """initdb (trust authentication on 127.0.0.1, replication included) and the settings given."""
        self.data.mkdir()
        chown_postgres(self.data)
        as_postgres(BIN / "initdb", "-D", self.data, "-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8")
        with open(self.data / "pg_hba.conf", "a") as hba:  # servers on other loopback addresses (127.0.0.2)
            hba.write("host all all 127.0.0.0/8 trust\nhost replication all 127.0.0.0/8 trust\n")
        self.configure(**settings)
        return self

    def configure(self, **settings: str) -> None:
        """Add settings to postgresql.auto.conf (read at the next start or reload)."""
        self.sockets.mkdir(exist_ok=True)
        chown_postgres(self.sockets)
        merged = {
            **BASE_SETTINGS,
            "listen_addresses": f"'{self.host}'",
            "port": str(self.port),
            "unix_socket_directories": f"'{self.sockets}'",
            **settings,
        }
        with open(self.data / "postgresql.auto.conf", "a") as conf:
            conf.writelines(f"{key} = {value}\n" for key, value in merged.items())

    def start(self) -> None:
        self.log.touch()
        chown_postgres(self.log)
        _undo(f"server {self.data}", self.crash)
        as_postgres(BIN / "pg_ctl", "-D", self.data, "-l", self.log, "-w", "-t", "60", "start")

    def pg_ctl(self, *args: str) -> None:
        as_postgres(BIN / "pg_ctl", "-D", self.data, "-w", "-t", "60", *args)

    def postmaster_pid(self) -> int | None:
        try:
            return int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def crash(self) -> None:
        """SIGKILL the server and every process of it (a host that loses power, for its clients), and
        remove the System V shared memory segment it leaves (only a server that exits frees it)."""
        pid = self.postmaster_pid()
        if pid is None:
            return
        try:  # postmaster.pid's 7th line: the segment's key and id
            segment: str | None = (self.data / "postmaster.pid").read_text().splitlines()[6].split()[1]
        except (OSError, IndexError):
            segment = None
        try:
            if os.getpgid(pid) == pid:  # pg_ctl starts the postmaster in a session of its own
                os.killpg(pid, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        with contextlib.suppress(FileNotFoundError):
            (self.data / "postmaster.pid").unlink()
        if segment is not None:
            subprocess.run(["ipcrm", "-m", segment], capture_output=True, check=False)

    def sql(self, statement: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
        with psycopg.connect(self.uri, autocommit=True, connect_timeout=10) as conn:
            cursor = conn.execute(statement, params)
            return cursor.fetchall() if cursor.description else []

    def log_lines(self, pattern: str) -> int:
        """Lines of the server's log matching ``pattern``."""
        regex = re.compile(pattern)
        return sum(1 for line in self.log.read_text(errors="replace").splitlines() if regex.search(line))

    def standby(
        self, root: Path, name: str, *, application_name: str, host: str = "127.0.0.1", port: int | None = None
    ) -> Cluster:
        """A streaming standby of this (running) server: pg_basebackup -R, its own port (or address)."""
        replica = Cluster(root, name, port, host)
        replica.data.mkdir(mode=0o700)
        chown_postgres(replica.data)
        as_postgres(
            BIN / "pg_basebackup",
            "-h",
            self.host,
            "-p",
            str(self.port),
            "-U",
            "postgres",
            "-D",
            replica.data,
            "-R",
            "-X",
            "stream",
            "-c",
            "fast",
            "-d",
            f"host={self.host} port={self.port} user=postgres application_name={application_name}",
        )
        # Promoted, it stands alone: a commit must not wait for a standby of its own that never comes.
        replica.configure(synchronous_standby_names="''")
        return replica


def mount_tmpfs(path: Path, size: str) -> None:
    """A tmpfs of ``size`` at ``path``, owned by postgres, unmounted by :func:`clean_up`."""
    path.mkdir(exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)], check=True)
    _undo(f"mount {path}", lambda: subprocess.run(["umount", "-l", str(path)], check=False))
    chown_postgres(path)


def can_mount() -> str | None:
    """Why a tmpfs cannot be mounted here (None: it can)."""
    probe = Path(tempfile.mkdtemp(prefix="sqlqueue-mount-probe-"))
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(probe)], capture_output=True)
        if done.returncode:
            return f"cannot mount a tmpfs here: {done.stderr.decode(errors='replace').strip()}"
        subprocess.run(["umount", str(probe)], check=False)
        return None
    finally:
        shutil.rmtree(probe, ignore_errors=True)
