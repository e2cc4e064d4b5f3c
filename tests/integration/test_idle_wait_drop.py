"""A worker that turns busy drops its outstanding idle wait at once, even when the cancel of its
`BZPOPMIN` is not honoured (on Python 3.11, redis-py's ``asyncio.wait_for`` swallows a cancel
that lands while the pop makes its connection, and the pop then blocks for all of
`idle_block`): awaiting it held busy workers 2 s with their slots free (`bench.periodic` at
100,000 schedules, lateness p99 1.5 s). A marker such a pop takes is put back for idle workers.
"""

from __future__ import annotations

import asyncio
from typing import Any

import drumbeat
from drumbeat import connections
from drumbeat.worker.claiming import Claimer
from drumbeat.worker.claims import ClaimTable

IDLE_BLOCK = 1.0
TRIES = 150


async def _claimer(app: drumbeat.App) -> tuple[Claimer, Any]:
    settings = app.settings.replace(idle_block=IDLE_BLOCK)
    claimer = Claimer(
        worker_id="w", shards=[app.scripts], settings=settings, table=ClaimTable(4),
        start=lambda shard, job: None, stopping=asyncio.Event(),
    )  # fmt: skip
    client = connections.worker_client(app.url, IDLE_BLOCK)
    await claimer.open(client)
    return claimer, client


async def test_dropping_the_idle_wait_never_waits_for_its_pop_to_time_out(
    app: drumbeat.App,
) -> None:
    claimer, client = await _claimer(app)
    waited_out = 0
    try:
        for i in range(TRIES):
            block = claimer.wakes.arm()
            # The pop makes a new connection (the last cancel closed its own) while others use
            # the client: the moment a swallowed cancel needs.
            await asyncio.wait({block}, timeout=0.0001 * (i % 7))
            await client.ping()
            await claimer.wakes.drop()
            if block.done() and not block.cancelled():
                waited_out += 1  # it ran to its timeout before cancel_block returned
    finally:
        await claimer.close()
        await client.aclose()
    assert waited_out == 0, f"{waited_out} of {TRIES} drops waited for the pop's whole block"


async def test_a_marker_taken_by_a_dropped_pop_is_put_back(app: drumbeat.App) -> None:
    claimer, client = await _claimer(app)
    key = app.keys.wake
    try:
        dropped: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        claimer.wakes.dropped.add(dropped)
        dropped.add_done_callback(claimer.wakes.give_back)
        await client.zadd(key, {"m": 7})
        popped = await client.bzpopmin([key], 1)  # as the dropped pop would have, late
        assert popped is not None and await client.zcard(key) == 0
        dropped.set_result(popped)
        await asyncio.sleep(0)  # the callback runs
        assert claimer.wakes.giving_back, "the put-back is under way"
        await asyncio.wait(claimer.wakes.giving_back)
        assert await client.zscore(key, "m") == 7.0, "the marker is back for idle workers"
        assert not claimer.wakes.dropped
    finally:
        await claimer.close()
        await client.aclose()


async def test_a_short_wait_arms_no_pop_and_a_long_one_does(app: drumbeat.App) -> None:
    """Claims paced a few ms apart (slots coming due) wait that long between them: a pop armed
    for each was dropped at the next claim, costing its connection every time (a reconnect
    every few ms: 70 of the 70.8 CPU-s a 1.18-CPU host had at 100,000 schedules every 5 s)."""
    claimer, client = await _claimer(app)
    try:
        now = claimer.now_ms()
        await claimer._wait_for_work(1, now, now + 5)
        assert not claimer.wakes.armed(), "a 5-ms wait armed a pop"
        await claimer._wait_for_work(1, now, now + 200)
        assert claimer.wakes.armed(), "a 200-ms wait should arm one (jobs wake it)"
    finally:
        await claimer.close()
        await client.aclose()


async def test_jobs_came_ends_an_idle_wait_under_way_short_or_long(app: drumbeat.App) -> None:
    """Runs this worker just queued in a queue it serves (a limited schedule's), or a signal,
    end its idle wait: it does not wait for its timer (the next slot due, a minute off here),
    nor, once told before it starts, wait at all."""
    claimer, client = await _claimer(app)
    now = claimer.now_ms()
    try:
        # A short wait (no pop armed): it ends within the loop turns that follow, long before
        # its 40-ms timer could.
        wait = asyncio.ensure_future(claimer._wait_for_work(4, now, claimer.now_ms() + 40))
        await asyncio.sleep(0)
        assert not wait.done() and claimer._waking is not None, "the wait should be under way"
        claimer.jobs_came()
        for _ in range(3):
            await asyncio.sleep(0)
        assert wait.done(), "the short wait went on after jobs_came"
        # A long one (a pop armed): not its timer's minute.
        wait = asyncio.ensure_future(claimer._wait_for_work(4, now, now + 60_000))
        await asyncio.sleep(0.005)
        assert not wait.done(), "the wait should be under way"
        claimer.jobs_came()
        await asyncio.wait_for(wait, 5)
        claimer.jobs_came()
        told = asyncio.ensure_future(claimer._wait_for_work(4, now, now + 60_000))
        await asyncio.wait_for(told, 5)
    finally:
        await claimer.close()
        await client.aclose()
