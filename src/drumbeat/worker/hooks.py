"""The seams where code plugs into a worker without editing its loops: the process starts and
stops, and each job starts and ends (with its outcome and duration).

Hooks run on the worker's event loop: a job hook must be quick (it delays the job's slot), a
process hook may take its time. Either may be a plain function or a coroutine function. A
job hook that raises is logged and the job goes on as if it had not been there; a start hook
that raises stops the worker before it claims anything (a process that cannot set up its
resources must not take work).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from drumbeat.replies import Claimed

log = logging.getLogger("drumbeat.worker")


@dataclass(frozen=True, slots=True)
class JobEnd:
    """How one run ended, as the after-job hooks see it."""

    job: Claimed
    outcome: str
    """done | retry | dead (a job); ok | fail | skip (a schedule run); cancelled (a stop or a
    lost lease: nothing is settled); crashed (the worker itself failed running it)."""
    duration: float
    """Seconds from the start of the run to its end."""


ProcessHook = Callable[[], Awaitable[None] | None]
JobHook = Callable[[Claimed], Awaitable[None] | None]
EndHook = Callable[[JobEnd], Awaitable[None] | None]


@dataclass(slots=True)
class Hooks:
    """Callables run by a `Worker` at each seam, in the order added."""

    on_start: list[ProcessHook] = field(default_factory=list)
    on_stop: list[ProcessHook] = field(default_factory=list)
    before_job: list[JobHook] = field(default_factory=list)
    after_job: list[EndHook] = field(default_factory=list)

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

    async def before(self, job: Claimed) -> None:
        for hook in self.before_job:
            try:
                await _call(hook, job)
            except Exception:
                log.exception("before_job hook %s failed on job %s", _name(hook), job.id)

    async def after(self, end: JobEnd) -> None:
        for hook in self.after_job:
            try:
                await _call(hook, end)
            except Exception:
                log.exception("after_job hook %s failed on job %s", _name(hook), end.job.id)


async def _call(hook: Callable[..., Any], *args: Any) -> None:
    result = hook(*args)
    if inspect.isawaitable(result):
        await result


def _name(hook: Callable[..., Any]) -> str:
    return getattr(hook, "__qualname__", repr(hook))
