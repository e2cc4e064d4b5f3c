"""What became of a claimed job once it ran (or could not): each kind of `Outcome` the runner
decides and the settler sends to Redis, one script per kind."""

from __future__ import annotations

from dataclasses import dataclass


def printable(text: str) -> str:
    """``text`` as valid UTF-8: an error message may hold lone surrogates (from bytes decoded
    with ``surrogateescape``, say), which neither the JSON codec nor a Redis argument can carry;
    they are kept visible as escapes."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


@dataclass(frozen=True, slots=True)
class Done:
    outcome: bytes
    ttl_ms: int


@dataclass(frozen=True, slots=True)
class Again:
    delay_ms: int
    error: str = ""
    """Why it is retried (for the job hooks; not stored)."""


@dataclass(frozen=True, slots=True)
class Bury:
    record: bytes
    ttl_ms: int
    reason: str


@dataclass(frozen=True, slots=True)
class Cancelled:
    """Stopped by `Job.cancel`: the outcome record says so, and it is never retried."""

    record: bytes
    ttl_ms: int


@dataclass(frozen=True, slots=True)
class HandBack:
    """Stopped at a checkpoint because the worker is shutting down: back to the queue now,
    without spending an attempt (its progress is saved)."""


@dataclass(frozen=True, slots=True)
class Unknown:
    """This worker does not know the job's task (a rolling deploy): back to its queue, not
    an attempt, after a wait (defer_unknown.lua), for a worker that knows it."""


@dataclass(frozen=True, slots=True)
class Parked:
    """Its limits do not let it start now: acquire_limits.lua gave up its claim (not an
    attempt) and it waits in Redis for its turn. Nothing to settle."""


@dataclass(slots=True)  # not frozen: a frozen init costs a setattr call per field, per run
class RunDone:
    """A schedule's run ended (or was skipped); where the schedule goes next."""

    outcome: str  # ok | fail | skip
    duration_ms: int
    generation: int
    grid_ms: int
    due_ms: int
    error: str = ""
    started_ms: int = 0
    """When the run began (Redis ms): a run that ran as a job builds its next record with it."""


@dataclass(frozen=True, slots=True)
class Queued:
    """A time-slot run of a schedule with limits or routed to another queue: it goes to its
    queue as a job for its one attempt (`slots.SlotScripts.queue_runs`)."""

    queue: str


@dataclass(frozen=True, slots=True)
class Resettle:
    """A time-slot run whose schedule changed while it ran: the settle replied its entry with
    the new definition (`slots.parse_settled`), to send again into the slot it is due in."""

    entry: str
    due_ms: int
    error: str | None


Outcome = (
    Done | Again | Bury | RunDone | Cancelled | HandBack | Unknown | Parked | Resettle | Queued
)
