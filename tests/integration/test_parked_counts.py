"""Jobs parked on limiter keys in `drumbeat status` (text and --json), `/metrics` and the
autoscaler's signal: counted per queue from the `parking` counters the limit scripts keep, the
limiter markers in `due` counted neither as delayed jobs nor as backlog; a parked schedule run's
lateness counted once."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

import drumbeat
from drumbeat import admin, autoscale, metrics
from drumbeat.protocol import LIMIT_PREFIX, MARKERS_FIELD
from drumbeat.testing import arun_until_idle
from tests.conftest import running_worker
from tests.helpers import wait_for, wait_for_async
from tests.integration.test_cli import APP, cli_env, ok, row

__all__ = ["cli_env"]  # a fixture the tests here use


@pytest.fixture
async def lapp(redis_url: str, namespace: str) -> AsyncIterator[drumbeat.App]:
    app = drumbeat.App(redis_url, namespace=namespace, idle_block=0.5, maintenance_interval=0.2)
    yield app
    await app.aclose()


def _gauges(app: drumbeat.App) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = metrics.render(app).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _parking(r: redis.Redis, app: drumbeat.App) -> dict[str, int]:
    return {k.decode(): int(v) for k, v in r.hgetall(app.keys.parking).items()}


async def test_status_counts_parked_jobs_per_queue_and_markers_as_nothing(
    cli_env: None, lapp: drumbeat.App, r: redis.Redis
) -> None:
    """Two queues, a concurrency-1 task in each, one run holding each key: the others park.
    Status, --json and /metrics report them per queue and in all, "delayed" stays 0 although
    each key's marker waits in its queue's `due`; once all ran, every counter is back at 0."""
    release = asyncio.Event()

    @lapp.task(concurrency_limit=1)
    async def hold(tag: str) -> None:
        await release.wait()

    @lapp.task(queue="builds", concurrency_limit=1)
    async def pack(tag: str) -> None:
        await release.wait()

    jobs = [await hold.aenqueue(f"h{i}") for i in range(3)]
    jobs += [await pack.aenqueue(f"p{i}") for i in range(2)]
    hold_key, pack_key = f"t:{hold.name}", f"t:{pack.name}"
    async with running_worker(lapp, concurrency=4):
        await wait_for_async(
            lambda: (r.zcard(lapp.keys.parked(hold_key)), r.zcard(lapp.keys.parked(pack_key))),
            lambda n: n == (2, 1),
            message="two hold jobs and one pack job should park",
        )
        assert r.zscore(lapp.keys.due, LIMIT_PREFIX + hold_key) is not None, "hold's marker"
        assert r.zscore(lapp.keys.due_of("builds"), LIMIT_PREFIX + pack_key) is not None

        stats = await asyncio.to_thread(admin.queue_stats, lapp)
        assert (stats.parked, stats.delayed) == (3, 0), "the markers are no delayed jobs"
        by_queue = {q.name: (q.ready, q.delayed, q.parked) for q in stats.queues}
        assert by_queue == {"default": (0, 0, 2), "builds": (0, 0, 1)}

        shown = json.loads((await asyncio.to_thread(ok, "status", APP, "--json")).stdout)
        assert shown["queue"]["parked"] == 3 and shown["queue"]["delayed"] == 0
        assert [(q["name"], q["delayed"], q["parked"]) for q in shown["queues"]] == [
            ("default", 0, 2),
            ("builds", 0, 1),
        ]
        text = (await asyncio.to_thread(ok, "status", APP)).stdout
        assert row(text, "parked (waiting for a limit)")[1] == "3"
        assert row(text, "due later (delayed jobs, next runs)")[1] == "0"
        assert row(text, "builds")[-3:] == ["0", "1", "active"], "builds: delayed 0, parked 1"

        gauges = await asyncio.to_thread(_gauges, lapp)
        assert gauges["drumbeat_queue_parked", (("queue", "default"),)] == 2
        assert gauges["drumbeat_queue_parked", (("queue", "builds"),)] == 1
        assert gauges["drumbeat_queue_delayed", ()] == 0

        release.set()
        for job in jobs:
            await job.aresult(timeout=20)
        await wait_for_async(
            lambda: _parking(r, lapp),
            lambda counts: set(counts.values()) == {0},
            message="every parked job moved on and every marker dropped: the counters are 0",
        )
    assert set(_parking(r, lapp)) == {"p|default", "m|default", "p|builds", "m|builds"}
    assert not [m for m in r.zrange(lapp.keys.due, 0, -1) if m.startswith(b"l:")]
    assert (await asyncio.to_thread(admin.queue_stats, lapp)).parked == 0


def test_a_due_limiter_marker_is_no_backlog_nor_lag(lapp: drumbeat.App, r: redis.Redis) -> None:
    """A key's marker long overdue (as when no worker serves its queue: nothing moves its jobs
    on, nothing re-scores it) beside one delayed job just due: the autoscaler's signal, the
    schedule-lag gauge and "delayed" count the job only, and the lag is the job's, not the
    marker's. The marker and its count are what acquire_limits.lua writes."""
    (job,) = lapp.enqueue_many([drumbeat.Prepared("later", [], {}, drumbeat.Options(delay=0.01))])
    due_ms = r.zscore(lapp.keys.due, job.id)
    assert due_ms is not None
    r.zadd(lapp.keys.due, {f"{LIMIT_PREFIX}t:later": due_ms - 600_000})
    r.hset(lapp.keys.parking, f"{MARKERS_FIELD}default", 1)
    wait_for(
        lambda: autoscale.read_signal(lapp).now_ms, lambda now: now > due_ms,
        message="Redis time should pass the job's due time",
    )  # fmt: skip

    signal = autoscale.read_signal(lapp)
    waited = signal.now_ms - due_ms
    assert signal.due_now == 1, "the delayed job is due; the marker is no backlog"
    assert 0 <= signal.lag_ms <= waited + 1000, f"the job's lag, not the marker's: {signal}"
    assert signal.backlog == 1
    assert admin.queue_stats(lapp).delayed == 1
    assert _gauges(lapp)["drumbeat_schedule_lag", ()] == 1

    # Only the marker due: no backlog, no lag.
    r.zremrangebyrank(lapp.keys.due, 1, -1)
    assert r.zrange(lapp.keys.due, 0, -1) == [f"{LIMIT_PREFIX}t:later".encode()]
    signal = autoscale.read_signal(lapp)
    assert (signal.due_now, signal.lag_ms) == (0, 0), signal


