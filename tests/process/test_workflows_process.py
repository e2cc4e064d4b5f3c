"""Workflows across worker processes killed -9 while dependencies complete: no dependent starts
before its dependencies ended, none is lost, and nothing of the workflow is left in Redis."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

import drumbeat

pytestmark = pytest.mark.process

ROOT = Path(__file__).resolve().parents[2]
STEP = "tests.apps.workflow_app.step"


def _worker(url: str, namespace: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "DRUMBEAT_REDIS_URL": url, "DRUMBEAT_NAMESPACE": namespace,
           "DRUMBEAT_LEASE": "1.0", "DRUMBEAT_MAINTENANCE_INTERVAL": "0.2",
           "PYTHONPATH": str(ROOT)}  # fmt: skip
    code = "import drumbeat; from tests.apps.workflow_app import app; drumbeat.run_worker(app)"
    return subprocess.Popen([sys.executable, "-c", code], env=env, cwd=ROOT)


@pytest.fixture
def workers() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
            p.wait(10)


def test_kill_9_while_dependencies_complete_loses_no_release(
    redis_url: str, namespace: str, r: redis.Redis, workers: list[subprocess.Popen[bytes]]
) -> None:
    app = drumbeat.App(redis_url, namespace=namespace)
    step = app.task_ref(STEP)
    # Diamonds: two builds, a join after both, a publish after the join.
    edges: dict[str, list[str]] = {}
    jobs: list[drumbeat.Job[object]] = []
    for _ in range(15):
        a, b = step.enqueue(0.15), step.enqueue(0.25)
        join = step.options(depends_on=[a, b]).enqueue(0.15)
        publish = step.options(depends_on=join).enqueue(0.05)
        edges[join.id], edges[publish.id] = [a.id, b.id], [join.id]
        jobs += [a, b, join, publish]
    workers += [_worker(redis_url, namespace), _worker(redis_url, namespace)]
    for _ in range(4):  # kill -9 one worker at a time while jobs run, and replace it
        time.sleep(0.7)
        victim = workers.pop(0)
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
        workers.append(_worker(redis_url, namespace))

    assert [job.result(timeout=60) for job in jobs] == [job.id for job in jobs]
    log = [e.decode().split("|") for e in r.lrange(f"test:{{{namespace}}}:log", 0, -1)]
    for dependent, deps in edges.items():
        first_start = log.index(next(e for e in log if e[:2] == ["start", dependent]))
        for dep in deps:
            ends = [i for i, e in enumerate(log) if e[:2] == ["end", dep]]
            assert ends and max(ends) < first_start, f"{dependent} started before {dep} ended"
    starts = [e[1] for e in log if e[0] == "start"]
    assert len(starts) > len(set(starts)), "the kills should have hit running jobs"
    # Every release happened once: nothing of the workflows is left.
    k = app.keys
    assert [r.hlen(k.deps), r.hlen(k.dependents), r.hlen(k.edges), r.zcard(k.freed)] == [0] * 4
    app.close()
