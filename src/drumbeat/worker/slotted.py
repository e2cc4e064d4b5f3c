"""The worker's lane for the time slots, where every schedule waits (docs/design/time-slots.md).

It claims the due slots of each schedule shard (those the last reply listed as upcoming), turns
their entries into `Claimed` runs for the runner, builds each run's next entry when it ends
(`settle_item`; `queue_item` when the runner sends a run of a limited or routed schedule to its
queue as a job, `finish_item` when that job ends), and keeps the process's lease in each
shard's `runners` under an incarnation of its own there: the runs it holds in a shard are its
while that lease lives. A reaped incarnation (its lease lapsed: a long freeze) has lost its
runs in that shard to other workers; the lane then takes a new incarnation there, and the
settles of the old one's runs are refused. A claim's entries wait in Redis in its lots (one
list per slot it took from), for the reaper; the lane reads them in the same write as the
claim, counts the runs of each lot left to settle (`Claims`), and a settle drops the lots all
settled.
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import logging
import math
import random
from collections.abc import Sequence
from typing import Any

import redis
import redis.asyncio as aredis

from drumbeat.config import Settings
from drumbeat.keys import Keys
from drumbeat.outcomes import RunDone
from drumbeat.protocol import FIELD_SEP, ROUTE_FIELD, RUN_PREFIX, SCHEDULE_FIELDS, run_times
from drumbeat.replies import Claimed, SlotRun
from drumbeat.schedules.slots import (
    UPCOMING,
    Claims,
    Entry,
    Lot,
    Queueing,
    Settled,
    SlotClaim,
    SlotScripts,
    read_lot,
    settled_fields,
    settled_record,
    text_of,
    wire,
)
from drumbeat.scripts import Call

from .claims import Claim

log = logging.getLogger("drumbeat.worker")

# A claim takes the slots due by this long after it is sent (ms): it reaches Redis a little
# later.
_SLACK_MS = 5
# A claim asks for the upcoming slots again when fewer than this many are left in its list, or
# the last of them is due within _AHEAD_MS.
_FEW = 16
_AHEAD_MS = 20
# Due slots a claim passes beyond the ones its room should fill (at the recent number of entries
# a slot gave): each passed slot costs a key, a read of its lot, and Redis a command.
_SPARE_SLOTS = 2
# A worker claims from a shard's time slots at most this often while it has room (ms), unless
# a slot was due by its last claim: the slots that come due meanwhile go in one claim. Claiming
# each slot as it came due (every ms at 10,000 schedules every 5 s, two workers racing for
# each) took 42 CPU-s in bench.periodic's 60-s window against this pace's 24-25, for a
# lateness p99 of 2 ms against 6.
_PACE_MS = 5
# A claim that knows this many times the due slots it passes takes a stretch of them at random
# rather than the oldest (`SlotLane.calls`).
_SPREAD = 3
# Fields of a schedule's record (`protocol.SCHEDULE_FIELDS`).
_FIELDS = len(SCHEDULE_FIELDS)


class SlotLane:
    """Claims and settles the runs of the time slots of the shards that hold schedules."""

    def __init__(
        self, worker_id: str, keys: Sequence[Keys], settings: Settings, held: Sequence[int]
    ) -> None:
        self.worker_id = worker_id
        self.settings = settings
        self.scripts = [SlotScripts(k) for k in keys]
        """Per shard of the worker (by its index there)."""
        self.held = list(held)
        """The worker's shards that hold schedules."""
        self._lives = itertools.count(1)
        self.claims = [Claims(f"{worker_id}.{next(self._lives)}") for _ in keys]
        """Per shard, the claims of the incarnation its runs are held under (`<worker
        id>.<n>`)."""
        self._numbers = itertools.count(1)
        self._first = [True for _ in keys]
        """Per shard, whether the incarnation has not claimed there yet (the claim registers
        it; a later claim of an incarnation missing from `runners` was reaped)."""
        self._tokens = itertools.count(1)
        self._upcoming: list[list[int]] = [[] for _ in keys]
        self._per_slot = [1.0 for _ in keys]
        """Per shard, the entries a slot gave a claim lately (a moving average)."""
        self._names: list[dict[str, bytes]] = [{} for _ in keys]
        """Per shard, task code -> task name (the `tasks` table)."""
        self._routes: list[dict[str, str]] = [{} for _ in keys]
        """Per shard, task code -> the queue its runs go to, for the codes of routed ones."""
        self._random = random.Random()
        self._passed: list[tuple[list[int], int]] = [([], 0) for _ in keys]
        """Per shard, the slots the last claim passed and the room it had."""
        self._claimed_ms = [0 for _ in keys]
        """Per shard, when the last claim was sent (Redis ms, as the worker knows it)."""

    @property
    def incarnation(self) -> list[str]:
        """Per shard, the incarnation its runs are held under."""
        return [c.incarnation for c in self.claims]

    def calls(self, shard: int, limit: int, now_ms: int) -> list[Call[Any]]:
        """A claim of up to ``limit`` runs from the due slots ``shard`` listed as upcoming,
        then the reads of its lots: one write (`took` takes their replies)."""
        known = self._upcoming[shard]
        due = bisect.bisect_right(known, now_ms + _SLACK_MS)
        # The due slots the room should fill, not every due slot known (a pool that fell behind
        # knows 128): those left stay known for the next claim.
        n = min(due, math.ceil(limit / self._per_slot[shard]) + _SPARE_SLOTS)
        at = 0
        if due >= _SPREAD * n:
            # A backlog (a cold start: every schedule due at once): every worker's list names
            # the same oldest slots, so claims that all passed its head found them taken by
            # one of them, whole or in part (`bench.periodic --cold`: 2 processes drained 11k
            # runs/s of 100,000 due with two thirds of a core busy; 44k/s with this). Each
            # takes a stretch at random instead.
            at = self._random.randrange(due - n + 1)
        passed, rest = known[at : at + n], known[:at] + known[at + n :]
        self._upcoming[shard] = rest
        self._passed[shard] = (passed, limit)
        self._claimed_ms[shard] = now_ms
        want = 0
        if len(rest) < _FEW or rest[-1] <= now_ms + _AHEAD_MS:
            want = UPCOMING
        s, incarnation = self.scripts[shard], self.claims[shard].incarnation
        number = next(self._numbers)
        claim = s.claim(
            incarnation, limit, self.settings.lease_ms, passed, number,
            first=self._first[shard], upcoming=want,
        )  # fmt: skip
        return [claim, *s.reads(incarnation, number, passed)]

    async def took(
        self, shard: int, replies: Sequence[Any], client: aredis.Redis
    ) -> tuple[SlotClaim, list[Claimed]]:
        """The claim's reply and the runs it took, ready for the runner (``replies``: those
        of `calls`); takes a new incarnation when the claim says this one was reaped."""
        result: SlotClaim = replies[0]
        if result.reaped:
            old = self.claims[shard].incarnation
            self.claims[shard] = Claims(f"{self.worker_id}.{next(self._lives)}")
            self._first[shard] = True
            log.warning("this worker's lease on its schedule runs of shard %d lapsed "
                        "(incarnation %s): they went back to their slots; claiming as %s",
                        shard, old, self.claims[shard].incarnation)  # fmt: skip
            return result, []
        self._first[shard] = False
        if result.upcoming is not None:
            self._upcoming[shard] = result.upcoming
        else:
            self._upcoming[shard] = self._left(shard, result) + self._upcoming[shard]
        claims, names, now = self.claims[shard], self._names[shard], result.now_ms
        routes = self._routes[shard]
        whole = [t for t in result.taken if t]
        if whole:
            self._per_slot[shard] = (self._per_slot[shard] + sum(whole) / len(whole)) / 2
        runs: list[Claimed] = []
        for taken, read in zip(result.taken, replies[1:], strict=True):
            lot: Lot = read
            if not taken:
                continue
            if len(lot.entries) + len(lot.malformed) != taken:
                # Read before the claim ran after all (it was sent again after Redis lost
                # its scripts): read it now.
                key = self.scripts[shard].k.claimed(claims.incarnation, lot.name)
                lot = read_lot(lot.name, lot.slot_ms, await client.lrange(key, 0, -1))
            for bad in lot.malformed:
                log.error("dropped a time-slot entry without a schedule id: %r", bad[:200])
            split = [(e, e.record.split(FIELD_SEP, 10)) for e in lot.entries]
            codes = {f[9] for _, f in split if len(f) == _FIELDS} - names.keys()
            if codes:
                await self._learn(shard, sorted(codes), client)
            claims.took(lot.name, len(split))
            runs += [
                self._claimed(e, f, now, names, routes, claims=claims, lot=lot.name)
                for e, f in split
            ]
        return result, runs

    def _left(self, shard: int, result: SlotClaim) -> list[int]:
        """The slots the claim passed that may still hold entries, for the next claim: those
        not due yet when it ran (sent up to `_SLACK_MS` early, it reached Redis before them),
        and, when its room ran out, the due ones from the last it took from on. Dropped from
        the list, a slot waited for the next list of upcoming slots, some 50-80 ms later
        (lateness p99 71 ms at 10,000 schedules every 5 s)."""
        passed, room = self._passed[shard]
        self._passed[shard] = ([], 0)
        left = [ms for ms in passed if ms > result.now_ms]
        if sum(result.taken) >= room:
            last = max((i for i, n in enumerate(result.taken) if n), default=0)
            left = sorted({*left, *(ms for ms in passed[last:] if ms <= result.now_ms)})
        return left

    async def _learn(self, shard: int, codes: list[str], client: aredis.Redis) -> None:
        """Task names of task codes, and the queue of a routed one (the `tasks` table:
        ``#<code>`` -> name, ``#q<code>`` -> queue)."""
        key = self.scripts[shard].k.tasks
        fields = [f for c in codes for f in (f"#{c}", f"{ROUTE_FIELD}{c}")]
        got = await client.hmget(key, fields)
        for i, code in enumerate(codes):
            name, queue = got[2 * i], got[2 * i + 1]
            self._names[shard][code] = b"?" if name is None else _bytes(name)
            if queue is not None:
                self._routes[shard][code] = text_of(queue)

    def _claimed(
        self,
        e: Entry,
        fields: list[str],
        now_ms: int,
        names: dict[str, bytes],
        routes: dict[str, str],
        *,
        claims: Claims,
        lot: str,
    ) -> Claimed:
        """A run for the runner; one whose record cannot be read has no spec (the runner
        reports it, and its entry goes back as it was)."""
        run = SlotRun(claims, lot, fields, now_ms, e.due_ms, e.first_start_ms, e.slot_ms)
        if len(fields) != _FIELDS or not fields[2].isdigit() or not fields[1].isdigit():
            return Claimed(RUN_PREFIX + e.schedule_id, None, e.stalls + 1, e.stalls,
                           next(self._tokens), 0, "", slot_run=run)  # fmt: skip
        flags, code, spec = fields[2], fields[9], fields[10]
        if routes:
            run.queue = routes.get(code)
        # The run's place in its schedule is read from its fields (`decode_run`), not from
        # `extra` (`SlotRun.run_key` makes that string if it becomes a job).
        return Claimed(
            RUN_PREFIX + e.schedule_id,
            names.get(code, b"?") + b"|" + wire(spec),
            e.stalls + 1,
            e.stalls,
            next(self._tokens),
            int(flags) % 10,
            "",
            slot_run=run,
        )

    def renew(self, client: redis.Redis) -> None:
        """Renews the incarnation's lease on every shard with schedules (the heartbeat's
        thread); a reaped one is found by its next claim."""
        for shard in self.held:
            incarnation = self.claims[shard].incarnation
            self.scripts[shard].renew(incarnation, self.settings.lease_ms).run(client)

    async def reap(self, client: aredis.Redis, now_ms: int) -> int:
        """Takes back the runs of every incarnation whose lease lapsed (any worker's); returns
        how many."""
        back = 0
        for shard in self.held:
            s = self.scripts[shard]
            lapsed = await client.zrangebyscore(s.k.runners, "-inf", now_ms, start=0, num=64)
            if lapsed:
                names = [text_of(x) for x in lapsed if isinstance(x, bytes | str)]
                async with client.pipeline(transaction=False) as pipe:
                    for name in names:
                        pipe.hkeys(s.k.inflight(name))
                    lots = await pipe.execute()
                held = {name: [text_of(lot) for lot in got]
                        for name, got in zip(names, lots, strict=True)}  # fmt: skip
                n = await s.reap(now_ms, held).arun(client)
                if n:
                    log.warning("shard %d: the leases of %s lapsed: %d schedule runs went back "
                                "to their slots", shard, ", ".join(names), n)  # fmt: skip
                back += n
        return back

    async def handback(self, client: aredis.Redis, claims: Sequence[Claim], now_ms: int) -> int:
        """Gives the runs ``claims`` hold back to their slots (a graceful stop past its
        grace); returns how many went back."""
        n = 0
        for (shard, incarnation), (lots, ids) in handback_ids(claims).items():
            call = self.scripts[shard].handback(incarnation, now_ms, lots, ids)
            n += await call.arun(client)
        handed_back(claims)
        return n

    async def deregister(self, client: aredis.Redis) -> None:
        """Gives up the incarnation's lease, and drops its lots, where it holds nothing
        (claims have stopped): runs it still holds (a hand-back that failed) come back when
        the lease lapses."""
        for shard in self.held:
            k, claims = self.scripts[shard].k, self.claims[shard]
            if claims.open:
                continue
            lots = await client.hkeys(k.inflight(claims.incarnation))
            lists = [k.claimed(claims.incarnation, text_of(lot)) for lot in lots]
            async with client.pipeline(transaction=False) as pipe:
                pipe.delete(k.inflight(claims.incarnation), *lists)
                pipe.zrem(k.runners, claims.incarnation)
                pipe.hdel(k.busy, claims.incarnation)
                await pipe.execute()

    def next_due(self, shard: int, result: SlotClaim) -> int | None:
        """When to claim from ``shard`` next: when its next slot comes due, as far as the reply
        tells, but not within `_PACE_MS` of the last claim, unless that slot was due by then
        (the claim left it: its room ran out)."""
        known = self._upcoming[shard]
        due = known[0] if known else result.next_ms
        if due is None or due <= self._claimed_ms[shard]:
            return due
        return max(due, self._claimed_ms[shard] + _PACE_MS)


