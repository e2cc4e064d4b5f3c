"""The schedule methods of `App` (it inherits them from `ScheduleMethods`): each hands its
schedules or ids to the store, ``app.scheduler`` (`ScheduleStore`), on Redis's clock."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from drumbeat.keys import Keys
from drumbeat.schedule import Mode
from drumbeat.scripts import Scripts

from .models import Schedule, ScheduleInfo
from .store import ScheduleStore, anow_ms, now_ms

if TYPE_CHECKING:
    import redis
    import redis.asyncio as redis_async

    from drumbeat.task import Task


class ScheduleMethods:
    """`App`'s schedule API; App provides what is declared here."""

    keys: Keys
    scripts: Scripts
    scheduler: ScheduleStore

    if TYPE_CHECKING:

        @property
        def redis(self) -> redis.Redis: ...

        async def aredis(self) -> redis_async.Redis: ...

    def schedule(
        self,
        id: str,
        task: Task[Any, Any] | str,
        *,
        every: float | None = None,
        cron: str | None = None,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        priority: int | None = None,
        tz: str = "UTC",
        mode: Mode = "rate",
        grace: float | None = None,
        jitter: float = 0.0,
        queue: str | None = None,
        rate_limit: str | None = None,
        rate_burst: int | None = None,
        concurrency_limit: int | None = None,
        limit_by: str | None = None,
        limiter: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        """Create or update (by ``id``) a schedule that runs ``task`` periodically.

        Args:
            every: seconds between runs (fixed rate: no drift, missed runs coalesced).
            cron: a five-field cron expression instead of ``every``, in time zone ``tz``.
            args: the task's positional arguments, as for `Task.enqueue`.
            kwargs: the task's keyword arguments.
            priority: 0..9 against other work; defaults to the task's.
            mode: ``"rate"`` (next = previous due + every) or ``"delay"`` (next = end + every).
            grace: skip (and count) a run that would start more than ``grace`` seconds late.
            jitter: spread each run by up to ``jitter`` seconds (stable per run).
            queue: the queue its runs go to; defaults to the task's. The workers that serve
                the default queue keep every schedule (they promote due runs, as Celery beat
                sends them); a run of another queue waits in that queue for its workers.
            rate_limit: starts per time over every worker (``"200/s"``). This and the four
                below limit this schedule's runs in place of the task's limits (as a whole),
                as `Task.options` takes them.
            rate_burst: starts allowed at once after a pause.
            concurrency_limit: runs at once.
            limit_by: the argument whose value ``concurrency_limit`` counts per.
            limiter: a budget declared with `App.limiter`.
            headers: headers every run carries (``current_job().headers``; str to str).
                Producer middleware does not run for a schedule's runs (no enqueue makes them).
        """
        item = Schedule(
            id, task, every, cron, args, kwargs or {}, priority, tz, mode, grace, jitter, queue,
            rate_limit, rate_burst, concurrency_limit, limit_by, limiter, headers,
        )  # fmt: skip
        self.schedule_many([item])

    async def aschedule(
        self,
        id: str,
        task: Task[Any, Any] | str,
        *,
        every: float | None = None,
        cron: str | None = None,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        priority: int | None = None,
        tz: str = "UTC",
        mode: Mode = "rate",
        grace: float | None = None,
        jitter: float = 0.0,
        queue: str | None = None,
        rate_limit: str | None = None,
        rate_burst: int | None = None,
        concurrency_limit: int | None = None,
        limit_by: str | None = None,
        limiter: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        """`schedule` for async callers."""
        item = Schedule(
            id, task, every, cron, args, kwargs or {}, priority, tz, mode, grace, jitter, queue,
            rate_limit, rate_burst, concurrency_limit, limit_by, limiter, headers,
        )  # fmt: skip
        await self.aschedule_many([item])

    def schedule_many(self, schedules: Iterable[Schedule]) -> list[int]:
        """Upsert many schedules, one script call per 500 per shard.

        Returns one code per schedule, in the order given: 1 created, 2 updated, 0 unchanged.
        """
        return self.scheduler.upsert(schedules)

    async def aschedule_many(self, schedules: Iterable[Schedule]) -> list[int]:
        """`schedule_many` for async callers."""
        return await self.scheduler.aupsert(schedules)

    def unschedule(self, *ids: str) -> int:
        """Remove schedules; a run queued or in flight finishes and is not followed by another."""
        return self.scheduler.each(ids, lambda s, chunk: s.remove(self.redis, chunk))

    async def aunschedule(self, *ids: str) -> int:
        client = await self.aredis()
        return await self.scheduler.aeach(ids, lambda s, chunk: s.aremove(client, chunk))

    def pause(self, *ids: str) -> int:
        """Stop scheduling runs (a run in flight finishes); returns how many were paused."""
        return self.scheduler.each(ids, lambda s, chunk: s.pause(self.redis, chunk))

    async def apause(self, *ids: str) -> int:
        client = await self.aredis()
        return await self.scheduler.aeach(ids, lambda s, chunk: s.apause(client, chunk))

    def resume(self, *ids: str) -> int:
        """Resume paused schedules at their next slot from now; returns how many resumed."""
        resumed = self.scheduler.resumed(now_ms(self.redis))
        return self.scheduler.each(ids, lambda s, chunk: s.resume(self.redis, chunk, resumed))

    async def aresume(self, *ids: str) -> int:
        client = await self.aredis()
        resumed = self.scheduler.resumed(await anow_ms(client))
        return await self.scheduler.aeach(ids, lambda s, chunk: s.aresume(client, chunk, resumed))

    def run_now(self, *ids: str) -> int:
        """Queue one extra run of each schedule now, unless one is already queued or running."""
        now = now_ms(self.redis)
        return self.scheduler.each(ids, lambda s, chunk: s.run_now(self.redis, chunk, now))

    async def arun_now(self, *ids: str) -> int:
        client = await self.aredis()
        now = await anow_ms(client)
        return await self.scheduler.aeach(ids, lambda s, chunk: s.arun_now(client, chunk, now))

    def schedules(self, prefix: str = "") -> Iterator[ScheduleInfo]:
        """Iterate over schedules whose id starts with ``prefix``, with their state."""
        return self.scheduler.iterate(prefix)

    async def aschedules(self, prefix: str = "") -> list[ScheduleInfo]:
        """`schedules` for async callers (returns a list)."""
        return await self.scheduler.alist(prefix)

    def get_schedule(self, schedule_id: str) -> ScheduleInfo | None:
        """One schedule with its state, or None if there is no schedule with this id."""
        return self.scheduler.get(schedule_id)

    async def aget_schedule(self, schedule_id: str) -> ScheduleInfo | None:
        """`get_schedule` for async callers."""
        return await self.scheduler.aget(schedule_id)

    def run_shard(self, schedule_id: str) -> tuple[Keys, Scripts]:
        """The keys and scripts of the shard a schedule's runs live in (its schedule's: a
        lookup when schedules are spread over shards)."""
        if not self.scheduler.apart:
            return self.keys, self.scripts
        found = self.scheduler.home_of(self.redis, schedule_id)
        return self._schedule_shard(schedule_id, found)

    async def arun_shard(self, schedule_id: str) -> tuple[Keys, Scripts]:
        if not self.scheduler.apart:
            return self.keys, self.scripts
        found = await self.scheduler.ahome_of(await self.aredis(), schedule_id)
        return self._schedule_shard(schedule_id, found)

    def _schedule_shard(self, schedule_id: str, found: int | None) -> tuple[Keys, Scripts]:
        i = self.scheduler.shard_of(schedule_id) if found is None else found
        return self.scheduler.shards[i], self.scheduler.scripts[i]
