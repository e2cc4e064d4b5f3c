"""Autoscaling: a supervisor sizes its pool of worker processes between MIN and MAX from what
waits in Redis, and registers itself there so that several supervisors share the work.

Every `Settings.scale_interval` the `Autoscaler` (from a thread of the supervisor's) does one
round trip (a pipeline): it writes its supervisor's registration (`beat_supervisor.lua`) and
reads the `Signal` (`scale_signal.lua` on every shard workers claim from; see scale_signal.py).
`plan` (pure) turns a signal into the processes this supervisor should run; `Policy` applies
that with hysteresis.

The rule (docs/deploy.md, "How `--autoscale MIN:MAX` decides", says the same for users):

- slots needed, over the namespace = jobs running (leases held) + the backlog the slots cannot
  start within one scale interval: ``ready + due-but-unpromoted - completions/s * interval``
  (paused queues' jobs left out: no worker takes them);
- processes needed, over every supervisor = ``ceil((slots needed - slots of workers no
  supervisor runs) / concurrency)``; under pressure (the oldest unpromoted due entry waited
  longer than one interval and is waiting longer than at the last look, or the lateness p99 of
  the last 20 s exceeds one interval: at most once per 20 s) at least 1.5 times the processes
  the supervisors run now;
- and, since a process is one event loop under one GIL, at least enough processes for the CPU
  the live workers use: ``ceil(sum of each worker's share of a core, capped at 1 /
  CPU_TARGET)`` less the workers no supervisor runs. A process that runs many short I/O-bound
  runs (the monitoring workload) saturates its core with free slots and an empty backlog; only
  its CPU shows it;
- this supervisor's share = ``ceil(processes needed * its MAX / sum of the MAXes of the live
  supervisors)``, within its MIN..MAX. Each supervisor takes a share of one shared figure, so
  two of them seeing the same backlog do not both jump to MAX;
- but never below the smallest pool that would not ask to grow again at once: the completions
  per second, scaled to that pool's share of the processes, must still start the backlog
  (hysteresis: a retired worker's completions leave the rate with it);
- up at once to the share; down one process at a time, once the share stayed below the pool
  for `Settings.scale_down_after` seconds without a break (the timer starts again after each).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis

from .protocol import LATENESS_WINDOW_MS
from .scale_signal import (
    RECENT_WINDOWS,
    Signal,
    SupervisorInfo,
    parse_signal,
    read_signal,
    run_calls,
    signal_calls,
)
from .scripts import Call

if TYPE_CHECKING:
    from .app import App

__all__ = [
    "Autoscaler",
    "CompletionRate",
    "Plan",
    "Policy",
    "Signal",
    "SupervisorInfo",
    "plan",
    "read_signal",
    "supervisor_ttl_ms",
]

log = logging.getLogger("drumbeat.autoscale")

#: Under pressure the supervisors together grow by at least this factor.
PRESSURE_GROWTH = 1.5
#: The share of a core a worker process should use at most: a process busier than this starts
#: its runs late (its loop is behind), so the pool grows until the CPU its workers use fits in
#: this share of each. Lower wastes processes; higher waits for lateness before growing.
CPU_TARGET = 0.7


def supervisor_ttl_ms(scale_interval: float) -> int:
    """How long a supervisor's registration lives without a beat (it beats every interval)."""
    return int(3 * scale_interval * 1000) + 5000


# -- the decision ------------------------------------------------------------------------------


class CompletionRate:
    """Jobs finished per second, from the ``processed`` count each live worker's heartbeat
    reports (every lease/3), over a window of several beats: workers present at both ends."""

    def __init__(self, window_ms: int) -> None:
        self.window_ms = window_ms
        self.samples: deque[tuple[int, dict[str, int]]] = deque()

    def add(self, now_ms: int, processed: Mapping[str, int]) -> float | None:
        """Adds a sample; returns the rate over the window, or None before two samples."""
        self.samples.append((now_ms, dict(processed)))
        while len(self.samples) > 2 and now_ms - self.samples[1][0] >= self.window_ms:
            self.samples.popleft()
        then, before = self.samples[0]
        if now_ms <= then:
            return None
        done = sum(max(0, n - before[w]) for w, n in processed.items() if w in before)
        return done * 1000 / (now_ms - then)


