"""``drumbeat_jobs_total`` counts a known workload settled by two worker processes, read over
``GET /metrics`` with prometheus-client's own parser: the counters live in Redis, so every
process adds to the same ones."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

import drumbeat
from drumbeat import admin
from drumbeat.dashboard import charts
from tests.helpers import wait_for
from tests.web.conftest import serve

pytestmark = pytest.mark.process

ROOT = Path(__file__).resolve().parents[2]
N_OK, N_BAD = 200, 10


@pytest.fixture
def workers(redis_url: str, namespace: str) -> Iterator[list[subprocess.Popen[bytes]]]:
    env = {**os.environ, "DRUMBEAT_REDIS_URL": redis_url, "DRUMBEAT_NAMESPACE": namespace,
           "DRUMBEAT_CONCURRENCY": "4", "PYTHONPATH": str(ROOT)}  # fmt: skip
    code = "import drumbeat; from tests.apps.metrics_app import app; drumbeat.run_worker(app)"
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, cwd=ROOT) for _ in range(2)]
    yield procs
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)


def _jobs_total(text: str) -> dict[tuple[str, str], float]:
    return {
        (s.labels["task"], s.labels["outcome"]): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "drumbeat_jobs_total"
    }


def test_jobs_total_equals_the_workload_of_two_worker_processes(
    redis_url: str, namespace: str, workers: list[subprocess.Popen[bytes]]
) -> None:
    app = drumbeat.App(redis_url, namespace=namespace)
    try:
        pids = {p.pid for p in workers}
        wait_for(
            lambda: {w.pid for w in admin.queue_stats(app).workers}, lambda seen: seen == pids,
            message="both worker processes heartbeat before the workload is sent",
        )  # fmt: skip
        ok = app.enqueue_many([drumbeat.Prepared("ok", [i], {}) for i in range(N_OK)])
        app.enqueue_many([drumbeat.Prepared("bad", [i], {}) for i in range(N_BAD)])
        # Both processes settled jobs: each ok job returns the pid that ran it.
        ran = {job.result(timeout=60) for job in ok}
        assert ran == pids, f"both worker processes ran jobs: {ran} of {pids}"
        expected = {("ok", "complete"): N_OK, ("bad", "retried"): N_BAD, ("bad", "dead"): N_BAD}
        with serve(app) as served:
            totals = wait_for(
                lambda: _jobs_total(httpx.get(served.url + "/metrics").text),
                lambda t: t == expected,
                message="drumbeat_jobs_total{task,outcome} equals the workload", timeout=30,
            )  # fmt: skip
        assert totals == expected
        flow = charts.series_json(app)["throughput"]
        assert sum(p["completed"] for p in flow) == N_OK
        assert sum(p["failed"] for p in flow) == 2 * N_BAD
    finally:
        app.close()
