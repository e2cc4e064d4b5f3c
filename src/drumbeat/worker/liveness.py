"""Liveness: the worker's event loop ticks, and a supervisor hears a beat, only while the worker
can still make progress; a hung worker falls silent, and its supervisor replaces it.

Also the line protocol on the pipe a supervisor passes down (`SUPERVISOR_FD`): one line per
message, ``"beat <pid>"`` (I am alive), ``"ready <pid>"`` (I am registered and claim from now
on) or ``"retire <pid>"`` (start my successor; I finish my jobs and exit). Each line is far
below PIPE_BUF, so concurrent writes of several workers never interleave.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable

log = logging.getLogger("drumbeat.worker")

#: Set by the supervisor for its workers: the file descriptor of the pipe on which they write
#: beats and ask for successors. (A pipe, not signals: signals coalesce, so two workers retiring
#: at once would get one successor; short writes to a pipe are atomic.)
SUPERVISOR_FD = "DRUMBEAT_SUPERVISOR_FD"
#: Set by the supervisor: the pipe protocol it reads. 1 (or unset) knew only ``"<pid>"``, a
#: retirement; 2 adds beats. A worker restarted on new code by SIGHUP may run under an older
#: supervisor, which would take every beat for a retirement: it beats only when asked for 2.
SUPERVISOR_PROTOCOL = "DRUMBEAT_SUPERVISOR_PROTOCOL"
PROTOCOL = 2
#: Set by a supervisor that reads ``"ready <pid>"`` (a rolling restart stops an old worker once
#: its successor said it). Apart from `SUPERVISOR_PROTOCOL`: a worker of older code checks that
#: for equality, and would stop beating under a supervisor that announced a higher protocol.
SUPERVISOR_READY = "DRUMBEAT_SUPERVISOR_READY"
#: Set by a supervisor that always tells a recycling worker when to retire (SIGUSR1), and keeps
#: it serving while its successors fail to start (`recycling`): such a worker waits for the word
#: without a deadline. An older supervisor sent it after its ready wait (60 s) at the latest,
#: dead successor or not; under one, the worker retires on its own after
#: `Settings.handover_wait`.
SUPERVISOR_HOLDS = "DRUMBEAT_SUPERVISOR_HOLDS"

#: The longest between two ticks of a healthy loop (shorter when `Settings.hang_timeout` is
#: small: a fifth of it).
TICK = 1.0


def tell_supervisor(kind: str) -> bool:
    """Writes one line (``kind`` and this pid) on the supervisor's pipe; False if this worker
    has no supervisor, or the write failed (then it says why in the log)."""
    fd = os.environ.get(SUPERVISOR_FD, "")
    if not fd.isdigit():
        return False
    v2 = os.environ.get(SUPERVISOR_PROTOCOL, "1").strip() == str(PROTOCOL)
    if not v2 and kind != "retire":
        return False
    if kind == "ready" and not os.environ.get(SUPERVISOR_READY):
        return False  # an older supervisor would log each such line as one it cannot read
    line = f"{kind} {os.getpid()}\n" if v2 else f"{os.getpid()}\n"
    try:
        # Never block the loop on a full pipe (a supervisor that stopped reading): the write
        # end's flag is shared with the supervisor, which does not write on it.
        os.set_blocking(int(fd), False)
        os.write(int(fd), line.encode())
    except BlockingIOError:
        return False  # the pipe is full: the supervisor is not reading now (stopped?)
    except OSError as exc:  # EPIPE: the supervisor is gone; EBADF: the fd was not passed down
        log.warning("could not write %r to the supervisor's pipe (fd %s): %s; no longer "
                    "writing to it", kind, fd, exc)  # fmt: skip
        os.environ.pop(SUPERVISOR_FD, None)  # one warning, not one a second
        return False
    return True


def parse(line: bytes) -> tuple[str, int] | None:
    """One line from a worker as (kind, pid); None if it is not one."""
    words = line.split()
    if len(words) == 1 and words[0].isdigit():  # protocol 1: a retirement
        return "retire", int(words[0])
    if len(words) == 2 and words[0] in (b"beat", b"ready", b"retire") and words[1].isdigit():
        return words[0].decode(), int(words[1])
    return None


class Liveness:
    """Ticks on the worker's event loop every `interval`; each tick beats to the supervisor
    unless the worker is wedged.

    Two signs of a hung worker, one per way a task can take the worker down:

    - its **event loop is blocked** (a task calling ``time.sleep`` or CPU-bound code inside
      ``async def``, a deadlock on the loop's thread): no tick, so no beat, and the heartbeat
      thread stops renewing leases once the loop has been silent `Settings.hang_timeout`
      (`silent_for`);
    - it is **wedged** (``wedged()`` returns why): every thread of the sync task pool still runs
      a call the runner gave up on (timed out, or cancelled) — threads cannot be stopped, so
      no sync job can start until one returns. The loop still ticks (its async work and its
      leases go on), but it does not beat.

    Args:
        interval: seconds between ticks.
        wedged: why the worker cannot start anything any more, or None.
    """

    def __init__(self, interval: float, wedged: Callable[[], str | None]) -> None:
        self.interval = interval
        self._wedged = wedged
        self.ticked = time.monotonic()
        """When the loop last ran a tick (read by the heartbeat thread)."""
        self._was_wedged: str | None = None
        self._thread_id = threading.get_ident()

    def silent_for(self) -> float:
        """Seconds since the loop last ticked."""
        return time.monotonic() - self.ticked

    def where(self) -> str:
        """Where the loop's thread is now (for a log line about a blocked loop)."""
        frame = sys._current_frames().get(self._thread_id)
        return "".join(traceback.format_stack(frame, limit=6)) if frame is not None else "?"

    def tick(self) -> None:
        self.ticked = time.monotonic()
        why = self._wedged()
        if why != self._was_wedged:
            if why is not None:
                log.error("this worker is wedged: %s; it stops beating, so a supervisor "
                          "replaces it", why)  # fmt: skip
            else:
                log.warning("this worker is no longer wedged: a stuck task thread returned")
            self._was_wedged = why
        if why is None:
            tell_supervisor("beat")

    async def run(self) -> None:
        """Ticks until cancelled (at the very end of the worker's run: a worker finishing its
        jobs after a stop is not hung)."""
        self._thread_id = threading.get_ident()
        while True:
            try:
                self.tick()
            except Exception:
                # Ticking on matters more: were this task to end, the heartbeat would drop the
                # leases and a supervisor kill the worker, with this error unseen until the end.
                log.exception("a liveness tick failed; ticking on")
            await asyncio.sleep(self.interval)


class CpuMeter:
    """The share of one core this process used between two readings: how an autoscaler tells
    a saturated process (its one event loop and its GIL cannot start more, although slots are
    free and nothing waits in Redis yet) from an idle one."""

    def __init__(self) -> None:
        self._last: tuple[float, float] | None = None

    def read(self) -> float | None:
        """CPU seconds per second since the last reading (threads included, so above 1.0 when
        tasks run C code that releases the GIL); None at the first reading, which only starts
        the count: before it the process was starting (connecting, running its start-up hooks),
        and that busy second would read as a saturated worker and grow every pool it joins."""
        now = (time.monotonic(), time.process_time())
        last, self._last = self._last, now
        if last is None or now[0] <= last[0]:
            return None
        return (now[1] - last[1]) / (now[0] - last[0])
