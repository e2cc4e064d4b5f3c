"""Read-only inspection of one App's queue, and the dead-letter admin (retry, purge).

Everything here is synchronous and reads the time from Redis (``TIME``), never the local
clock, so ages are right however far this machine's clock drifts from the workers'.
"""

from __future__ import annotations

import contextlib
import json
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from . import connections
from .errors import SerializationError
from .job import decode_outcome, decode_progress, decode_spec
from .keys import DEFAULT_QUEUE, WHEEL_BUCKETS, Keys, job_shard_of
from .protocol import (
    LATENESS_WINDOW_MS,
    LEASES_HELD,
    MARKERS_FIELD,
    MAX_PRIORITY,
    MIN_PRIORITY,
    PARKED_FIELD,
    PRIORITY_SPAN,
    bin_percentile_ms,
    parse_owner,
    ready_score,
    wheel_marker,
)
from .scripts import Call, Scripts

if TYPE_CHECKING:
    import redis

    from .app import App

__all__ = [
    "DeadLetter",
    "QueueCounts",
    "QueueStats",
    "RunningJob",
    "WorkerStats",
    "dead_count",
    "dead_letters",
    "purge_dead",
    "queue_stats",
    "ready_by_queue",
    "retry_dead",
    "running_jobs",
]

#: A worker whose heartbeat is older than this many leases is reaped as gone (as `Worker` does).
WORKER_TTL_LEASES = 3

UNKNOWN_TASK = "?"


@dataclass(frozen=True, slots=True)
class RunningJob:
    """A job under a lease: who runs it, for how long, and how long its lease still holds."""

    id: str
    worker: str
    claimed_ms: int
    deadline_ms: int
    lease_age: float
    """Seconds since the running attempt was claimed."""
    lease_left: float
    """Seconds until the lease expires unless renewed (negative: expired, not yet reaped)."""
    progress: Any = None
    """The progress it last saved at a checkpoint, if any."""


@dataclass(frozen=True, slots=True)
class WorkerStats:
    """A worker process, from its last heartbeat."""

    id: str
    host: str | None
    pid: int | None
    concurrency: int | None
    running: int | None
    processed: int | None
    started_ms: int | None
    heartbeat_ms: int
    heartbeat_age: float
    """Seconds since its last heartbeat."""


@dataclass(frozen=True, slots=True)
class QueueStats:
    """A snapshot of one namespace's queue."""

    now_ms: int
    """Redis server time of the snapshot."""
    ready_by_priority: tuple[int, ...]
    """Jobs waiting in `ready`, indexed by priority 0..9, over all queues."""
    delayed: int
    """Jobs waiting in `due` (delayed, backing off before a retry, or a rate-limited start
    booked); waiting schedules are counted by `schedule_stats`, and the markers of schedule
    buckets and limiter keys that `due` also holds are left out."""
    running_total: int
    running: tuple[RunningJob, ...]
    """At most the ``running_limit`` leases closest to expiry."""
    dead: int
    workers: tuple[WorkerStats, ...]
    """Workers whose last heartbeat is recent enough to count them as alive."""
    stale_workers: int
    """Registered workers that stopped heartbeating and were not swept yet."""
    queues: tuple[QueueCounts, ...] = ()
    """Per queue (the default one first, then by name): ready per priority, delayed, parked."""
    parked: int = 0
    """Jobs (and schedule runs) parked on a limiter key: they wait for a rate or concurrency
    limit, in no `ready` and no `due`."""

    @property
    def ready(self) -> int:
        return sum(self.ready_by_priority)


@dataclass(frozen=True, slots=True)
class QueueCounts:
    """What waits in one queue."""

    name: str
    ready_by_priority: tuple[int, ...]
    """Jobs waiting in the queue's `ready`, indexed by priority 0..9."""
    delayed: int
    parked: int = 0
    """Its jobs parked on a limiter key."""

    @property
    def ready(self) -> int:
        return sum(self.ready_by_priority)


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


