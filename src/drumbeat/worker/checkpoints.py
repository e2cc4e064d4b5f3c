"""Checkpoints: where a long job lends its slot to more urgent work, saves its progress, and
stops when it was cancelled or the worker is shutting down.

Every run gets a `Control` (the worker's side of `drumbeat.checkpoint`). Its common path reads
a few local fields and returns: no Redis round trip. The worker keeps `Lending.best`, the
priority of the most urgent job it knows to be ready, from its claim replies and from the
signals enqueues publish (`signals.py`); a checkpoint lends only when that beats its job's
priority and no slot is free (with a free slot, the claim loop takes the urgent job itself).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any

from drumbeat.errors import Interrupted, LeaseLost
from drumbeat.job import encode_progress
from drumbeat.keys import DEFAULT_QUEUE
from drumbeat.schedule import RUN_PREFIX

from .claims import Claim, ClaimTable
from .retrying import is_transient

if TYPE_CHECKING:
    import redis.asyncio as aredis

    from drumbeat.config import Settings
    from drumbeat.replies import Claimed
    from drumbeat.scripts import Scripts
    from drumbeat.serialization import Codec

log = logging.getLogger("drumbeat.worker")

NO_PRIORITY = -1


class Lending:
    """What every run's checkpoints share: the worker's view of waiting urgent work, and the
    means to save progress and to run an urgent job in a lent slot."""

    def __init__(
        self,
        *,
        worker_id: str,
        shards: Sequence[Scripts],
        jobs: int = 1,
        table: ClaimTable,
        settings: Settings,
        codec: Codec,
        start_lent: Callable[[int, Claimed], Claim],
        stopping: asyncio.Event,
        queues: list[str] = [DEFAULT_QUEUE],  # noqa: B006 (never mutated)
    ) -> None:
        self.worker_id = worker_id
        self.queues = queues
        """The queues the worker serves: it lends its slots to their jobs only."""
        self.shards = shards
        """The worker's shards (a run's progress is saved in its own)."""
        self.jobs = jobs
        """How many of them, first, are job shards (urgent jobs wait in those)."""
        self.table = table
        self.settings = settings
        self.codec = codec
        self.start_lent = start_lent
        self.stopping = stopping
        self.interval = settings.progress_interval
        self._best = [NO_PRIORITY] * jobs
        """Per job shard, the priority of the most urgent job known to wait in a served
        queue's `ready`."""
        self.claiming = False
        """A lend's claim is in flight: other checkpoints do not race it for the same job."""
        self.retiring = False
        """The worker stops claiming but finishes its runs (`Worker.retire`): a checkpoint does
        not hand its run back."""
        self.loop: asyncio.AbstractEventLoop | None = None
        self.client: aredis.Redis | None = None

    def handing_back(self) -> bool:
        """The worker stops and its runs go back to the queue at their next checkpoint."""
        return self.stopping.is_set() and not self.retiring

    def may_lend(self) -> bool:
        """No lend's claim is in flight, and the worker still takes work (a retiring one
        takes none, urgent or not)."""
        return not self.claiming and not self.retiring

    def open(self, client: aredis.Redis) -> None:
        self.loop = asyncio.get_running_loop()
        self.client = client

    @property
    def best(self) -> int:
        """Priority of the most urgent job known to wait, over the job shards."""
        return max(self._best)

    def seen(self, best: int, shard: int = 0) -> None:
        """A claim reply told the best priority left in a job shard's `ready`: that replaces
        the view of that shard."""
        if shard < self.jobs:
            self._best[shard] = best

    def heard(self, priority: int, queue: str = DEFAULT_QUEUE, shard: int = 0) -> None:
        """A job of ``priority`` became ready in ``queue`` of job shard ``shard`` (a signal);
        lending may pay off if this worker serves that queue."""
        if queue in self.queues and shard < self.jobs:
            self._best[shard] = max(self._best[shard], priority)

    def control(self, claim: Claim) -> Control:
        return Control(self, claim)

    def lendable(self) -> bool:
        """Whether a running job has reached a checkpoint (and so may lend its slot)."""
        return any(c.checkpointed for c in self.table.running_controls())

    async def save(self, control: Control) -> None:
        """Writes the run's progress, fenced by its token (a stale run cannot overwrite it)."""
        assert self.client is not None
        job = control.claim.job
        blob = encode_progress(self.codec, control.progress, self.settings.max_payload_bytes)
        shard = self.shards[control.claim.shard]
        saved = await shard.save_progress(job.id, job.token, blob).arun(self.client)
        control.dirty = False
        control.saved_at = time.monotonic()
        if not saved:
            control.claim.lost = True

    async def lend(self, control: Control) -> None:
        """Claims the most urgent ready job of strictly higher priority into this run's slot
        and waits for it to end; nothing if another worker took it first."""
        assert self.client is not None
        if self.claiming:
            return
        shard = self._best.index(self.best)  # where the most urgent job waits
        call = self.shards[shard].claim_urgent(
            self.worker_id, control.priority + 1, self.settings.lease_ms, self.queues
        )
        self.claiming = True
        try:
            result = await call.arun(self.client)
        finally:
            self.claiming = False
        self._best[shard] = result.best
        if not result.jobs:
            return
        claim = self.start_lent(shard, result.jobs[0])
        assert claim.task is not None
        log.info("job %s lends its slot to job %s (priority %d > %d)", control.claim.job.id,
                 claim.job.id, claim.job.priority, control.priority)  # fmt: skip
        control.lending_since = time.monotonic()
        try:
            # wait(), not await: cancelling the paused run must not cancel the urgent one.
            await asyncio.wait({claim.task})
        finally:
            control.paused_before += time.monotonic() - control.lending_since
            control.lending_since = 0.0


