"""The supervisor's rolling restart (SIGHUP, a deploy): for each slot in turn, a new worker (new
code) starts; once it serves (or has had `Settings.ready_wait` to) the old one is stopped
gracefully, and once that has left, the next slot. Capacity never drops below N, however long the
new code takes to start; new code that cannot start ends the restart with the old workers serving.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import time
from typing import TYPE_CHECKING

from drumbeat.worker_watch import exit_reason

if TYPE_CHECKING:
    from drumbeat.supervisor import Supervisor

__all__ = ["RollingRestart"]

log = logging.getLogger("drumbeat.supervisor")


class RollingRestart:
    """The rolling restarts of one supervisor's slots, asked for by `ask` (its SIGHUP handler)
    and driven a step at a time by `step` (its loop)."""

    def __init__(self, supervisor: Supervisor) -> None:
        self._sup = supervisor
        self._reloads = 0  # SIGHUPs not yet started on
        self.roll: list[int] = []
        """The slots still to replace in the restart under way."""
        self.successor: subprocess.Popen[bytes] | None = None
        """The new worker of the slot being replaced, until it takes its place."""
        self._successor_started = 0.0
        self.leaving: subprocess.Popen[bytes] | None = None
        """The old worker replaced last, until it has left (the next slot waits for it)."""
        # The roll's last new worker that took its place after ready_wait without saying it
        # serves (older code, or a start slower than that), until it says so.
        self._unproven: subprocess.Popen[bytes] | None = None

    def ask(self) -> None:
        """A SIGHUP arrived: only counted, so a signal handler may call it; `step` acts."""
        self._reloads += 1

    @property
    def under_way(self) -> bool:
        """Whether slots are being replaced (the pool is not rescaled meanwhile)."""
        return bool(self.roll) or self.successor is not None

    def step(self) -> None:
        """One step of a rolling restart. A new worker that dies while starting ends the
        restart and leaves the old workers serving."""
        sup = self._sup
        if self._reloads and not self.roll and self.successor is None:
            self._reloads = 0
            self.roll = list(range(len(sup.slots)))
            self._unproven = None  # of an earlier roll: its fate is not this one's business
            log.info("SIGHUP: restarting %d worker processes one at a time", len(self.roll))
        if self.roll and self._unproven_died():
            return
        if self.leaving is not None:
            if self.leaving.poll() is None:
                return
            self.leaving = None
        if not self.roll:
            return
        slot = sup.slots[self.roll[0]]
        if self.successor is None:
            self.successor, self._successor_started = sup.spawn(), time.monotonic()
            return
        if self.successor.poll() is not None:
            # New code that cannot start (an import error, a failing on_startup hook): each
            # next slot would fail alike, so the roll ends here and no old worker is stopped.
            log.error("rolling restart stopped: the new worker process pid %d (replacing "
                      "worker process %d, pid %s) %s after %.1f s, before it served (see its "
                      "log above); the %d remaining old workers keep serving: fix the code "
                      "and send SIGHUP again", self.successor.pid, slot.index,
                      "-" if slot.proc is None else slot.proc.pid,
                      exit_reason(self.successor.returncode),
                      time.monotonic() - self._successor_started,
                      len(self.roll))  # fmt: skip
            self.successor, self.roll = None, []
            return
        if self.successor.pid not in sup.pipe.ready:
            waited = time.monotonic() - self._successor_started
            if waited < sup.ready_wait:
                return
            log.warning("the new worker pid %d has not said it serves after %.0f s "
                        "(ready_wait, DRUMBEAT_READY_WAIT); it takes the place of the old one "
                        "all the same", self.successor.pid, waited)  # fmt: skip
            self._unproven = self.successor
        old, slot.proc = slot.proc, self.successor
        slot.started, slot.pause = self._successor_started, 0.5
        self.successor = None
        self.roll.pop(0)
        if old is not None:
            sup.drop_spare(old.pid)  # the new worker takes its place: a successor is spare
        if old is not None and old.poll() is None:
            old.send_signal(signal.SIGTERM)  # it finishes or hands back its jobs, then exits
            self.leaving = old

    def _unproven_died(self) -> bool:
        """True if the roll's new worker that took its place unproven (`ready_wait`) died
        before it served: new code whose start fails slowly. The roll stops (a new worker
        still warming up is stopped too), so the other old workers serve on."""
        proc = self._unproven
        if proc is None or proc.pid in self._sup.pipe.ready:
            self._unproven = None
            return False
        if proc.poll() is None:
            return False
        log.error("rolling restart stopped: the new worker process pid %d %s before it "
                  "served, after it had taken an old worker's place (it was silent for "
                  "ready_wait, %g s; see its log above); the %d remaining old workers keep "
                  "serving: fix the code and send SIGHUP again", proc.pid,
                  exit_reason(proc.returncode), self._sup.ready_wait, len(self.roll))  # fmt: skip
        if self.successor is not None and self.successor.poll() is None:
            self.successor.send_signal(signal.SIGTERM)
            self._sup.retired.append(self.successor)
        self.successor, self.roll, self._unproven = None, [], None
        return True