async def test_a_parked_schedule_run_counts_its_lateness_once(
    lapp: drumbeat.App, r: redis.Redis
) -> None:
    """A run of a concurrency-1 task parks while another run holds the key: it is counted as
    parked, and its lateness is counted once, when it starts (so at least as long as it
    waited parked), not also when its first claim parked it."""
    release = asyncio.Event()
    started: list[int] = []

    @lapp.task(concurrency_limit=1)
    async def poll(n: int) -> None:
        started.append(n)
        if n == 0:
            await release.wait()

    await lapp.aschedule("poll0", poll, every=3600, args=[0])
    await lapp.aschedule("poll1", poll, every=3600, args=[1])
    async with running_worker(lapp, concurrency=4):
        await lapp.arun_now("poll0")
        await wait_for_async(lambda: 0 in started, message="poll0's run should start")
        await lapp.arun_now("poll1")
        await wait_for_async(
            lambda: r.zcard(lapp.keys.parked(f"t:{poll.name}")),
            lambda n: n == 1,
            message="poll1's run should park behind poll0's",
        )
        assert (await asyncio.to_thread(admin.queue_stats, lapp)).parked == 1
        await asyncio.sleep(0.3)  # it waits parked at least this long
        release.set()
        await wait_for_async(lambda: 1 in started, message="poll1's run should start")
        await lapp.aunschedule("poll0", "poll1")
    fields = {k.decode(): int(v) for k, v in r.hgetall(lapp.keys.lateness).items()}
    counted = sum(n for f, n in fields.items() if f.startswith("c") and f[1:].isdigit())
    assert counted == len(started), f"one lateness per run started {started}: {fields}"
    assert fields["cs"] >= 300, f"poll1 started at least 300 ms late: {fields}"
    assert _parking(r, lapp).get("p|default") == 0


def _runs_counted(r: redis.Redis, app: drumbeat.App) -> int:
    """Schedule runs whose lateness the `lateness` hash counted (its cumulative bins)."""
    fields = {k.decode(): int(v) for k, v in r.hgetall(app.keys.lateness).items()}
    return sum(n for f, n in fields.items() if f.startswith("c") and f[1:].isdigit())


async def test_a_run_handed_back_at_a_stop_counts_its_lateness_once(
    redis_url: str, namespace: str, r: redis.Redis
) -> None:
    """A run (of a limited schedule: a job for its one attempt) still going when its worker's
    `shutdown_grace` ends is handed back on its first attempt (no attempt spent); the worker
    that runs it next counts its lateness, and the first claim's count is taken back (and the
    time slots' claim counted none: queue_runs took it back)."""
    app = drumbeat.App(redis_url, namespace=namespace, idle_block=0.5, shutdown_grace=0.3)
    go_on = asyncio.Event()
    started = 0

    @app.task(concurrency_limit=1)
    async def poll() -> None:
        nonlocal started
        started += 1
        await go_on.wait()  # no checkpoint: only the hand-back at the stop ends it

    try:
        await app.aschedule("poll", poll, every=3600)
        async with running_worker(app, concurrency=2):
            await app.arun_now("poll")
            await wait_for_async(lambda: started, lambda n: n == 1, message="the run should start")
            assert _runs_counted(r, app) == 1
        assert r.zscore(app.keys.ready, "s:poll") is not None, "the stop should hand it back"
        assert _runs_counted(r, app) == 0, "the hand-back takes back what its claim counted"
        go_on.set()
        assert await arun_until_idle(app, concurrency=2) == 1, "the handed-back run runs"
        assert started == 2
        assert not r.hexists(app.keys.state, "s:poll"), "the run should finish"
        await app.aunschedule("poll")
        assert _runs_counted(r, app) == 1, "one run, one lateness"
    finally:
        await app.aclose()
