"""The queues, running jobs and workers of one App, as status, the dashboard and the
autoscaler read them."""

from __future__ import annotations

import dataclasses
import json
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from drumbeat import connections
from drumbeat.job import decode_progress
from drumbeat.keys import DEFAULT_QUEUE, Keys
from drumbeat.protocol import (
    LEASES_HELD,
    MARKERS_FIELD,
    MAX_PRIORITY,
    MIN_PRIORITY,
    PARKED_FIELD,
    PRIORITY_SPAN,
    parse_owner,
    ready_score,
)

from ._replies import int_or_none, pairs, text, time_ms
from .pausing import paused_queues

if TYPE_CHECKING:
    import redis

    from drumbeat.app import App

#: A worker whose heartbeat is older than this many leases is reaped as gone (as `Worker` does).
WORKER_TTL_LEASES = 3


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
    booked); waiting schedules are counted by `schedule_stats`, and the markers of limiter
    keys that `due` also holds are left out."""
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
    waiting: int = 0
    """Jobs waiting for their dependencies (docs/workflows.md), in no queue: counted over
    every queue (`deps` is one hash per job shard)."""

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
    paused: bool = False
    """Whether it is paused (`App.pause_queue`): no worker takes its jobs."""

    @property
    def ready(self) -> int:
        return sum(self.ready_by_priority)


def level_range(priority: int) -> tuple[int, str]:
    """The ``ZCOUNT`` bounds of one priority level in `ready`: ``[base, base + span)``."""
    base = ready_score(priority, 0)
    return base, f"({base + PRIORITY_SPAN}"


def queue_stats(app: App, running_limit: int = 50) -> QueueStats:
    """Counts per priority level, delayed, running (with leases), dead and live workers.

    Summed over every shard the workers claim from (the jobs' shard, and the schedule shards
    when there are several), and per queue (a paused one listed even before any job was sent
    to it). Four round trips: the queues (`App.known_queues`), the paused ones, the counts,
    the lease listings and the workers (a transaction when there is one shard), and the
    owners of the listed leases. Parked jobs, and the limiter markers left out of
    "delayed", are read from each shard's `parking` counters, not counted by a scan.
    """
    shards = _claimed_shards(app)
    client = app.redis
    paused = paused_queues(app)
    others = [q for q in dict.fromkeys([*app.known_queues(), *paused]) if q != DEFAULT_QUEUE]
    levels = range(MIN_PRIORITY, MAX_PRIORITY + 1)
    limit = max(0, running_limit)
    with connections.pipeline(client, transaction=len(shards) == 1) as pipe:
        pipe.time()
        for k in shards:
            for priority in levels:
                low, high = level_range(priority)
                pipe.zcount(k.ready, low, high)
            pipe.zcard(k.due)
            _leases(pipe, k, limit)
            pipe.hgetall(k.parking)
            pipe.hvals(k.busy)  # time-slot runs held: no leases, counted per worker
        for k in app.job_keys:  # other queues are in the job shards only
            _count_queues(pipe, k, others)
        for k in app.job_keys:
            pipe.zcard(k.dead)
        for k in app.job_keys:
            pipe.hlen(k.deps)
        main = app.keys
        pipe.zrange(main.workers, 0, -1, withscores=True)
        pipe.hgetall(main.workerinfo)
        raw = pipe.execute()
    now_ms = time_ms(raw[0])
    default, running_total, listed, parking = _shard_counts(shards, raw[1:])
    queues = [_parked(default, parking)]
    at = 1 + len(shards) * _PER_SHARD
    width = len(others) * (len(levels) + 1)
    per_shard = [
        _queue_counts(others, raw[at + i * width : at + (i + 1) * width])
        for i in range(len(app.job_keys))
    ]
    queues += [_parked(_summed(parts), parking) for parts in zip(*per_shard, strict=True)]
    queues = [dataclasses.replace(q, paused=q.name in paused) for q in queues]
    counts = [sum(q.ready_by_priority[p] for q in queues) for p in levels]
    delayed = sum(q.delayed for q in queues)
    at += len(app.job_keys) * width
    dead = sum(int(n) for n in raw[at : at + len(app.job_keys)])
    at += len(app.job_keys)
    waiting = sum(int(n) for n in raw[at : at + len(app.job_keys)])
    workers, infos = raw[at + len(app.job_keys) :]
    listed = sorted(listed)[:limit]  # closest to expiry first, over all shards
    running = _running(client, listed, now_ms)

    ttl_ms = app.settings.lease_ms * WORKER_TTL_LEASES
    info_by_id = {text(key): value for key, value in infos.items()}
    live: list[WorkerStats] = []
    stale = 0
    for worker_id, score in pairs(workers):
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
        waiting=waiting,
    )


# Replies per shard in `queue_stats`: ready per priority, due, leases held, the leases listed,
# the `parking` counters, the time-slot runs held per worker incarnation.
_PER_SHARD = MAX_PRIORITY - MIN_PRIORITY + 6


def _shard_counts(
    shards: Sequence[Keys], raw: Sequence[Any]
) -> tuple[QueueCounts, int, list[tuple[float, str, Keys]], dict[str, int]]:
    """The per-shard replies of `queue_stats`, summed: the default queue's counts (its
    parked jobs not yet added), runs held (leases, and time-slot runs), the leases listed, the
    `parking` counters."""
    levels = MAX_PRIORITY - MIN_PRIORITY + 1
    counts = [0] * levels
    delayed = running_total = 0
    listed: list[tuple[float, str, Keys]] = []
    parking: dict[str, int] = defaultdict(int)
    for i, k in enumerate(shards):
        part = raw[i * _PER_SHARD : (i + 1) * _PER_SHARD]
        counts = [c + int(n) for c, n in zip(counts, part[:levels], strict=True)]
        delayed += int(part[levels])
        running_total += int(part[levels + 1]) + sum(int(n) for n in part[levels + 4])
        listed += [(score, job_id, k) for job_id, score in pairs(part[levels + 2])]
        for field, n in part[levels + 3].items():
            parking[text(field)] += int(n)
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
    now_ms = time_ms(raw[0])
    total = sum(int(n) for n in raw[1::2])
    listed = [(score, job_id, k) for k, part in zip(shards, raw[2::2], strict=True)
              for job_id, score in pairs(part)]  # fmt: skip
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
        parsed = parse_owner(text(owner))
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
        pid=int_or_none(info.get("pid")),
        concurrency=int_or_none(info.get("concurrency")),
        running=int_or_none(info.get("running")),
        processed=int_or_none(info.get("processed")),
        started_ms=int_or_none(info.get("started_ms")),
        heartbeat_ms=beat_ms,
        heartbeat_age=max(0, now_ms - beat_ms) / 1000,
    )
