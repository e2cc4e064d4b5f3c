"""Claiming: the loop that takes jobs and schedule runs for the worker's free slots.

It claims shard after shard (starting at a rotating one, so none starves), at most as many
items as slots are free (a busy worker never prefetches): jobs, then the runs of the due time
slots (`slotted.SlotLane`), and blocks in Redis when there is nothing to do. It claims only from
the queues the worker serves (one claim takes from all of them, best first); schedules belong
to the default queue, so schedule shards are claimed from only when the worker serves it. It
owns the claim connection (`Link`), the pipelined idle wait (`Waiter`) and the clock offset to
Redis.

On a Redis Cluster the claim connection is a `Link` per master (`routing.Routed`), and the idle
wait one ``BZPOPMIN`` per shard (each shard's wake keys share its slot; one pop over several
shards would be refused as cross-slot), sent through the cluster client, which routes each to
its shard's master.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable

import redis
import redis.asyncio as aredis

from drumbeat.config import Settings
from drumbeat.keys import DEFAULT_QUEUE
from drumbeat.replies import Claimed, ClaimResult
from drumbeat.scripts import Call, Scripts

from .claims import ClaimTable
from .link import Link
from .retrying import Backoff, is_transient
from .routing import Routed
from .slotted import SlotLane
from .waiter import PopRefused, Waiter
from .wakes import WakePop

log = logging.getLogger("drumbeat.worker")

# A busy worker whose jobs checkpoint promotes what comes due at most this often (seconds).
_BUSY_PROMOTE_EVERY = 0.05
# In a shard with time slots (whose runs the lane claims), a shard whose claim found no
# job waiting (none in `ready`, none due soon) is not claimed from again for this long (s),
# unless a signal, or an idle wait's wake, says jobs came: an empty claim costs Redis as much
# as a time-slot claim of 30 runs, and this process a round trip. A job enqueued meanwhile
# (priority 0: those above signal) waits this much longer to start.
_JOBS_QUIET_S = 0.02
# An idle wait shorter than this (s) arms no pop on the wake keys (`_wait_for_work`).
_SHORT_WAIT_S = 0.05


class Claimer:
    def __init__(
        self,
        *,
        worker_id: str,
        shards: list[Scripts],
        settings: Settings,
        table: ClaimTable,
        start: Callable[[int, Claimed], None],
        stopping: asyncio.Event,
        queues: list[str] = [DEFAULT_QUEUE],  # noqa: B006 (never mutated)
        jobs: int = 1,
    ) -> None:
        self.worker_id = worker_id
        self.queues = queues
        """The queues served, the default one first if served."""
        self.jobs = jobs
        """The first ``jobs`` shards are job shards (every queue); the rest schedule shards."""
        # Schedule shards hold only schedules, kept by the default queue (whose runs, with
        # schedule_shards > 1, go to the default queue too).
        self.shards = shards if queues[0] == DEFAULT_QUEUE else shards[:jobs]
        self.settings = settings
        self.table = table
        self._start = start
        self.stopping = stopping
        self._next_shard = 0
        self._clock_offset_ms = 0
        self._client: aredis.Redis | None = None
        self._link: Link | Routed | None = None
        self._waiter: Waiter | None = None
        self._routed: Routed | None = None
        self._rewire = False
        """On a cluster: the last pipelined wait failed, so its master may have changed."""
        # Per shard, its wake keys: a job shard's of every queue served, a schedule shard's
        # of its default queue.
        groups = [[shard.k.wake_of(q) for q in self.queues] if i < jobs else [shard.k.wake]
                  for i, shard in enumerate(self.shards)]  # fmt: skip
        self.wakes = WakePop(groups, settings.idle_block, per_shard=False, came=self.jobs_came)
        self._next_due_ms: int | None = None
        self._unblocking: set[asyncio.Task[None]] = set()
        """`slots_due_at`'s unblocks under way (held: the loop keeps only weak references)."""
        self._due_sooner = asyncio.Event()
        self._came = False
        """Set by `jobs_came`: the next idle wait does not start (jobs sent to a queue this
        worker serves wait for no timer: a signal), and one under way (`_waking`) ends."""
        self._waking: asyncio.Future[None] | None = None
        self.lendable: Callable[[], bool] = lambda: False
        """Whether a running job checkpoints (so promoting what comes due may let it lend)."""
        self.on_best: Callable[[int, int], None] = lambda best, shard: None
        """Told the priority of the best job left in a job shard's `ready` after each claim (and
        which shard)."""
        self.release_limits: Callable[[int, str, list[str]], Call[list[int]]] | None = None
        """Makes the call that moves on the jobs parked on limiter keys whose markers a claim
        found due (`limiting.Gate.release_call`)."""
        self.lane: SlotLane | None = None
        """Claims the runs of the time slots after each shard's claim (None: the worker does not
        serve the default queue, whose schedules are)."""
        self._quiet_until = [0.0] * len(self.shards)
        """Per shard, until when (monotonic) its claim of jobs is skipped (`_JOBS_QUIET_S`)."""
        self._jobs_due: list[int | None] = [None] * len(self.shards)
        """Per shard, when its next job comes due, as its last claim of jobs said: a skipped
        claim must not forget it (a delayed job would wait out the idle block)."""
        self._schedules_paused = [False] * len(self.shards)
        """Per shard, whether its last claim said the default queue is paused: schedules are
        its, so the time-slot lane claims no runs there meanwhile (resuming wakes this
        worker, whose next claim says so)."""

    def now_ms(self) -> int:
        """Redis server time in ms, as last seen by a claim (worker clocks drift)."""
        return int(time.time() * 1000) + self._clock_offset_ms

    async def open(self, client: aredis.Redis, routed: Routed | None = None) -> None:
        """Starts using ``client``; on a Redis Cluster, ``routed`` carries the claims (and
        ``client`` is the cluster client)."""
        self._client = client
        self._link = Link(client) if routed is None else routed
        self._routed = routed
        self.wakes.client = client
        self.wakes.per_shard = routed is not None
        if len(self.shards) == 1:  # the pipelined wait claims from one shard
            self._waiter = await self._new_waiter()

    async def _new_waiter(self) -> Waiter:
        """The pipelined wait's `Waiter`; on a cluster, on a connection to the master that owns
        the shard's slot now (asked afresh: it is made again after a wait failed)."""
        assert self._client is not None
        client = self._client
        if self._routed is not None:
            client = await self._routed.nodes.client_of(self.shards[0].k.ready, fresh=True)
        return Waiter(client, self.wakes.keys, self.settings.idle_block)

    async def close(self) -> None:
        await self.wakes.close()
        if self._waiter is not None:
            await self._waiter.aclose()
        if self._link is not None:
            await self._link.aclose()

    async def run(self) -> None:
        """Claims and starts jobs until the worker stops."""
        unblocker = asyncio.create_task(self._unblock_on_stop())
        try:
            await self._claim_until_stopped()
        finally:
            unblocker.cancel()
            await asyncio.gather(unblocker, return_exceptions=True)

    async def _unblock_on_stop(self) -> None:
        await self.stopping.wait()
        if self._waiter is not None:
            await self._waiter.unblock()

    async def _claim_until_stopped(self) -> None:
        backoff = Backoff()
        idle: ClaimResult | None = None
        while not self.stopping.is_set():
            try:
                free = self.table.free
                if free <= 0:
                    await self._wait_busy()
                    continue
                if idle is None:
                    claimed, now_ms, next_due_ms = await self._claim(free)
                else:  # the wait's own claim left `ready` empty: no jobs to claim again
                    claimed, now_ms, next_due_ms = await self._after_wait(free, idle)
                idle = None
                if claimed < free:
                    idle = await self._wait_for_work(free - claimed, now_ms, next_due_ms)
                backoff.reset()
            except Exception as exc:
                if not is_transient(exc):
                    raise
                await backoff.wait(self.stopping, backoff.failed(log, "claiming", exc))

    def jobs_came(self) -> None:
        """Jobs may wait (a signal): the next claims look for them again, and an idle wait
        under way ends."""
        self._look_again()
        self._came = True
        if self._waking is not None and not self._waking.done():
            self._waking.set_result(None)

    def _look_again(self) -> None:
        for shard in range(len(self._quiet_until)):
            self._quiet_until[shard] = 0.0

    def slots_due_at(self, due_ms: int) -> None:
        """A settle filled a slot due at ``due_ms``, in no upcoming list the lane holds: a
        wait that would end later ends now (alone, a schedule every second ran a second late,
        at the wait's `idle_block`). Among many schedules it ends sooner anyway."""
        if self._next_due_ms is not None and self._next_due_ms <= due_ms:
            return
        self._next_due_ms = due_ms
        self.jobs_came()
        if self._waiter is not None:  # a wait that carries a claim blocks in Redis
            task = asyncio.get_running_loop().create_task(self._waiter.unblock())
            self._unblocking.add(task)
            task.add_done_callback(self._unblocked)

    def _unblocked(self, task: asyncio.Task[None]) -> None:
        self._unblocking.discard(task)
        if not task.cancelled() and task.exception() is not None:  # it ends at its timeout
            log.debug("ending a wait early failed: %r", task.exception())

    def due_at(self, due_ms: int) -> None:
        """Something comes due at ``due_ms`` (a signal): a busy wait re-arms its timer."""
        self.jobs_came()
        if self._next_due_ms is None or due_ms < self._next_due_ms:
            self._next_due_ms = due_ms
            self._due_sooner.set()

    async def _wait_busy(self) -> None:
        """Every slot is busy: waits for one to free up. If a running job checkpoints (it can
        lend its slot), also wakes at the next due time to claim nothing, only to promote what
        came due (a delayed or retried urgent job): the reply tells the best priority waiting,
        and a checkpoint then lends for it."""
        # Clear before any await: a job finishing (or a signal) during the cancel sets it again.
        self.table.slot_free.clear()
        self._due_sooner.clear()
        await self.wakes.drop()
        timeout = None
        if self._next_due_ms is not None and self.lendable():
            timeout = max(_BUSY_PROMOTE_EVERY, (self._next_due_ms - self.now_ms()) / 1000)
        waits = {asyncio.ensure_future(self.table.slot_free.wait()),
                 asyncio.ensure_future(self._due_sooner.wait())}  # fmt: skip
        done, pending = await asyncio.wait(waits, timeout=timeout, return_when="FIRST_COMPLETED")
        for waiting in pending:
            waiting.cancel()
        if not done:  # the next due time came: claim nothing, promote what came due
            call = self._claim_call(0, 0)
            assert self._link is not None
            (result,) = await self._link.run([call])
            await self._took(0, result)
            self._next_due_ms = result.next_due_ms

    async def _claim(self, free: int) -> tuple[int, int, int | None]:
        """Claims up to ``free`` items; returns (claimed, Redis now, earliest due time seen)."""
        assert self._link is not None
        n = len(self.shards)
        claimed, now_ms, next_due = 0, 0, None
        start = self._next_shard
        self._next_shard = (start + 1) % n
        for i in range(n):
            shard = (start + i) % n
            due: list[int | None] = []
            slotted = self.lane is not None and shard in self.lane.held
            if not slotted or time.monotonic() >= self._quiet_until[shard]:
                call = self._claim_call(shard, free - claimed)
                (result,) = await self._link.run([call])
                took, result = await self._took(shard, result)
                claimed += took
                now_ms = result.now_ms
                if slotted:
                    self._quiet_if_empty(shard, took, result)
            due.append(self._jobs_due[shard] if slotted else result.next_due_ms)
            if slotted and claimed < free and not self._schedules_paused[shard]:
                took, slot_due, now_ms = await self._claim_slots(shard, free - claimed)
                claimed += took
                due.append(slot_due)
            for at in due:
                if at is not None:
                    next_due = at if next_due is None else min(next_due, at)
            if claimed >= free:
                break
        self._next_due_ms = next_due
        return claimed, now_ms, next_due

    async def _after_wait(self, free: int, idle: ClaimResult) -> tuple[int, int, int | None]:
        """After the idle wait's claim left `ready` empty: claims the time slots only, if the
        worker has them (the wait's claim does not); returns as `_claim` does."""
        if self.lane is None or 0 not in self.lane.held or self._schedules_paused[0]:
            return 0, idle.now_ms, idle.next_due_ms
        took, slot_due, now_ms = await self._claim_slots(0, free)
        dues = [due for due in (idle.next_due_ms, slot_due) if due is not None]
        self._next_due_ms = min(dues) if dues else None
        return took, now_ms, self._next_due_ms

    def _quiet_if_empty(self, shard: int, took: int, result: ClaimResult) -> None:
        """After a claim of jobs from a shard with time slots: keeps its next due time, and
        skips the shard's next claims of jobs for `_JOBS_QUIET_S` if it found none waiting
        and none due sooner."""
        self._jobs_due[shard] = result.next_due_ms
        if not took and result.best < 0 and (
            result.next_due_ms is None
            or result.next_due_ms > result.now_ms + _JOBS_QUIET_S * 1000
        ):  # fmt: skip
            self._quiet_until[shard] = time.monotonic() + _JOBS_QUIET_S

    async def _claim_slots(self, shard: int, free: int) -> tuple[int, int | None, int]:
        """Claims up to ``free`` runs of the time slots of ``shard`` and starts them; returns
        (started, when its next slot comes due, Redis now)."""
        assert self.lane is not None and self._link is not None and self._client is not None
        replies = await self._link.run(self.lane.calls(shard, free, self.now_ms()))
        result, runs = await self.lane.took(shard, replies, self._client)
        for job in runs:
            self._start(shard, job)
        return len(runs), self.lane.next_due(shard, result), result.now_ms

    async def _took(self, shard: int, result: ClaimResult) -> tuple[int, ClaimResult]:
        """Starts what a claim took, and moves on the jobs parked on the limiter keys whose
        markers it found due. Returns (started, the reply)."""
        assert self._link is not None
        self._schedules_paused[shard] = DEFAULT_QUEUE in result.paused
        self._clock_offset_ms = result.now_ms - int(time.time() * 1000)
        if shard < self.jobs:
            self.on_best(result.best, shard)
        for job in result.jobs:
            self._start(shard, job)
        if result.limiters and self.release_limits is not None:
            # The claim stepped these markers aside for a second: move their jobs on now, and
            # wake for the first start that booked (the reply predates it).
            (released,) = await self._link.run([self.release_limits(shard, "", result.limiters)])
            due = released[1]
            if due >= 0 and (result.next_due_ms is None or due < result.next_due_ms):
                result = dataclasses.replace(result, next_due_ms=due)
        return len(result.jobs), result

    async def _wait_for_work(
        self, free: int, now_ms: int, next_due_ms: int | None
    ) -> ClaimResult | None:
        """Waits until a job is enqueued (a marker on `wake`), the next item is due, or
        `idle_block` passes, whichever comes first.

        Redis times blocked commands out only on its cron tick (every 100 ms at the default
        `hz`), far too coarse for due times. So one `BZPOPMIN` stays outstanding across waits,
        with the full `idle_block` as its timeout, and a local timer (from a due time Redis
        gave us, corrected by the measured clock offset) ends the wait at the due time. With
        nothing due within `idle_block`, the wait carries the next claim (`Waiter`); if that
        claim left `ready` empty, its reply is returned, and the loop waits again on it.
        """
        assert self._client is not None
        timeout = self.settings.idle_block
        if next_due_ms is not None:
            timeout = min(timeout, (next_due_ms - now_ms) / 1000)
        if timeout <= 0 or self._came:
            self._came = False
            return None
        if self._rewire and self._waiter is not None:
            old, self._waiter = self._waiter, None
            await old.aclose()
            self._waiter = await self._new_waiter()
            self._rewire = False
        if (
            timeout >= self.settings.idle_block
            and self._waiter is not None
            and not self.wakes.armed()
        ):
            return await self._wait_then_claim(free)
        if not self.wakes.armed() and timeout < _SHORT_WAIT_S:
            # Claims paced a few ms apart (slots coming due): a pop armed for so short a
            # wait is mostly dropped when the next claim fills the slots, and each drop
            # costs its connection, made again for the next pop. A job sent meanwhile
            # waits for the next claim, this long at most, unless it says so (`jobs_came`).
            # (What asyncio.sleep does, with a future `jobs_came` may end early.)
            waking = self._waking = asyncio.get_running_loop().create_future()
            timer = asyncio.get_running_loop().call_later(timeout, _wake, waking)
            try:
                await waking
            finally:
                timer.cancel()
                self._waking, self._came = None, False
            return None
        block = self.wakes.arm()
        stop = asyncio.ensure_future(self.stopping.wait())
        waking = self._waking = asyncio.get_running_loop().create_future()
        await asyncio.wait({block, stop, waking}, timeout=timeout,
                           return_when="FIRST_COMPLETED")  # fmt: skip
        stop.cancel()
        waking.cancel()
        self._waking, self._came = None, False
        if block.done():
            block.exception()  # consumed; a failed block just means: look again
            self._look_again()  # a wake marker (or a failed wait): look for jobs
        return None

    async def _wait_then_claim(self, free: int) -> ClaimResult | None:
        """Waits with a claim of up to ``free`` jobs pipelined behind the pop (slots only free
        up meanwhile, so it never overfills). Awaited in line, not as a task of its own: at
        light load the loop wakeups a task and `asyncio.wait` add are most of the time from
        the reply to the job's start."""
        assert self._client is not None and self._waiter is not None
        call = self._claim_call(0, free)
        if self.stopping.is_set():  # set since the loop looked; `_unblock_on_stop` is done
            return None
        try:
            # Stopping ends the wait early (`_unblock_on_stop`); what the claim took is still
            # started (the shutdown then finishes or hands it back).
            raw = await self._waiter.block_then(call)
        except PopRefused as refused:  # (ASK while the slot migrates, MOVED after)
            if refused.claim is not None:  # the claim behind it ran: what it took starts
                await self._took(0, call.parse(refused.claim))
            self._wait_failed(refused.refused)
            return None
        except Exception as exc:
            self._wait_failed(exc)
            return None
        result = call.parse(raw) if raw is not None else await call.arun(self._client)
        took, last = await self._took(0, result)
        self._next_due_ms = last.next_due_ms
        if self.lane is not None and 0 in self.lane.held:
            # The loop claims the time slots next: this claim stands for shard 0's of jobs,
            # and left `ready` empty if it took fewer than it could.
            self._quiet_if_empty(0, took, last)
        if took:
            # Let the jobs just started take their first step before this loop goes on to
            # arm its next wait: at light load that is the time from enqueue to start.
            await asyncio.sleep(0)
        # Fewer than `free` taken: `ready` was empty at the reply, so there are no jobs to claim
        # before waiting again (a job enqueued since left a marker on `wake`).
        return last if took < free else None

    def _wait_failed(self, exc: Exception) -> None:
        """Raises ``exc`` of a failed wait for the claim loop's backoff, unless Redis refuses
        the pipelined wait itself for good: then plain waits from now on."""
        # On a cluster a failed wait (MOVED, a lost connection) may mean its master is another
        # node now: the next wait asks.
        self._rewire = self._routed is not None
        if not isinstance(exc, redis.ResponseError) or is_transient(exc):
            raise exc from None
        # The pop or CLIENT ID refused (an ACL, a proxy): plain waits work everywhere.
        log.warning("waiting with a pipelined claim failed (%s); using plain waits", exc)
        self._waiter = None

    def _claim_call(self, shard: int, limit: int) -> Call[ClaimResult]:
        """A claim of up to ``limit`` items from one shard: a job shard claims from every queue
        served, a schedule shard from its default queue (its schedules' runs queued as jobs)."""
        s = self.settings
        queues = self.queues if shard < self.jobs else [DEFAULT_QUEUE]
        return self.shards[shard].claim(
            self.worker_id, limit, s.lease_ms, s.batch_limit, queues=queues
        )


def _wake(waking: asyncio.Future[None]) -> None:
    if not waking.done():
        waking.set_result(None)
