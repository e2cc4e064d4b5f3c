"""The operator's tools on a real Redis Cluster (3 masters, 3 replicas), with the schedule shards
on 3 different masters: every ``drumbeat`` command, a supervised pool of worker processes
(``drumbeat worker --processes 2``) and the dashboard's pages, JSON, actions and ``/metrics``
over plain HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

import drumbeat
from drumbeat import admin
from tests.apps import cluster_app
from tests.cluster.conftest import ClusterServer
from tests.cluster.test_cluster import _spread_namespace
from tests.conftest import _free_port, running_worker
from tests.helpers import wait_for, wait_for_async
from tests.integration.test_cli import assert_clean_error, ok, row, run

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.apps.cluster_app:app"
MODULE = "tests.apps.cluster_app"
SHARDS = 3


@pytest.fixture
def spread(redis_cluster: ClusterServer) -> str:
    """A fresh namespace whose 3 schedule shards live on the 3 masters."""
    return _spread_namespace(redis_cluster, SHARDS)


@pytest.fixture
def cluster_env(
    monkeypatch: pytest.MonkeyPatch, redis_cluster: ClusterServer, spread: str
) -> Iterator[None]:
    """What ``tests.apps.cluster_app`` reads: the cluster's URL, the namespace, the shards."""
    monkeypatch.setenv("DRUMBEAT_REDIS_URL", redis_cluster.url)
    monkeypatch.setenv("DRUMBEAT_NAMESPACE", spread)
    monkeypatch.setenv("DRUMBEAT_SCHEDULE_SHARDS", str(SHARDS))
    monkeypatch.setenv("COLUMNS", "200")  # rich tables keep 32-character ids on one line
    sys.modules.pop(MODULE, None)
    yield
    sys.modules.pop(MODULE, None)


def _app(redis_cluster: ClusterServer, namespace: str) -> drumbeat.App:
    made = drumbeat.App(redis_cluster.url, namespace=namespace, schedule_shards=SHARDS)
    cluster_app.define(made)
    return made


@pytest.fixture
async def app(
    cluster_env: None, redis_cluster: ClusterServer, spread: str
) -> AsyncIterator[drumbeat.App]:
    made = _app(redis_cluster, spread)
    yield made
    await made.aclose()


def _one_per_shard(app: drumbeat.App, prefix: str) -> list[str]:
    """Schedule ids, one on each shard (so on each master)."""
    by_shard: dict[int, str] = {}
    n = 0
    while len(by_shard) < SHARDS:
        candidate = f"{prefix}{n}"
        by_shard.setdefault(app.scheduler.shard_of(candidate), candidate)
        n += 1
    return [by_shard[shard] for shard in range(SHARDS)]


def _info(app: drumbeat.App, schedule_id: str) -> drumbeat.ScheduleInfo | None:
    return next((i for i in app.schedules() if i.id == schedule_id), None)


async def cli(*args: str, input: str | None = None) -> str:
    """The command's stdout; it must exit 0 (off the loop: a worker may run on it)."""
    return (await asyncio.to_thread(ok, *args, input=input)).stdout


# -- the CLI -----------------------------------------------------------------------------------


async def test_enqueue_status_cancel_and_schedules_commands(app: drumbeat.App) -> None:
    queued = (await cli("enqueue", APP, "add", "[1, 2]", "--priority", "3")).strip()
    delayed = (await cli("enqueue", APP, "add", "[5]", "--delay", "600")).strip()
    assert re.fullmatch(r"[0-9a-f]{32}", queued) and re.fullmatch(r"[0-9a-f]{32}", delayed)
    assert app.job(queued).status() is drumbeat.JobStatus.QUEUED

    out = await cli("status", APP)
    assert app.settings.namespace in out
    assert row(out, "ready")[1] == "1" and row(out, "3")[1] == "1"
    assert row(out, "due later (delayed jobs, next runs)")[1] == "1"

    assert f"cancelled {delayed}" in await cli("cancel", APP, delayed)
    assert app.job(delayed).status() is drumbeat.JobStatus.CANCELLED
    assert run("cancel", APP, delayed).exit_code == 1, "nothing left to cancel"

    ids = _one_per_shard(app, "sched-")
    for schedule_id in ids:
        app.schedule(schedule_id, "tick", every=3600, args=[schedule_id])
    listed = await cli("schedules", "ls", APP)
    assert all(row(listed, i)[1] == "every 1h" for i in ids), listed
    shown = await cli("schedules", "show", APP, ids[2])
    assert row(shown, "shard")[1] == f"2 of {SHARDS}", shown  # shards count from 0
    assert row(shown, "task")[1] == "tick"

    assert "paused 3 schedules" in await cli("schedules", "pause", APP, *ids)
    assert all(info.paused for info in app.schedules())
    assert "resumed 3 schedules" in await cli("schedules", "resume", APP, *ids)
    assert not any(info.paused for info in app.schedules())
    assert "queued a run of 1 schedule" in await cli("schedules", "run-now", APP, ids[1])
    assert "removed 1 schedule" in await cli("schedules", "rm", APP, ids[0], "--yes")
    assert _info(app, ids[0]) is None
    assert sorted(info.id for info in app.schedules()) == sorted(ids[1:])

    out = await cli("status", APP)
    assert row(out, "schedules")[1] == "2" and row(out, "shards")[1] == str(SHARDS)