class Control:
    """One run's checkpoints (`drumbeat.context.Checkpoints`)."""

    __slots__ = (
        "checkpointed",
        "claim",
        "dirty",
        "is_async",
        "lending",
        "lending_since",
        "paused_before",
        "priority",
        "progress",
        "saved_at",
    )  # fmt: skip

    def __init__(self, lending: Lending, claim: Claim) -> None:
        self.lending = lending
        self.claim = claim
        self.priority = claim.job.priority
        self.progress: Any = None
        self.dirty = False
        self.saved_at = 0.0  # so the first progress a run reports is saved at once
        self.paused_before = 0.0
        self.lending_since = 0.0
        self.is_async = True
        self.checkpointed = False
        """It reached a checkpoint: it can lend its slot."""

    @property
    def paused(self) -> float:
        ongoing = time.monotonic() - self.lending_since if self.lending_since else 0.0
        return self.paused_before + ongoing

    def _wanted(self, progress: Any) -> bool:
        """The fast path: whether this checkpoint has anything to do."""
        self.checkpointed = True
        if progress is not None:
            self.progress = progress
            self.dirty = True
        lending, claim = self.lending, self.claim
        return (
            claim.lost
            or claim.cancelled
            or lending.handing_back()
            or (lending.best > self.priority and lending.table.free <= 0 and lending.may_lend())
            or (self.dirty and time.monotonic() - self.saved_at >= lending.interval)
        )

    def checkpoint(self, progress: Any) -> None:
        """From a sync task's thread: the work happens on the worker's loop."""
        if self._wanted(progress):
            loop = self.lending.loop
            if loop is None or loop.is_closed() or not loop.is_running():
                # The worker is gone (a thread left running after a hard stop): nothing of
                # this run can be saved or settled any more.
                raise Interrupted("handback")
            asyncio.run_coroutine_threadsafe(self._act(), loop).result()

    async def acheckpoint(self, progress: Any) -> None:
        if self._wanted(progress):
            await self._act()

    async def _act(self) -> None:
        lending, claim = self.lending, self.claim
        if claim.lost:
            raise LeaseLost(
                f"job {claim.job.id}: the lease of this run (token {claim.job.token}) was taken "
                "over; its work is no longer its own, so it stops here"
            )
        if claim.cancelled:
            raise Interrupted("cancelled")
        saves = not claim.job.id.startswith(RUN_PREFIX)  # a schedule's run is not resumed
        if lending.handing_back():
            if self.dirty and saves:
                await self._quietly(lending.save(self))
            raise Interrupted("handback")
        lend = lending.best > self.priority and lending.table.free <= 0 and lending.may_lend()
        due = time.monotonic() - self.saved_at >= lending.interval
        if self.dirty and saves and (lend or due):
            await self._quietly(lending.save(self))
        if lend and not claim.lost:
            await self._quietly(lending.lend(self))

    async def _quietly(self, step: Coroutine[Any, Any, None]) -> None:
        """A save or a lend while Redis restarts or fails over is skipped, not the task's
        failure: the progress is saved at a later checkpoint, and it lends another time."""
        try:
            await step
        except Exception as exc:
            if not is_transient(exc):
                raise
            self.saved_at = time.monotonic()
            log.warning("checkpoint of job %s skipped (%s: %s)", self.claim.job.id,
                        type(exc).__name__, exc)  # fmt: skip
