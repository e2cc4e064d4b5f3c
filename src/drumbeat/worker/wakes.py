"""The idle wait's pop: one ``BZPOPMIN`` on the wake keys of the queues a worker serves, kept
outstanding across waits (`claiming.Claimer` arms it and waits on it), and dropped when the
worker turns busy, so a busy worker does not swallow the markers meant for idle ones.

On a Redis Cluster it is one pop per shard (each shard's wake keys share its slot; one pop over
several shards would be refused as cross-slot), sent through the cluster client, which routes
each to its shard's master.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import redis.asyncio as aredis

log = logging.getLogger("drumbeat.worker")

# How long dropping the outstanding pop waits for it to end (s): see `WakePop.drop`.
_CANCEL_WAIT_S = 0.01


class WakePop:
    """The outstanding pop of one worker's idle wait."""

    def __init__(
        self,
        groups: list[list[str]],
        idle_block: float,
        *,
        per_shard: bool,
        came: Callable[[], None],
    ) -> None:
        self.groups = groups
        """Per shard, its wake keys: a job shard's of every queue served, a schedule shard's
        of its default queue."""
        self.idle_block = idle_block
        self.per_shard = per_shard
        """One pop per shard (a cluster) rather than one over every wake key."""
        self._came = came
        """Told when a dropped pop's marker is put back: this worker looks for jobs too."""
        self.client: aredis.Redis | None = None
        self.block: asyncio.Future[Any] | None = None
        """The pop armed, until it ends or is dropped."""
        self.dropped: set[asyncio.Future[Any]] = set()
        """Pops dropped whose cancel was not honoured (`drop`), until they end."""
        self.giving_back: set[asyncio.Future[Any]] = set()
        """Put-backs of wake markers dropped pops took (referenced until they end)."""

    @property
    def keys(self) -> list[str]:
        """What an idle wait blocks on: a marker for any queue served, on any shard."""
        return [key for group in self.groups for key in group]

    def armed(self) -> bool:
        return self.block is not None and not self.block.done()

    def arm(self) -> asyncio.Future[Any]:
        """The pop armed (a new one unless one is outstanding)."""
        if self.block is None or self.block.done():
            self.block = asyncio.ensure_future(self.pop())
        return self.block

    async def pop(self) -> Any:
        """Pops a marker off any wake key: one ``BZPOPMIN`` over all of them, or on a cluster
        one per shard (a marker a pop takes as another returns is no loss: every wake is
        followed by a claim on every shard)."""
        assert self.client is not None
        client, block = self.client, self.idle_block
        if not self.per_shard:
            return await client.bzpopmin(self.keys, block)
        pops = [asyncio.ensure_future(client.bzpopmin(keys, block)) for keys in self.groups]
        try:
            done, _ = await asyncio.wait(pops, return_when="FIRST_COMPLETED")
            return next(iter(done)).result()
        finally:
            for pop in pops:  # not awaited: a cancel may be swallowed (`drop`)
                if not pop.done():
                    pop.cancel()
                    self.dropped.add(pop)
                    pop.add_done_callback(self.give_back)

    async def drop(self) -> None:
        """Drops the outstanding pop (cancelling costs its connection, a reconnect on the next
        wait).

        The cancel is not always honoured: a pop still making its connection (each wait after
        a cancel makes a new one) sits in redis-py's ``asyncio.wait_for``, which on Python 3.11
        swallows a cancel that lands as the write it waits for completes (fixed in 3.12), and
        the pop then blocks for its whole `idle_block`. Awaited, that held every busy worker
        2 s with its slots free (`bench.periodic` at 100,000 schedules: lateness p99 1.5 s in
        5 of 11 runs). So the wait is short, and a pop that outlives it is left to end on its
        own; a marker it takes meanwhile is put back for the idle workers (`give_back`)."""
        block, self.block = self.block, None
        if block is None or block.done():
            return
        block.cancel()
        await asyncio.wait({block}, timeout=_CANCEL_WAIT_S)
        if block.done():
            self.give_back(block)
        else:
            self.dropped.add(block)
            block.add_done_callback(self.give_back)

    async def close(self) -> None:
        """Drops the pop and waits for what is left of dropped ones: each ends within its
        `idle_block`, and the client they use must outlive them."""
        await self.drop()
        left = [*self.dropped, *self.giving_back]
        if left:
            await asyncio.wait(left)

    def give_back(self, block: asyncio.Future[Any]) -> None:
        """Puts back the wake marker a dropped pop took, if it took one."""
        self.dropped.discard(block)
        if block.cancelled() or block.exception() is not None:
            return
        popped = block.result()
        if popped and self.client is not None:
            key, member, score = popped
            self._came()
            back = asyncio.ensure_future(self.client.zadd(key, {member: score}))
            self.giving_back.add(back)
            back.add_done_callback(self._gave_back)

    def _gave_back(self, back: asyncio.Future[Any]) -> None:
        self.giving_back.discard(back)
        # A marker lost here costs an idle worker at most one `idle_block` of delay.
        if not back.cancelled() and back.exception() is not None:
            log.debug("putting back a wake marker failed: %s", back.exception())
