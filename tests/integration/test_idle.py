"""An idle worker stays idle: after schedules are removed, paused, run by hand or moved later,
it settles into one claim per `idle_block` instead of claiming again and again (issue 10, 2.1).

Each test runs on a Redis of its own, so the command counter sees this worker and nothing else.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import redis

import drumbeat
from drumbeat.script_sources import SHAS
from tests.conftest import RedisServer, running_worker, server_binary
from tests.helpers import blocked_in, commands, wait_for_async

SCHEDULES = 600
IDLE_BLOCK = 0.5
WINDOW = 2 * IDLE_BLOCK
# Commands an idle worker may cost in one WINDOW, counting every command Redis executes (a
# script's own calls count too, see _commands). Measured per idle_block today (INFO commandstats):
# CLIENT ID + BZPOPMIN, and two claims (the one pipelined behind the pop, then the claim loop's),
# each an EVALSHA making 6 calls on an empty queue (TIME, ZRANGEBYSCORE x2, ZPOPMIN, ZCARD,
# ZRANGE): 16 per idle_block. A window of two idle_blocks overlaps at most three: 48. Housekeeping
# and the heartbeat are set far apart (below), so at most one of each falls in a window: a reap
# script (at most ~25 calls) and a lease renewal (~4), plus the INFO that closes the window: 78,
# rounded to 100. A worker that spins on a stale marker costs tens of thousands per window.
MAX_COMMANDS = 100


@pytest.fixture
async def own_app() -> AsyncIterator[tuple[drumbeat.App, redis.Redis]]:
    server = RedisServer(server_binary())
    server.start()
    app = drumbeat.App(
        server.url,
        namespace="t" + uuid.uuid4().hex[:12],
        idle_block=IDLE_BLOCK,
        min_interval=1.0,
        maintenance_interval=30.0,
        lease=60.0,
    )
    client = redis.Redis.from_url(server.url)
    try:
        yield app, client
    finally:
        client.close()
        await app.aclose()
        server.stop()


def _commands(client: redis.Redis) -> int:
    """Commands the server has executed so far (a script's own calls included)."""
    return int(client.info("stats")["total_commands_processed"])


def _now_ms(client: redis.Redis) -> int:
    sec, usec = client.time()
    return int(sec) * 1000 + int(usec) // 1000


async def _poll(check: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting until {what}"
        await asyncio.sleep(0.05)


async def _settled_quiet(client: redis.Redis, timeout: float = 30.0) -> None:
    """Waits until two windows in a row cost at most MAX_COMMANDS each (the worker has finished
    what was in flight by then); a worker that never settles fails with the counts it made."""
    deadline = time.monotonic() + timeout
    counts: list[int] = []
    while True:
        before = _commands(client)
        await asyncio.sleep(WINDOW)
        counts.append(_commands(client) - before)
        if len(counts) >= 2 and max(counts[-2:]) <= MAX_COMMANDS:
            return
        assert time.monotonic() < deadline, (
            f"an idle worker should make at most {MAX_COMMANDS} Redis commands per {WINDOW} s "
            f"({IDLE_BLOCK} s idle_block); it made {counts[-8:]} in the last windows"
        )


def _remove(app: drumbeat.App, ids: list[str]) -> Awaitable[int]:
    return app.aunschedule(*ids)


def _pause(app: drumbeat.App, ids: list[str]) -> Awaitable[int]:
    return app.apause(*ids)


async def _run_now_then_remove(app: drumbeat.App, ids: list[str]) -> int:
    await app.arun_now(*ids)
    return await app.aunschedule(*ids)


async def _move_later(app: drumbeat.App, ids: list[str]) -> int:
    # Once a day, twelve hours from now (UTC): nothing comes due while the test watches, and
    # every bucket's marker is left at the earlier time it had.
    (task,) = app.tasks.values()
    hour = (time.gmtime().tm_hour + 12) % 24
    later = [drumbeat.Schedule(i, task, cron=f"0 {hour} * * *") for i in ids]
    return len(await app.aschedule_many(later))


@pytest.mark.slow
@pytest.mark.parametrize(
    "change",
    [_remove, _pause, _run_now_then_remove, _move_later],
    ids=["unschedule", "pause", "run_now-unschedule", "upsert-later"],
)
async def test_idle_worker_stays_quiet_after_schedules_change(
    own_app: tuple[drumbeat.App, redis.Redis],
    change: Callable[[drumbeat.App, list[str]], Awaitable[int]],
) -> None:
    app, client = own_app
    ran: set[str] = set()

    @app.task
    async def tick(i: int) -> None:
        ran.add(f"s{i}")

    ids = [f"s{i}" for i in range(SCHEDULES)]
    await app.aschedule_many(
        [drumbeat.Schedule(f"s{i}", tick, every=1, args=(i,)) for i in range(SCHEDULES)]
    )
    async with running_worker(app, concurrency=50):
        await _poll(lambda: len(ran) == SCHEDULES, f"all {SCHEDULES} schedules ran once")
        await change(app, ids)
        await _settled_quiet(client)
        now = _now_ms(client)
        due = app.keys.due
        past = client.zrangebyscore(due, "-inf", now, withscores=True)
        assert past == [], f"`due` should hold no marker in the past once idle, holds {past[:5]}"


def _log_every_command(r: redis.Redis) -> None:
    """Puts every command in the SLOWLOG, to tell the scripts apart."""
    r.config_set("slowlog-log-slower-than", 0)
    r.config_set("slowlog-max-len", 10_000)
    r.slowlog_reset()


def _script_calls(r: redis.Redis, name: str) -> int:
    """The calls of script ``name`` in the SLOWLOG (`_log_every_command`)."""
    sha = SHAS[name].encode()
    return sum(1 for e in r.slowlog_get(10_000) if e["command"].split()[:2] == [b"EVALSHA", sha])


async def test_an_idle_worker_claims_once_per_idle_block(
    own_redis: RedisServer, own_r: redis.Redis, namespace: str
) -> None:
    """The idle wait carries the next claim behind its BZPOPMIN; when that claim took nothing
    the worker waits again on its reply instead of claiming jobs a second time at once (two
    claims per idle_block, before). It also claims the time slots once a wait (the wait's
    claim does not)."""
    app = drumbeat.App(own_redis.url, namespace=namespace, idle_block=0.2,
                       maintenance_interval=60.0, lease=120.0)  # fmt: skip
    try:
        async with running_worker(app):
            # Past start-up (its first claim and reap, its registration), then measure.
            await wait_for_async(lambda: commands(own_r, "bzpopmin") >= 2,
                                 message="the worker never went idle")  # fmt: skip
            _log_every_command(own_r)
            pops = commands(own_r, "bzpopmin")
            await wait_for_async(lambda: commands(own_r, "bzpopmin") >= pops + 8,
                                 message="the idle worker stopped waiting")  # fmt: skip
            waits = commands(own_r, "bzpopmin") - pops
            claims, slot_claims = _script_calls(own_r, "claim"), _script_calls(own_r, "claim_slots")
    finally:
        await app.aclose()
    # One of each per wait (the window may cut one wait's claims from its pop).
    assert claims <= waits + 1, f"{claims} claims of jobs over {waits} idle waits"
    assert waits - 1 <= slot_claims <= waits + 1, f"{slot_claims} slot claims, {waits} waits"


async def test_a_job_at_light_load_costs_one_claim(
    own_redis: RedisServer, own_r: redis.Redis, namespace: str
) -> None:
    """The wait's own claim took the job and left `ready` empty: the worker starts it and waits
    again on that reply, rather than claiming once more before its next wait (two claims per
    job, before)."""
    app = drumbeat.App(own_redis.url, namespace=namespace, maintenance_interval=60.0, lease=120.0)

    @app.task
    async def work() -> None: ...

    jobs = 10
    try:
        async with running_worker(app):
            await wait_for_async(lambda: commands(own_r, "bzpopmin") >= 2,
                                 message="the worker never went idle")  # fmt: skip
            _log_every_command(own_r)
            pops = commands(own_r, "bzpopmin")
            for _ in range(jobs):  # one at a time, the worker idle in between
                job = await work.aenqueue()
                await job.aresult(timeout=10)
                await wait_for_async(lambda: blocked_in(own_r, "bzpopmin"),
                                     message="the worker did not wait again")  # fmt: skip
            waits = commands(own_r, "bzpopmin") - pops
            claims = _script_calls(own_r, "claim")
    finally:
        await app.aclose()
    # One claim per wait (each job's, and any wait that ran out its idle_block meanwhile).
    assert claims == waits, f"{claims} claims for {jobs} jobs taken one at a time in {waits} waits"
