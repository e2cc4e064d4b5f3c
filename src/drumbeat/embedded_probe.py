"""Whether the embedded redis-server is up: probes of its unix socket (absent, loading, ready or
unresponsive) and of its process, each bounded by a short timeout so no wait can hang.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Literal

import redis
from redis.backoff import NoBackoff
from redis.exceptions import BusyLoadingError, RedisError
from redis.retry import Retry

__all__ = [
    "POLL_INTERVAL",
    "PROBE_TIMEOUT",
    "State",
    "client",
    "listening",
    "pid_alive",
    "probe",
    "settle",
]

#: How long one probe waits for a connection or an answer.
PROBE_TIMEOUT = 1.0
#: The pause between probes while waiting for the server to come up or go away.
POLL_INTERVAL = 0.05

State = Literal["absent", "loading", "ready", "unresponsive"]


def client(sock: Path, timeout: float = PROBE_TIMEOUT) -> redis.Redis:
    # No retries: a probe wants the first answer, and retry backoff would stretch the
    # timeouts that bound every wait here.
    return redis.Redis(
        unix_socket_path=str(sock),
        socket_timeout=timeout,
        socket_connect_timeout=PROBE_TIMEOUT,
        retry=Retry(NoBackoff(), 0),
    )


def listening(sock: Path) -> bool:
    """Whether a process accepts connections on the socket (a leftover file does not)."""
    sock_probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock_probe.settimeout(PROBE_TIMEOUT)
    try:
        sock_probe.connect(str(sock))
    except (FileNotFoundError, ConnectionRefusedError):
        return False
    except OSError:
        # Present but not answering normally (full backlog, no permission): treating it as
        # absent would start a second server over the same files.
        return True
    finally:
        sock_probe.close()
    return True


def probe(sock: Path) -> State:
    if not listening(sock):
        return "absent"
    with client(sock) as conn:
        try:
            conn.ping()
        except BusyLoadingError:  # a ConnectionError subclass, so it goes first
            return "loading"
        except RedisError:
            return "unresponsive"
    return "ready"


def settle(sock: Path) -> State:
    """Re-probe an unresponsive socket for a moment before concluding anything.

    A server that was just killed, or is just starting, can accept a connection and then drop
    it; within a second or two it answers or the socket goes away.
    """
    deadline = time.monotonic() + 2 * PROBE_TIMEOUT
    state: State = "unresponsive"
    while state == "unresponsive" and time.monotonic() < deadline:
        time.sleep(POLL_INTERVAL)
        state = probe(sock)
    return state


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    # The daemon is re-parented to init; until init reaps it, an exited server lingers as a
    # zombie, which signal 0 still reaches.
    try:
        proc_stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc (macOS), or it vanished: trust the signal
    return proc_stat.rpartition(")")[2].split()[:1] != ["Z"]