def _str(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _pairs(raw: Any) -> list[tuple[str, float]]:
    """A ``WITHSCORES`` reply as (member, score) pairs."""
    return [(_str(member), float(score)) for member, score in raw]


def _members(raw: Any) -> list[str]:
    return [_str(member) for member in raw]


def _time_ms(raw: Any) -> int:
    seconds, micros = raw
    return int(seconds) * 1000 + int(micros) // 1000


def level_range(priority: int) -> tuple[int, str]:
    """The ``ZCOUNT`` bounds of one priority level in `ready`: ``[base, base + span)``."""
    base = ready_score(priority, 0)
    return base, f"({base + PRIORITY_SPAN}"


def queue_stats(app: App, running_limit: int = 50) -> QueueStats:
    """Counts per priority level, delayed, running (with leases), dead and live workers.

    Summed over every shard the workers claim from (the jobs' shard, and the schedule shards
    when there are several), and per queue. Three round trips: the queues (`App.known_queues`),
    the counts, the lease listings and the workers (a transaction when there is one shard), and
    the owners of the listed leases. Parked jobs, and the limiter markers left out of
    "delayed", are read from each shard's `parking` counters, not counted by a scan.
    """
    shards = _claimed_shards(app)
    client = app.redis
    others = [q for q in app.known_queues() if q != DEFAULT_QUEUE]
    levels = range(MIN_PRIORITY, MAX_PRIORITY + 1)
    limit = max(0, running_limit)
    with connections.pipeline(client, transaction=len(shards) == 1) as pipe:
        pipe.time()
        for k in shards:
            for priority in levels:
                low, high = level_range(priority)
                pipe.zcount(k.ready, low, high)
            pipe.zcard(k.due)
            pipe.zmscore(k.due, _MARKERS)  # schedule buckets' markers: not delayed jobs
            _leases(pipe, k, limit)
            pipe.hgetall(k.parking)
        for k in app.job_keys:  # other queues are in the job shards only
            _count_queues(pipe, k, others)
        for k in app.job_keys:
            pipe.zcard(k.dead)
        main = app.keys
        pipe.zrange(main.workers, 0, -1, withscores=True)
        pipe.hgetall(main.workerinfo)
        raw = pipe.execute()
    now_ms = _time_ms(raw[0])
    default, running_total, listed, parking = _shard_counts(shards, raw[1:])
    queues = [_parked(default, parking)]
    at = 1 + len(shards) * _PER_SHARD
    width = len(others) * (len(levels) + 1)
    per_shard = [
        _queue_counts(others, raw[at + i * width : at + (i + 1) * width])
        for i in range(len(app.job_keys))
    ]
    queues += [_parked(_summed(parts), parking) for parts in zip(*per_shard, strict=True)]
    counts = [sum(q.ready_by_priority[p] for q in queues) for p in levels]
    delayed = sum(q.delayed for q in queues)
    at += len(app.job_keys) * width
    dead = sum(int(n) for n in raw[at : at + len(app.job_keys)])
    workers, infos = raw[at + len(app.job_keys) :]
    listed = sorted(listed)[:limit]  # closest to expiry first, over all shards
    running = _running(client, listed, now_ms)

    ttl_ms = app.settings.lease_ms * WORKER_TTL_LEASES
    info_by_id = {_str(key): value for key, value in infos.items()}
    live: list[WorkerStats] = []
    stale = 0
    for worker_id, score in _pairs(workers):
        beat_ms = int(score)
        if now_ms - beat_ms > ttl_ms:
            stale += 1
            continue
        live.append(_worker_stats(worker_id, beat_ms, now_ms, info_by_id.get(worker_id)))
    live.sort(key=lambda w: w.id)

    return QueueStats(
        now_ms=now_ms,
        ready_by_priority=tuple(counts),
        delayed=delayed,
        running_total=running_total,
        running=tuple(running),
        dead=int(dead),
        workers=tuple(live),
        stale_workers=stale,
        queues=tuple(queues),
        parked=sum(q.parked for q in queues),
    )


# Replies per shard in `queue_stats`: ready per priority, due, its wheel markers, leases held,
# the leases listed, the `parking` counters.
_PER_SHARD = MAX_PRIORITY - MIN_PRIORITY + 6


def _shard_counts(
    shards: Sequence[Keys], raw: Sequence[Any]
) -> tuple[QueueCounts, int, list[tuple[float, str, Keys]], dict[str, int]]:
    """The per-shard replies of `queue_stats`, summed: the default queue's counts (its
    parked jobs not yet added), leases held, the leases listed, the `parking` counters."""
    levels = MAX_PRIORITY - MIN_PRIORITY + 1
    counts = [0] * levels
    delayed = running_total = 0
    listed: list[tuple[float, str, Keys]] = []
    parking: dict[str, int] = defaultdict(int)
    for i, k in enumerate(shards):
        part = raw[i * _PER_SHARD : (i + 1) * _PER_SHARD]
        counts = [c + int(n) for c, n in zip(counts, part[:levels], strict=True)]
        markers = sum(score is not None for score in part[levels + 1])
        delayed += int(part[levels]) - markers
        running_total += int(part[levels + 2])
        listed += [(score, job_id, k) for job_id, score in _pairs(part[levels + 3])]
        for field, n in part[levels + 4].items():
            parking[_str(field)] += int(n)
    return QueueCounts(DEFAULT_QUEUE, tuple(counts), delayed), running_total, listed, parking


def running_jobs(app: App, limit: int = 100) -> tuple[int, int, list[RunningJob]]:
    """``(now_ms, leases held, the limit leases closest to expiry)`` over every shard workers
    claim from, in two round trips (the leases, then their owners and progress)."""
    shards = _claimed_shards(app)
    with connections.pipeline(app.redis, transaction=len(shards) == 1) as pipe:
        pipe.time()
        for k in shards:
            _leases(pipe, k, max(0, limit))
        raw = pipe.execute()
    now_ms = _time_ms(raw[0])
    total = sum(int(n) for n in raw[1::2])
    listed = [(score, job_id, k) for k, part in zip(shards, raw[2::2], strict=True)
              for job_id, score in _pairs(part)]  # fmt: skip
    listed = sorted(listed)[: max(0, limit)]
    return now_ms, total, _running(app.redis, listed, now_ms)


def _leases(pipe: Any, keys: Keys, limit: int) -> None:
    """Queues the count of the leases a shard holds and its ``limit`` closest to expiry (two
    replies), without the member kept so that `leases` stays a skiplist (`LEASES_KEEP`)."""
    pipe.zcount(keys.leases, *LEASES_HELD)
    pipe.zrangebyscore(keys.leases, *LEASES_HELD, start=0, num=limit, withscores=True)


def _count_queues(pipe: Any, keys: Keys, queues: Sequence[str]) -> None:
    """Queues the counts of each of ``queues`` (ready per priority, then delayed)."""
    for queue in queues:
        for priority in range(MIN_PRIORITY, MAX_PRIORITY + 1):
            pipe.zcount(keys.ready_of(queue), *level_range(priority))
        pipe.zcard(keys.due_of(queue))


def _queue_counts(queues: Sequence[str], raw: Sequence[Any]) -> list[QueueCounts]:
    """The replies of `_count_queues`, per queue."""
    width = MAX_PRIORITY - MIN_PRIORITY + 2
    out = []
    for i, queue in enumerate(queues):
        part = raw[i * width : (i + 1) * width]
        out.append(QueueCounts(queue, tuple(int(n) for n in part[:-1]), int(part[-1])))
    return out


def _summed(parts: Sequence[QueueCounts]) -> QueueCounts:
    """One queue's counts over the job shards."""
    by_priority = tuple(sum(n) for n in zip(*(p.ready_by_priority for p in parts), strict=True))
    return QueueCounts(parts[0].name, by_priority, sum(p.delayed for p in parts))


def _parked(counts: QueueCounts, parking: Mapping[str, int]) -> QueueCounts:
    """``counts`` with its parked jobs, and without the limiter markers its `due` holds (the
    `parking` counters summed over the shards; clamped at 0: jobs parked before the counters
    existed were never counted in, but are counted off as they move on)."""
    markers = max(0, parking.get(MARKERS_FIELD + counts.name, 0))
    parked = max(0, parking.get(PARKED_FIELD + counts.name, 0))
    delayed = max(0, counts.delayed - markers)
    return QueueCounts(counts.name, counts.ready_by_priority, delayed, parked)


_MARKERS = [wheel_marker(bucket) for bucket in range(WHEEL_BUCKETS)]


def ready_by_queue(stats: QueueStats) -> dict[str, tuple[int, ...]]:
    """Ready jobs per queue, each indexed by priority 0..9 (what the dashboard and
    ``drumbeat_queue_ready{queue,priority}`` show)."""
    if not stats.queues:
        return {DEFAULT_QUEUE: stats.ready_by_priority}
    return {q.name: q.ready_by_priority for q in stats.queues}


def _claimed_shards(app: App) -> list[Keys]:
    """The shards workers claim from: the job shards, then schedule shards if apart."""
    if app.settings.schedule_shards > 1:
        return [*app.job_keys, *app.scheduler.apart]
    return list(app.job_keys)


def _running(
    client: redis.Redis, listed: list[tuple[float, str, Keys]], now_ms: int
) -> list[RunningJob]:
    by_shard: dict[str, tuple[Keys, list[tuple[float, str]]]] = {}
    for score, job_id, k in listed:
        by_shard.setdefault(k.owners, (k, []))[1].append((score, job_id))
    owner_of: dict[tuple[str, str], Any] = {}
    progress_of: dict[tuple[str, str], Any] = {}
    if by_shard:
        with client.pipeline(transaction=False) as pipe:
            for k, items in by_shard.values():
                pipe.hmget(k.owners, [job_id for _, job_id in items])
                pipe.hmget(k.progress, [job_id for _, job_id in items])
            replies = pipe.execute()
        for (k, items), owners, saved in zip(
            by_shard.values(), replies[::2], replies[1::2], strict=True
        ):
            for (_, job_id), owner, progress in zip(items, owners, saved, strict=True):
                owner_of[(k.owners, job_id)] = owner
                progress_of[(k.owners, job_id)] = decode_progress(progress)
    running: list[RunningJob] = []
    for score, job_id, k in listed:
        owner = owner_of.get((k.owners, job_id))
        if owner is None:  # finished between the two round trips
            continue
        parsed = parse_owner(_str(owner))
        worker, claimed_ms = ("?", 0) if parsed is None else (parsed.worker, parsed.claimed_ms)
        deadline = int(score)
        running.append(
            RunningJob(
                id=job_id,
                worker=worker,
                claimed_ms=claimed_ms,
                deadline_ms=deadline,
                lease_age=(now_ms - claimed_ms) / 1000,
                lease_left=(deadline - now_ms) / 1000,
                progress=progress_of.get((k.owners, job_id)),
            )
        )
    return running


def _worker_stats(worker_id: str, beat_ms: int, now_ms: int, raw: bytes | None) -> WorkerStats:
    info: dict[str, Any] = {}
    if raw is not None:
        try:
            decoded = json.loads(raw)
        except ValueError:
            decoded = None
        if isinstance(decoded, dict):
            info = decoded
    host = info.get("host")
    return WorkerStats(
        id=worker_id,
        host=host if isinstance(host, str) else None,
        pid=_int(info.get("pid")),
        concurrency=_int(info.get("concurrency")),
        running=_int(info.get("running")),
        processed=_int(info.get("processed")),
        started_ms=_int(info.get("started_ms")),
        heartbeat_ms=beat_ms,
        heartbeat_age=max(0, now_ms - beat_ms) / 1000,
    )


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
               for job_id, score in _pairs(top)]  # fmt: skip
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
            attempt = _int(record.get("attempt"))
            raw_tb = record.get("traceback")
            tb = raw_tb if isinstance(raw_tb, str) else None
    return DeadLetter(job_id, died_ms, task, error, attempt, tb, progress)


