"""The job listings of the Jobs page and their JSON: the running jobs, the jobs waiting in one
queue at one priority, and the delayed jobs of one queue (waiting in its `due` for a later time,
or backing off before a retry), each a page at a time (never more than a page is read, whatever
the queue holds).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from drumbeat import admin
from drumbeat.cli.shapes import timestamp
from drumbeat.connections import pipeline
from drumbeat.protocol import LIMIT_PREFIX, MAX_PRIORITY, MIN_PRIORITY, RUN_PREFIX

from .job_record import as_text, describe, parse_state
from .query import BadQuery

if TYPE_CHECKING:
    from drumbeat.app import App
    from drumbeat.keys import Keys

__all__ = [
    "DUE_READS",
    "PAGE",
    "RUNNING_LIMIT",
    "DueCursor",
    "delayed_json",
    "queued_json",
    "running_json",
]

#: Queued jobs listed on one page.
PAGE = 50
#: Running jobs listed (the leases closest to expiry first; the page sorts them by age).
RUNNING_LIMIT = 100
#: `due` reads one page of delayed jobs makes at most: limiter keys' markers share `due` with
#: the jobs and are skipped, so a stretch of markers ends a page short, with a cursor to go on
#: from.
DUE_READS = 8


def running_json(app: App, limit: int = RUNNING_LIMIT) -> dict[str, Any]:
    """The running jobs (the ``limit`` leases closest to expiry), longest-running first."""
    now_ms, total, running = admin.running_jobs(app, limit)
    specs: dict[str, Any] = {}
    plain = [r.id for r in running if not r.id.startswith(RUN_PREFIX)]
    if plain:
        with pipeline(app.redis, transaction=False) as pipe:
            for job_id in plain:  # each in the job shard its id names
                pipe.hget(app.job_shard(job_id)[0].jobs, job_id)
            specs = dict(zip(plain, pipe.execute(), strict=True))
    jobs = [
        {
            "id": r.id,
            **describe(r.id, specs.get(r.id)),
            "worker": r.worker,
            "running_s": r.lease_age,
            "lease_left_s": r.lease_left,
            **timestamp("claimed", r.claimed_ms),
            "progress": r.progress,
        }
        for r in sorted(running, key=lambda r: r.claimed_ms)
    ]
    return {**timestamp("now", now_ms), "total": total, "running": jobs}


def queued_json(
    app: App,
    queue: str,
    priority: int,
    after: int | None = None,
    limit: int = PAGE,
    *,
    shard: int = 0,
) -> dict[str, Any]:
    """The jobs waiting in ``queue`` at ``priority`` in job shard ``shard``, in the order they
    will run, starting after the score ``after`` (the ``next`` of the previous page); with the
    level's counts (in that shard: each shard keeps its own order)."""
    keys = app.job_keys[shard]
    ready = keys.ready_of(queue)
    low, high = admin.level_range(priority)
    start = low if after is None else f"({after}"
    with pipeline(app.redis, transaction=True) as pipe:
        for p in range(MIN_PRIORITY, MAX_PRIORITY + 1):
            pipe.zcount(ready, *admin.level_range(p))
        pipe.zrange(ready, start, high, byscore=True, offset=0, num=limit, withscores=True)
        *counts, page = pipe.execute()
    listed = [(as_text(member), int(score)) for member, score in page]
    ids = [job_id for job_id, _ in listed]
    specs, states = _records(app, keys, ids)
    jobs = []
    for (job_id, score), spec, raw in zip(listed, specs, states, strict=True):
        state = parse_state(raw)
        jobs.append(
            {"id": job_id, **describe(job_id, spec), "attempt": state.attempt if state else None,
             "score": score}
        )  # fmt: skip
    more = len(listed) == limit and limit > 0
    return {
        "queue": queue,
        "shard": shard,
        "priority": priority,
        "count": int(counts[priority]),
        "counts_by_priority": [int(n) for n in counts],
        "jobs": jobs,
        "next": listed[-1][1] if more else None,
    }


