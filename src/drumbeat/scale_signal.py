"""What the autoscaler sizes pools on, read from Redis: the `Signal` (what waits and what runs,
over every shard workers claim from) and the registrations of the live supervisors.

`signal_calls` are the `scale_signal.lua` calls, one per shard; `parse_signal` folds their
replies into one `Signal`; `read_signal` does both for `drumbeat status`, the dashboard and the
metrics. The supervisors' `Autoscaler` (autoscale.py) sends the same calls with its own beat.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis
from redis.exceptions import NoScriptError

from .admin import lateness_summary
from .protocol import MAX_PRIORITY, MIN_PRIORITY
from .replies import text
from .scripts import Call

if TYPE_CHECKING:
    from .app import App

__all__ = [
    "RECENT_WINDOWS",
    "Signal",
    "SupervisorInfo",
    "parse_signal",
    "read_signal",
    "run_calls",
    "signal_calls",
]

#: Lateness counts as recent over this many windows of the `lateness` ring (10 s each).
RECENT_WINDOWS = 2


@dataclass(frozen=True, slots=True)
class SupervisorInfo:
    """A live supervisor, from its registration."""

    id: str
    heartbeat_ms: int
    host: str | None = None
    pid: int | None = None
    live: int = 0
    desired: int = 0
    minimum: int = 1
    maximum: int = 1
    concurrency: int | None = None
    slots: int = 0
    """Slots of its processes, retiring ones included (they still hold their registration)."""
    reason: str = ""
    """Why it last changed its pool (or how it started)."""
    reason_ms: int | None = None
    started_ms: int | None = None
    needed: int | None = None
    """Processes its last decision found needed over every supervisor."""


@dataclass(frozen=True, slots=True)
class Signal:
    """What waits and what runs, over every shard workers claim from."""

    now_ms: int
    ready_by_priority: tuple[int, ...]
    """Jobs and runs waiting in `ready`, indexed by priority 0..9 (of queues not paused)."""
    due_now: int
    """Entries of `due` past their time, not yet promoted (delayed jobs), and `due_runs`."""
    lag_ms: int
    """How long the oldest of those has waited (0 when none)."""
    running: int
    """Leases held: the busy slots; or, when more, the runs the live workers said they ran at
    their last heartbeat (runs of the time slots hold no lease of their own)."""
    slots: int
    """Slots of the live workers (registered within one lease)."""
    workers: int
    processed: Mapping[str, int]
    """Jobs each live worker has finished, for `CompletionRate`."""
    cpu: float = 0.0
    """The cores the live workers use, each capped at one (from their last heartbeat)."""
    lateness_p99_ms: float | None = None
    """Schedule runs' start lateness p99 over the last `RECENT_WINDOWS` windows."""
    supervisors: tuple[SupervisorInfo, ...] = ()
    due_runs: int = 0
    """Schedule runs due in the time slots and not claimed yet (estimated from the due slots
    and the runs a slot holds on average; exact when every slot is due)."""
    paused: int = 0
    """Jobs that wait in paused queues (ready, or due): no part of the backlog, since no worker
    takes them until their queue is resumed; with the schedule runs due while the default queue
    is paused."""

    @property
    def waiting_for_slots(self) -> bool:
        """Due schedule runs wait while every slot of the live workers is busy: more slots
        (processes, or concurrency) would start them sooner."""
        return self.due_runs > 0 and self.slots > 0 and self.busy >= self.slots

    @property
    def ready(self) -> int:
        return sum(self.ready_by_priority)

    @property
    def backlog(self) -> int:
        return self.ready + self.due_now

    @property
    def busy(self) -> int:
        """Busy slots: the leases held, at most the live workers' slots. Leases can outnumber
        slots: a run paused at a checkpoint keeps its lease while the urgent job it lent its
        slot to holds another (two leases, one slot: `worker.claims.ClaimTable`), and a worker
        killed or stopped hard leaves its leases until they lapse and are reaped, after its
        registration is gone. (`running` keeps them all: the plan counts each such job, as the
        lender resumes and the dead worker's jobs come back to be run.)"""
        return min(self.running, self.slots)


def _json(raw: bytes | str) -> dict[str, Any]:
    try:
        value = json.loads(raw) if raw else None
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _int(value: Any, default: int | None = None) -> Any:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _supervisor(sid: str, expiry_ms: int, info: Mapping[str, Any]) -> SupervisorInfo:
    host, reason = info.get("host"), info.get("reason")
    return SupervisorInfo(
        id=sid,
        heartbeat_ms=expiry_ms - _int(info.get("ttl_ms"), 0),
        host=host if isinstance(host, str) else None,
        pid=_int(info.get("pid")),
        live=_int(info.get("live"), 0),
        desired=_int(info.get("desired"), 0),
        minimum=_int(info.get("min"), 1),
        maximum=max(1, _int(info.get("max"), 1)),
        concurrency=_int(info.get("concurrency")),
        slots=_int(info.get("slots"), 0),
        reason=reason if isinstance(reason, str) else "",
        reason_ms=_int(info.get("reason_ms")),
        started_ms=_int(info.get("started_ms")),
        needed=_int(info.get("needed")),
    )


