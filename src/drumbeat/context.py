"""The Context a running task can read: which job it is, which attempt, and its fencing token."""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Context:
    """What a task knows about the run it is part of."""

    job_id: str
    task: str
    attempt: int
    """1 on the first run; counts every claim, including runs a crashed worker never finished."""
    token: int
    """Fencing token of this claim: strictly larger for every later claim of any job in the shard.
    Store it beside side effects (``... WHERE token < :token``) to make them idempotent when a
    run whose lease was taken over finishes late."""
    priority: int
    worker: str
    schedule_id: str | None = None
    """The schedule this run belongs to; None for a one-off job."""
    due_ms: int | None = None
    """When this run was due (epoch ms, Redis clock); None for a one-off job."""


_current: ContextVar[Context] = ContextVar("drumbeat_job")


def current_job() -> Context:
    """The Context of the job running in this task or thread; ``LookupError`` outside a job."""
    try:
        return _current.get()
    except LookupError:
        raise LookupError("current_job() is only available while a drumbeat job runs") from None
