"""Which script settles which outcome, and what it counts: one table (`KINDS`) for jobs, and
the grouping of a batch's outcomes into script calls (`group_of`)."""

from __future__ import annotations

from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass
from typing import Any

from drumbeat.config import Settings
from drumbeat.outcomes import (
    Again,
    Bury,
    Cancelled,
    Done,
    HandBack,
    Outcome,
    Queued,
    Resettle,
    RunDone,
    Unknown,
)
from drumbeat.protocol import RUN_PREFIX
from drumbeat.replies import Claimed
from drumbeat.schedules.slots import Settled
from drumbeat.scripts import Call, Scripts

from .claims import Claim, ClaimKey
from .slotted import finish_item, settle_item


@dataclass(frozen=True, slots=True)
class Kind:
    """How one type of outcome is settled and counted."""

    what: str
    """What settling does, for logs."""
    script: Callable[[Scripts, str, Settings], Callable[[Sequence[Any]], Call[list[int]]]] | None
    """The script call for a batch of one shard (its `Scripts`) and one queue (None: built by
    `Settler._calls` itself)."""
    item: Callable[[Claimed, Any], tuple[Any, ...]]
    """The script's item for one claim and its outcome; its first two fields are id, token."""
    counts: Callable[[Any], tuple[int, int]]
    """(processed, failed) this outcome adds to the worker's counters."""
    by_queue: bool = False
    """Its script writes to the job's queue's keys: one call per queue."""


def _unknown_wait(settings: Settings) -> tuple[int, int]:
    """(least, most) ms a job whose task this worker lacks waits before it is claimed again:
    a second at first, up to a tenth of the grace (at most 10 s), so a worker of a newer deploy
    gets it soon and one lacking it claims it a few dozen times over the grace at most."""
    grace_ms = round(settings.unknown_task_grace * 1000)
    least = min(1000, grace_ms)
    return least, max(least, min(10_000, grace_ms // 10))


def _ttl(settings: Settings) -> int:
    """Ms the outcome of a dependent dead-lettered with its dependency is kept."""
    return round(settings.result_ttl * 1000)


KINDS: dict[type[Outcome], Kind] = {
    # Ends of jobs go one call per queue: a dependent of the same queue is released at once
    # (one of another queue within a `maintenance_interval`, by reap.lua; docs/workflows.md).
    Done: Kind(
        "ack", lambda s, q, cfg: lambda items: s.complete(items, (q,), ttl_ms=_ttl(cfg)),
        lambda j, o: (j.id, j.token, o.outcome, o.ttl_ms, j.extra),
        lambda o: (1, 0), by_queue=True,
    ),
    Again: Kind(
        "retry", lambda s, q, cfg: lambda items: s.retry(items, q),
        lambda j, o: (j.id, j.token, o.delay_ms, j.priority),
        lambda o: (0, 0), by_queue=True,
    ),
    Bury: Kind(
        "dead-letter", lambda s, q, cfg: lambda items: s.bury(items, (q,), ttl_ms=_ttl(cfg)),
        lambda j, o: (j.id, j.token, o.record, o.ttl_ms),
        lambda o: (0, 1), by_queue=True,
    ),
    Cancelled: Kind(
        "cancel",
        lambda s, q, cfg: lambda items: s.complete(items, (q,), cancelled=True, ttl_ms=_ttl(cfg)),
        lambda j, o: (j.id, j.token, o.record, o.ttl_ms, j.extra),
        lambda o: (0, 0), by_queue=True,
    ),
    HandBack: Kind(
        "hand-back", lambda s, q, cfg: lambda items: s.handback(items, q),
        lambda j, o: (j.id, j.token),
        lambda o: (0, 0), by_queue=True,
    ),
    Unknown: Kind(
        "hand-back (task unknown here)",
        lambda s, q, cfg: lambda items: s.defer_unknown(items, *_unknown_wait(cfg), queue=q),
        lambda j, o: (j.id, j.token),
        lambda o: (0, 0), by_queue=True,
    ),
}  # fmt: skip

# A schedule's run, whatever its outcome (a `RunDone`, or the `Resettle` of a schedule changed
# while it ran), is settled into the time slots: by settle_slots.lua, one call per incarnation,
# when claimed from them; by finish_runs.lua when it ran as a job. A time-slot run that becomes
# a job (`Queued`) goes by queue_runs.lua, one call per incarnation and queue (and whether this
# worker takes it: `Settler.take`).
SLOT_KIND = Kind(
    "reschedule", None, lambda j, o: (),
    lambda o: (1, int(o.outcome == "fail")) if isinstance(o, RunDone) else (0, 0),
)  # fmt: skip
QUEUE_KIND = Kind("queue as a job", None, lambda j, o: (), lambda o: (0, 0))


def slot_item(job: Claimed, outcome: Outcome) -> Settled:
    """The settle of a schedule's run (claimed from the time slots, or run as a job)."""
    if isinstance(outcome, Resettle):
        sid = job.id[len(RUN_PREFIX) :]
        slot_ms = 0 if job.slot_run is None else job.slot_run.slot_ms
        return Settled(sid, outcome.entry, outcome.due_ms, slot_ms, outcome.error)
    assert isinstance(outcome, RunDone)
    return settle_item(job, outcome) if job.slot_run is not None else finish_item(job, outcome)


def group_of(claim: Claim, outcome: Outcome, takes: Container[ClaimKey] = ()) -> tuple[Any, ...]:
    """The script call an outcome goes in: a time-slot run's by its incarnation ("slot"), or
    its queue too, and whether this worker takes it (in ``takes``), when it goes there as a job
    ("queue"); a run that ran as a job ("finish"); a job's by its kind of outcome, and its
    queue when the script writes to it ("job")."""
    run = claim.job.slot_run
    if run is not None:
        if isinstance(outcome, Queued):
            return ("queue", claim.shard, run.incarnation, outcome.queue, claim.key in takes)
        return ("slot", claim.shard, run.incarnation)
    if isinstance(outcome, RunDone | Resettle):
        return ("finish", claim.shard)
    of = type(outcome)
    return ("job", claim.shard, of, claim.job.queue if KINDS[of].by_queue else "")