def settle_item(job: Claimed, outcome: RunDone) -> Settled:
    """The settle of a time-slot run: its schedule's next entry, built here from the record it
    was claimed with. A record that cannot be read goes back as it was, due when the runner
    said (it reported the run unreadable)."""
    run = job.slot_run
    assert run is not None
    sid = job.id[len(RUN_PREFIX) :]
    error = outcome.error if outcome.outcome == "fail" else None
    try:
        record = settled_fields(
            run.fields, outcome=outcome.outcome, started_ms=run.claimed_ms,
            duration_ms=outcome.duration_ms, next_grid_ms=outcome.grid_ms, due_ms=run.due_ms,
            first_start_ms=run.first_ms,
        )  # fmt: skip
    except ValueError:
        record = FIELD_SEP.join(run.fields)
    return Settled(sid, f"{sid}|{record}", outcome.due_ms, run.slot_ms, error)


def queue_item(job: Claimed) -> Queueing:
    """A time-slot run going to its queue as a job: its job record carries the schedule's
    record as claimed, from which `finish_item` builds the next one."""
    run = job.slot_run
    assert run is not None and job.spec is not None
    name = job.spec.partition(FIELD_SEP.encode())[0]
    record = name + b"|" + wire(FIELD_SEP.join(run.fields))
    return Queueing(job.id[len(RUN_PREFIX) :], run.slot_ms, record, job.priority, run.run_key(),
                    job.stalls, run.claimed_ms)  # fmt: skip


