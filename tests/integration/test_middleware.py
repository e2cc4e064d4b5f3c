"""Job middleware and headers on a real Redis: producer middleware around every enqueue path,
run middleware around every run (sync and async), headers kept through retries, checkpoints,
hand-backs and schedules, and ``drumbeat worker`` running the app's middleware."""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import drumbeat
from drumbeat.testing import arun_until_idle
from tests.helpers import wait_for_async

ROOT = Path(__file__).resolve().parents[2]


class Recorder(drumbeat.Middleware):
    """Notes every call it gets."""

    def __init__(self) -> None:
        self.enqueued: list[tuple[str, str, dict[str, str], bool | None]] = []
        self.runs: list[dict[str, Any]] = []

    def before_enqueue(self, job: drumbeat.Enqueueing) -> None:
        job.headers["tenant"] = "acme"

    def after_enqueue(self, job: drumbeat.Enqueueing, error: BaseException | None) -> None:
        self.enqueued.append((job.id, job.task, dict(job.headers), job.created))

    async def before_run(self, job: drumbeat.JobInfo) -> None:  # a coroutine works too
        job.notes["started"] = time.monotonic()

    def after_run(self, end: drumbeat.JobEnd) -> None:
        job = end.job
        self.runs.append({"id": job.id, "task": job.task, "queue": job.queue,
                          "attempt": job.attempt, "headers": job.headers,
                          "outcome": end.outcome, "duration": end.duration, "error": end.error,
                          "noted": "started" in job.notes})  # fmt: skip


async def test_options_headers_reach_sync_and_async_tasks(app: drumbeat.App) -> None:
    seen: list[dict[str, str]] = []

    @app.task
    def sync_task() -> None:
        seen.append(drumbeat.current_job().headers)

    @app.task
    async def async_task() -> None:
        seen.append(drumbeat.current_job().headers)

    await sync_task.options(headers={"a": "1"}).aenqueue()
    await async_task.options(headers={"b": "2"}).aenqueue()
    await async_task.aenqueue()
    assert await arun_until_idle(app, concurrency=1) == 3
    assert seen == [{"a": "1"}, {"b": "2"}, {}]


async def test_a_record_without_headers_is_written_as_before_and_reads_as_none(
    app: drumbeat.App,
) -> None:
    seen: list[dict[str, str]] = []

    @app.task
    def plain() -> None:
        seen.append(drumbeat.current_job().headers)

    job = await plain.aenqueue()
    raw = await (await app.aredis()).hget(app.keys.jobs, job.id)
    assert raw is not None and b'"h"' not in raw, "a job without headers: the old record"
    await arun_until_idle(app)
    assert seen == [{}]


async def test_headers_are_checked_at_enqueue(app: drumbeat.App) -> None:
    @app.task
    def noop() -> None: ...

    with pytest.raises(drumbeat.InvalidJob, match="headers must be a dict of str to str"):
        noop.options(headers={"n": 1})  # type: ignore[dict-item]
    big = {"blob": "x" * 5000}
    with pytest.raises(drumbeat.PayloadTooLarge, match=r"Settings\.max_header_bytes"):
        await noop.options(headers=big).aenqueue()
    small = drumbeat.App(app.url, namespace=app.keys.namespace, max_header_bytes=64)
    try:
        small.task(name=noop.name)(noop.fn)
        with pytest.raises(drumbeat.PayloadTooLarge, match="over the limit of 64 bytes"):
            await small.task_ref(noop.name).options(headers={"k": "v" * 64}).aenqueue()
    finally:
        await small.aclose()
    assert await (await app.aredis()).hlen(app.keys.jobs) <= 1, "nothing was written"


async def test_producer_middleware_runs_on_every_enqueue_path(app: drumbeat.App) -> None:
    rec = Recorder()
    app.middleware(rec)
    seen: list[tuple[str, dict[str, str]]] = []

    @app.task(name="mw.note")
    def note(via: str) -> None:
        seen.append((via, drumbeat.current_job().headers))

    jobs = [
        note.enqueue("enqueue"),
        await note.aenqueue("aenqueue"),
        *app.enqueue_many([note.prepare("many1"), note.prepare("many2")]),
        app.enqueue("mw.note", "by name"),
        await app.task_ref("mw.note").options(headers={"x": "1"}).aenqueue("ref"),
        note.options(key="once").enqueue("keyed"),
        note.options(key="once").enqueue("duplicate"),
    ]
    assert [e[0] for e in rec.enqueued] == [j.id for j in jobs], "after_enqueue sees the ids"
    assert [e[3] for e in rec.enqueued] == [True] * 7 + [False], "and created / deduplicated"
    await arun_until_idle(app)
    assert sorted(seen) == sorted([
        ("enqueue", {"tenant": "acme"}), ("aenqueue", {"tenant": "acme"}),
        ("many1", {"tenant": "acme"}), ("many2", {"tenant": "acme"}),
        ("by name", {"tenant": "acme"}), ("ref", {"x": "1", "tenant": "acme"}),
        ("keyed", {"tenant": "acme"}),
    ])  # fmt: skip


