"""The public models of schedules: `Schedule` (what `App.schedule_many` takes) and
`ScheduleInfo` (what `App.schedules` lists), and the decoding of a stored record into one."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from drumbeat.keys import DEFAULT_QUEUE
from drumbeat.protocol import ROUTE_FIELD
from drumbeat.schedule import Cadence, Mode, decode_schedule_spec, parse_record
from drumbeat.task import Task


@dataclass(frozen=True, slots=True)
class Schedule:
    """One schedule for `App.schedule_many`; the fields are `App.schedule`'s arguments."""

    id: str
    task: Task[Any, Any] | str
    every: float | None = None
    cron: str | None = None
    args: Sequence[Any] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    priority: int | None = None
    tz: str = "UTC"
    mode: Mode = "rate"
    grace: float | None = None
    jitter: float = 0.0
    queue: str | None = None
    rate_limit: str | None = None
    rate_burst: int | None = None
    concurrency_limit: int | None = None
    limit_by: str | None = None
    limiter: str | None = None
    headers: Mapping[str, str] | None = field(default=None, hash=False)
    """Headers every run carries (``current_job().headers``, `JobInfo.headers`)."""

    @property
    def cadence(self) -> Cadence:
        return Cadence(self.every, self.cron, self.tz, self.mode, self.grace, self.jitter)


@dataclass(frozen=True, slots=True)
class ScheduleInfo:
    """A schedule and its state, as `App.schedules` lists it. Times are epoch ms (Redis clock)."""

    id: str
    task: str
    args: list[Any]
    kwargs: dict[str, Any]
    cadence: Cadence
    priority: int
    paused: bool
    next_due_ms: int | None
    """None while a run is queued or in flight, or while paused."""
    last_run_ms: int | None
    last_duration_ms: int | None
    last_lateness_ms: int | None
    """How long after its due time the last run started (None before the first run, and for
    a schedule whose last run ended before drumbeat recorded it)."""
    runs: int
    failures: int
    misfires: int
    last_error: str | None
    """The error of the most recent failed run (kept after later successes)."""
    generation: int
    queue: str = DEFAULT_QUEUE
    """The queue its runs go to."""


def task_names(raw: Mapping[bytes, bytes]) -> dict[str, str]:
    """Task code -> name (and ``q<code>`` -> queue of a routed code), from a shard's `tasks`
    table (see _lib.lua's task_code)."""
    return {k[1:].decode(): v.decode() for k, v in raw.items() if k.startswith(b"#") and k[1:]}


def decode_info(
    schedule_id: str,
    value: bytes,
    names: Mapping[str, str] | None = None,
    due: float | None = None,
    fault: bytes | None = None,
) -> ScheduleInfo:
    """A stored record (``value``) as a `ScheduleInfo`; ``names``: `task_names` of its shard."""
    record = parse_record(value)
    args, kwargs, cadence, _ = decode_schedule_spec(record.spec)
    return ScheduleInfo(
        id=schedule_id,
        task=(names or {}).get(record.task_code, "?"),
        args=args,
        kwargs=kwargs,
        cadence=cadence,
        priority=record.priority,
        paused=record.paused,
        next_due_ms=None if due is None else int(due),
        last_run_ms=record.last_start_ms,
        last_duration_ms=record.last_ms if record.last_start_ms else None,
        last_lateness_ms=record.last_late_ms if record.last_start_ms else None,
        runs=record.runs,
        failures=record.failures,
        misfires=record.misfires,
        last_error=fault.decode(errors="replace") if fault else None,
        generation=record.generation,
        # `names` holds the `tasks` fields after their "#": the route's too.
        queue=(names or {}).get(ROUTE_FIELD[1:] + record.task_code, DEFAULT_QUEUE),
    )
