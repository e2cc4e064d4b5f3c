"""Housekeeping every worker shares: reaping expired leases, results, dead letters and gone
workers (`reap.lua`), and announcing the jobs it dead-lettered to their `Job.result` waiters.

There is no leader: every worker reaps about once a `maintenance_interval`, jittered so many
workers do not reap in lockstep; each pass is atomic, so two reaping at once is harmless. A
worker reaps every queue, served or not (a crashed worker's jobs may be of any): it reads the
registry of queues (`queues`) before each pass on the jobs' shard.

While a shard's slot migrates to another master (a resharding), Redis runs neither the reap
nor a heartbeat's renewal of the shard's leases (each names a key that exists on neither
side), so a migration longer than what is left of a lease lets live jobs' leases expire. When
it ends, the first reap would take those jobs over and run them again. So after a reap of a
shard met a migration, that shard's expired leases are left alone for `hold_after_migration`
(one heartbeat interval and the time a renewal takes to ride out the migration's end), long
enough for the workers' heartbeats, which try every 0.1 s meanwhile, to renew them; the rest
of the reap goes on.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence

import redis.asyncio as aredis

from drumbeat.config import Settings
from drumbeat.keys import Keys
from drumbeat.replies import Reaped
from drumbeat.scripts import Call, Scripts

from .retrying import REDIS_FAILURES, Backoff, is_migrating

log = logging.getLogger("drumbeat.worker")


class Housekeeper:
    def __init__(
        self,
        shards: list[Scripts],
        settings: Settings,
        stopping: asyncio.Event,
        registry: str = "",
        served: Sequence[str] = (),
        *,
        jobs: int = 1,
    ) -> None:
        self.shards = shards
        self.jobs = jobs
        """The first ``jobs`` shards are job shards: their reaps requeue to every queue."""
        self.settings = settings
        self.stopping = stopping
        self.registry = registry
        """The `queues` key of the jobs' shard ("" : reap the default queue only)."""
        self.served = list(served)
        self._queues: list[Sequence[str]] = [() for _ in shards]
        self._held_until = [0.0 for _ in shards]
        """Per shard, until when (monotonic) its expired leases are left alone."""
        self.hold_after_migration = settings.lease / 3 + 1.0
        self.reap_slots: Callable[[aredis.Redis], Awaitable[int]] | None = None
        """Takes back the time slots' runs of lapsed incarnations (`SlotLane.reap`)."""

    def _reap_call(self, shard: int) -> Call[Reaped]:
        s = self.settings
        return self.shards[shard].reap(
            max_stalls=s.max_stalls,
            limit=s.batch_limit,
            dead_ttl_ms=round(s.dead_ttl * 1000),
            worker_ttl_ms=s.lease_ms * 3,
            result_ttl_ms=round(s.result_ttl * 1000),
            queues=self._queues[shard],
            take_over=time.monotonic() >= self._held_until[shard],
        )

    async def run(self, client: aredis.Redis) -> None:
        """Reaps until the worker stops.

        Ends by itself once stopping, not only by cancellation: a cancellation that lands while
        the Redis client is between two awaits can be lost (seen under load: the task stayed
        "cancelling" in its sleep and the shutdown waited for it forever).
        """
        backoff = Backoff(first=self.settings.maintenance_interval, most=30.0)
        while not self.stopping.is_set():
            try:
                more = False
                if self.registry:
                    stored = await client.smembers(self.registry)
                    names = sorted({*self.served, *(_str(q) for q in stored)})
                    for i in range(self.jobs):
                        self._queues[i] = names
                for shard in range(len(self.shards)):
                    more = await self._reap(client, shard) or more
                if self.reap_slots is not None:
                    await self.reap_slots(client)
                backoff.reset()
                if more:
                    # A busy queue can expire thousands of outcomes a second; sweeping one
                    # batch per interval would let them pile up.
                    await asyncio.sleep(0)
                    continue
                pause = self.settings.maintenance_interval * (0.75 + random.random() / 2)
            except REDIS_FAILURES as exc:
                # Even a refused reap is retried (slowly): it changes nothing until it runs.
                pause = backoff.failed(log, "housekeeping", exc)
            await backoff.wait(self.stopping, pause)

    async def _reap(self, client: aredis.Redis, shard: int) -> bool:
        """One pass on one shard; True if it should run again at once."""
        try:
            reaped = await self._reap_call(shard).arun(client)
        except REDIS_FAILURES as exc:
            if is_migrating(exc):
                self._held_until[shard] = time.monotonic() + self.hold_after_migration
            raise
        if reaped.requeued or reaped.buried:
            log.warning("shard %d: expired leases: %d requeued, %d dead-lettered",
                        shard, reaped.requeued, len(reaped.buried))  # fmt: skip
        if reaped.buried:
            await self._announce(client, self.shards[shard].k, reaped.buried)
        return reaped.more

    async def _announce(self, client: aredis.Redis, keys: Keys, ids: list[str]) -> None:
        """Wakes `Job.result` waiters of jobs that reap dead-lettered (Lua cannot name the keys)."""
        ttl_ms = max(1, round(self.settings.result_ttl * 1000))
        async with client.pipeline(transaction=False) as pipe:
            for job_id in ids:
                pipe.rpush(keys.done(job_id), 0)
                pipe.pexpire(keys.done(job_id), ttl_ms)
            await pipe.execute()


def _str(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