def dead_count(app: App) -> int:
    """How many jobs are in the dead-letter set."""
    with app.redis.pipeline(transaction=False) as pipe:
        for k in app.job_keys:
            pipe.zcard(k.dead)
        return sum(int(n) for n in pipe.execute())


def retry_dead(app: App, ids: Sequence[str] | None) -> int:
    """Requeue dead letters with a fresh set of attempts; ``None`` requeues all of them.

    Returns how many were requeued (ids not in the dead set, or without a job record, are
    skipped).
    """
    queues = app.known_queues()
    return _apply(app, ids, lambda scripts, batch: scripts.revive(batch, queues))


def purge_dead(app: App, ids: Sequence[str] | None) -> int:
    """Delete dead letters for good; ``None`` deletes all of them. Returns how many."""
    return _apply(app, ids, lambda scripts, batch: scripts.purge(batch))


_Make = Callable[[Scripts, Sequence[str]], Call[int]]


def _apply(app: App, ids: Sequence[str] | None, make: _Make) -> int:
    """``make``'s calls over ``ids`` (each in the job shard it names), or over every dead
    letter of every job shard."""
    batch = app.settings.batch_limit
    client = app.redis
    if ids is None:
        return sum(
            _apply_all(app, k, s, make) for k, s in zip(app.job_keys, app.job_scripts, strict=True)
        )
    total = 0
    by_shard: dict[int, list[str]] = {}
    for job_id in dict.fromkeys(ids):
        by_shard.setdefault(job_shard_of(job_id), []).append(job_id)
    for group in by_shard.values():
        _, scripts = app.job_shard(group[0])
        total += sum(make(scripts, group[i : i + batch]).run(client)
                     for i in range(0, len(group), batch))  # fmt: skip
    return total