def finish_item(job: Claimed, outcome: RunDone) -> Settled:
    """The settle of a run that ran as a job (`queue_item`): its schedule's next entry, built
    from the record its job carries. A record that cannot be read goes back as it was (the
    runner reported it)."""
    sid = job.id[len(RUN_PREFIX) :]
    record = text_of((job.spec or b"").partition(FIELD_SEP.encode())[2])
    due, first = run_times(job.extra)
    error = outcome.error if outcome.outcome == "fail" else None
    with contextlib.suppress(ValueError):  # unreadable: it goes back as it was
        record = settled_record(
            record, outcome=outcome.outcome, started_ms=outcome.started_ms,
            duration_ms=outcome.duration_ms, next_grid_ms=outcome.grid_ms, due_ms=due,
            first_start_ms=first,
        )  # fmt: skip
    return Settled(sid, f"{sid}|{record}", outcome.due_ms, 0, error)


def _bytes(value: bytes | str) -> bytes:
    return value.encode() if isinstance(value, str) else value


def handback_ids(claims: Sequence[Claim]) -> dict[tuple[int, str], tuple[list[str], list[str]]]:
    """Per (shard, incarnation) of the time-slot runs ``claims`` hold, the lots that hold
    them and their schedule ids."""
    out: dict[tuple[int, str], tuple[list[str], list[str]]] = {}
    for claim in claims:
        run = claim.job.slot_run
        if run is not None:
            lots, ids = out.setdefault((claim.shard, run.incarnation), ([], []))
            if run.lot not in lots:
                lots.append(run.lot)
            ids.append(claim.job.id[len(RUN_PREFIX) :])
    return out


def handed_back(claims: Sequence[Claim]) -> None:
    """Counts the time-slot runs of ``claims`` as done with (handed back, or left to the
    reaper when the hand-back failed)."""
    for claim in claims:
        run = claim.job.slot_run
        if run is not None:
            run.claims.done(run.lot)
