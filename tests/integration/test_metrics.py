"""`/metrics` as Prometheus reads it: counters kept in Redis by every worker, gauges read at
scrape time, against a known workload run by two workers with connections of their own."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

pytest.importorskip("prometheus_client", reason="pip install 'drumbeat[dashboard]'")

from prometheus_client.parser import text_string_to_metric_families

import drumbeat
from drumbeat import metrics
from drumbeat.job import encode_success
from drumbeat.outcomes import Done
from drumbeat.worker.claims import ClaimTable
from drumbeat.worker.link import Link
from drumbeat.worker.settling import Settler
from drumbeat.worker.tally import DURATION_BUCKETS
from tests.conftest import reap_call, running_worker
from tests.helpers import wait_for_async

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(app: drumbeat.App) -> Samples:
    """Every sample of `metrics.render`, parsed by prometheus-client's own parser."""
    text = metrics.render(app).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def _define(app: drumbeat.App) -> None:
    @app.task(name="ok")
    async def ok(x: int) -> int:
        return x

    @app.task(name="flaky", retries=1, backoff=0.01, backoff_max=0.01)
    def flaky(x: int) -> None:
        raise RuntimeError(f"no {x}")


@pytest.fixture
async def two_apps(redis_url: str, namespace: str) -> AsyncIterator[list[drumbeat.App]]:
    apps = [drumbeat.App(redis_url, namespace=namespace) for _ in range(2)]
    for a in apps:
        _define(a)
    yield apps
    for a in apps:
        await a.aclose()


async def test_counters_add_up_over_two_workers(two_apps: list[drumbeat.App]) -> None:
    producer, other = two_apps
    n_ok, n_flaky = 300, 20
    jobs = [drumbeat.Prepared("ok", [i], {}) for i in range(n_ok)]
    jobs += [drumbeat.Prepared("flaky", [i], {}) for i in range(n_flaky)]
    await producer.aenqueue_many(jobs)
    before = scrape(producer)
    assert value(before, "drumbeat_queue_ready", queue="default", priority="0") == n_ok + n_flaky

    async with running_worker(producer, concurrency=5) as w1, running_worker(other) as w2:

        def settled() -> tuple[float, ...]:
            s = scrape(producer)
            return (
                value(s, "drumbeat_jobs_total", task="ok", outcome="complete"),
                value(s, "drumbeat_jobs_total", task="flaky", outcome="retried"),
                value(s, "drumbeat_jobs_total", task="flaky", outcome="dead"),
            )

        await wait_for_async(
            settled,
            lambda got: got == (n_ok, n_flaky, n_flaky),
            message="(complete, retried, dead) counted once per attempt, over both workers",
            timeout=60,
            interval=0.2,
        )
        samples = scrape(producer)
        assert value(samples, "drumbeat_workers") == 2
        assert w1.processed > 0 and w2.processed > 0, "both workers took part"

    assert value(samples, "drumbeat_dead_letters") == n_flaky
    assert value(samples, "drumbeat_queue_ready", queue="default", priority="0") == 0
    assert value(samples, "drumbeat_jobs_running") == 0
    assert value(samples, "drumbeat_jobs_total", task="ok", outcome="failed") == 0
    # The histogram counts every settled attempt: 300 runs of ok, 2 attempts of each flaky job.
    assert value(samples, "drumbeat_job_duration_seconds_count", task="ok") == n_ok
    assert value(samples, "drumbeat_job_duration_seconds_count", task="flaky") == 2 * n_flaky
    assert value(samples, "drumbeat_job_duration_seconds_bucket", task="ok", le="+Inf") == n_ok
    assert value(samples, "drumbeat_job_duration_seconds_sum", task="ok") > 0
    first = str(DURATION_BUCKETS[-1])
    assert value(samples, "drumbeat_job_duration_seconds_bucket", task="ok", le=first) == n_ok


