"""`drumbeat worker --processes 2` against a real PostgreSQL whose backends are all terminated
between batches: no job fails, and each worker process has its own connection, made anew once
after each termination (tests/apps/pg_app.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import redis

import drumbeat
from tests.helpers import wait_for
from tests.pg import backends, terminate_backends

pytestmark = pytest.mark.process

ROOT = Path(__file__).resolve().parents[2]
BATCHES = 4


@pytest.fixture
def supervisor(redis_url: str, namespace: str, pg_dsn: str) -> Iterator[subprocess.Popen[bytes]]:
    environ = {**os.environ, "DRUMBEAT_REDIS_URL": redis_url, "DRUMBEAT_NAMESPACE": namespace,
               "PG_APP_DSN": pg_dsn, "PYTHONPATH": str(ROOT)}  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "drumbeat", "worker", "tests.apps.pg_app:app",
         "--processes", "2", "--concurrency", "4"],
        cwd=ROOT, env=environ,
    )  # fmt: skip
    yield proc
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)


def test_two_processes_ride_out_terminated_connections_each_with_its_own(
    redis_url: str,
    namespace: str,
    pg_dsn: str,
    r: redis.Redis,
    supervisor: subprocess.Popen[bytes],
) -> None:
    app = drumbeat.App(redis_url, namespace=namespace)
    admin = psycopg.connect(pg_dsn, autocommit=True)
    results: list[list[int]] = []
    failed: list[str] = []
    terminated: list[int] = []
    try:
        wait_for(lambda: r.zcard(app.keys.workers), until=lambda n: n == 2,
                 message="two worker processes should register")  # fmt: skip
        for batch in range(BATCHES):
            if batch:  # no job runs now: kill every connection the workers hold
                terminated.append(terminate_backends(admin))
            key = f"test:{{{namespace}}}:batch:{uuid.uuid4().hex}"
            for job in [app.enqueue("tests.apps.pg_app.where", key) for _ in range(8)]:
                try:
                    results.append([batch, *job.result(timeout=60)])
                except drumbeat.JobFailed as exc:
                    failed.append(str(exc))
        supervisor.send_signal(signal.SIGTERM)
        assert supervisor.wait(30) == 0
        wait_for(lambda: backends(admin), until=lambda b: b == set(),
                 message="the workers should close their connections when they stop")  # fmt: skip
    finally:
        admin.close()
        app.close()
    assert failed == [], "no job should fail for a terminated connection"
    assert terminated == [2] * (BATCHES - 1), "each process should hold one connection"
    by_worker: dict[int, set[int]] = defaultdict(set)
    per_batch: dict[tuple[int, int], set[int]] = defaultdict(set)
    created: dict[int, int] = defaultdict(int)
    for batch, worker, backend, made in results:
        by_worker[worker].add(backend)
        per_batch[batch, worker].add(backend)
        created[worker] = max(created[worker], made)
    assert len(by_worker) == 2, f"two worker processes should run the jobs: {dict(by_worker)}"
    first, second = by_worker.values()
    assert not first & second, f"a connection was shared by two processes: {dict(by_worker)}"
    assert all(len(b) == 1 for b in per_batch.values()), f"one connection a batch: {per_batch}"
    for worker, seen in by_worker.items():
        # each process ran every batch: its first connection plus one per termination
        assert len(seen) == created[worker] == BATCHES, (worker, seen, created)
