"""The schedule store: where each schedule lives, and the writes and reads `App` offers on it.

Every schedule, plain, limited, routed, cron or interval, paused or not, waits as one entry in
the time slots of its shard (`slots.py`): the worker's lane claims the due slots and runs their
entries, or, for a schedule with limits or routed to another queue, queues the run as a job for
that one attempt (queue_runs.lua; finish_runs.lua settles it). With ``schedule_shards`` 1,
schedules live in the jobs' shard. With S > 1, a schedule lives in one of S schedule shards by
a hash of its id, unless it is limited or routed: such a schedule lives in the jobs' shard,
where the limiter keys and the queues are, so one limiter holds for all its runs and every job
(a limit is exact across shards) and its runs reach their queue. An id's entry is in one of its
`homes`; a change by id goes to each (a no-op where it is not).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import redis
import redis.asyncio as redis_async

from drumbeat.errors import InvalidJob, UnknownTask
from drumbeat.keys import DEFAULT_QUEUE, Keys
from drumbeat.middleware import check_header_size, check_headers
from drumbeat.schedule import (
    check_schedule_id,
    decode_schedule_spec,
    encode_schedule_spec,
    parse_record,
    stable_hash,
)
from drumbeat.scripts import Scripts
from drumbeat.serialization import encode_call
from drumbeat.task import Options, Task

from . import reads
from .changes import SlotChanges, UpsertItem
from .models import Schedule, ScheduleInfo
from .plans import adrive, drive

if TYPE_CHECKING:
    from drumbeat.app import App

T = TypeVar("T")


class ScheduleStore:
    """The schedules of one app (`App.scheduler`): shard routing, and each operation of the
    schedule API, for the sync and the async client."""

    def __init__(self, app: App) -> None:
        self.app = app
        ns, n = app.settings.namespace, app.settings.schedule_shards
        self.apart: list[Keys] = [] if n == 1 else [Keys(ns, i) for i in range(n)]
        """The S schedule shards (none with schedule_shards 1)."""
        self.shards: list[Keys] = [*self.apart, Keys(ns)]
        """Every shard schedules live in, the jobs' shard last."""
        self.scripts = [Scripts(k) for k in self.shards]
        self.apart_scripts = self.scripts[: len(self.apart)]
        self.changes = [SlotChanges(k) for k in self.shards]
        self.jobs_shard = len(self.shards) - 1
        """The index of the jobs' shard in `shards`."""

    def shard_of(self, schedule_id: str) -> int:
        """The shard a schedule of the default queue without limits lives in."""
        if not self.apart:
            return self.jobs_shard
        return stable_hash("shard", schedule_id) % len(self.apart)

    def homes(self, schedule_id: str) -> list[int]:
        """The shards a schedule may live in: its hashed one, then the jobs' shard."""
        shard = self.shard_of(schedule_id)
        return [shard] if shard == self.jobs_shard else [shard, self.jobs_shard]

    # -- writes ------------------------------------------------------------------------------

    def encode(self, schedules: Iterable[Schedule], now_ms: int) -> list[tuple[int, UpsertItem]]:
        """Each schedule checked and encoded, in order (nothing is written if one is bad), as
        (the shard it lives in, its upsert item)."""
        out = []
        settings, codec = self.app.settings, self.app.codec
        for s in schedules:
            if not isinstance(s, Schedule):
                raise InvalidJob(f"schedule_many takes drumbeat.Schedule items, got {s!r}")
            check_schedule_id(s.id)
            task = self._task(s.task)
            cadence = s.cadence
            cadence.validate(settings.min_interval)
            priority = task.config.priority if s.priority is None else s.priority
            queue = task.config.queue if s.queue is None else s.queue
            Options(priority=priority, queue=queue)  # checks both
            encode_call(codec, s.args, s.kwargs, settings.max_payload_bytes)  # names a bad one
            limits = task.call_limits(
                f"schedule {s.id!r}",
                rate_limit=s.rate_limit,
                rate_burst=s.rate_burst,
                concurrency_limit=s.concurrency_limit,
                limit_by=s.limit_by,
                limiter=s.limiter,
            )
            limited = bool(limits or task.limits)
            if limited:  # an unknown limiter, a limit_by the args lack
                self.app.limits_of(limits or task.limits, task, s.args, s.kwargs)
            spec = encode_schedule_spec(
                codec,
                list(s.args),
                dict(s.kwargs),
                cadence,
                None if limits is None else limits.to_record(),
                headers=self._headers(s),
            )
            grid, due = cadence.first_due(s.id, now_ms)
            routed = queue != DEFAULT_QUEUE
            shard = self.jobs_shard if limited or routed else self.shard_of(s.id)
            route = queue if routed else ""
            out.append((shard, (s.id, priority, grid, due, task.name, route, spec)))
        return out

    def upsert(self, schedules: Iterable[Schedule]) -> list[int]:
        """`App.schedule_many`: one code per schedule, 1 created, 2 updated, 0 unchanged."""
        client = self.app.redis
        encoded = self.encode(schedules, now_ms(client))
        moved = self._leaving(encoded)
        gone: set[str] = set()
        for shard, ids in moved.items():
            there = drive(client, reads.held(self.shards[shard], ids))
            held = [i for i, flag in zip(ids, next(there), strict=True) if flag]
            if held:
                self.changes[shard].remove(client, held)
                gone.update(held)
        codes: dict[int, list[int]] = {}
        for shard, items in _grouped(encoded).items():
            codes[shard] = []
            for chunk in self._chunks(items):
                codes[shard] += self.changes[shard].upsert(client, chunk)
        return _in_order(encoded, codes, gone)

    async def aupsert(self, schedules: Iterable[Schedule]) -> list[int]:
        """`upsert` for async callers."""
        client = await self.app.aredis()
        encoded = self.encode(schedules, await anow_ms(client))
        moved = self._leaving(encoded)
        gone: set[str] = set()
        for shard, ids in moved.items():
            (flags,) = await adrive(client, reads.held(self.shards[shard], ids))
            held = [i for i, flag in zip(ids, flags, strict=True) if flag]
            if held:
                await self.changes[shard].aremove(client, held)
                gone.update(held)
        codes: dict[int, list[int]] = {}
        for shard, items in _grouped(encoded).items():
            codes[shard] = []
            for chunk in self._chunks(items):
                codes[shard] += await self.changes[shard].aupsert(client, chunk)
        return _in_order(encoded, codes, gone)

    def _leaving(self, encoded: Sequence[tuple[int, UpsertItem]]) -> dict[int, list[str]]:
        """Per shard, the ids that may live there but now belong in another (with
        schedule_shards > 1, a schedule that became limited or routed moves to the jobs'
        shard, and back when it no longer is): each leaves first, answered 2 (updated). A
        crash in between loses the schedule until it is registered again, where the other
        order would run it twice."""
        out: dict[int, list[str]] = defaultdict(list)
        for shard, item in encoded:
            for other in self.homes(item[0]):
                if other != shard:
                    out[other].append(item[0])
        return out

    def each(self, ids: Iterable[str], act: Callable[[SlotChanges, list[str]], int]) -> int:
        """The sum of ``act`` (a `SlotChanges` call: remove, pause, ...) over ``ids`` in every
        shard each may live in, per `batch_limit` chunk."""
        return sum(
            act(self.changes[shard], chunk)
            for shard, items in self._by_home(ids).items()
            for chunk in self._chunks(items)
        )

    async def aeach(
        self, ids: Iterable[str], act: Callable[[SlotChanges, list[str]], Awaitable[int]]
    ) -> int:
        """`each` for async callers."""
        done = 0
        for shard, items in self._by_home(ids).items():
            for chunk in self._chunks(items):
                done += await act(self.changes[shard], chunk)
        return done

    def resumed(self, now_ms: int) -> Callable[[str, bytes], tuple[int, int, int]]:
        """For `SlotChanges.resume`: a paused schedule's (generation, grid slot, due time)
        when resumed at ``now_ms``, from its record (the paused stretch is not caught up)."""

        def resumed(schedule_id: str, record: bytes) -> tuple[int, int, int]:
            parsed = parse_record(record)
            cadence = decode_schedule_spec(parsed.spec)[2]
            return (parsed.generation, *cadence.first_due(schedule_id, now_ms))

        return resumed

    # -- reads -------------------------------------------------------------------------------

    def iterate(self, prefix: str = "") -> Iterator[ScheduleInfo]:
        """`App.schedules`."""
        return drive(self.app.redis, reads.listing(self, prefix))

    async def alist(self, prefix: str = "") -> list[ScheduleInfo]:
        return await adrive(await self.app.aredis(), reads.listing(self, prefix))

    def get(self, schedule_id: str) -> ScheduleInfo | None:
        """`App.get_schedule`."""
        return next(drive(self.app.redis, reads.lookup(self, schedule_id)), None)

    async def aget(self, schedule_id: str) -> ScheduleInfo | None:
        found = await adrive(await self.app.aredis(), reads.lookup(self, schedule_id))
        return found[0] if found else None

    def run_flying(self, schedule_id: str) -> bool:
        """Whether a run of ``schedule_id`` is claimed by a worker's lane and not settled
        (`Job.status` of its run: a run queued as a job has a job's status)."""
        return bool(next(drive(self.app.redis, reads.in_flight(self, schedule_id)), False))

    async def arun_flying(self, schedule_id: str) -> bool:
        found = await adrive(await self.app.aredis(), reads.in_flight(self, schedule_id))
        return bool(found and found[0])

    def home_of(self, client: redis.Redis, schedule_id: str) -> int | None:
        """The shard a schedule lives in (an index of `shards`), or None."""
        return next(drive(client, reads.home(self, schedule_id)), None)

    async def ahome_of(self, client: redis_async.Redis, schedule_id: str) -> int | None:
        found = await adrive(client, reads.home(self, schedule_id))
        return found[0] if found else None

    def count(self, client: redis.Redis) -> int:
        """How many schedules there are: each shard's `where` holds one field per schedule."""
        with client.pipeline(transaction=False) as pipe:
            for keys in self.shards:
                pipe.hlen(keys.where)
            return sum(int(n) for n in pipe.execute())

    # -- helpers -----------------------------------------------------------------------------

    def _by_home(self, ids: Iterable[str]) -> dict[int, list[str]]:
        out: dict[int, list[str]] = defaultdict(list)
        for schedule_id in ids:
            for shard in self.homes(check_schedule_id(schedule_id)):
                out[shard].append(schedule_id)
        return out

    def _chunks(self, items: list[T]) -> Iterator[list[T]]:
        step = self.app.settings.batch_limit
        for i in range(0, len(items), step):
            yield items[i : i + step]

    def _headers(self, s: Schedule) -> dict[str, str] | None:
        """A schedule's headers, checked (None when it has none)."""
        if not s.headers:
            return None
        headers = check_headers(s.headers, f"schedule {s.id!r}")
        check_header_size(headers, self.app.settings.max_header_bytes, f"schedule {s.id!r}")
        return headers

    def _task(self, task: Task[Any, Any] | str) -> Task[Any, Any]:
        if isinstance(task, Task):
            if self.app.tasks.get(task.name) is not task:
                raise UnknownTask(f"task {task.name!r} is not registered with this app")
            return task
        try:
            return self.app.get_task(task)
        except UnknownTask as exc:
            raise UnknownTask(f"cannot schedule an unknown task: {exc}") from None


def now_ms(client: redis.Redis) -> int:
    """The Redis server's clock, in ms: every schedule time is on it."""
    sec, usec = client.time()
    return int(sec) * 1000 + int(usec) // 1000


async def anow_ms(client: redis_async.Redis) -> int:
    sec, usec = await client.time()
    return int(sec) * 1000 + int(usec) // 1000


def _grouped(encoded: Sequence[tuple[int, UpsertItem]]) -> dict[int, list[UpsertItem]]:
    out: dict[int, list[UpsertItem]] = defaultdict(list)
    for shard, item in encoded:
        out[shard].append(item)
    return out


def _in_order(
    encoded: Sequence[tuple[int, UpsertItem]], codes: dict[int, list[int]], moved: set[str]
) -> list[int]:
    """Each shard's codes back in input order; a schedule that moved between shards is
    answered 2 (updated)."""
    taken: dict[int, Iterator[int]] = {shard: iter(c) for shard, c in codes.items()}
    out = []
    for shard, item in encoded:
        code = next(taken[shard])
        out.append(2 if item[0] in moved else code)
    return out
