"""Three worker processes hold 2,000 one-second schedules on cadence, through a kill -9."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest
import redis

import drumbeat

pytestmark = [pytest.mark.process, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
N = 2000
WINDOW_S = 15


def _worker(url: str, namespace: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "DRUMBEAT_REDIS_URL": url, "DRUMBEAT_NAMESPACE": namespace,
           "DRUMBEAT_LEASE": "1.0", "DRUMBEAT_MAINTENANCE_INTERVAL": "0.2",
           "DRUMBEAT_CONCURRENCY": "100",
           "PYTHONPATH": str(ROOT)}  # fmt: skip
    code = "import drumbeat; from tests.apps.sched_app import app; drumbeat.run_worker(app)"
    return subprocess.Popen([sys.executable, "-c", code], env=env, cwd=ROOT)


def test_2000_schedules_on_cadence_across_a_kill_9(
    redis_url: str, namespace: str, r: redis.Redis
) -> None:
    app = drumbeat.App(redis_url, namespace=namespace, lease=1.0)
    app.enqueue  # noqa: B018 - the task below is registered by name, as the workers do

    @app.task(name="monitor")
    async def monitor(n: int) -> None: ...

    app.schedule_many(
        [drumbeat.Schedule(f"mon:{i}", monitor, every=1, args=(i,)) for i in range(N)]
    )
    workers = [_worker(redis_url, namespace) for _ in range(3)]
    try:
        sec, _ = r.time()
        t0 = (int(sec) + 2) * 1000  # a whole second, after the workers have started
        time.sleep(max(0.0, t0 / 1000 - time.time()) + WINDOW_S / 2)
        victim = workers[0]
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
        time.sleep(WINDOW_S / 2 + 2.5)  # the rest of the window, and the stragglers
        for w in workers[1:]:
            w.send_signal(signal.SIGTERM)
        for w in workers[1:]:
            assert w.wait(30) == 0
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
                w.wait(10)

    runs: dict[str, list[tuple[int, float, float, int, int]]] = defaultdict(list)
    for entry in r.lrange(f"test:{{{namespace}}}:runs", 0, -1):
        sid, due, start, end, attempt, pid = entry.decode().split("|")
        runs[sid].append((int(due), float(start), float(end), int(attempt), int(pid)))

    window = range(t0, t0 + WINDOW_S * 1000)
    per_schedule = {sid: sum(1 for due, *_ in rs if due in window) for sid, rs in runs.items()}
    assert len(per_schedule) == N
    off = {sid: n for sid, n in per_schedule.items() if abs(n - WINDOW_S) > 1}
    assert not off, f"{len(off)} schedules off cadence, e.g. {list(off.items())[:5]}"

    for sid, rs in runs.items():
        _check_no_overlap_and_no_double(sid, rs, victim.pid)

    # The victim's runs in flight came back as later attempts, after its 1 s lease.
    retried = [(run[0], run[1]) for rs in runs.values() for run in rs if run[3] > 1]
    assert retried, "kill -9 mid-flight left no run to recover"
    for due, start in retried:
        assert start - due >= 900
    app.close()


def _check_no_overlap_and_no_double(
    sid: str, rs: list[tuple[int, float, float, int, int]], victim_pid: int
) -> None:
    rs.sort(key=lambda x: x[1])
    for earlier, later in itertools.pairwise(rs):
        assert later[1] >= earlier[2], f"{sid} ran twice at once"
    by_due: dict[int, list[tuple[int, float, float, int, int]]] = defaultdict(list)
    for run in rs:
        by_due[run[0]].append(run)
    for due, same in by_due.items():
        if len(same) > 1:
            # At-least-once: only a run the victim finished but could not settle before
            # kill -9 comes back, as a later attempt in a surviving worker.
            first, again = sorted(same, key=lambda x: x[3])
            assert len(same) == 2 and first[4] == victim_pid, f"{sid} doubled at {due}"
            assert again[3] > first[3] and again[4] != victim_pid
