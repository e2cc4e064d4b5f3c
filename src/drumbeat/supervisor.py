"""Several worker processes under one supervisor: start them, restart any that dies (with
backoff, and a crash loop stops the supervisor instead of spinning), replace any that hangs
(stops beating), and stop them on signals.

Each worker is a fresh interpreter (``python -m drumbeat worker APP``), not a fork: it imports
the app itself, so no user state, Redis client, thread or embedded-Redis handle of the
supervisor is ever shared with a worker, and a restarted worker runs the code on disk now.
The supervisor only starts, watches and signals processes; sizing the pool from Redis is the
`Scaler`'s business (`autoscale.Autoscaler`, which looks from a thread of its own), asked every
loop for a count between MIN and MAX. A scale-down retires a worker with SIGUSR1: it claims no
more, finishes its jobs and exits, which is not a crash.

What the workers say on their pipe, and which of them hang, is `worker_watch.WorkerPipe`'s to
hear; the rolling restart a SIGHUP asks for is `rolling_restart.RollingRestart`'s to drive.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Protocol

from drumbeat.rolling_restart import RollingRestart
from drumbeat.worker_watch import WorkerPipe, exit_reason

log = logging.getLogger("drumbeat.supervisor")

#: A worker that dies within this many seconds of its start counts towards a crash loop.
QUICK_DEATH = 10.0
#: This many quick deaths in a row stop the supervisor (exit 1) instead of restarting again.
CRASH_LOOP = 5
_POLL = 0.1


class Scaler(Protocol):
    """Sizes the pool (`autoscale.Autoscaler`)."""

    def decide(self, live: int, desired: int, retiring: int) -> int:
        """The processes wanted now, given those live, wanted so far and retiring; called
        every loop, so it must not block."""
        ...

    def close(self) -> None:
        """The supervisor stops."""
        ...


@dataclass
class _Handover:
    """A recycling worker's hand-over, until it is told to retire: its successors that die
    before they serve are restarted with backoff (as a slot's worker is), and a crash loop of
    them ends the recycle, the worker serving on."""

    started: float  # when the successor running now started
    restart_at: float | None = None  # when the next successor starts, after one died
    pause: float = 0.5
    quick_deaths: int = 0


@dataclass
class _Slot:
    """One of the N processes the supervisor keeps running."""

    index: int
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    restart_at: float = 0.0
    pause: float = 0.5
    quick_deaths: deque[float] = field(default_factory=deque)


class Supervisor:
    """Keeps ``processes`` workers of one app running until a signal stops them.

    Args:
        argv: the worker command, without the interpreter (``["-m", "drumbeat", "worker",
            APP, ...]``), run once per process.
        processes: how many to keep running (at first, and at least).
        shutdown_grace: how long a graceful stop waits for the workers (they finish or hand
            back their jobs within their own grace); past it they are killed.
        hang_timeout: a worker that has not beaten for this long is hung: it is killed and
            replaced. Before its first beat, it has this long from its start, at least
            `QUICK_DEATH`.
        maximum: the most processes ``scaler`` may ask for (default: ``processes``).
        scaler: asked every loop how many processes to run.
        ready_wait: `Settings.ready_wait`. An old worker (recycling, or in a rolling restart)
            is stopped once its successor serves (it said "ready": registered, claiming),
            however long its start-up takes; a successor still silent after this long (slow,
            or older code, which never says it) takes the old one's place all the same.
    """

    def __init__(
        self,
        argv: Sequence[str],
        processes: int,
        shutdown_grace: float,
        hang_timeout: float = 30.0,
        *,
        maximum: int | None = None,
        scaler: Scaler | None = None,
        ready_wait: float = 60.0,
    ) -> None:
        if processes < 1:
            raise ValueError(f"processes must be >= 1, got {processes}")
        self.minimum = processes
        self.maximum = processes if maximum is None else maximum
        if self.maximum < self.minimum:
            raise ValueError(f"expected MIN <= MAX processes, got {processes}:{maximum}")
        self.scaler = scaler
        self.retired: list[subprocess.Popen[bytes]] = []
        """Workers told to leave (scaled down, a spare no longer wanted): finishing their jobs."""
        self.argv = [sys.executable, *argv]
        self.slots = [_Slot(i) for i in range(processes)]
        self.shutdown_grace = shutdown_grace
        self._signals: list[int] = []
        self.pipe = WorkerPipe()
        """What the workers say: beats, who serves, who asks for a successor."""
        # A retiring worker's pid -> its successor, started before it leaves. Keyed by the pid:
        # only its own exit hands the successor on; another worker that exits 0 meanwhile (a
        # task called sys.exit(0), a worker that stopped on its own) is a death, restarted as
        # one, and must not take a successor meant for another slot.
        self._spares: dict[int, subprocess.Popen[bytes]] = {}
        # A recycling worker claims on until its successor serves; then it is told to retire
        # (SIGUSR1). Its pid -> its hand-over, until it is told (or its recycle is given up).
        self._handing_over: dict[int, _Handover] = {}
        # A spare or a rolling restart's new worker that spent its budget before it took its
        # slot: its successor starts once it has.
        self._deferred: set[int] = set()
        self._env = {**os.environ, **self.pipe.env}
        self.hang_timeout = hang_timeout
        self.ready_wait = ready_wait
        self.restart = RollingRestart(self)
        """The rolling restart a SIGHUP asks for."""

    def run(self) -> int:
        """Runs until SIGTERM/SIGINT (returns 0 once every worker stopped) or a crash loop
        (returns 1). A second signal passes on at once: the workers stop immediately."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        signal.signal(signal.SIGHUP, self._on_hup)
        log.info("supervising %d worker processes: %s", len(self.slots), " ".join(self.argv))
        try:
            while not self._signals:
                if not self._tend():
                    self._close_scaler()
                    self._stop()
                    return 1
                self.restart.step()
                self._autoscale()
                time.sleep(_POLL)
            self._close_scaler()
            self._stop()
            return 0
        finally:
            self._close_scaler()
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                signal.signal(sig, signal.SIG_DFL)
            self.pipe.close()

    def _close_scaler(self) -> None:
        """Ends the scaler's looks before the workers stop: a stopping pool takes no more
        scaling decisions (nor logs any), and leaves the other supervisors' shares at once."""
        if self.scaler is not None:
            scaler, self.scaler = self.scaler, None
            scaler.close()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals.append(signum)  # only a flag: the loop acts on it

    def _on_hup(self, signum: int, frame: FrameType | None) -> None:
        self.restart.ask()  # a rolling restart (a deploy): the loop acts on it

    @property
    def pids(self) -> list[int]:
        """The live workers' process ids."""
        return [s.proc.pid for s in self.slots if s.proc is not None and s.proc.poll() is None]

    @property
    def desired(self) -> int:
        """The processes the supervisor keeps running now (MIN..MAX)."""
        return len(self.slots)

    def _autoscale(self) -> None:
        """Forgets retired workers that left; asks the scaler for a count and scales to it."""
        for proc in self.retired:
            if proc.poll() is not None:
                log.info("retired worker pid %d exited (%s)", proc.pid, proc.returncode)
        self.retired = [p for p in self.retired if p.poll() is None]
        if self.scaler is None or self._signals:  # a stop began: no more decisions
            return
        self.scale_to(self.scaler.decide(len(self.pids), self.desired, len(self.retired)))

    def scale_to(self, n: int) -> None:
        """Grows the pool to ``n`` processes (they start at the next look) or shrinks it,
        retiring the newest: SIGUSR1, after which a worker claims no more, finishes its jobs
        and exits. Clamped to MIN..MAX; deferred while a rolling restart replaces slots."""
        n = max(self.minimum, min(self.maximum, n))
        if n == len(self.slots) or self.restart.under_way or self._signals:
            return
        log.info("scaling from %d to %d worker processes", len(self.slots), n)
        while len(self.slots) < n:
            self.slots.append(_Slot(max((s.index for s in self.slots), default=-1) + 1))
        while len(self.slots) > n:
            # A slot waiting to restart goes first: nothing runs there to retire.
            idle = [s for s in self.slots if s.proc is None or s.proc.poll() is not None]
            slot = idle[-1] if idle else self.slots[-1]
            self.slots.remove(slot)
            if slot.proc is not None:
                self.drop_spare(slot.proc.pid)  # it was recycling: nothing takes its place
            if slot.proc is not None and slot.proc.poll() is None:
                slot.proc.send_signal(signal.SIGUSR1)
                self.retired.append(slot.proc)

    def _tend(self) -> bool:
        """Starts the workers that are due to (re)start; False on a crash loop."""
        now = time.monotonic()
        self._start_successors(now)
        self._hand_over(now)
        # Importing the app may be slow on a busy machine, whatever hang_timeout the jobs call
        # for: a start-up has at least QUICK_DEATH.
        start_timeout = max(self.hang_timeout, QUICK_DEATH)
        self.pipe.kill_hung(
            self._live(), now, hang_timeout=self.hang_timeout, start_timeout=start_timeout
        )
        for slot in self.slots:
            proc = slot.proc
            if proc is not None and proc.poll() is None:
                if now - slot.started > QUICK_DEATH:
                    slot.pause = 0.5  # it lived: the next death restarts it soon again
                    slot.quick_deaths.clear()
                continue
            spare = None if proc is None else self._spares.pop(proc.pid, None)
            if proc is not None and spare is not None:
                # It retired (recycled); its successor is already running. (Had it died while
                # finishing its jobs, the successor takes its place all the same.)
                self.pipe.hung.discard(proc.pid)
                log.log(logging.INFO if proc.returncode == 0 else logging.WARNING,
                        "worker process %d (pid %d) retired (exit %s); pid %d takes its place",
                        slot.index, proc.pid, proc.returncode, spare.pid)  # fmt: skip
                slot.proc, slot.started = spare, now
                continue
            if proc is not None:  # it died
                slot.proc = None
                lived = now - slot.started
                log.warning("worker process %d (pid %d) exited with %s after %.1f s; "
                            "restarting in %.1f s", slot.index, proc.pid, proc.returncode,
                            lived, slot.pause)  # fmt: skip
                # A hang is not a crash loop: it is rarely the start-up (which has a whole
                # hang_timeout), mostly a job, which its stalls dead-letter in the end; one bad
                # job must not stop the pool. Nor does it spin: one restart per hang_timeout.
                hung = proc.pid in self.pipe.hung
                self.pipe.hung.discard(proc.pid)
                if lived < QUICK_DEATH and proc.returncode != 0 and not hung:
                    slot.quick_deaths.append(now)
                    if len(slot.quick_deaths) >= CRASH_LOOP:
                        log.error("worker process %d died %d times within %.0f s of starting; "
                                  "stopping (see its log above)", slot.index,
                                  len(slot.quick_deaths), QUICK_DEATH)  # fmt: skip
                        return False
                slot.restart_at = now + slot.pause
                slot.pause = min(slot.pause * 2, 30.0)
            if now >= slot.restart_at:
                slot.proc = self.spawn()
                slot.started = now
        return True

    def _start_successors(self, now: float) -> None:
        """Starts a successor for each slot's worker that asked for one (it retires once the
        successor serves, `_hand_over`)."""
        asked = self.pipe.read()
        self._deferred &= {p.pid for p in self._live()}
        asked += [pid for pid in self._deferred if self._slot_of(pid) is not None]
        for pid in asked:  # successors start before the retiring leave
            if pid in self._spares or pid in self._handing_over:
                continue  # said twice: one successor
            if self._slot_of(pid) is not None:
                self._deferred.discard(pid)
                self._spares[pid] = self.spawn()
                self._handing_over[pid] = _Handover(now)
            elif any(p.pid == pid for p in (*self._spares.values(), self.restart.successor) if p):
                self._deferred.add(pid)  # not in its slot yet: it gets a successor once it is
            else:
                # Not a slot's worker (one scaled down or leaving a rolling restart): it was
                # leaving anyway, and nothing takes its place.
                log.info("worker pid %d retires outside the pool; no successor", pid)

    def _stop(self) -> None:
        """Passes the stop on to every worker and waits for them; a second signal meanwhile
        passes on too (the workers then stop at once); past the grace they are killed."""
        passed = 0
        deadline = time.monotonic() + self.shutdown_grace + 10
        while True:
            while passed < max(1, len(self._signals)):
                for proc in self._live():
                    proc.send_signal(signal.SIGTERM)
                passed += 1
            live = self._live()
            if not live:
                break
            if time.monotonic() > deadline:
                log.error("killing %d worker processes that outlived the grace", len(live))
                for proc in live:
                    proc.kill()
                    proc.wait()
                break
            time.sleep(_POLL)
        codes = [s.proc.returncode for s in self.slots if s.proc is not None]
        log.info("all worker processes stopped (exit codes %s)", codes)

    def _hand_over(self, now: float) -> None:
        """Tells each recycling worker to retire (SIGUSR1) once its successor serves, or has
        had `ready_wait` to (an older worker never says it serves). A successor that dies before
        it serves is restarted with backoff while the worker claims on; a crash loop of them
        ends the recycle, and the worker serves on past its budget."""
        for pid, over in list(self._handing_over.items()):
            slot = self._slot_of(pid)
            if slot is None or slot.proc is None or slot.proc.poll() is not None:
                del self._handing_over[pid]  # gone already (or its successor was dropped)
                continue
            spare = self._spares.get(pid)
            if spare is None:
                if over.restart_at is not None and now >= over.restart_at:
                    self._spares[pid] = self.spawn()
                    over.started, over.restart_at = now, None
                continue
            if spare.poll() is not None and spare.pid not in self.pipe.ready:
                self._successor_died(slot, pid, spare, over, now)
                continue
            if spare.pid in self.pipe.ready or now - over.started >= self.ready_wait:
                if spare.pid not in self.pipe.ready:
                    log.warning("the successor pid %d of worker process %d (pid %d) has not "
                                "said it serves after %.0f s (ready_wait, DRUMBEAT_READY_WAIT); "
                                "pid %d retires all the same", spare.pid, slot.index, pid,
                                now - over.started, pid)  # fmt: skip
                del self._handing_over[pid]
                with contextlib.suppress(ProcessLookupError):
                    slot.proc.send_signal(signal.SIGUSR1)

    def _successor_died(
        self, slot: _Slot, pid: int, spare: subprocess.Popen[bytes], over: _Handover, now: float
    ) -> None:
        """The successor of recycling worker ``pid`` died before it served: the worker claims
        on, and another successor starts after a pause; a crash loop of them (`CRASH_LOOP`
        quick deaths in a row) ends the recycle instead. The supervisor does not stop there: it
        has lost no capacity (it stops on a crash loop only when a slot has no worker left)."""
        del self._spares[pid]
        lived = now - over.started
        hung = spare.pid in self.pipe.hung
        self.pipe.hung.discard(spare.pid)
        if lived >= QUICK_DEATH:
            over.pause, over.quick_deaths = 0.5, 0  # it lived: not a crash loop
        elif spare.returncode != 0 and not hung:
            over.quick_deaths += 1
        if over.quick_deaths >= CRASH_LOOP:
            del self._handing_over[pid]
            log.error("recycling given up: the successors of worker process %d (pid %d) died "
                      "%d times within %.0f s of starting, the last %s (see its log above); "
                      "pid %d serves on past its budget, until it exits or a SIGHUP replaces "
                      "it", slot.index, pid, over.quick_deaths, QUICK_DEATH,
                      exit_reason(spare.returncode), pid)  # fmt: skip
            return
        log.error("the successor pid %d of worker process %d (pid %d) %s after %.1f s, before "
                  "it served (see its log above); pid %d claims on, another successor starts "
                  "in %.1f s", spare.pid, slot.index, pid, exit_reason(spare.returncode),
                  lived, pid, over.pause)  # fmt: skip
        over.restart_at = now + over.pause
        over.pause = min(over.pause * 2, 30.0)

    def drop_spare(self, pid: int) -> None:
        """Stops the successor started for worker ``pid`` when its slot goes (a scale-down, a
        rolling restart) before ``pid`` left: it has no jobs yet, so a graceful stop."""
        self._handing_over.pop(pid, None)
        spare = self._spares.pop(pid, None)
        if spare is not None and spare.poll() is None:
            spare.send_signal(signal.SIGTERM)
            self.retired.append(spare)

    def _slot_of(self, pid: int) -> _Slot | None:
        """The slot whose worker is ``pid``."""
        return next((s for s in self.slots if s.proc is not None and s.proc.pid == pid), None)

    def spawn(self) -> subprocess.Popen[bytes]:
        """Starts one worker process, handing it the write end of the pipe."""
        proc = subprocess.Popen(self.argv, env=self._env, pass_fds=(self.pipe.write_fd,))
        self.pipe.started(proc.pid)
        return proc

    def _live(self) -> list[subprocess.Popen[bytes]]:
        procs = [s.proc for s in self.slots if s.proc is not None] + [*self._spares.values()]
        procs += [p for p in (self.restart.successor, self.restart.leaving) if p is not None]
        procs += self.retired
        return [p for p in procs if p.poll() is None]