@dataclass(frozen=True, slots=True)
class Plan:
    """What a signal asks of one supervisor."""

    mine: int
    """Processes this supervisor should run, within its MIN..MAX."""
    processes: int
    """Processes needed over every supervisor."""
    slots: int
    """Slots needed over the namespace (running + what cannot start within an interval)."""
    share: str
    """``its MAX/sum of MAXes``."""


def plan(
    signal: Signal,
    *,
    me: str,
    minimum: int,
    maximum: int,
    live: int,
    slots: int,
    concurrency: int,
    rate: float | None,
    interval: float,
    pressure: bool = False,
) -> Plan:
    """The processes supervisor ``me`` (running ``live`` processes with ``slots`` slots in all)
    should run for ``signal`` (the rule is in the module docstring)."""
    others = [s for s in signal.supervisors if s.id != me]
    sum_max = maximum + sum(s.maximum for s in others)
    supervised_slots = slots + sum(s.slots for s in others)
    supervised_live = live + sum(s.live for s in others)
    unsupervised = max(0, signal.slots - supervised_slots)
    unsupervised_workers = max(0, signal.workers - supervised_live)

    def need(rate: float | None) -> tuple[int, int, int]:
        """(slots needed, processes needed in all, processes here) at completion ``rate``."""
        startable = (rate or 0.0) * interval
        needed_slots = signal.running + max(0, math.ceil(signal.backlog - startable))
        processes = math.ceil(max(0, needed_slots - unsupervised) / concurrency)
        processes = max(processes, math.ceil(signal.cpu / CPU_TARGET) - unsupervised_workers)
        if pressure:
            processes = max(processes, math.ceil(max(1, supervised_live) * PRESSURE_GROWTH))
        mine = math.ceil(processes * maximum / sum_max)
        return needed_slots, processes, max(minimum, min(maximum, mine))

    needed_slots, processes, mine = need(rate)
    # Hysteresis: shrink only to a pool that would not at once ask to grow again. The jobs
    # completed per second come from the processes; a pool of fewer completes fewer (once a
    # retired worker left, its completions drop out of `CompletionRate` at once), so a backlog
    # the pool of now starts within an interval may not be started by the smaller pool: it
    # would scale back up a look later (4 -> 3 -> 4). The smallest pool that stays below the
    # up-rule at its own rate is what this supervisor asks for.
    if rate and mine < live and supervised_live > 0:
        for n in range(mine, live):
            at = rate * (supervised_live - (live - n)) / supervised_live
            if need(at)[2] <= n:
                break
        else:
            n = live
        mine = n
    return Plan(mine, processes, needed_slots, f"{maximum}/{sum_max}")


def describe(signal: Signal, p: Plan, rate: float | None, pressure: str | None) -> str:
    """The inputs and outcome of a decision in one line, for logs and `drumbeat status`."""
    levels = [f"p{i} {n}" for i, n in reversed(list(enumerate(signal.ready_by_priority))) if n]
    ready = f"{signal.ready} ready" + (f" ({', '.join(levels[:3])})" if levels else "")
    due = f", {signal.due_now} due unclaimed (lag {signal.lag_ms} ms)" if signal.due_now else ""
    held = f", {signal.paused} in paused queues" if signal.paused else ""
    done = "?" if rate is None else f"{rate:.0f}"
    why = f"; {pressure}" if pressure else ""
    over = signal.running - signal.busy
    extra = f" (+{over} leases past them: lent slots or gone workers)" if over else ""
    return (
        f"{ready}{due}{held}, {signal.busy} of {signal.slots} slots busy{extra}, "
        f"{done} jobs/s done, "
        f"cpu {signal.cpu:.2f} of {signal.workers} workers{why}"
        f" → {p.processes} processes in all, {p.mine} here (share {p.share})"
    )


