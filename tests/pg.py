"""A real PostgreSQL server for the tests (Debian's ``postgresql`` package): ``initdb`` in a
temporary directory, ``postgres`` on a free port (and a unix socket in that directory), stopped
at the end. Found under /usr/lib/postgresql/*/bin, by ``pg_config --bindir``, or on PATH; or
only in ``DRUMBEAT_TEST_PG_BINDIR`` when that is set.

``initdb`` and ``postgres`` refuse to run as root; as root they run as the ``postgres`` system
user (or ``nobody``), who is given the directory.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

MISSING = "PostgreSQL is not installed (apt-get install postgresql)"


def find_bindir() -> Path | None:
    """The directory holding ``initdb`` and ``postgres`` (the newest version), or None."""

    def version(path: str) -> tuple[int, ...]:
        return tuple(int(n) for n in re.findall(r"\d+", path))

    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=version, reverse=True)
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        out = subprocess.run(["pg_config", "--bindir"], capture_output=True, check=True, text=True)
        candidates.append(out.stdout.strip())
    if shutil.which("initdb"):
        candidates.append(str(Path(shutil.which("initdb") or "").parent))
    if "DRUMBEAT_TEST_PG_BINDIR" in os.environ:
        candidates = [os.environ["DRUMBEAT_TEST_PG_BINDIR"]]
    for bindir in map(Path, candidates):
        if (bindir / "initdb").is_file() and (bindir / "postgres").is_file():
            return bindir
    return None


def _unprivileged() -> pwd.struct_passwd | None:
    """The user to run the server as when we are root; None when we are not root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    raise RuntimeError("running as root, and neither a 'postgres' nor a 'nobody' user exists to "
                       "run PostgreSQL as (initdb and postgres refuse root)")  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresServer:
    """One ``postgres`` process with a fresh cluster; `dsn` reaches its ``postgres`` database
    as the superuser ``postgres`` (trust authentication, 127.0.0.1 only)."""

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.dir = Path(tempfile.mkdtemp(prefix="drumbeat-pg-", dir="/tmp"))
        self.data = self.dir / "data"
        self.port = _free_port()
        self.user = _unprivileged()
        self.proc: subprocess.Popen[bytes] | None = None
        self._log = open(self.dir / "log", "wb")  # noqa: SIM115 (closed in stop)

    def dsn(self, dbname: str = "postgres") -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={dbname} connect_timeout=10"

    def _as_user(self) -> dict[str, Any]:
        if self.user is None:
            return {}
        return {"user": self.user.pw_uid, "group": self.user.pw_gid, "extra_groups": []}

    def start(self) -> None:
        if self.user is not None:
            os.chown(self.dir, self.user.pw_uid, self.user.pw_gid)
        # fsync off and no sync after initdb: a throwaway cluster, started in about a second.
        subprocess.run(
            [self.bindir / "initdb", "-D", self.data, "-U", "postgres", "-A", "trust",
             "-E", "UTF8", "--no-sync", "--no-locale"],
            cwd=self.dir, check=True, capture_output=True, **self._as_user(),
        )  # fmt: skip
        self.proc = subprocess.Popen(
            [self.bindir / "postgres", "-D", self.data, "-p", str(self.port), "-k", self.dir,
             "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "max_connections=200"],
            cwd=self.dir, stdout=subprocess.DEVNULL, stderr=self._log, **self._as_user(),
        )  # fmt: skip
        self._wait_ready()

    def _wait_ready(self) -> None:
        import psycopg

        assert self.proc is not None
        deadline = time.monotonic() + 60
        while True:
            try:
                psycopg.connect(self.dsn()).close()
                return
            except psycopg.OperationalError as exc:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    log = (self.dir / "log").read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"postgres did not start ({exc}); its log:\n{log}") from None
                time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGINT)  # fast shutdown: it disconnects clients
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
            self.proc = None
        self._log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def terminate_backends(admin: Any) -> int:
    """Terminates every other connection to ``admin``'s database and waits (up to 10 s each)
    until each has exited; returns how many there were."""
    rows = admin.execute(
        "select pg_terminate_backend(pid, 10000) from pg_stat_activity "
        "where pid <> pg_backend_pid() and datname = current_database()"
    ).fetchall()
    assert all(row[0] for row in rows), f"a backend did not exit within 10 s: {rows}"
    return len(rows)


def backends(admin: Any) -> set[int]:
    """The pids of the other connections to ``admin``'s database."""
    rows = admin.execute(
        "select pid from pg_stat_activity "
        "where pid <> pg_backend_pid() and datname = current_database()"
    ).fetchall()
    return {int(row[0]) for row in rows}