async def test_after_enqueue_sees_the_error_of_a_failed_enqueue(app: drumbeat.App) -> None:
    errors: list[BaseException | None] = []

    @app.middleware
    class Huge(drumbeat.Middleware):
        def before_enqueue(self, job: drumbeat.Enqueueing) -> None:
            job.headers["huge"] = "x" * 10_000

        def after_enqueue(self, job: drumbeat.Enqueueing, error: BaseException | None) -> None:
            errors.append(error)

    @app.task
    def noop() -> None: ...

    with pytest.raises(drumbeat.PayloadTooLarge):
        await noop.aenqueue()
    assert len(errors) == 1 and isinstance(errors[0], drumbeat.PayloadTooLarge)


async def test_run_middleware_sees_each_run_its_outcome_and_duration(app: drumbeat.App) -> None:
    rec = Recorder()
    app.middleware(rec)

    @app.task(name="mw.ok", queue="fast")
    async def ok() -> None:
        await asyncio.sleep(0.05)

    @app.task(name="mw.flaky", retries=1, backoff=0.01)
    def flaky() -> None:
        raise RuntimeError("flaky " + str(drumbeat.current_job().attempt))

    a = await ok.aenqueue()
    b = await flaky.options(headers={"h": "v"}).aenqueue()
    assert await arun_until_idle(app) == 3
    runs = {(r["id"], r["attempt"]): r for r in rec.runs}
    assert runs[(a.id, 1)]["task"] == "mw.ok" and runs[(a.id, 1)]["queue"] == "fast"
    assert runs[(a.id, 1)]["outcome"] == "done" and runs[(a.id, 1)]["duration"] >= 0.04
    assert runs[(a.id, 1)]["headers"] == {"tenant": "acme"} and runs[(a.id, 1)]["noted"]
    first, second = runs[(b.id, 1)], runs[(b.id, 2)]
    assert (first["outcome"], second["outcome"]) == ("retry", "dead")
    assert "RuntimeError: flaky 1" in first["error"] and "flaky 2" in second["error"]
    assert first["headers"] == second["headers"] == {"h": "v", "tenant": "acme"}


async def test_a_failing_middleware_is_logged_and_the_job_goes_on(
    app: drumbeat.App, caplog: pytest.LogCaptureFixture
) -> None:
    @app.middleware
    class Broken(drumbeat.Middleware):
        def before_enqueue(self, job: drumbeat.Enqueueing) -> None:
            raise ValueError("enqueue side")

        def before_run(self, job: drumbeat.JobInfo) -> None:
            raise ValueError("run side")

        def after_run(self, end: drumbeat.JobEnd) -> None:
            raise ValueError("after run")

    @app.task
    def add(a: int, b: int) -> int:
        return a + b

    with caplog.at_level(logging.ERROR):
        job = await add.aenqueue(1, 2)
        await arun_until_idle(app)
    assert await job.aresult(timeout=1) == 3
    messages = [r.getMessage() for r in caplog.records]
    assert any("before_enqueue of" in m and "Broken" in m for m in messages), messages
    assert any("before_job hook" in m and job.id in m for m in messages), messages
    assert any("after_job hook" in m and job.id in m for m in messages), messages


async def test_a_context_variable_set_before_the_run_reaches_the_task(app: drumbeat.App) -> None:
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")
    seen: list[str] = []

    @app.middleware
    class Sets(drumbeat.Middleware):
        def before_run(self, job: drumbeat.JobInfo) -> None:
            var.set(job.headers.get("who", "?"))

        def after_run(self, end: drumbeat.JobEnd) -> None:
            seen.append("after:" + var.get())

    @app.task
    def in_thread() -> None:
        seen.append("sync:" + var.get())

    @app.task
    async def on_loop() -> None:
        seen.append("async:" + var.get())

    await in_thread.options(headers={"who": "s"}).aenqueue()
    await on_loop.options(headers={"who": "a"}).aenqueue()
    await arun_until_idle(app, concurrency=1)
    assert seen == ["sync:s", "after:s", "async:a", "after:a"]


async def test_headers_are_kept_through_a_retry_and_a_checkpoint_resume(
    app: drumbeat.App,
) -> None:
    seen: list[tuple[int, Any, dict[str, str]]] = []

    @app.task(retries=1, backoff=0.01)
    def resumes() -> None:
        ctx = drumbeat.current_job()
        seen.append((ctx.attempt, ctx.progress, ctx.headers))
        drumbeat.checkpoint(progress=7)
        if ctx.attempt == 1:
            raise RuntimeError("again")

    await resumes.options(headers={"trace": "t1"}).aenqueue()
    await arun_until_idle(app)
    assert seen == [(1, None, {"trace": "t1"}), (2, 7, {"trace": "t1"})]