@dataclass
class Policy:
    """Hysteresis over `plan`: up at once, down one process per ``scale_down_after`` seconds of
    a plan continuously below the pool. Times are monotonic seconds, passed in."""

    minimum: int
    maximum: int
    scale_down_after: float
    desired: int = 0
    reason: str = ""
    changed: bool = False
    """The last `step` changed `desired`."""
    _below_since: float | None = None
    _lag_ms: int = 0
    _late_quiet_until: float = 0.0

    def __post_init__(self) -> None:
        if not 1 <= self.minimum <= self.maximum:
            raise ValueError(
                f"expected 1 <= MIN <= MAX processes, got MIN {self.minimum}, MAX {self.maximum}"
            )
        self.desired = self.desired or self.minimum
        fixed = self.minimum == self.maximum
        self.reason = self.reason or (
            f"fixed pool of {self.minimum}" if fixed else f"started at MIN ({self.minimum})"
        )

    def pressure(self, signal: Signal, interval: float, now: float) -> str | None:
        """Why work waits longer than it should although the backlog rule is content, if so:
        schedule lag past one interval and growing, or recent lateness p99 past one interval
        (counted once per `RECENT_WINDOWS` windows: the ring still holds the lateness from
        before the last scale-up until they pass)."""
        interval_ms = interval * 1000
        grew = signal.lag_ms > interval_ms and signal.lag_ms > self._lag_ms
        self._lag_ms = signal.lag_ms
        if grew:
            return f"schedule lag {signal.lag_ms} ms and growing"
        p99 = signal.lateness_p99_ms
        if p99 is not None and p99 > interval_ms and now >= self._late_quiet_until:
            self._late_quiet_until = now + RECENT_WINDOWS * LATENESS_WINDOW_MS / 1000
            return f"lateness p99 {p99:.0f} ms"
        return None

    def step(self, now: float, target: int, reason: str) -> int:
        """The pool size after a plan of ``target`` processes at ``now``."""
        self.changed = False
        target = max(self.minimum, min(self.maximum, target))
        if target > self.desired:
            self._below_since = None
            self._set(target, reason)
        elif target < self.desired:
            if self._below_since is None:
                self._below_since = now
            if now - self._below_since >= self.scale_down_after:
                self._below_since = now  # the next one waits as long again
                self._set(
                    self.desired - 1,
                    f"{reason}; below the pool for {self.scale_down_after:g} s → retiring one",
                )
        else:
            self._below_since = None
        return self.desired

    def _set(self, desired: int, reason: str) -> None:
        self.desired, self.reason, self.changed = desired, reason, True


# -- the supervisor's side ---------------------------------------------------------------------


def _supervisor_id() -> str:
    host = re.sub(r"[^A-Za-z0-9_.:@/+=-]", "-", socket.gethostname()) or "host"
    return f"{host}.{os.getpid()}.{uuid.uuid4().hex[:6]}"


