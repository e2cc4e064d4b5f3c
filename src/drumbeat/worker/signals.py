"""Signals: what Redis tells a busy worker between its claims, on a pub/sub channel per job shard.

- ``r<priority>``: a job became the head of `ready` (enqueued, handed back, requeued). A worker
  whose slots are all busy learns of urgent work here, so its checkpoints can lend a slot
  without asking Redis. ``r<priority>:<queue>``: the same in a queue other than the default one
  (a worker that does not serve it ignores it).
- ``d<ms>``: a delayed job above the lowest priority became the next due, at ``ms``. A busy
  worker whose jobs checkpoint promotes it then, so a checkpoint can lend for it.
- ``c<job id>``: `Job.cancel` of a running job. Its run stops at once (async) or at its next
  checkpoint (sync).

A missed message costs little: the next claim reply carries the head of `ready` again, and a
cancel is also written to `cancels`, which the heartbeat reads.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

import redis.asyncio as aredis

from drumbeat.keys import DEFAULT_QUEUE

from .retrying import Backoff, is_transient

log = logging.getLogger("drumbeat.worker")


class Signals:
    def __init__(
        self,
        channels: Sequence[str],
        stopping: asyncio.Event,
        on_ready: Callable[[int, str, int], None],
        on_cancel: Callable[[str], None],
        on_due: Callable[[int], None],
    ) -> None:
        self.channels = list(channels)
        """The job shards' channels, in the worker's shard order (a ready signal says which)."""
        self.stopping = stopping
        self.on_ready = on_ready
        self.on_cancel = on_cancel
        self.on_due = on_due
        self.subscribed = asyncio.Event()

    async def run(self, client: aredis.Redis | Callable[[], Awaitable[aredis.Redis]]) -> None:
        """Listens until the worker stops. A Redis that restarts or fails over is waited out
        with backoff (as the other parts do), not taken for a crash: messages missed
        meanwhile are made up for by claim replies and the heartbeat.

        Args:
            client: the client to subscribe on, or a coroutine function that gives it anew
                for each try (on a Redis Cluster: a client of the channel's master, which may
                have changed since the last try).
        """
        backoff = Backoff(first=0.1, most=5.0)
        while not self.stopping.is_set():
            try:
                await self._listen(client if isinstance(client, aredis.Redis) else await client())
            except Exception as exc:
                if not is_transient(exc):
                    raise
                self.subscribed.clear()
                await backoff.wait(self.stopping, backoff.failed(log, "listening for signals", exc))

    async def _listen(self, client: aredis.Redis) -> None:
        async with client.pubsub(ignore_subscribe_messages=True) as pubsub:
            await pubsub.subscribe(*self.channels)
            self.subscribed.set()
            while not self.stopping.is_set():
                message = await pubsub.get_message(timeout=1.0)
                if message is not None:
                    self.handle(message["data"], message["channel"])

    def handle(self, data: bytes | str, channel: bytes | str = b"") -> None:
        text = data.decode() if isinstance(data, bytes) else data
        name = channel.decode() if isinstance(channel, bytes) else channel
        kind, rest = text[:1], text[1:]
        priority, _, queue = rest.partition(":")
        if kind == "r" and priority.isdigit():
            shard = self.channels.index(name) if name in self.channels else 0
            self.on_ready(int(priority), queue or DEFAULT_QUEUE, shard)
        elif kind == "c" and rest:
            self.on_cancel(rest)
        elif kind == "d" and rest.isdigit():
            self.on_due(int(rest))
        else:
            log.warning("ignoring an unknown signal %r on %s", text[:100], name)