async def test_status_running_cancel_and_dead_commands_with_a_worker(app: drumbeat.App) -> None:
    boom = (await cli("enqueue", APP, "boom", '"kaput"')).strip()
    held = (await cli("enqueue", APP, "where", "[60]")).strip()
    async with running_worker(app, concurrency=2) as worker:
        await wait_for_async(
            lambda: (admin.dead_count(app), app.job(held).status()),
            lambda seen: seen == (1, drumbeat.JobStatus.RUNNING),
            message="boom should be dead and where running",
        )
        out = await cli("status", APP, "--wide")
        assert row(out, "running")[1] == "1" and row(out, "dead letters")[1] == "1"
        assert row(out, "workers")[1] == "1"
        assert row(out, held)[1] == worker.id
        assert str(os.getpid()) in row(out, worker.id)

        assert "is running and stops" in await cli("cancel", APP, held)
        await wait_for_async(
            lambda: app.job(held).status(), lambda s: s is drumbeat.JobStatus.CANCELLED,
            message="a running async job stops at once when cancelled",
        )  # fmt: skip

        listed = await cli("dead", "ls", APP, "--wide")
        assert row(listed, boom)[2] == "boom" and row(listed, boom)[4] == "RuntimeError: kaput"
        (first,) = admin.dead_letters(app)
        assert "requeued 1 job" in await cli("dead", "retry", APP, boom)
        await wait_for_async(
            lambda: [d.died_ms for d in admin.dead_letters(app)],
            lambda died: len(died) == 1 and died[0] > first.died_ms,
            message="the retried job should run again and die again",
        )
    refused = await asyncio.to_thread(run, "dead", "purge", APP, boom, input="n\n")
    assert refused.exit_code == 1 and admin.dead_count(app) == 1
    assert "purged 1 job" in await cli("dead", "purge", APP, boom, input="y\n")
    assert admin.dead_count(app) == 0
    assert "no dead letters" in await cli("dead", "ls", APP)


def test_an_unreachable_cluster_is_one_red_line(
    cluster_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """redis-py's cluster client says so with a `RedisClusterException`, which is no
    `RedisError`: a traceback before."""
    monkeypatch.setenv("DRUMBEAT_REDIS_URL", f"redis+cluster://127.0.0.1:{_free_port()}")
    unreachable = "Redis Cluster cannot be connected"
    assert_clean_error(run("status", APP), 1, unreachable)
    assert_clean_error(run("enqueue", APP, "add", "[1]"), 1, unreachable)


# -- a supervised pool -------------------------------------------------------------------------


def _children(pid: int) -> set[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return {int(c) for c in f.read().split()}
    except OSError:
        return set()


@pytest.fixture
def supervisor(cluster_env: None) -> Iterator[subprocess.Popen[bytes]]:
    """``drumbeat worker --processes 2`` on the cluster, killed with its workers if left."""
    environ = {**os.environ, "DRUMBEAT_LEASE": "1.0", "DRUMBEAT_MAINTENANCE_INTERVAL": "0.2",
               "PYTHONPATH": str(ROOT)}  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "drumbeat", "worker", APP, "--processes", "2",
         "--concurrency", "4"],
        cwd=ROOT, env=environ,
    )  # fmt: skip
    try:
        yield proc
    finally:
        if proc.poll() is None:
            for child in _children(proc.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child, signal.SIGKILL)
            proc.kill()
            proc.wait(10)


@pytest.mark.process
@pytest.mark.slow
def test_a_supervised_pool_runs_jobs_and_schedules_and_replaces_a_killed_worker(
    redis_cluster: ClusterServer, spread: str, supervisor: subprocess.Popen[bytes]
) -> None:
    app = _app(redis_cluster, spread)
    try:
        workers = wait_for(
            lambda: {w.pid for w in admin.queue_stats(app).workers},
            lambda pids: len(pids) == 2,
            message="two worker processes should register on the cluster", timeout=60,
        )  # fmt: skip
        assert workers == _children(supervisor.pid)
        ids = _one_per_shard(app, "tick-")
        for schedule_id in ids:
            app.schedule(schedule_id, "tick", every=1, args=[schedule_id])
        jobs = [app.enqueue("where", 0.2) for _ in range(16)]
        assert {job.result(timeout=30) for job in jobs} <= workers
        wait_for(
            lambda: {i.id: i.runs for i in app.schedules()},
            lambda runs: len(runs) == SHARDS and min(runs.values()) >= 2,
            message="each schedule, one per master, should run twice", timeout=30,
        )  # fmt: skip

        victim = app.enqueue("where").result(timeout=30)
        os.kill(victim, signal.SIGKILL)
        replaced = wait_for(
            lambda: _children(supervisor.pid) - workers, bool,
            message="the supervisor should replace the killed worker", timeout=60,
        )  # fmt: skip
        after = [app.enqueue("where", 0.05) for _ in range(8)]
        ran_on = {job.result(timeout=30) for job in after}
        assert victim not in ran_on and ran_on <= (workers | replaced)
        supervisor.send_signal(signal.SIGTERM)
        assert supervisor.wait(30) == 0, "SIGTERM stops the pool cleanly"
    finally:
        app.close()