async def test_headers_are_kept_through_a_hand_back(redis_url: str, namespace: str) -> None:
    app = drumbeat.App(redis_url, namespace=namespace, shutdown_grace=30.0, idle_block=0.5)
    seen: list[dict[str, str]] = []
    units: list[int] = []

    @app.task
    def long(n: int) -> None:
        seen.append(drumbeat.current_job().headers)
        for i in range(drumbeat.current_job().progress or 0, n):
            time.sleep(0.01)
            units.append(i)
            drumbeat.checkpoint(progress=i + 1)

    job = await long.options(headers={"k": "v"}).aenqueue(200)
    worker = drumbeat.Worker(app)
    run = asyncio.create_task(worker.run())
    await wait_for_async(lambda: len(units) >= 3, message="the job did not start", timeout=10)
    worker.stop()
    await asyncio.wait_for(run, 10)
    assert await job.astatus() is drumbeat.JobStatus.QUEUED, "it was not handed back"
    await arun_until_idle(app)
    assert seen == [{"k": "v"}, {"k": "v"}]
    await app.aclose()


async def test_a_schedule_carries_its_headers_to_each_run(redis_url: str, namespace: str) -> None:
    app = drumbeat.App(redis_url, namespace=namespace)
    seen: list[tuple[str | None, dict[str, str]]] = []
    rec = Recorder()
    app.middleware(rec)

    @app.task
    def tick() -> None:
        seen.append((drumbeat.current_job().schedule_id, drumbeat.current_job().headers))

    await app.aschedule("with", tick, every=3600, headers={"team": "ops"})
    await app.aschedule("without", tick, every=3600)
    assert rec.enqueued == [], "producer middleware does not run for schedules"
    assert await app.arun_now("with", "without") == 2  # else the first runs are an hour off
    assert await arun_until_idle(app) == 2
    assert sorted(seen) == [("with", {"team": "ops"}), ("without", {})]
    assert sorted((r["id"], r["headers"].get("team")) for r in rec.runs) == [
        ("s:with", "ops"), ("s:without", None),
    ]  # fmt: skip
    await app.aclose()


async def test_a_limited_schedules_run_is_seen_queued_then_run(
    redis_url: str, namespace: str
) -> None:
    """A run of a limited schedule becomes a job of its queue: its worker, which serves that
    queue, runs it on at once and middleware sees one run, with its headers, as `ok`. A run
    routed to a paused queue waits there: seen first as `queued`, then, once the queue is
    resumed, as its run."""
    app = drumbeat.App(redis_url, namespace=namespace)
    rec = Recorder()
    app.middleware(rec)
    ran: list[dict[str, str]] = []

    @app.task(concurrency_limit=1)
    def tick() -> None:
        ran.append(drumbeat.current_job().headers)

    await app.aschedule("limited", tick, every=3600, headers={"team": "ops"})
    assert await app.arun_now("limited") == 1
    assert await arun_until_idle(app) == 1
    assert ran == [{"team": "ops"}]
    assert [(r["id"], r["outcome"], r["headers"].get("team")) for r in rec.runs] == [
        ("s:limited", "ok", "ops"),
    ]  # fmt: skip

    rec.runs.clear()
    await app.aschedule("routed", tick, every=3600, queue="builds", headers={"team": "ops"})
    await app.apause_queue("builds")
    assert await app.arun_now("routed") == 1
    # The run is queued in its paused queue, where it waits: nothing runs.
    assert await arun_until_idle(app, queues=["default", "builds"]) == 0
    assert [r["outcome"] for r in rec.runs] == ["queued"], "the run queued in its paused queue"
    assert len(ran) == 1
    await app.aresume_queue("builds")
    assert await arun_until_idle(app, queues=["default", "builds"]) == 1, "run once resumed"
    assert len(ran) == 2
    assert [(r["id"], r["outcome"], r["headers"].get("team")) for r in rec.runs] == [
        ("s:routed", "queued", "ops"), ("s:routed", "ok", "ops"),
    ]  # fmt: skip
    await app.aclose()


@pytest.mark.process
def test_drumbeat_worker_runs_the_apps_middleware(
    redis_url: str, namespace: str, tmp_path: Path
) -> None:
    log = tmp_path / "runs.jsonl"
    env = {**os.environ, "DRUMBEAT_REDIS_URL": redis_url, "DRUMBEAT_TEST_NAMESPACE": namespace,
           "DRUMBEAT_TEST_MW_LOG": str(log)}  # fmt: skip
    producer = drumbeat.App(redis_url, namespace=namespace)
    try:
        ref = producer.task_ref("mw.echo")
        job = ref.options(headers={"request": "r-1"}).enqueue("hi")
        proc = subprocess.run(
            [sys.executable, "-m", "drumbeat", "worker", "tests.apps.mw_app:app", "--burst"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert job.result(timeout=1) == {"text": "hi", "request": "r-1"}
    finally:
        producer.close()
    [line] = [json.loads(x) for x in log.read_text().splitlines()]
    assert line["id"] == job.id and line["task"] == "mw.echo" and line["outcome"] == "done"
    assert line["headers"] == {"request": "r-1"} and line["before"] is True
    assert line["attempt"] == 1 and line["queue"] == "default" and line["duration"] >= 0