def _apply_all(app: App, keys: Keys, scripts: Scripts, make: _Make) -> int:
    """Walks one shard's dead set oldest first up to the newest entry present now, so jobs
    that die again meanwhile (a retried job failing at once) are not picked up in a loop.
    Entries a script skips stay in place, so the offset moves past them."""
    batch = app.settings.batch_limit
    client = app.redis
    dead = keys.dead
    newest = _pairs(client.zrange(dead, -1, -1, withscores=True))
    if not newest:
        return 0
    upto = int(newest[0][1])
    total, offset = 0, 0
    while True:
        chunk = _members(client.zrange(dead, "-inf", upto, byscore=True, offset=offset, num=batch))
        if not chunk:
            return total
        done = make(scripts, chunk).run(client)
        total += done
        offset += len(chunk) - done


# -- schedules ---------------------------------------------------------------------------------

# The lateness histogram's ring (protocol.py) holds a few more windows than the minute read.
LATENESS_WINDOWS_PER_MINUTE = 60_000 // LATENESS_WINDOW_MS


@dataclass(frozen=True, slots=True)
class Lateness:
    """Run lateness (start - due) over the last minute; percentiles are bin upper bounds."""

    runs: int
    p50_ms: float | None
    p99_ms: float | None
    max_ms: int | None


