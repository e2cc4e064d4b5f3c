"""The flusher at a worker's stop: every outcome in hand when it is asked to close is sent,
whatever it was awaiting then."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import redis.asyncio as aredis

import drumbeat
from drumbeat.job import encode_success
from drumbeat.outcomes import Done
from drumbeat.scripts import Call
from drumbeat.worker.claims import ClaimTable
from drumbeat.worker.link import Link
from drumbeat.worker.settling import Settler
from tests.helpers import wait_for_async


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
