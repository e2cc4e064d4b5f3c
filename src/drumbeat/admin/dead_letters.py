"""The dead-letter set: listed, counted, retried, purged, over every job shard."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

from drumbeat.errors import SerializationError
from drumbeat.job import decode_outcome, decode_progress, decode_spec
from drumbeat.job_ids import job_shard_of
from drumbeat.keys import Keys
from drumbeat.scripts import Call, Scripts

from ._replies import int_or_none, members, pairs

if TYPE_CHECKING:
    from drumbeat.app import App

UNKNOWN_TASK = "?"
R = TypeVar("R", int, "Revived")


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A job in the dead-letter set, with the failure that put it there."""

    id: str
    died_ms: int
    task: str
    """The task name, or ``"?"`` when the job record is missing or malformed."""
    error: str
    attempt: int | None
    traceback: str | None
    progress: Any = None
    """The progress it last saved at a checkpoint (a retry resumes from it), if any."""

    @property
    def died_at(self) -> datetime:
        return datetime.fromtimestamp(self.died_ms / 1000, tz=UTC)


def dead_letters(app: App, limit: int = 50) -> list[DeadLetter]:
    """The newest ``limit`` dead letters over the job shards, newest first, with their task
    and failure."""
    if limit <= 0:
        return []
    client = app.redis
    with client.pipeline(transaction=False) as pipe:
        for k in app.job_keys:
            pipe.zrange(k.dead, 0, limit - 1, desc=True, withscores=True)
        tops = pipe.execute()
    entries = [(score, job_id, k) for k, top in zip(app.job_keys, tops, strict=True)
               for job_id, score in pairs(top)]  # fmt: skip
    entries = sorted(entries, key=lambda e: -e[0])[:limit]
    if not entries:
        return []
    with client.pipeline(transaction=False) as pipe:
        for _, job_id, k in entries:
            pipe.hget(k.errors, job_id)
            pipe.hget(k.jobs, job_id)
            pipe.hget(k.progress, job_id)
        raw = pipe.execute()
    return [
        _dead_letter(
            job_id, int(score), raw[3 * i], raw[3 * i + 1], decode_progress(raw[3 * i + 2])
        )
        for i, (score, job_id, _) in enumerate(entries)
    ]


def _dead_letter(
    job_id: str, died_ms: int, err: bytes | None, spec: bytes | None, progress: Any = None
) -> DeadLetter:
    task = UNKNOWN_TASK
    if spec is not None:
        with contextlib.suppress(SerializationError):
            task = decode_spec(spec).task
    error, attempt, tb = "(no error record)", None, None
    if err is not None:
        try:
            record = decode_outcome(err)
        except Exception:  # a foreign or corrupt record: show it rather than fail the listing
            error = f"(unreadable error record) {err[:200]!r}"
        else:
            error = str(record.get("error", "(no error text)"))
            attempt = int_or_none(record.get("attempt"))
            raw_tb = record.get("traceback")
            tb = raw_tb if isinstance(raw_tb, str) else None
    return DeadLetter(job_id, died_ms, task, error, attempt, tb, progress)


def dead_count(app: App) -> int:
    """How many jobs are in the dead-letter set."""
    with app.redis.pipeline(transaction=False) as pipe:
        for k in app.job_keys:
            pipe.zcard(k.dead)
        return sum(int(n) for n in pipe.execute())


@dataclass(frozen=True, slots=True)
class Revived:
    """What `retry_dead` brought back (lua/revive.lua)."""

    jobs: int = 0
    """Dead letters requeued (ids not in the dead set, or without a job record, are skipped)."""
    dependents: int = 0
    """Dependents that were dead-lettered with them (their dependency failed) and came back to
    wait for them: not in ``jobs`` (docs/workflows.md, *Dead-letter retry*)."""
    outside_batch: int = 0
    """Of the jobs and dependents, the batch members whose batch had already ended (or was
    cancelled) when they came back: it is not reopened, they run outside its counts."""

    def __add__(self, other: Revived) -> Revived:
        return Revived(
            self.jobs + other.jobs,
            self.dependents + other.dependents,
            self.outside_batch + other.outside_batch,
        )


def retry_dead(app: App, ids: Sequence[str] | None) -> Revived:
    """Requeue dead letters with a fresh set of attempts; ``None`` requeues all of them.

    Returns how many were requeued, and how many dependents came back with them.
    """
    queues = app.known_queues()
    return _apply(app, ids, lambda scripts, batch: _revive(scripts, batch, queues), Revived())


def _revive(scripts: Scripts, ids: Sequence[str], queues: Sequence[str]) -> Call[Revived]:
    call = scripts.revive(ids, queues)
    return Call(call.name, call.keys, call.args, lambda raw: Revived(*call.parse(raw)))


def purge_dead(app: App, ids: Sequence[str] | None) -> int:
    """Delete dead letters for good; ``None`` deletes all of them. Returns how many."""
    return _apply(app, ids, lambda scripts, batch: scripts.purge(batch), 0)


def _apply(
    app: App, ids: Sequence[str] | None, make: Callable[[Scripts, Sequence[str]], Call[R]], zero: R
) -> R:
    """``make``'s calls over ``ids`` (each in the job shard it names), or over every dead
    letter of every job shard; their replies added up from ``zero``."""
    batch = app.settings.batch_limit
    client = app.redis
    total = zero
    if ids is None:
        for k, s in zip(app.job_keys, app.job_scripts, strict=True):
            total = total + _apply_all(app, k, s, make, zero)
        return total
    by_shard: dict[int, list[str]] = {}
    for job_id in dict.fromkeys(ids):
        by_shard.setdefault(job_shard_of(job_id), []).append(job_id)
    for group in by_shard.values():
        _, scripts = app.job_shard(group[0])
        for i in range(0, len(group), batch):
            total = total + make(scripts, group[i : i + batch]).run(client)
    return total


def _apply_all(
    app: App, keys: Keys, scripts: Scripts, make: Callable[[Scripts, Sequence[str]], Call[R]],
    zero: R,
) -> R:  # fmt: skip
    """Walks one shard's dead set oldest first up to the newest entry present now, so jobs
    that die again meanwhile (a retried job failing at once) are not picked up in a loop.
    Entries a script skips stay in place, so the offset moves past them: it is how many of
    the entries walked are still there, read again after each call, since a retry also takes
    out the dependents it brings back to wait (lua/_workflows.lua: adopt_orphans), wherever
    they stand in the set."""
    batch = app.settings.batch_limit
    client = app.redis
    dead = keys.dead
    newest = pairs(client.zrange(dead, -1, -1, withscores=True))
    if not newest:
        return zero
    upto = newest[0][1]
    total = zero
    walked: list[str] = []
    while True:
        offset = len(walked)
        chunk = members(client.zrange(dead, "-inf", upto, byscore=True, offset=offset, num=batch))
        if not chunk:
            return total
        total = total + make(scripts, chunk).run(client)
        walked += chunk
        with client.pipeline(transaction=False) as pipe:
            for job_id in walked:
                pipe.zscore(dead, job_id)
            scores = pipe.execute()
        walked = [j for j, s in zip(walked, scores, strict=True) if s is not None and s <= upto]
