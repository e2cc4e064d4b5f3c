"""Settling: outcomes go to Redis in batches, one script call per kind of outcome and shard.

Runs end one by one; their outcomes wait in `pending` until the flusher sends every outcome
that finished while the last batch was in flight, in one write on its own connection. Which
script settles which outcome, and what it counts, is one table (`settle_kinds`). Every settled,
refused or unsendable claim is released, so no lease is renewed past its job's end.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import redis

from drumbeat.config import Settings
from drumbeat.outcomes import Outcome, Queued, Resettle, RunDone
from drumbeat.replies import Claimed
from drumbeat.schedules.slots import SlotScripts
from drumbeat.scripts import Call, Scripts

from .claims import Claim, ClaimKey, ClaimTable
from .link import Link
from .retrying import Backoff, is_transient
from .routing import Routed
from .settle_kinds import KINDS, QUEUE_KIND, SLOT_KIND, Kind, group_of, slot_item
from .slotted import handback_ids, handed_back, queue_item
from .tally import TALLY_INTERVAL, Tally

log = logging.getLogger("drumbeat.worker")


# One script call: what it does, and the outcomes it settles, in the order of its items.
_Batch = tuple[Call[Any], Kind, list[tuple[Claim, Outcome]]]


class Settler:
    """Owns the outcomes not yet in Redis; `run` is the flusher."""

    def __init__(
        self,
        shards: list[Scripts],
        table: ClaimTable,
        settings: Settings,
        worker_id: str = "",
        queues: Sequence[str] = (),
    ) -> None:
        self.shards = shards
        self.worker_id = worker_id
        self.served = frozenset(queues)
        """The queues this worker serves: a time-slot run of a schedule limited or routed to
        one of them becomes a job this worker takes at once (`take`)."""
        self._takes: dict[ClaimKey, asyncio.Future[Claimed | None]] = {}
        self.table = table
        self.settings = settings
        self.limit = settings.batch_limit
        self.pending: list[tuple[Claim, Outcome]] = []
        self.processed = 0
        self.failed = 0
        self.tally = Tally() if settings.metrics else None
        """Metrics counts not yet in Redis (``None``: the `metrics` setting is off)."""
        self._tally_due = 0.0
        """When (monotonic) the next counts may be sent: at most one `tally` call per
        `TALLY_INTERVAL`, riding with a batch, or alone when none comes by then."""
        self._tally_timer: asyncio.TimerHandle | None = None
        self._wanted = asyncio.Event()
        self._closing = False
        self._stranded: list[Claim] = []
        """Time-slot runs whose settle Redis refused for good (`_give_back`)."""
        self.on_slot_due: Callable[[int], None] = lambda due_ms: None
        """Told the soonest next slot of the time-slot runs a batch settled (the claimer's
        `slots_due_at`): a slot made since the worker's last claim is in no list it holds."""

    def add(self, claim: Claim, outcome: Outcome) -> None:
        self.pending.append((claim, outcome))
        self._wanted.set()

    async def take(self, claim: Claim, outcome: Queued) -> Claimed | None:
        """Sends a time-slot run whose queue this worker serves to it as a job (with the next
        batch) and takes that job at once, as a claim would, unless the queue is paused: its
        run goes on in the slot it holds, rather than waiting for a claim to find it. Returns
        the job taken, or None: refused (its run was put back), left in its paused queue (the
        claim is released either way), or never sent (the flusher stopped: the claim is still
        held, so the stop hands it back)."""
        taken: asyncio.Future[Claimed | None] = asyncio.get_running_loop().create_future()
        self._takes[claim.key] = taken
        self.add(claim, outcome)
        return await taken

    def _took(self, claim: Claim, job: Claimed | None) -> None:
        taken = self._takes.pop(claim.key, None)
        if taken is not None and not taken.done():
            taken.set_result(job)

    async def run(self, link: Link | Routed) -> None:
        """Sends outcomes until `close`; never cancelled mid-batch (a cancelled ack would be
        neither sent nor kept): shutdown calls `close` and waits for it to drain."""
        try:
            while True:
                await self._wanted.wait()
                self._wanted.clear()
                await self.flush(link)
                # An outcome may have come while `flush` sent counts alone, after its last
                # batch: a close then must still send it (else the stop hands its run back,
                # and it runs twice).
                if self._closing and not self.pending:
                    return
        finally:
            if self._tally_timer is not None:
                self._tally_timer.cancel()
            for claim, _ in self.pending:  # left for the stop to hand back
                self._took(claim, None)

    def close(self) -> None:
        """Asks `run` to send what is pending and return."""
        self._closing = True
        self._wanted.set()

    async def flush(self, link: Link | Routed) -> None:
        backoff = Backoff()
        while self.pending:
            batch, self.pending = self.pending, []
            try:
                retry, refused = await self._send(link, self._calls(batch))
                if self._stranded:
                    stranded, self._stranded = self._stranded, []
                    await self._give_back(stranded, link)
                if refused is None:
                    backoff.reset()
                else:  # Redis refused some for now: sending them again at once would spin
                    await asyncio.sleep(backoff.failed(log, f"settling {len(retry)} jobs", refused))
            except Exception as exc:
                if not is_transient(exc):
                    # Outcomes that cannot be sent (a bug, a value the connection cannot
                    # encode) must not stop the flusher, nor keep their leases alive: the
                    # leases lapse and the jobs run again.
                    log.exception("settling %d jobs failed; they run again when their leases "
                                  "expire", len(batch))  # fmt: skip
                    for claim, _ in batch:
                        self.table.release(claim)
                        self._took(claim, None)
                    await self._give_back([c for c, _ in batch if c.job.slot_run is not None], link)
                    continue
                retry = batch
                await asyncio.sleep(backoff.failed(log, f"settling {len(batch)} jobs", exc))
            self.pending[:0] = retry
        if self.tally and (self._closing or self._tally_time()):  # no batch to ride with
            await self._send_tally(link)

    async def _give_back(self, claims: list[Claim], link: Link | Routed) -> None:
        """Time-slot runs that could not be settled go back to a slot at once: they have no
        lease of their own to lapse (their worker's lives on), so they would wait for ever."""
        if not claims:
            return
        calls: list[Call[int]] = []
        for (shard, incarnation), (numbers, ids) in handback_ids(claims).items():
            slot_runs = [c.job.slot_run for c in claims if c.shard == shard]
            back_ms = min(run.due_ms for run in slot_runs if run is not None)
            slots = SlotScripts(self.shards[shard].k)
            calls.append(slots.handback(incarnation, back_ms, numbers, ids))
        try:
            back = sum(await link.run(calls))
        except Exception:
            # Their lots stay open: the stop keeps the lease for the reaper to find them.
            log.exception("handing %d schedule runs back failed; they come back when this "
                          "worker's lease lapses", len(claims))  # fmt: skip
            return
        handed_back(claims)
        log.warning("handed %d schedule runs that could not be settled back to their slots",
                    back)  # fmt: skip

    def _tally_time(self) -> bool:
        """Whether counts may be sent now; if not, makes sure `run` wakes when they may."""
        now = time.monotonic()
        if now >= self._tally_due:
            self._tally_due = now + TALLY_INTERVAL
            return True
        if self._tally_timer is None:
            self._tally_timer = asyncio.get_running_loop().call_later(
                self._tally_due - now, self._tally_wake
            )
        return False

    def _tally_wake(self) -> None:
        self._tally_timer = None
        self._wanted.set()

    async def _send_tally(self, link: Link | Routed) -> None:
        assert self.tally is not None
        counts = self.tally.take()
        try:
            await link.send([self.shards[0].tally(counts)])
        except Exception:  # lost connection: the counts go with the next batch
            self.tally.put_back(counts)
            return
        await self._tallied(link, counts)

    def _calls(self, batch: Sequence[tuple[Claim, Outcome]]) -> list[_Batch]:
        """One script call per kind of outcome, per shard (and queue, or incarnation, as the
        script needs), per `batch_limit` items."""
        groups: dict[tuple[Any, ...], list[tuple[Claim, Outcome]]] = {}
        for item in batch:
            groups.setdefault(group_of(*item, self._takes), []).append(item)
        calls: list[_Batch] = []
        for group, items in groups.items():
            # The lots all settled go with the first settle of their incarnation.
            run = items[0][0].job.slot_run
            drops = run.claims.drops() if group[0] == "slot" and run is not None else []
            for i in range(0, len(items), self.limit):
                calls.append(self._call(group, items[i : i + self.limit], drops))
                drops = []
        return calls

    def _call(
        self, group: tuple[Any, ...], chunk: list[tuple[Claim, Outcome]], drops: list[str]
    ) -> _Batch:
        """The script call of one chunk of a group of `_group_of`."""
        what, shard = group[0], group[1]
        if what == "job":
            kind = KINDS[group[2]]
            assert kind.script is not None
            make = kind.script(self.shards[shard], group[3], self.settings)
            return make([kind.item(c.job, o) for c, o in chunk]), kind, chunk
        slots = SlotScripts(self.shards[shard].k)
        if what == "queue":
            runs = [queue_item(c.job) for c, _ in chunk]
            taker = self.worker_id if group[4] else ""
            call = slots.queue_runs(
                group[2], group[3], runs, taker=taker, lease_ms=self.settings.lease_ms
            )
            return call, QUEUE_KIND, chunk
        settled = [slot_item(c.job, o) for c, o in chunk]
        if what == "slot":
            return slots.settle(group[2], settled, drops), SLOT_KIND, chunk
        tokens = [c.job.token for c, _ in chunk]
        return slots.finish_runs(list(zip(tokens, settled, strict=True))), SLOT_KIND, chunk

    async def _send(
        self, link: Link | Routed, calls: list[_Batch]
    ) -> tuple[list[tuple[Claim, Outcome]], redis.ResponseError | None]:
        """Sends the calls in one write; returns the outcomes to send again (a call Redis
        refused for now: full, read-only, busy) and the first such refusal. A refused item (its
        lease was lost) is logged. The metrics counts of the batch go in the same write, and
        are taken back for the outcomes Redis did not take."""
        counts = self._count(calls)
        sent: list[Call[Any]] = [call for call, _, _ in calls]
        if counts:
            sent.append(self.shards[0].tally(counts))
        try:
            await link.send(sent)
        except BaseException:
            if self.tally is not None:  # the batch is counted again when it is sent again
                self._uncount(item for _, _, items in calls for item in items)
                self.tally.put_back(counts)
            raise
        again, refused = await self._replies(link, calls)
        if counts:
            await self._tallied(link, counts)
        return again, refused

    async def _replies(
        self, link: Link | Routed, calls: list[_Batch]
    ) -> tuple[list[tuple[Claim, Outcome]], redis.ResponseError | None]:
        again: list[tuple[Claim, Outcome]] = []
        refused: redis.ResponseError | None = None
        for _, kind, items in calls:
            taken: Iterator[Claimed] = iter(())
            try:
                _, accepted = await link.next()
            except redis.ResponseError as exc:
                self._uncount(items)
                if is_transient(exc):
                    again += items
                    refused = refused or exc
                    continue
                # A script error will not go away by retrying: the jobs' leases lapse and
                # they run again elsewhere; time-slot runs, which have no lease of their own,
                # go back to their slots (`_give_back`).
                stranded = [c for c, _ in items if c.job.slot_run is not None]
                log.error("%s of %d jobs failed (%s); %s", kind.what, len(items), exc,
                          "they go back to their slots" if stranded else
                          "they run again when their leases expire")  # fmt: skip
                accepted = [None] * len(items)  # none settled, none refused: see below
                self._stranded += stranded
            else:
                accepted, taken = self._accepted(kind, items, accepted)
            release, counts, processed, failed = self.table.release, kind.counts, 0, 0
            soonest: int | None = None
            for (claim, outcome), ok in zip(items, accepted, strict=True):
                run = claim.job.slot_run
                if isinstance(ok, tuple):  # a time-slot run whose schedule changed meanwhile
                    error = slot_item(claim.job, outcome).error
                    again.append((claim, Resettle(ok[1], ok[0], error)))
                else:
                    release(claim)
                    if run is not None and ok is not None:  # (a stranded run: `_give_back`)
                        run.claims.done(run.lot)
                    if ok == 1 and isinstance(outcome, RunDone):
                        soonest = min(soonest or outcome.due_ms, outcome.due_ms)
                    if kind is QUEUE_KIND:
                        self._took(claim, next(taken) if ok == 2 else None)
                if ok:
                    more, failures = counts(outcome)
                    processed += more
                    failed += failures
            self.processed += processed
            self.failed += failed
            if soonest is not None:
                self.on_slot_due(soonest)
        return again, refused

    def _accepted(
        self, kind: Kind, items: list[tuple[Claim, Outcome]], reply: Any
    ) -> tuple[list[Any], Iterator[Claimed]]:
        """What Redis said of each item of a call's ``reply``, and the jobs it took for this
        worker (`take`); the refused ones are logged and their counts taken back."""
        accepted, taken = reply, iter(())
        if kind is QUEUE_KIND:
            accepted, taken = reply.statuses, iter(reply.taken)
        lost = [item for item, ok in zip(items, accepted, strict=True) if not ok]
        for claim, _ in lost:
            log.warning("%s of job %s refused: its lease was taken over (fencing token %s)",
                        kind.what, claim.job.id, claim.job.token)  # fmt: skip
        self._uncount(lost)
        return accepted, taken

    def _count(self, calls: list[_Batch]) -> list[str | int]:
        """The metrics counts to send with ``calls`` (and any taken back before)."""
        if self.tally is None:
            return []
        for _, _, items in calls:
            for claim, outcome in items:
                self.tally.add(claim.task_name, outcome, claim.seconds)
        return self.tally.take() if self._tally_time() else []

    def _uncount(self, items: Iterable[tuple[Claim, Outcome]]) -> None:
        """Takes back the counts of outcomes Redis did not take (sent with the next write)."""
        if self.tally is not None:
            for claim, outcome in items:
                self.tally.add(claim.task_name, outcome, claim.seconds, -1)

    async def _tallied(self, link: Link | Routed, counts: list[str | int]) -> None:
        """Reads the reply of the `tally` call sent with a batch."""
        assert self.tally is not None
        try:
            await link.next()
        except Exception as exc:
            # A lost connection too: the flusher must not crash over counts (on a cluster,
            # a failover is when it happens).
            if is_transient(exc):
                self.tally.put_back(counts)
            elif not isinstance(exc, redis.ResponseError):
                raise
            else:
                log.error("dropped %d metrics counts Redis refused: %s", len(counts) // 2, exc)