async def test_schedule_runs_are_counted_with_their_lateness(app: drumbeat.App) -> None:
    @app.task(name="tick")
    async def tick() -> None:
        pass

    app.schedule("tick:1", tick, every=1)
    async with running_worker(app):

        def counted() -> tuple[float, float]:
            s = scrape(app)
            return (
                value(s, "drumbeat_jobs_total", task="tick", outcome="complete"),
                value(s, "drumbeat_schedule_lateness_seconds_count"),
            )

        await wait_for_async(
            counted,
            lambda got: got[0] >= 2 and got[1] >= 2,
            message="(runs, lateness samples) of two schedule runs counted",
            timeout=30,
            interval=0.2,
        )
    samples = scrape(app)
    assert value(samples, "drumbeat_schedules") == 1
    assert value(samples, "drumbeat_schedule_lateness_seconds_bucket", le="+Inf") == value(
        samples, "drumbeat_schedule_lateness_seconds_count"
    )


async def test_metrics_off_writes_no_counters(redis_url: str, namespace: str) -> None:
    app = drumbeat.App(redis_url, namespace=namespace, metrics=False)
    try:
        _define(app)
        job = await app.aenqueue_many([drumbeat.Prepared("ok", [1], {})])
        async with running_worker(app):
            assert await job[0].aresult(timeout=10) == 1
        assert not app.redis.exists(app.keys.metrics)
        assert value(scrape(app), "drumbeat_jobs_total", task="ok", outcome="complete") == 0
    finally:
        await app.aclose()


async def test_an_ack_refused_for_a_lost_lease_is_not_counted(app: drumbeat.App) -> None:
    """The count sent with the batch is taken back once Redis refuses the ack (fencing)."""

    @app.task(name="work", retries=3)
    def work() -> None: ...

    r = app.redis
    job = work.enqueue()
    stale = app.scripts.claim("worker-a", 1, 10_000, 100).run(r).jobs[0]
    r.zadd(app.keys.leases, {job.id: 1})  # backdated: the reaper hands it to another worker
    assert reap_call(app).run(r).requeued == 1
    fresh = app.scripts.claim("worker-b", 1, 10_000, 100).run(r).jobs[0]

    link = Link(await app.aredis())
    table = ClaimTable(2)
    settler = Settler([app.scripts], table, app.settings)
    runs = asyncio.create_task(settler.run(link))
    for claimed, result in ((stale, "stale"), (fresh, "fresh")):
        claim = table.hold(0, claimed)
        claim.task_name, claim.seconds = "work", 0.002
        settler.add(claim, Done(encode_success(app.codec, result, 1 << 20), 60_000))
        await wait_for_async(lambda: len(table), lambda n: n == 0, message="settled")
    settler.close()
    await asyncio.wait_for(runs, 10)
    await link.aclose()

    assert job.result(timeout=1) == "fresh"
    samples = scrape(app)
    assert value(samples, "drumbeat_jobs_total", task="work", outcome="complete") == 1
    assert value(samples, "drumbeat_job_duration_seconds_count", task="work") == 1


async def test_schedules_are_counted_over_every_shard_and_after_a_script_flush(
    redis_url: str, namespace: str
) -> None:
    app = drumbeat.App(redis_url, namespace=namespace, schedule_shards=3)
    try:

        @app.task(name="tick")
        async def tick() -> None: ...

        app.schedule_many([drumbeat.Schedule(f"s:{i}", tick, every=3600) for i in range(500)])
        assert len({app.scheduler.shard_of(f"s:{i}") for i in range(500)}) == 3
        assert app.scheduler.count(app.redis) == 500
        app.redis.script_flush()  # as after a restart or a failover: NOSCRIPT, then EVAL
        assert value(scrape(app), "drumbeat_schedules") == 500
    finally:
        await app.aclose()


async def test_a_gauge_says_which_queues_are_paused(app: drumbeat.App) -> None:
    @app.task(queue="builds")
    def build() -> None: ...

    await build.aenqueue()
    await app.apause_queue("mail")  # paused before any job was sent to it
    samples = scrape(app)
    paused = {labels: v for (name, labels), v in samples.items() if name == "drumbeat_queue_paused"}
    assert paused == {
        (("queue", q),): 1.0 if q == "mail" else 0.0 for q in ("default", "builds", "mail")
    }
    await app.apause_queue("default")
    await app.aresume_queue("mail")
    samples = scrape(app)
    assert value(samples, "drumbeat_queue_paused", queue="default") == 1
    assert value(samples, "drumbeat_queue_paused", queue="mail") == 0
