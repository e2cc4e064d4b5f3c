"""Limiting: the rate and concurrency limits a claimed job must acquire before it runs.

A claim cannot check limits itself: a job's limiter keys depend on its task and on the value of
its ``limit_by`` argument (one key per user, say: unbounded, so no script can name them before
it runs). So the runner, once it has decoded a job of a limited task, asks `Gate.acquire`
(acquire_limits.lua, one round trip): the job runs, or it gives up its claim (not an attempt)
and waits in Redis, in `due` until a booked start or parked on a key until a release moves it
on. When the run ends in any way, `Gate.release` frees its concurrency permits and moves parked
jobs on (release_limits.lua); a claim that finds a key's marker due calls it too. Jobs of
unlimited tasks never come here: they cost what they cost before limits existed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import redis
import redis.asyncio as aredis

from drumbeat.errors import InvalidJob
from drumbeat.job import Spec
from drumbeat.limits import Limit, Limits, argument_value, limiter_key, task_key, value_key
from drumbeat.replies import Claimed
from drumbeat.scripts import Call, Scripts

from .link import Link
from .routing import Routed

if TYPE_CHECKING:
    from drumbeat.app import App
    from drumbeat.task import Task

log = logging.getLogger("drumbeat.worker")

#: How far ahead a rate limit books starts: a job whose start is due within this goes to
#: `due` for that time (a claim promotes it then, on time); a later one is parked, and the key's
#: marker comes due when a release can book a batch (half a horizon's worth) again.
HORIZON_MS = 200
#: At most this many parked jobs are moved on per key per release call.
RELEASE_BATCH = 100


class RedisClock:
    """Redis' time as a worker best knows it, for waiting until a granted start.

    A reply's Redis time minus the local time its reply was read at is a lower bound of the
    offset between the two clocks (the reply took some time to come back): the largest bound
    of the last `WINDOW_MS` (the reply that came back fastest) is the tightest, and still never
    ahead of Redis, so a run does not start before its grant. A claim's offset alone (the
    latest reply's) lagged by that reply's delay: 1 ms at the median, 10 ms at p99 under load
    (bench.limits), which starts granted a few ms ahead waited on top of their turn.
    """

    #: A bound this old is dropped, so a step of either clock is followed within it.
    WINDOW_MS = 1000

    def __init__(self) -> None:
        # (local ms, bound), bounds strictly decreasing: the first is the largest in the window.
        self._bounds: deque[tuple[float, float]] = deque()

    def observe(self, redis_ms: int, read_ms: float) -> None:
        """A reply carried Redis time ``redis_ms``; it was read at local time ``read_ms``."""
        bound = redis_ms - read_ms
        while self._bounds and self._bounds[-1][1] <= bound:
            self._bounds.pop()
        self._bounds.append((read_ms, bound))

    def now_ms(self, known_ms: int, local_ms: float | None = None) -> float:
        """Redis' time now: the latest of ``known_ms`` (another lower bound, e.g. the
        claims') and the local clock (``local_ms``, default now) plus the tightest bound of the
        window."""
        local = time.time() * 1000 if local_ms is None else local_ms
        while self._bounds and self._bounds[0][0] < local - self.WINDOW_MS:
            self._bounds.popleft()
        if not self._bounds:
            return known_ms
        return max(known_ms, local + self._bounds[0][1])


class Gate:
    """Acquires and releases the limiter keys of a worker's runs."""

    def __init__(self, app: App, shards: Sequence[Scripts], queues: Sequence[str]) -> None:
        self.app = app
        self.shards = shards
        self.lease_ms = app.settings.lease_ms
        # Parked jobs of these queues can be moved on by this worker: the ones it serves and
        # the ones its tasks name.
        self.queues = list(dict.fromkeys([*queues, *app.queues()]))
        self.client: aredis.Redis | None = None
        self.link: Link | Routed | None = None
        """The connection acquisitions and releases go on (on a cluster, set to a `Routed`;
        else made from `client` when first needed)."""
        # Acquisitions reach Redis in the order the runs asked (the order they were claimed
        # in): on the client's pool, a call that waits for a new connection would reach Redis
        # after later ones and take a permit out of turn. One at a time (a round trip each)
        # kept the order, but a claimed batch's runs then started, ended and freed their slots
        # a round trip apart, so claims and settles went one job at a time (bench.limits: 1.1
        # jobs per claim instead of 1.7 at 500/s, 1.9 instead of 12.6 under a concurrency
        # limit; Redis commands per job 56 -> 74 and 24 -> 37); so the ones waiting are sent
        # together, in order, in one write on a `Link`. The releases of ended runs go the same
        # way: each through the client was a quarter of a limited job's worker CPU (its
        # packing and pool; a profile of 6,000 jobs), and in turn, a release sent before a
        # later acquisition of its key frees the permit first.
        self._waiting: list[tuple[Call[list[int]], asyncio.Future[list[int]]]] = []
        self._in_flight: list[tuple[Call[list[int]], asyncio.Future[list[int]]]] = []
        self._sender: asyncio.Task[None] | None = None
        self.clock = RedisClock()
        """Redis' time, as the replies of acquisitions tell it (see `RedisClock`)."""
        self.parked = 0
        """Runs that gave up their claim to wait for a limit (booked or parked)."""
        self._told_per_shard: set[str] = set()

    def check(self) -> None:
        """Refuses to start a worker whose tasks name a limiter the app does not declare."""
        for task in self.app.tasks.values():
            name = task.limits.limiter
            if name is not None and name not in self.app.limiters:
                raise InvalidJob(
                    f"task {task.name!r} names limiter {name!r}, which is not declared; call "
                    f"app.limiter({name!r}, rate=..., concurrency=...) where the tasks are"
                )

    def keys_of(self, task: Task[Any, Any], spec: Spec) -> list[tuple[str, Limit]]:
        """The limiter keys a run of ``task`` with this call must hold (empty: unlimited)."""
        limits = task.limits if spec.limits is None else Limits.from_record(spec.limits)
        if not limits:
            return []
        keyed: list[tuple[str, Limit]] = []
        if limits.own is not None:
            name = task_key(task.name)
            if limits.limit_by is not None:
                value = argument_value(task.fn, limits.limit_by, spec.args, spec.kwargs)
                name += value_key(value)
            keyed.append((name, limits.own))
        if limits.limiter is not None:
            limit = self.app.limiters.get(limits.limiter)
            if limit is None:
                raise InvalidJob(
                    f"limiter {limits.limiter!r} is not declared in this worker's app; "
                    f"declare it with app.limiter({limits.limiter!r}, ...)"
                )
            keyed.append((limiter_key(limits.limiter), limit))
        return keyed

    async def acquire(
        self,
        shard: int,
        job: Claimed,
        keyed: list[tuple[str, Limit]],
        now_ms: Callable[[], int],
    ) -> int | None:
        """The start the limits granted (Redis clock ms; reached when this returns): the run
        may start. None: the job gave up its claim to wait (or its lease was lost), so the run
        must not start. ``now_ms``: Redis time, as the worker knows it."""
        assert self.client is not None
        if shard > 0:
            self._tell_per_shard(keyed)
        call = self.shards[shard].acquire_limits(
            job.id, job.token, queue=job.queue, lease_ms=self.lease_ms, horizon_ms=HORIZON_MS,
            limits=[(name, limit.args()) for name, limit in keyed],
        )  # fmt: skip
        reply = await self._in_turn(call)
        if reply[0] == 1:
            # Granted for a start a few ms ahead (LIMIT_NEAR_MS): wait for that time itself
            # (Redis' clock), not for a delay from the call, whose reply may come late.
            delay = reply[1] - self.clock.now_ms(now_ms())
            if delay > 0:
                await asyncio.sleep(delay / 1000)
            return int(reply[1])
        if reply[0] == 0:
            log.warning("job %s: its lease was taken over before its limits were acquired", job.id)
        else:
            self.parked += 1
        return None

    async def _in_turn(self, call: Call[list[int]]) -> list[int]:
        """``call``'s reply, sent after every acquisition asked before it, in one pipeline with
        the ones asked while the previous pipeline was out."""
        future: asyncio.Future[list[int]] = asyncio.get_running_loop().create_future()
        self._waiting.append((call, future))
        if self._sender is None or self._sender.done():
            self._sender = asyncio.create_task(self._send_waiting())
            self._sender.add_done_callback(self._sender_done)
        return await future

    async def _send_waiting(self) -> None:
        if self.link is None:
            assert self.client is not None
            self.link = Link(self.client)
        while self._waiting:
            self._in_flight, self._waiting = self._waiting, []
            await self._send(self.link, self._in_flight)
        self._in_flight = []

    def _sender_done(self, sender: asyncio.Task[None]) -> None:
        """Cancelled (the worker stops; perhaps before it ran at all): no run may wait for a
        reply that will not come. (A sender that ended as it should may already have a
        successor, which owns the runs waiting now.)"""
        if not sender.cancelled() or sender is not self._sender:
            return
        left = [*self._in_flight, *self._waiting]
        self._in_flight, self._waiting = [], []
        for _, future in left:
            if not future.done():
                future.cancel()

    async def _send(
        self,
        link: Link | Routed,
        batch: list[tuple[Call[list[int]], asyncio.Future[list[int]]]],
    ) -> None:
        """Sends the batch in one write and hands each run its reply (an error reply to its
        run alone; a lost connection to every run not answered yet)."""
        try:
            await link.send([call for call, _ in batch])
        except Exception as exc:
            _fail([future for _, future in batch], exc)
            return
        for i, (_, future) in enumerate(batch):
            try:
                _, reply = await link.next()
            except redis.ResponseError as exc:  # its own error: the connection is in step
                _fail([future], exc)
                continue
            except Exception as exc:
                _fail([f for _, f in batch[i:]], exc)
                return
            if len(reply) == 3:  # granted, with Redis' time
                self.clock.observe(int(reply[2]), time.time() * 1000)
            if not future.done():  # done: its run was cancelled (a stop)
                future.set_result(reply)

    def _tell_per_shard(self, keyed: list[tuple[str, Limit]]) -> None:
        """A run outside the main shard acquires its limits on its own shard's keys (a script
        touches one slot). Limited schedules and jobs live in the main shard (`Scheduler`,
        `Enqueuer.shard_for`), but a schedule's task may have gained a limit since it was
        registered, and a job's producer may not have known its task's limits: say once per
        key that the limit then holds per shard."""
        for name, _ in keyed:
            if name not in self._told_per_shard:
                self._told_per_shard.add(name)
                log.warning(
                    "limiter key %r: a run outside the main shard acquires it on its shard's "
                    "own keys, so across the %d shards the limit holds per shard (up to %d "
                    "times it): a schedule whose task gained its limit after it was registered "
                    "(register it again), or a job enqueued by a producer that did not know "
                    "its task's limits (import the task where the job is enqueued)",
                    name, len(self.shards), len(self.shards),
                )  # fmt: skip

    def release_call(
        self, shard: int, job_id: str, names: Sequence[str], token: int | None = None
    ) -> Call[list[int]]:
        return self.shards[shard].release_limits(
            job_id, names, token=token, queues=self.queues, horizon_ms=HORIZON_MS,
            lease_ms=self.lease_ms, batch=RELEASE_BATCH,
        )  # fmt: skip

    async def release(self, shard: int, job_id: str, token: int, names: Sequence[str]) -> None:
        """Frees the permits on ``names`` of ``job_id``'s run ``token`` (it ended) and moves
        parked jobs on. Best effort: a permit left behind lapses with the job's lease and is
        purged."""
        try:
            await self._in_turn(self.release_call(shard, job_id, names, token))
        except Exception as exc:
            log.warning("releasing the limits of job %s failed (%s: %s); they lapse with its "
                        "lease", job_id, type(exc).__name__, exc)  # fmt: skip

    async def aclose(self) -> None:
        if self.link is not None:
            await self.link.aclose()


def _fail(futures: Sequence[asyncio.Future[list[int]]], exc: Exception) -> None:
    for future in futures:
        if not future.done():  # done: its run was cancelled (a stop)
            future.set_exception(exc)