@dataclass(frozen=True, slots=True)
class DueCursor:
    """Where the next page of delayed jobs starts: a due time (ms), and how many members of
    `due` with that very score the pages before listed or skipped (due times tie: jobs
    enqueued together with one delay), so that a page reads from its cursor on only."""

    score: int
    skip: int

    def __str__(self) -> str:
        return f"{self.score}.{self.skip}"

    @classmethod
    def parse(cls, text: str) -> DueCursor:
        try:
            score, skip = (int(part) for part in text.split("."))
        except ValueError:
            raise BadQuery(
                f"after must be <due ms>.<skip> as a page's next gives it, got {text!r}"
            ) from None
        if skip < 0:
            raise BadQuery(f"after {text!r} has a negative skip; expected >= 0")
        return cls(score, skip)


def _is_marker(member: str, state: bytes | None) -> bool:
    """A limiter key's marker in `due`, not a job: it has the prefix and no state (a job id
    may hold ``:``, but every job in `due` has a state)."""
    return state is None and member.startswith(LIMIT_PREFIX)


def delayed_json(
    app: App, queue: str, after: DueCursor | None = None, limit: int = PAGE, *, shard: int = 0
) -> dict[str, Any]:
    """The jobs waiting in ``queue``'s `due` (delayed, or backing off before a retry), the
    soonest due first, starting at ``after`` (the ``next`` of the previous page); markers are
    skipped. ``in_due`` counts the members of `due`, markers included (the overview's delayed
    count leaves them out by the `parking` counters)."""
    keys = app.job_keys[shard]
    due = keys.due_of(queue)
    with pipeline(app.redis, transaction=True) as pipe:
        pipe.time()
        pipe.zcard(due)
        now, in_due = pipe.execute()
    score, skip = (None, 0) if after is None else (after.score, after.skip)
    listed: list[tuple[str, int, bytes | None, bytes | None]] = []
    more = limit > 0  # until a read reaches the end of `due`
    for _ in range(DUE_READS if limit > 0 else 0):
        page = cast("list[tuple[bytes, float]]", app.redis.zrange(
            due, "-inf" if score is None else score, "+inf",
            byscore=True, offset=skip, num=limit, withscores=True,
        ))  # fmt: skip
        members = [as_text(member) for member, _ in page]
        specs, states = _records(app, keys, members)
        seen = 0
        for member, (_, raw_score), spec, state in zip(members, page, specs, states, strict=True):
            seen += 1
            at = int(raw_score)
            score, skip = (at, skip + 1) if at == score else (at, 1)
            if not _is_marker(member, state):
                listed.append((member, at, spec, state))
                if len(listed) == limit:
                    break
        if len(page) < limit and seen == len(page):
            more = False
            break
        if len(listed) == limit:
            break
    jobs = []
    for job_id, at, spec, raw in listed:
        state = parse_state(raw)
        jobs.append({
            "id": job_id, **describe(job_id, spec),
            "attempt": state.attempt if state else None,
            "priority": state.priority if state else None,
            **timestamp("due", at),
        })  # fmt: skip
    return {
        **timestamp("now", int(now[0]) * 1000 + int(now[1]) // 1000),
        "queue": queue,
        "shard": shard,
        "in_due": int(in_due),
        "jobs": jobs,
        "next": str(DueCursor(score, skip)) if more and score is not None else None,
    }


def _records(app: App, keys: Keys, ids: list[str]) -> tuple[list[Any], list[Any]]:
    """The job records and states of ``ids`` (their places in ``keys``), in one round trip."""
    if not ids:
        return [], []
    with pipeline(app.redis, transaction=False) as pipe:
        pipe.hmget(keys.jobs, ids)
        pipe.hmget(keys.state, ids)
        specs, states = pipe.execute()
    return specs, states
