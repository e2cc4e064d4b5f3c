"""Workflows: jobs that wait for other jobs (``options(depends_on=...)``), and chains of them.

A dependent waits in Redis, in no queue, until each of its dependencies ended; the script that
ends a job releases or dead-letters its dependents in the same call (lua/_workflows.lua). The
page for users is docs/workflows.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

from .errors import InvalidJob, UnknownDependency
from .job import Job
from .job_ids import job_shard_of, new_job_id
from .protocol import RUN_PREFIX

if TYPE_CHECKING:
    from .app import App
    from .task import Prepared

#: The error enqueue_after.lua answers when a dependency is no job it knows.
UNKNOWN_REPLY = "DEPENDENCY_UNKNOWN"


@dataclass(frozen=True, slots=True)
class Dependency:
    """Jobs to wait for, as one entry of ``depends_on``; ``allow_failure=True``: the dependent
    runs even if they are dead-lettered or cancelled (it is dead-lettered with them
    otherwise)."""

    jobs: tuple[str, ...]
    allow_failure: bool = False

    def __init__(
        self, jobs: Iterable[Job[Any] | str] | Job[Any] | str, allow_failure: bool = False
    ):
        many = [jobs] if isinstance(jobs, Job | str) else list(jobs)
        object.__setattr__(self, "jobs", tuple(_job_id(j) for j in many))
        object.__setattr__(self, "allow_failure", bool(allow_failure))


DependsOn: TypeAlias = Job[Any] | str | Dependency | Iterable[Job[Any] | str | Dependency]
"""What ``depends_on`` takes: a job (handle or id), a `Dependency`, or an iterable of them."""


def dependencies(depends_on: DependsOn | None) -> tuple[tuple[str, bool], ...]:
    """``depends_on`` as (job id, may fail) pairs, each id once (a job named both plainly and
    in a `Dependency` with ``allow_failure`` may fail)."""
    if depends_on is None:
        return ()
    entries = [depends_on] if isinstance(depends_on, Job | str | Dependency) else depends_on
    found: dict[str, bool] = {}
    for entry in entries:
        if isinstance(entry, Dependency):
            for job_id in entry.jobs:
                found[job_id] = found.get(job_id, False) or entry.allow_failure
        else:
            job_id = _job_id(entry)
            found[job_id] = found.get(job_id, False)
    return tuple(found.items())


def _job_id(job: object) -> str:
    if isinstance(job, Job):
        return job.id
    if isinstance(job, str) and job:
        if job.startswith(RUN_PREFIX):
            raise InvalidJob(
                f"depends_on names {job!r}, a schedule's run: only jobs can be waited for"
            )
        return job
    raise InvalidJob(
        f"depends_on takes jobs (Job handles or ids) or drumbeat.Dependency(...), got {job!r}"
    )


def shard_of_dependent(prepared: Prepared, chosen: int) -> int:
    """The job shard of a job with dependencies: theirs (a script touches one shard), which
    must also be the one its id, dedup key or limits chose (``chosen``), else `InvalidJob`."""
    o = prepared.options
    shards = {job_shard_of(job_id) for job_id, _ in o.depends_on}
    if len(shards) > 1 or shards != {chosen}:
        where = ", ".join(f"{job_id} (shard {job_shard_of(job_id)})" for job_id, _ in o.depends_on)
        raise InvalidJob(
            f"a job of task {prepared.task!r} would live in job shard {chosen} but depends on "
            f"{where}: a job and its dependencies must share a job shard (Settings.job_shards; "
            "drop the dedup key or limits that placed it, or chain the jobs with app.chain)"
        )
    return chosen


def check_dependent(prepared: Prepared, unique_ms: int) -> None:
    """What a job with dependencies cannot also have, refused at enqueue."""
    o = prepared.options
    if o.delay or o.at is not None:
        raise InvalidJob(
            f"a job of task {prepared.task!r} with depends_on cannot have delay= or at=: it "
            "runs once its dependencies ended"
        )
    if unique_ms:
        raise InvalidJob(
            f"a job of task {prepared.task!r} with depends_on cannot have unique_for: a dedup "
            "key holds while it lives"
        )


def raise_if_refused(exc: Exception) -> None:
    """Raises `UnknownDependency` if ``exc``, an error Redis answered an enqueue with, is
    enqueue_after.lua's refusal of a dependency; returns otherwise."""
    text = str(exc)
    if UNKNOWN_REPLY not in text:
        return
    named = text.split(UNKNOWN_REPLY, 1)[1].split(maxsplit=1)
    job_id = named[0] if named else "?"
    raise UnknownDependency(
        f"depends_on names job {job_id}, which is unknown, or ended and its outcome was not "
        "kept (result_ttl=0) or has expired; nothing of that enqueue call was written"
    ) from exc


def chain_steps(app: App, steps: Sequence[Prepared]) -> list[Prepared]:
    """``steps``, each after the one before: the next depends on it (on top of its own
    ``depends_on``), all in one job shard, with ids given here so one enqueue sends them
    (the caller checked that each is a `Prepared`: task.py imports this module)."""
    if not steps:
        return []
    first = steps[0].options
    if first.depends_on:
        shard = job_shard_of(first.depends_on[0][0])
    else:
        keyed = next((s.options.key for s in steps if s.options.key is not None), None)
        limited = any(s.options.limits or _task_limited(app, s.task) for s in steps)
        shard = app.enqueuer.shard_for(keyed, limited, app.enqueuer.next_turn())
    chained, previous = [], None
    for step in steps:
        o = step.options
        # The step before comes first: `current_job().dependencies[0]` is it.
        after = o.depends_on if previous is None else ((previous, False), *o.depends_on)
        previous = new_job_id(shard)
        options = dataclasses.replace(o, depends_on=after, job_id=previous)
        chained.append(dataclasses.replace(step, options=options))
    return chained


def sent_one_by_one(chained: Sequence[Prepared]) -> bool:
    """Whether a chain goes one step per enqueue: when a step before the last has a dedup key.
    A step found a duplicate keeps the id of the job holding its key, which the next step must
    wait for; one script call learns it in time (enqueue_after.lua), separate calls would not."""
    return any(step.options.key is not None for step in chained[:-1])


def after_previous(step: Prepared, previous: Job[Any] | None) -> Prepared:
    """A step of `chain_steps` made to wait for ``previous``, the job its enqueue returned."""
    o = step.options
    if previous is None or not o.depends_on:
        return step
    after = ((previous.id, False), *o.depends_on[1:])
    return dataclasses.replace(step, options=dataclasses.replace(o, depends_on=after))


def _task_limited(app: App, task: str) -> bool:
    known = app.tasks.get(task)
    return bool(known is not None and known.limits)
