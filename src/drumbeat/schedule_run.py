"""A schedule's run under way, as the runner sees it: where the run sits in its schedule
(decoded from the claim), and where its schedule goes once it ends (`ScheduleRun.next`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .errors import SerializationError
from .outcomes import RunDone, printable
from .protocol import FIELD_SEP_BYTES, RUN_PREFIX, RUN_STATE_FIELDS, RUN_STATE_SEP, SPEC_FIELD
from .schedule import Cadence, decode_schedule_call, is_misfire, jitter_ms, run_call

if TYPE_CHECKING:
    from .replies import Claimed
    from .runner import Named

# A schedule record that cannot be read still comes back this much later, so it cannot spin.
_UNREADABLE_RETRY_MS = 60_000

_RUN_PREFIX_LEN = len(RUN_PREFIX)
_RUN_STATE_LEN = len(RUN_STATE_FIELDS)


class ScheduleRun:
    """A schedule's run under way: where its schedule goes once it ends (`next`)."""

    __slots__ = (
        "cadence", "due", "gen", "grid", "manual", "now_ms", "schedule_id", "start_ms", "started"
    )  # fmt: skip

    def __init__(
        self,
        schedule_id: str,
        *,
        due: int,
        grid: int,
        gen: int,
        manual: bool,
        cadence: Cadence,
        now_ms: Callable[[], int],
        started: float,
        start_ms: int,
    ) -> None:
        self.schedule_id = schedule_id
        self.due = due
        self.grid = grid
        self.gen = gen
        self.manual = manual
        """Queued by `Schedule.run_now`: it keeps the slot it jumped ahead of."""
        self.cadence = cadence
        self.now_ms = now_ms
        self.started = started
        """When the run began (`time.monotonic`)."""
        self.start_ms = start_ms
        """When the run began (Redis ms): a late one stands for the slots passed by then."""

    def next(self, outcome: str, error: str = "") -> RunDone:
        """The outcome of the run, ended now, and its schedule's next slot."""
        end, grid, cadence = self.now_ms(), self.grid, self.cadence
        if self.manual and grid > end:
            nxt = (grid, grid + jitter_ms(self.schedule_id, grid, cadence.jitter_ms), 0)
        else:
            nxt = cadence.after_run(self.schedule_id, grid, end, self.start_ms)
        duration = round((time.monotonic() - self.started) * 1000)
        return RunDone(
            outcome,
            duration,
            self.gen,
            nxt[0],
            nxt[1],
            printable(error) if error else "",
            self.start_ms,
        )


def decode_run(
    job: Claimed,
    named: Named | None,
    start: tuple[int, float],
    now_ms: Callable[[], int],
) -> tuple[ScheduleRun, bytes, list[Any], dict[str, Any], Any, dict[str, str]] | RunDone:
    """A run's place in its schedule and its record's (task name, args, kwargs, limits,
    headers); a damaged record is reported (`RunDone`) and comes back later. ``start``:
    when the run began, (Redis ms, `time.monotonic`)."""
    gen, run = -1, job.slot_run
    try:
        if job.spec is None:
            raise SerializationError("no schedule record")
        if run is not None:  # from the time slots: its fields as claimed
            gen, grid, due = int(run.fields[0]), int(run.fields[1]), run.due_ms
            # Due before its grid slot: moved ahead by `App.run_now`, its schedule goes back
            # to that slot after it.
            manual = grid > due
            task_name = job.spec.partition(FIELD_SEP_BYTES)[0]
            spec: str | bytes = run.fields[SPEC_FIELD]
        else:  # queued as a job: its state's RUN_STATE_FIELDS (a fifth, a stall's first
            # start, is finish_runs' business)
            due_s, grid_s, gen_s, manual_s = job.extra.split(RUN_STATE_SEP)[:_RUN_STATE_LEN]
            due, grid, gen, manual = int(due_s), int(grid_s), int(gen_s), manual_s == "1"
            task_name, spec = run_call(job.spec, queued=True)
        if named is not None:
            named.task_name = task_name.decode(errors="replace")
        args, kwargs, cadence, limits, headers = decode_schedule_call(spec)
    except Exception as exc:
        error = f"unreadable schedule record: {type(exc).__name__}: {exc}"
        retry_at = start[0] + _UNREADABLE_RETRY_MS
        return RunDone("fail", 0, gen, retry_at, retry_at, error)
    slot = ScheduleRun(job.id[_RUN_PREFIX_LEN:], due=due, grid=grid, gen=gen, manual=manual,
                 cadence=cadence, now_ms=now_ms, started=start[1],
                 start_ms=start[0])  # fmt: skip
    return slot, task_name, args, kwargs, limits, headers


def not_run(
    job: Claimed, due: int, start_ms: int, grace_ms: int, max_stalls: int
) -> tuple[str, str] | None:
    """Why a run is settled without running its task, as (outcome, error), or None."""
    if job.stalls > max_stalls:  # reap.lua requeued it for this
        return "fail", f"lease expired {job.stalls} times (worker crashed or hung)"
    if job.attempt == 1 and is_misfire(due, start_ms, grace_ms):
        return "skip", ""
    return None
