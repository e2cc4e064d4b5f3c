"""Batches across worker processes killed -9 while members complete: every member is counted
once (however often it ran), the callback is released once, after every member ended, and
nothing of the batch's members is left in Redis."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import redis

import drumbeat
from tests.process.test_workflows_process import ROOT, STEP, workers

pytestmark = pytest.mark.process

__all__ = ["workers"]  # the fixture, shared


def _worker(url: str, namespace: str) -> subprocess.Popen[bytes]:
    # Four slots each: the members outlast several kills.
    env = {**os.environ, "DRUMBEAT_REDIS_URL": url, "DRUMBEAT_NAMESPACE": namespace,
           "DRUMBEAT_LEASE": "1.0", "DRUMBEAT_MAINTENANCE_INTERVAL": "0.2",
           "DRUMBEAT_CONCURRENCY": "4", "PYTHONPATH": str(ROOT)}  # fmt: skip
    code = "import drumbeat; from tests.apps.workflow_app import app; drumbeat.run_worker(app)"
    return subprocess.Popen([sys.executable, "-c", code], env=env, cwd=ROOT)


def test_kill_9_while_members_complete_counts_each_once_and_calls_back_once(
    redis_url: str, namespace: str, r: redis.Redis, workers: list[object]
) -> None:
    app = drumbeat.App(redis_url, namespace=namespace)
    step = app.task_ref(STEP)
    members = [step.prepare(0.2 + 0.1 * (i % 4)) for i in range(40)]
    batch = app.batch(members, on_complete=step.prepare(0.01), on_success=step.prepare(0.01))
    procs = [_worker(redis_url, namespace), _worker(redis_url, namespace)]
    workers += procs  # type: ignore[operator]
    log_key = f"test:{{{namespace}}}:log"
    while not r.llen(log_key):  # the first member started
        time.sleep(0.05)
    for _ in range(4):  # kill -9 one worker at a time while members run, and replace it
        time.sleep(0.5)
        victim = procs.pop(0)
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
        procs.append(_worker(redis_url, namespace))
        workers.append(procs[-1])

    status = batch.wait(timeout=60)
    assert (status.total, status.succeeded, status.failed, status.pending) == (40, 40, 0, 0)
    assert batch.on_complete is not None and batch.on_success is not None
    assert batch.on_complete.result(timeout=30) == batch.on_complete.id
    assert batch.on_success.result(timeout=30) == batch.on_success.id
    log = [e.decode().split("|") for e in r.lrange(f"test:{{{namespace}}}:log", 0, -1)]
    starts = [e[1] for e in log if e[0] == "start"]
    assert len(starts) > len(set(starts)), "the kills should have hit running members"
    ids = {job.id for job in batch.jobs}
    last_end = max(i for i, e in enumerate(log) if e[0] == "end" and e[1] in ids)
    for callback in (batch.on_complete.id, batch.on_success.id):
        first_start = next(i for i, e in enumerate(log) if e[:2] == ["start", callback])
        assert first_start > last_end, "a callback started before every member ended"
    assert r.hlen(app.keys.members) == 0
    app.close()