def signal_calls(app: App, queues: Sequence[str] | None = None) -> list[Call[Any]]:
    """The `scale_signal.lua` call of every shard workers claim from; the first (the main
    shard, where workers and supervisors register) reads the registrations too; the job shards
    count the backlog of ``queues`` (default: those the app's tasks name); schedule shards hold
    the default queue's runs only."""
    lease = app.settings.lease_ms
    served = queues or app.queues()
    calls = [app.scripts.scale_signal(lease, True, served, RECENT_WINDOWS)]
    calls += [s.scale_signal(lease, False, served, RECENT_WINDOWS) for s in app.job_scripts[1:]]
    if app.settings.schedule_shards > 1:
        calls += [
            s.scale_signal(lease, False, windows=RECENT_WINDOWS)
            for s in app.scheduler.apart_scripts
        ]
    return calls


def parse_signal(replies: Sequence[Any]) -> Signal:
    """A `Signal` from the replies of `signal_calls`, in their order."""
    now_ms = int(replies[0][0])
    counts = [0] * (MAX_PRIORITY - MIN_PRIORITY + 1)
    due_now = running = due_runs = paused = 0
    earliest: int | None = None
    lateness: dict[str, str] = {}
    for i, raw in enumerate(replies):
        counts = [c + int(n) for c, n in zip(counts, raw[1], strict=True)]
        due_now += int(raw[2])
        if int(raw[3]) >= 0:
            earliest = int(raw[3]) if earliest is None else min(earliest, int(raw[3]))
        running += int(raw[4])
        due_runs += int(raw[8])
        paused += int(raw[9])
        flat = raw[5]
        for k in range(0, len(flat), 2):  # shards' windows line up: prefix slots by shard
            name = text(flat[k])
            lateness[f"{name[0]}{i}.{name[1:]}"] = text(flat[k + 1])
    workers, sups = replies[0][6], replies[0][7]
    slots, processed, cpu, reported = 0, {}, 0.0, 0
    for k in range(0, len(workers), 2):
        info = _json(workers[k + 1])
        slots += _int(info.get("concurrency"), 0)
        reported += _int(info.get("running"), 0)
        processed[text(workers[k])] = _int(info.get("processed"), 0)
        share = info.get("cpu")
        if isinstance(share, int | float) and not isinstance(share, bool) and share > 0:
            cpu += min(1.0, float(share))  # threads in C code use more, but one loop no more
    supervisors = tuple(
        _supervisor(text(sups[k]), int(float(sups[k + 1])), _json(sups[k + 2]))
        for k in range(0, len(sups), 3)
    )  # (id, expiry, info): the heartbeat is the expiry less the ttl the info gives
    lag = now_ms - earliest if earliest is not None and earliest <= now_ms else 0
    late = lateness_summary(lateness, now_ms, windows=RECENT_WINDOWS)
    return Signal(
        now_ms=now_ms,
        ready_by_priority=tuple(counts),
        due_now=due_now,
        lag_ms=lag,
        running=max(running, reported),
        slots=slots,
        workers=len(processed),
        processed=processed,
        cpu=cpu,
        lateness_p99_ms=late.p99_ms,
        supervisors=supervisors,
        due_runs=due_runs,
        paused=paused,
    )


def run_calls(client: redis.Redis, calls: Sequence[Call[Any]]) -> list[Any]:
    """Runs ``calls`` in one pipeline (one round trip) and returns their parsed replies; a
    call refused with NOSCRIPT (Redis restarted) did nothing and runs again on its own."""
    with client.pipeline(transaction=False) as pipe:
        for call in calls:  # by its command: a cluster's pipeline has no `evalsha`
            pipe.execute_command(*call.command())  # type: ignore[no-untyped-call]
        raw = pipe.execute(raise_on_error=False)
    out = []
    for call, reply in zip(calls, raw, strict=True):
        if isinstance(reply, NoScriptError):
            out.append(call.run(client))
        elif isinstance(reply, Exception):
            raise reply
        else:
            out.append(call.parse(reply))
    return out


def read_signal(app: App) -> Signal:
    """The signal now, for `drumbeat status`: over every queue jobs were sent to (two round
    trips, nothing written)."""
    return parse_signal(run_calls(app.redis, signal_calls(app, app.known_queues())))
