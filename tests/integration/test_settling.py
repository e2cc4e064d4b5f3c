"""The flusher: at a worker's stop, every outcome in hand when it is asked to close is sent,
whatever it was awaiting then; a time-slot run whose settle fails for good goes back to a slot,
and its lot is counted done for it once."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest
import redis
import redis.asyncio as aredis

import drumbeat
from drumbeat.job import encode_success
from drumbeat.outcomes import Done, RunDone
from drumbeat.schedules.slots import SlotScripts
from drumbeat.scripts import Call
from drumbeat.worker.claims import ClaimTable
from drumbeat.worker.link import Link
from drumbeat.worker.settling import Settler
from tests.helpers import claim_due_runs, redis_now_ms, wait_for_async


class _HeldTally(Link):
    """A link to the real Redis whose lone metrics write waits until the test lets it go, so
    the flusher sits in it as long as the test needs."""

    def __init__(self, client: aredis.Redis) -> None:
        super().__init__(client)
        self.in_tally = asyncio.Event()
        self.let_go = asyncio.Event()

    async def send(self, calls: Sequence[Call[Any]]) -> None:
        if [c.name for c in calls] == ["tally"]:
            self.in_tally.set()
            await self.let_go.wait()
        await super().send(calls)


async def test_an_outcome_that_comes_while_the_flusher_sends_counts_is_sent_at_close(
    app: drumbeat.App,
) -> None:
    # A run that ended while the flusher sent the metrics counts alone, then a close (the
    # worker's stop): the flusher used to return with that outcome unsent, and the stop
    # handed the run back as unfinished though it had run (so it ran twice).
    @app.task(name="work")
    def work() -> None: ...

    jobs = [work.enqueue() for _ in range(3)]
    claimed = app.scripts.claim("worker-a", 3, 60_000, 100).run(app.redis).jobs
    assert sorted(j.id for j in claimed) == sorted(j.id for j in jobs)
    link = _HeldTally(await app.aredis())
    table = ClaimTable(3)
    settler = Settler([app.scripts], table, app.settings)
    assert settler.tally is not None  # metrics are on by default
    flusher = asyncio.create_task(settler.run(link))
    done = Done(encode_success(app.codec, None, 1 << 20), 60_000)
    try:
        # The first outcome's counts ride with its ack; the second's wait, as counts go at
        # most every `TALLY_INTERVAL`, and with nothing else to send then they go alone.
        settler.add(table.hold(0, claimed[0]), done)
        await wait_for_async(lambda: len(table), lambda n: n == 0, message="first settled")
        settler.add(table.hold(0, claimed[1]), done)
        await asyncio.wait_for(link.in_tally.wait(), 10)
        settler.add(table.hold(0, claimed[2]), done)
        settler.close()
        link.let_go.set()
        await asyncio.wait_for(flusher, 10)
    finally:
        link.let_go.set()
        await link.aclose()
    assert not settler.pending, "the flusher returned with an outcome unsent"
    assert len(table) == 0, "a settled run is still held: the stop would hand it back"
    assert [await j.astatus() for j in jobs] == ["complete"] * 3


async def test_a_run_whose_settle_fails_for_good_leaves_its_lot_to_the_runs_still_in_flight(
    app: drumbeat.App, r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two runs claimed into one lot; the first's settle fails for good (a script error), so it
    # goes back to a slot. The lot must stay while the second is in flight: a lot counted done
    # twice for the first was dropped by the next settle, and had the worker then died, the
    # reaper (which finds in-flight runs by their lots) could never have put the second back.
    @app.task(name="tick")
    async def tick() -> None: ...

    await app.aschedule_many([drumbeat.Schedule(sid, "tick", every=3600) for sid in "ab"])
    assert await app.arun_now("a", "b") == 2  # both due in the same slot: one lot
    keys = app.scheduler.shards[0]
    lane, (first, second) = await claim_due_runs(app, r, 2)
    assert first.slot_run is not None and second.slot_run is not None
    lot = first.slot_run.lot
    assert second.slot_run.lot == lot and lane.claims[0].open == {lot: 2}

    settle = SlotScripts.settle

    def broken(self: SlotScripts, incarnation: str, items: list, drops: list) -> Call:  # type: ignore[type-arg]
        call = settle(self, incarnation, items, drops)  # ARGV[2], the runs' count, unreadable:
        return Call(call.name, call.keys, [call.args[0], "x", *call.args[2:]], call.parse)

    monkeypatch.setattr(SlotScripts, "settle", broken)
    link = Link(await app.aredis())
    table = ClaimTable(2)
    settler = Settler([app.scripts], table, app.settings)
    flusher = asyncio.create_task(settler.run(link))
    held = [table.hold(0, run) for run in (first, second)]
    now = redis_now_ms(r)
    settler.add(held[0], RunDone("ok", 5, 1, now + 3_600_000, now + 3_600_000, "", now))
    await wait_for_async(lambda: held[0].key in table, lambda h: not h, message="given up")
    settler.close()
    await asyncio.wait_for(flusher, 10)
    await link.aclose()

    assert lane.claims[0].open == {lot: 1}, "the lot was counted done for a run still in flight"
    assert lane.claims[0].drops() == []
    assert held[1].key in table
    waiting = r.lrange(keys.slot(first.slot_run.slot_ms), 0, -1)
    assert [e.split(b"|")[0] for e in waiting] == [b"a"], "given back to its slot"
    in_lot = r.lrange(keys.claimed(lane.incarnation[0], lot), 0, -1)
    assert [e.split(b"|")[0] for e in in_lot] == [b"b"], "the lot holds the run in flight"
