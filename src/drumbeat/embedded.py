"""The private redis-server behind ``App()`` with no URL: one per data directory, on a unix
socket, persisted with AOF, shared by every drumbeat process of the user on this machine.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from redis.exceptions import RedisError

from drumbeat.embedded_probe import POLL_INTERVAL, client, listening, pid_alive, probe, settle
from drumbeat.errors import ConfigurationError
from drumbeat.redis_server import FIX_HINT, binary_version, find_binary

if sys.platform != "win32":
    import fcntl

__all__ = ["EmbeddedStatus", "ensure_running", "find_binary", "home", "status", "stop"]

SOCKET_NAME = "redis.sock"
PID_NAME = "redis.pid"
LOG_NAME = "redis.log"
LOCK_NAME = "lock"

# Redis 7 keeps its AOF as several files in this directory; 6.2 uses a single appendonly.aof.
_AOF_DIR_7 = "appendonlydir"

# sun_path is 104 bytes on macOS and 108 on Linux, both counting the trailing NUL; staying
# under the smaller one keeps a data directory portable between the two.
_MAX_SOCKET_PATH_BYTES = 103

_START_TIMEOUT = 10.0
# Replaying a large AOF can legitimately take a while; the server says LOADING meanwhile.
_LOADING_TIMEOUT = 300.0
_STOP_TIMEOUT = 10.0
_LOG_TAIL_LINES = 20


@dataclass(frozen=True, slots=True)
class EmbeddedStatus:
    """A snapshot of the embedded server, as `status` found it.

    Attributes:
        url: The URL clients use, whether or not the server is running.
        home: The data directory.
        running: Whether something listens on the socket.
        pid: The server's process id, when running.
        redis_version: The server's version, when running.
        binary: The running server's executable, or else the one `find_binary` would start
            (None if there is none).
        aof_enabled: Whether the server persists with AOF, when running.
        used_memory_human: The server's memory use, e.g. ``"1.02M"``, when running.
        keys: The number of keys in database 0, when running.
    """

    url: str
    home: Path
    running: bool
    pid: int | None
    redis_version: str | None
    binary: str | None
    aof_enabled: bool | None
    used_memory_human: str | None
    keys: int | None


@dataclass(frozen=True, slots=True)
class _Paths:
    home: Path
    socket: Path
    pidfile: Path
    logfile: Path
    lockfile: Path

    @property
    def url(self) -> str:
        return f"unix://{quote(str(self.socket), safe='/')}?db=0"


def home() -> Path:
    """Return the data directory of the embedded server.

    ``$DRUMBEAT_HOME`` if set, else ``$XDG_DATA_HOME/drumbeat``, else
    ``~/.local/share/drumbeat``. The directory need not exist yet.

    Returns:
        An absolute path.
    """
    explicit = os.environ.get("DRUMBEAT_HOME")
    if explicit:
        return Path(explicit).expanduser().absolute()
    xdg = os.environ.get("XDG_DATA_HOME")
    # The XDG spec says to ignore a relative XDG_DATA_HOME.
    if xdg and Path(xdg).is_absolute():
        return Path(xdg) / "drumbeat"
    return Path.home() / ".local" / "share" / "drumbeat"


def ensure_running(home: Path | None = None) -> str:
    """Start the embedded redis-server, or reuse the one already running, and return its URL.

    Several processes may call this at once: an exclusive lock on ``<home>/lock`` makes exactly
    one of them start the server and the others reuse it. The server daemonizes and keeps
    running after this process exits, so that every drumbeat process on the machine shares it
    and the jobs stay put; `stop` shuts it down.

    It listens on ``<home>/redis.sock`` only (no TCP port), persists with AOF
    (``appendfsync everysec``, no RDB snapshots: a crash of the machine may lose the last
    second of writes, `stop` loses none) and never evicts keys. Redis 7 converts a 6.x AOF to
    its own format on first start, after which a 6.x binary refuses this directory.

    Args:
        home: The data directory; `home()` when None. Created (mode 0700) if missing.

    Returns:
        A ``unix://...?db=0`` URL for ``redis.Redis.from_url``.

    Raises:
        ConfigurationError: If the socket path is too long, no redis-server is found, the
            server does not come up in time, or the data directory holds Redis 7 AOF files
            that an older binary cannot read.
    """
    paths = _paths(home)
    paths.home.mkdir(mode=0o700, parents=True, exist_ok=True)
    with _locked(paths):
        state = probe(paths.socket)
        if state == "unresponsive":
            state = settle(paths.socket)
        if state == "ready":
            return paths.url
        if state == "loading":
            _wait_ready(paths, started=time.monotonic())
            return paths.url
        if state == "unresponsive":
            raise ConfigurationError(
                f"Something listens on {paths.socket} but does not answer PING; not starting "
                f"a second server over the same data. Stop it, or see {paths.logfile}."
                f"{_log_tail(paths.logfile)}"
            )
        _start(paths, find_binary())
    return paths.url


def status(home: Path | None = None) -> EmbeddedStatus:
    """Describe the embedded server without starting or changing anything.

    Args:
        home: The data directory; `home()` when None.

    Returns:
        An `EmbeddedStatus`; the server's fields are None when it is not running (or does not
        answer INFO).

    Raises:
        ConfigurationError: If the socket path is too long.
    """
    paths = _paths(home)
    info: dict[str, object] = {}
    running = listening(paths.socket)
    if running:
        with contextlib.suppress(RedisError), client(paths.socket) as conn:
            info = conn.info()

    binary = info.get("executable")
    if not isinstance(binary, str) or not binary:
        try:
            binary = str(find_binary())
        except ConfigurationError:
            binary = None

    pid = info.get("process_id")
    version = info.get("redis_version")
    memory = info.get("used_memory_human")
    aof = info.get("aof_enabled")
    db0 = info.get("db0", {})
    keys = db0.get("keys", 0) if isinstance(db0, dict) else 0
    return EmbeddedStatus(
        url=paths.url,
        home=paths.home,
        running=running,
        pid=pid if isinstance(pid, int) else None,
        redis_version=str(version) if version is not None else None,
        binary=binary,
        aof_enabled=bool(aof) if isinstance(aof, int) else None,
        used_memory_human=str(memory) if memory is not None else None,
        keys=keys if info and isinstance(keys, int) else None,
    )


def stop(home: Path | None = None) -> bool:
    """Shut the embedded server down, if it is running, and wait until its process is gone.

    Uses a plain ``SHUTDOWN``, which fsyncs the AOF first, so nothing acknowledged is lost.
    Other processes that use the server lose their connections; the next `ensure_running`
    starts it again.

    Args:
        home: The data directory; `home()` when None.

    Returns:
        Whether the server was running.

    Raises:
        ConfigurationError: If the server refuses to shut down or outlives the wait.
    """
    paths = _paths(home)
    if not paths.home.is_dir():
        return False
    with _locked(paths):
        if probe(paths.socket) == "absent":
            return False
        pid = _shutdown(paths)
        deadline = time.monotonic() + _STOP_TIMEOUT
        while listening(paths.socket) or (pid is not None and pid_alive(pid)):
            if time.monotonic() > deadline:
                raise ConfigurationError(
                    f"The embedded redis-server (pid {pid}) did not exit within "
                    f"{_STOP_TIMEOUT:g} s of SHUTDOWN.{_log_tail(paths.logfile)}"
                )
            time.sleep(POLL_INTERVAL)
    return True


def _paths(home_dir: Path | None) -> _Paths:
    base = (home_dir if home_dir is not None else home()).expanduser().absolute()
    sock = base / SOCKET_NAME
    if len(os.fsencode(sock)) > _MAX_SOCKET_PATH_BYTES:
        raise ConfigurationError(
            f"The embedded Redis socket path {str(sock)!r} is {len(os.fsencode(sock))} bytes; "
            f"unix sockets allow at most {_MAX_SOCKET_PATH_BYTES}. Set DRUMBEAT_HOME to a "
            "shorter directory (e.g. ~/.drumbeat)."
        )
    return _Paths(
        home=base,
        socket=sock,
        pidfile=base / PID_NAME,
        logfile=base / LOG_NAME,
        lockfile=base / LOCK_NAME,
    )


@contextlib.contextmanager
def _locked(paths: _Paths) -> Iterator[None]:
    if sys.platform == "win32":
        raise ConfigurationError(
            "The embedded Redis needs a POSIX system; on Windows pass a URL to App() or set "
            "DRUMBEAT_REDIS_URL."
        )
    fd = os.open(paths.lockfile, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        # Blocks while another process starts or stops the server; that process's own waits
        # are bounded, and the kernel drops the lock if it dies.
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # also releases the lock


def _start(paths: _Paths, binary: Path) -> None:
    _check_aof_readable(paths, binary)
    # A socket or pidfile left by a killed server would only confuse the new one's start-up
    # and our readiness check; nothing listens on it (checked under the lock).
    paths.socket.unlink(missing_ok=True)
    paths.pidfile.unlink(missing_ok=True)
    args = [
        str(binary),
        "--port", "0",
        "--unixsocket", str(paths.socket),
        "--unixsocketperm", "700",
        "--dir", str(paths.home),
        "--appendonly", "yes",
        "--appendfsync", "everysec",
        "--daemonize", "yes",
        "--pidfile", str(paths.pidfile),
        "--logfile", str(paths.logfile),
        "--maxmemory-policy", "noeviction",
        "--save", "",
    ]  # fmt: skip
    started = time.monotonic()
    try:
        # The foreground process exits once the daemon has forked; the daemon reopens its
        # stdio on /dev/null, so the pipes close and this returns.
        result = subprocess.run(
            args,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            cwd=paths.home,
            timeout=_START_TIMEOUT,
            start_new_session=True,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigurationError(f"Could not run {binary}: {exc}. {FIX_HINT}") from exc
    if result.returncode != 0:
        output = (result.stderr or result.stdout).decode(errors="replace").strip()
        raise ConfigurationError(
            f"{binary} exited with status {result.returncode} instead of starting the embedded "
            f"Redis in {paths.home}.{' Output: ' + output if output else ''}"
            f"{_log_tail(paths.logfile)}"
        )
    _wait_ready(paths, started)


def _wait_ready(paths: _Paths, started: float) -> None:
    deadline = started + _START_TIMEOUT
    while True:
        state = probe(paths.socket)
        if state == "ready":
            return
        now = time.monotonic()
        if state == "loading":
            deadline = max(deadline, min(now + _START_TIMEOUT, started + _LOADING_TIMEOUT))
        elif _daemon_died(paths):
            raise ConfigurationError(
                f"The embedded redis-server in {paths.home} exited during start-up."
                f"{_log_tail(paths.logfile)}"
            )
        elif now > deadline:
            raise ConfigurationError(
                f"The embedded redis-server in {paths.home} did not answer PING within "
                f"{now - started:.1f} s.{_log_tail(paths.logfile)}"
            )
        time.sleep(POLL_INTERVAL)


def _daemon_died(paths: _Paths) -> bool:
    """Whether the started daemon already exited, so waiting longer is pointless."""
    try:
        pid = int(paths.pidfile.read_text().strip())
    except (OSError, ValueError):
        return False  # not written yet
    return not pid_alive(pid)


def _shutdown(paths: _Paths) -> int | None:
    with client(paths.socket) as conn:
        pid: int | None = None
        with contextlib.suppress(RedisError):
            pid = int(conn.info("server")["process_id"])
    # Answered only once the server is done: it fsyncs its AOF first (over a second on a busy
    # disk, seen in CI) or finishes a script, so this waits as long as the exit may take.
    with client(paths.socket, timeout=_STOP_TIMEOUT) as conn:
        try:
            # Plain SHUTDOWN: with AOF on and no save points it fsyncs the AOF and writes no
            # RDB snapshot.
            conn.shutdown()
        except RedisError as exc:
            raise ConfigurationError(
                f"The embedded redis-server in {paths.home} refused SHUTDOWN: {exc}"
                f"{_log_tail(paths.logfile)}"
            ) from exc
    return pid


def _check_aof_readable(paths: _Paths, binary: Path) -> None:
    """Refuse to start Redis < 7 on a directory whose AOF Redis 7 wrote.

    Redis 7 moves the AOF into ``appendonlydir/``; 6.2 does not look there and would start
    empty, hiding every stored job without an error.
    """
    if not (paths.home / _AOF_DIR_7).is_dir():
        return
    version = binary_version(binary)
    if version is not None and version < (7, 0):
        raise ConfigurationError(
            f"{paths.home} holds an AOF written by Redis 7 or later, which {binary} "
            f"(Redis {'.'.join(map(str, version))}) cannot read; starting it would show an "
            "empty queue. Use a redis-server 7 or later (set DRUMBEAT_REDIS_SERVER), or a "
            "different DRUMBEAT_HOME."
        )


def _log_tail(logfile: Path) -> str:
    try:
        lines = logfile.read_text(errors="replace").splitlines()[-_LOG_TAIL_LINES:]
    except OSError:
        return ""
    if not lines:
        return ""
    return f"\nLast lines of {logfile}:\n" + "\n".join(lines)