# -- the dashboard -----------------------------------------------------------------------------


def test_dashboard_pages_json_actions_and_metrics(
    redis_cluster: ClusterServer, spread: str
) -> None:
    pytest.importorskip("starlette", reason="pip install 'drumbeat[dashboard]'")
    from tests.web.conftest import ThreadWorker, serve

    app = _app(redis_cluster, spread)
    ids = _one_per_shard(app, "dash-")
    for schedule_id in ids:
        app.schedule(schedule_id, "tick", every=3600, args=[schedule_id])
    held = app.enqueue("where", 60)
    dead = app.enqueue("boom", "<b>kaput</b>")
    later = drumbeat.Options(delay=600)
    (delayed,) = app.enqueue_many([drumbeat.Prepared("add", [1], {}, later)])
    elsewhere = drumbeat.Options(priority=4, queue="other")  # no worker serves it: it waits
    (other,) = app.enqueue_many([drumbeat.Prepared("add", [2], {}, elsewhere)])
    try:
        with ThreadWorker(_app(redis_cluster, spread), concurrency=2), serve(app) as served:
            wait_for(
                lambda: (admin.queue_stats(app).running_total, admin.dead_count(app)),
                lambda seen: seen == (1, 1), message="where runs and boom is dead",
            )  # fmt: skip
            for path in ("/", "/jobs", "/schedules", "/dead"):
                page = httpx.get(served.url + path)
                assert page.status_code == 200, (path, page.text[:500])
                assert "<b>kaput</b>" not in page.text, path
            overview = httpx.get(served.url + "/api/overview").json()
            assert overview["queue"] | {"ready_by_priority": None} == {
                "ready": 1, "ready_by_priority": None, "delayed": 1, "parked": 0,
                "running": 1, "dead": 1, "waiting": 0,
            }, overview["queue"]  # fmt: skip
            assert overview["queues"]["other"][4] == 1
            assert overview["schedules"]["total"] == SHARDS
            assert overview["schedules"]["shards"] == SHARDS
            assert len(overview["workers"]) == 1

            running = httpx.get(served.url + "/api/jobs/running").json()
            assert [j["id"] for j in running["running"]] == [held.id]
            queued = httpx.get(
                served.url + "/api/jobs/queued", params={"queue": "other", "priority": "4"}
            ).json()
            assert [j["id"] for j in queued["jobs"]] == [other.id]
            later = httpx.get(served.url + "/api/jobs/delayed", params={"queue": "default"})
            assert [j["id"] for j in later.json()["jobs"]] == [delayed.id]
            job = httpx.get(f"{served.url}/api/job/{held.id}").json()
            assert job["status"] == "running", job
            letters = httpx.get(served.url + "/api/dead").json()
            assert letters["total"] == 1 and letters["dead_letters"][0]["id"] == dead.id
            listed = httpx.get(served.url + "/api/schedules").json()
            assert sorted(s["id"] for s in listed["schedules"]) == sorted(ids)
            for schedule_id in ids:
                one = httpx.get(f"{served.url}/api/schedule/{schedule_id}")
                assert one.status_code == 200 and one.json()["id"] == schedule_id

            metrics = httpx.get(served.url + "/metrics")
            assert metrics.status_code == 200
            for line in (
                "drumbeat_jobs_running 1.0", "drumbeat_dead_letters 1.0",
                "drumbeat_queue_delayed 1.0", f"drumbeat_schedules {SHARDS}.0",
                'drumbeat_queue_ready{priority="4",queue="other"} 1.0', "drumbeat_workers 1.0",
            ):  # fmt: skip
                assert line in metrics.text.splitlines(), (line, metrics.text)

            json_reply = {"accept": "application/json"}
            csrf = served.guard.csrf
            paused = httpx.post(
                served.url + "/schedules/pause", data={"id": ids[1], "csrf": csrf},
                headers=json_reply,
            )  # fmt: skip
            assert paused.json() == {"pause": 1}
            info = _info(app, ids[1])
            assert info is not None and info.paused
            purged = httpx.post(
                served.url + "/dead/purge", data={"all": "1", "csrf": csrf}, headers=json_reply
            )
            assert purged.json() == {"purge": 1}
            assert admin.dead_count(app) == 0
            assert held.cancel()  # so the worker stops at once
    finally:
        app.close()
