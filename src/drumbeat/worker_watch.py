"""The supervisor's watch over its worker processes: the pipe they write on (`worker.liveness`
has its protocol), which of them beat, serve or ask for a successor, which went silent and are
killed as hung, and how one ended, for the log.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import time

from drumbeat.worker.liveness import (
    PROTOCOL,
    SUPERVISOR_FD,
    SUPERVISOR_HOLDS,
    SUPERVISOR_PROTOCOL,
    SUPERVISOR_READY,
    parse,
)

__all__ = ["WorkerPipe", "exit_reason"]

log = logging.getLogger("drumbeat.supervisor")


class WorkerPipe:
    """The read end of the pipe every worker of one supervisor writes on, and what was heard
    there. The write end is passed down to each worker (`env` names it)."""

    def __init__(self) -> None:
        # Retiring workers write their pid here; each gets a successor before it leaves.
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.read_fd, False)
        #: What a worker's environment adds: where to write, and which messages are read.
        self.env = {SUPERVISOR_FD: str(self.write_fd), SUPERVISOR_PROTOCOL: str(PROTOCOL),
                    SUPERVISOR_READY: "1", SUPERVISOR_HOLDS: "1"}  # fmt: skip
        self._beats: dict[int, float] = {}  # pid -> its last beat (its start before the first)
        self._beaten: set[int] = set()  # pids that beat at least once
        self.ready: set[int] = set()
        """Pids that said they serve."""
        self.hung: set[int] = set()
        """Pids killed as hung, until their death is handled."""
        self._unread = b""  # the start of a line not yet all read from the pipe

    def started(self, pid: int) -> None:
        """Worker ``pid`` just started: its allowance to start counts from now."""
        self._beats[pid] = time.monotonic()

    def read(self) -> list[int]:
        """Reads every line the workers wrote since the last look: notes the beats and who
        serves, and returns the pids of the workers that asked for a successor."""
        data = self._unread
        while True:
            try:
                chunk = os.read(self.read_fd, 65536)
            except BlockingIOError:
                break
            if not chunk:
                break
            data += chunk
        *lines, self._unread = data.split(b"\n")
        now, retiring = time.monotonic(), []
        for line in lines:
            message = parse(line)
            if message is None:
                log.warning("ignoring a line a worker wrote on the pipe: %r", line[:80])
            elif message[0] == "retire":
                retiring.append(message[1])
            elif message[0] == "ready":
                if message[1] in self._beats:
                    self.ready.add(message[1])
            elif message[1] in self._beats:  # not a process that has gone since
                self._beats[message[1]] = now
                self._beaten.add(message[1])
        return retiring

    def kill_hung(
        self,
        live: list[subprocess.Popen[bytes]],
        now: float,
        *,
        hang_timeout: float,
        start_timeout: float,
    ) -> None:
        """Kills every worker of ``live`` silent for ``hang_timeout`` since its last beat, or
        for ``start_timeout`` since its start if it never beat; the supervisor restarts it as
        a death (its jobs come back when their leases lapse). Forgets the workers gone."""
        for proc in live:
            silent = now - self._beats.get(proc.pid, now)
            beaten = proc.pid in self._beaten
            if silent <= (hang_timeout if beaten else start_timeout):
                continue
            since = "its last beat" if beaten else "it started, never beat"
            log.error("worker process pid %d is hung: %.1f s since %s (hang_timeout %g s); "
                      "killing it (SIGKILL) and starting another", proc.pid, silent, since,
                      hang_timeout)  # fmt: skip
            proc.kill()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                log.error("worker process pid %d outlived SIGKILL for 5 s", proc.pid)
            self.hung.add(proc.pid)
        pids = {p.pid for p in live}
        for gone in self._beats.keys() - pids:
            del self._beats[gone]
        self._beaten &= pids
        self.ready &= pids

    def close(self) -> None:
        """Closes both ends (the workers keep their own copies of the write end)."""
        os.close(self.read_fd)
        os.close(self.write_fd)


def exit_reason(code: int | None) -> str:
    """How a process ended, for a log line: "exited with 1", "was killed by SIGKILL"."""
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
    return f"exited with {code}"
