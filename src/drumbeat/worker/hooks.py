"""The seams where code plugs into a worker without editing its loops: the process starts and
stops, and each job starts and ends (with its outcome and duration).

Hooks run on the worker's event loop: a job hook must be quick (it delays the job's slot), a
process hook may take its time. Either may be a plain function or a coroutine function. A
job hook that raises is logged and the job goes on as if it had not been there; a start hook
that raises stops the worker before it claims anything (a process that cannot set up its
resources must not take work).

The app's public job middleware (`drumbeat.Middleware`, `App.middleware`) is this same
mechanism: `Hooks.adopt` adds each middleware's ``before_run`` / ``after_run`` to the job
hooks, so a middleware and a hook see the same `JobInfo` and `JobEnd`.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from drumbeat.errors import SerializationError
from drumbeat.job import decode_spec
from drumbeat.middleware import Middleware, overrides
from drumbeat.protocol import RUN_PREFIX
from drumbeat.replies import Claimed
from drumbeat.schedule import decode_schedule_call, run_call

log = logging.getLogger("drumbeat.worker")


_RUN_PREFIX_LEN = len(RUN_PREFIX)


class JobInfo:
    """One run of a job (or of a schedule), as job hooks and middleware see it. The task name
    and headers are read from the job's record when first asked for (a hook that does not
    ask costs no decoding)."""

    __slots__ = ("_headers", "_task", "claimed", "notes")

    def __init__(self, claimed: Claimed) -> None:
        self.claimed = claimed
        """The claim as the worker holds it (internal)."""
        self.notes: dict[str, Any] = {}
        """For a middleware's own use between ``before_run`` and ``after_run``."""
        self._task: str | None = None
        self._headers: dict[str, str] | None = None

    @property
    def id(self) -> str:
        """The job's id; ``s:<schedule id>`` for a schedule's run."""
        return self.claimed.id

    @property
    def attempt(self) -> int:
        """1 on the first run; counts every claim, including runs a crashed worker lost."""
        return self.claimed.attempt

    @property
    def priority(self) -> int:
        return self.claimed.priority

    @property
    def queue(self) -> str:
        return self.claimed.queue

    @property
    def schedule_id(self) -> str | None:
        """The schedule of a schedule's run; None for a job."""
        job_id = self.claimed.id
        return job_id[_RUN_PREFIX_LEN:] if job_id.startswith(RUN_PREFIX) else None

    @property
    def task(self) -> str:
        """The task's name ("" when the record cannot be read: the run fails saying why)."""
        if self._task is None:
            self._decode()
        return self._task or ""

    @property
    def headers(self) -> dict[str, str]:
        """The job's headers (a schedule run's: its schedule's); {} when it has none."""
        if self._headers is None:
            self._decode()
        return self._headers if self._headers is not None else {}

    def _decode(self) -> None:
        spec = self.claimed.spec
        self._task, self._headers = "", {}
        if spec is None:
            return
        try:
            if self.claimed.id.startswith(RUN_PREFIX):
                name, blob = run_call(spec, queued=self.claimed.slot_run is None)
                self._task = name.decode(errors="replace")
                self._headers = decode_schedule_call(blob)[4]
            else:
                decoded = self.claimed.decoded = decode_spec(spec)  # the runner's, too
                self._task, self._headers = decoded.task, decoded.headers
        except (SerializationError, ValueError, IndexError, TypeError):
            pass  # the runner reports an unreadable record; a hook sees what could be read

    def __repr__(self) -> str:
        return f"<JobInfo {self.id} attempt={self.attempt} queue={self.queue}>"


@dataclass(slots=True)  # not frozen: a frozen init costs a setattr call per field, per run
class JobEnd:
    """How one run ended, as the after-job hooks see it."""

    job: JobInfo
    outcome: str
    """done | retry | dead (a job); ok | fail | skip (a schedule run); cancelled (a stop, a
    lost lease, or `Job.cancel`); handback (back to its queue, not an attempt: a stop at a
    checkpoint, or a task this worker lacks); limited (waiting for its limits); queued (a
    schedule's run sent to its queue as a job); crashed (the worker itself failed running
    it)."""
    duration: float
    """Seconds from the start of the run to its end."""
    error: str = ""
    """What went wrong, for a retry, a dead letter or a failed schedule run; else empty."""

    @property
    def failed(self) -> bool:
        """Whether the run ended in an error (retry, dead, fail, crashed)."""
        return self.outcome in _FAILED


_FAILED = frozenset(("retry", "dead", "fail", "crashed"))

ProcessHook = Callable[[], Awaitable[None] | None]
JobHook = Callable[[JobInfo], Awaitable[None] | None]
EndHook = Callable[[JobEnd], Awaitable[None] | None]


@dataclass(slots=True)
class Hooks:
    """Callables run by a `Worker` at each seam, in the order added."""

    on_start: list[ProcessHook] = field(default_factory=list)
    on_stop: list[ProcessHook] = field(default_factory=list)
    before_job: list[JobHook] = field(default_factory=list)
    after_job: list[EndHook] = field(default_factory=list)

    def adopt(self, middleware: Iterable[Middleware]) -> None:
        """Adds the job hooks of an app's middleware: their ``before_run`` ahead of the hooks
        given, their ``after_run`` after them, in the reverse order (so they nest)."""
        mws = list(middleware)
        self.before_job[:0] = [mw.before_run for mw in mws if overrides(mw, "before_run")]
        self.after_job.extend(mw.after_run for mw in reversed(mws) if overrides(mw, "after_run"))

    @property
    def per_job(self) -> bool:
        """Whether any job hook is set (the hot path skips them all otherwise)."""
        return bool(self.before_job or self.after_job)

    async def started(self) -> None:
        """Runs the start hooks; an exception propagates (the worker does not start)."""
        for hook in self.on_start:
            await _call(hook)

    async def stopped(self) -> None:
        """Runs every stop hook, logging (not raising) what fails."""
        for hook in self.on_stop:
            try:
                await _call(hook)
            except Exception:
                log.exception("on_stop hook %s failed", _name(hook))

    # Each hook called in line (no coroutine of `_call` per hook and run), awaited if it
    # returned an awaitable: a run pays the hooks' own cost, little more.

    async def before(self, job: JobInfo) -> None:
        for hook in self.before_job:
            try:
                result = hook(job)
                if result is not None and inspect.isawaitable(result):
                    await result
            except Exception:
                log.exception("before_job hook %s failed on job %s", _name(hook), job.id)

    async def after(self, end: JobEnd) -> None:
        for hook in self.after_job:
            try:
                result = hook(end)
                if result is not None and inspect.isawaitable(result):
                    await result
            except Exception:
                log.exception("after_job hook %s failed on job %s", _name(hook), end.job.id)


async def _call(hook: Callable[..., Any], *args: Any) -> None:
    result = hook(*args)
    if inspect.isawaitable(result):
        await result


def _name(hook: Callable[..., Any]) -> str:
    return getattr(hook, "__qualname__", repr(hook))