class Autoscaler:
    """A supervisor's link to Redis. `look` registers the supervisor, reads the signal and
    returns the pool size wanted; `decide` (the supervisor's call, every loop) never blocks:
    a thread of its own looks every scale interval with the pool's latest state, so a slow or
    unreachable Redis never holds up restarts and signals. `close` deregisters. MIN == MAX is a
    fixed pool (registered all the same: `drumbeat status` shows it, other supervisors count
    its MAX)."""

    def __init__(
        self,
        app: App,
        *,
        minimum: int,
        maximum: int,
        concurrency: int,
        queues: Sequence[str] | None = None,
    ) -> None:
        self.app = app
        self.queues = queues  # what its workers serve: the backlog it scales on
        self.settings = app.settings
        self.interval = self.settings.scale_interval
        self.concurrency = concurrency
        self.id = _supervisor_id()
        self.policy = Policy(minimum, maximum, self.settings.scale_down_after)
        window = max(self.settings.lease_ms, int(5 * self.interval * 1000))
        self.rate = CompletionRate(window)
        self.started_ms: int | None = None
        self.reason_ms: int | None = None
        self.last: Signal | None = None
        self.last_plan: Plan | None = None
        self._failing = False
        self._state = (0, minimum, 0)  # live, desired, retiring: the supervisor's last word
        self._wanted = minimum
        self._stop = threading.Event()
        # Held from the stop check to the decision's log line, and by `close` to set the stop:
        # a look in flight when the supervisor stops decides nothing (nor logs "scaling to").
        self._deciding = threading.Lock()
        self._thread: threading.Thread | None = None

    def info(self, live: int, desired: int, retiring: int) -> dict[str, Any]:
        p = self.last_plan
        return {
            "host": socket.gethostname(), "pid": os.getpid(), "live": live, "desired": desired,
            "min": self.policy.minimum, "max": self.policy.maximum,
            "concurrency": self.concurrency, "slots": (live + retiring) * self.concurrency,
            "reason": self.policy.reason, "reason_ms": self.reason_ms,
            "started_ms": self.started_ms, "needed": None if p is None else p.processes,
            "ttl_ms": supervisor_ttl_ms(self.interval),
        }  # fmt: skip

    def decide(self, live: int, desired: int, retiring: int) -> int:
        """The pool size the last look wanted; the next look sees this state of the pool."""
        self._state = (live, desired, retiring)
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="drumbeat-autoscale", daemon=True
            )
            self._thread.start()
        return self._wanted

    def _run(self) -> None:
        while not self._stop.is_set():
            live, desired, retiring = self._state
            try:
                self._wanted = self.look(live, desired, retiring, time.monotonic())
            except Exception:  # a bug here must not end the thread: the pool would freeze
                log.exception("autoscaling failed; keeping %d processes", self._wanted)
            self._stop.wait(self.interval)

    def look(self, live: int, desired: int, retiring: int, now: float) -> int:
        """One look: returns the pool size wanted (the policy's last when Redis fails)."""
        if self._stop.is_set():
            return self.policy.desired  # closed: neither registers again nor decides
        info = json.dumps(self.info(live, desired, retiring)).encode()
        ttl = supervisor_ttl_ms(self.interval)
        calls: list[Call[Any]] = [self.app.scripts.beat_supervisor(self.id, info, ttl)]
        calls += signal_calls(self.app, self.queues)
        try:
            replies = run_calls(self.app.redis, calls)
        except (redis.RedisError, OSError, redis.exceptions.RedisClusterException) as exc:
            if not self._failing:
                log.warning("autoscaling: cannot read Redis (%s: %s); keeping %d processes "
                            "until it answers", type(exc).__name__, exc, desired)  # fmt: skip
            self._failing = True
            return self.policy.desired
        if self._failing:
            log.info("autoscaling: Redis answers again")
            self._failing = False
        with self._deciding:
            if self._stop.is_set():
                return self.policy.desired  # the supervisor is stopping: no more decisions
            return self._decide(parse_signal(replies[1:]), live, retiring, now)

    def _decide(self, signal: Signal, live: int, retiring: int, now: float) -> int:
        if self.started_ms is None:
            self.started_ms = self.reason_ms = signal.now_ms
        rate = self.rate.add(signal.now_ms, signal.processed)
        pressure = self.policy.pressure(signal, self.interval, now)
        p = plan(
            signal, me=self.id, minimum=self.policy.minimum, maximum=self.policy.maximum,
            live=live, slots=(live + retiring) * self.concurrency,
            concurrency=self.concurrency, rate=rate, interval=self.interval,
            pressure=pressure is not None,
        )  # fmt: skip
        self.last, self.last_plan = signal, p
        wanted = self.policy.step(now, p.mine, describe(signal, p, rate, pressure))
        if self.policy.changed:
            self.reason_ms = signal.now_ms
            log.info("scaling to %d processes: %s", wanted, self.policy.reason)
        return wanted

    def close(self) -> None:
        """Stops looking and deregisters (a stopped supervisor leaves the others' shares at
        once; one killed leaves when its registration expires). No decision is taken once it
        returned, even by a look that was in flight."""
        with self._deciding:
            self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)  # a look in flight on a dead Redis: deregistering fails too
        with contextlib.suppress(redis.RedisError, OSError, redis.exceptions.RedisClusterException):
            ttl = supervisor_ttl_ms(self.interval)
            self.app.scripts.beat_supervisor(self.id, b"", ttl).run(self.app.redis)