@dataclass(frozen=True, slots=True)
class ScheduleStats:
    total: int
    """Schedules registered, over every shard."""
    shards: int
    lateness: Lateness


def lateness_summary(
    fields: Mapping[Any, Any], now_ms: int, windows: int = LATENESS_WINDOWS_PER_MINUTE
) -> Lateness:
    """Merge the last ``windows`` windows (by default the last minute's) from one or more
    shards' `lateness` hashes."""
    current = now_ms // LATENESS_WINDOW_MS
    counts: dict[int, int] = defaultdict(int)
    top: int | None = None
    held = {k: v for k, v in ((_str(k), _str(v)) for k, v in fields.items())}
    recent = {name[1:] for name, value in held.items()
              if name.startswith("w") and current - int(value) < windows}  # fmt: skip
    for name, value in held.items():  # one pass: the ring holds thousands of fields
        if name.startswith("b"):
            slot, _, bin_ = name[1:].partition(":")
            if slot in recent:
                counts[int(bin_)] += int(value)
        elif name.startswith("m") and name[1:] in recent:
            top = max(top or 0, int(value))
    total = sum(counts.values())
    if not total:
        return Lateness(0, None, None, None)
    return Lateness(total, bin_percentile_ms(counts, 0.50), bin_percentile_ms(counts, 0.99), top)


def schedule_stats(app: App) -> ScheduleStats:
    """How many schedules there are and how late their runs started over the last minute."""
    client = app.redis
    shards = app.scheduler.shards
    with connections.pipeline(client, transaction=False) as pipe:
        pipe.time()
        for keys in shards:
            pipe.hgetall(keys.lateness)
        raw = pipe.execute()
    now_ms = _time_ms(raw[0])
    merged: dict[str, str] = {}
    for i, _keys in enumerate(shards):
        # Shards' windows and bins line up; prefix slots by shard so they merge as windows.
        for k, v in raw[1 + i].items():
            name = _str(k)
            merged[f"{name[0]}{i}.{name[1:]}"] = _str(v)
    total = app.scheduler.count(client)
    return ScheduleStats(total, len(app.scheduler.apart) or 1, lateness_summary(merged, now_ms))
