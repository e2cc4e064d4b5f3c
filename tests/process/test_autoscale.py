"""`drumbeat worker --autoscale MIN:MAX`: a supervisor grows its pool for a backlog and shrinks it
back once idle, retiring processes that finish their jobs first; two supervisors share one
backlog by their MAXes."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

import drumbeat
from drumbeat.autoscale import CPU_TARGET, read_signal
from tests.helpers import wait_for

pytestmark = pytest.mark.process

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.apps.scale_app:app"


def _events(r: redis.Redis, namespace: str) -> list[list[str]]:
    return [e.decode().split("|") for e in r.lrange(f"test:{{{namespace}}}:scale", 0, -1)]


def _children(pid: int) -> set[int]:
    """The live child processes of ``pid`` (from /proc)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return {int(c) for c in f.read().split()}
    except OSError:
        return set()


def _env(url: str, namespace: str, **more: str) -> dict[str, str]:
    return {**os.environ, "DRUMBEAT_REDIS_URL": url, "DRUMBEAT_NAMESPACE": namespace,
            "DRUMBEAT_LEASE": "1.0", "DRUMBEAT_MAINTENANCE_INTERVAL": "0.2",
            "DRUMBEAT_SCALE_INTERVAL": "0.2", "PYTHONPATH": str(ROOT), **more}  # fmt: skip


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def _supervise(
    procs: list[subprocess.Popen[bytes]], env: dict[str, str], bounds: str
) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "drumbeat", "worker", APP, "--autoscale", bounds,
         "--concurrency", "2"],
        cwd=ROOT, env=env,
    )  # fmt: skip
    procs.append(proc)
    return proc


def _ran_once_each(r: redis.Redis, namespace: str, n: int) -> None:
    runs = [e for e in _events(r, namespace) if e[0] == "ran"]
    times = Counter(int(e[1]) for e in runs)
    assert times == Counter(range(n)), f"each job should run exactly once: {sorted(times.items())}"
    assert {e[2] for e in runs} == {"1"}, "a job was handed back and ran again (attempt > 1)"


def test_autoscale_grows_for_a_backlog_and_shrinks_to_min_once_idle_finishing_every_job(
    redis_url: str, namespace: str, r: redis.Redis, started: list[subprocess.Popen[bytes]]
) -> None:
    # A grace shorter than the long jobs: a scale-down that merely stopped a worker would
    # hand them back (and they would run twice).
    env = _env(redis_url, namespace, DRUMBEAT_SCALE_DOWN_AFTER="1.0", DRUMBEAT_SHUTDOWN_GRACE="0.5")
    sup = _supervise(started, env, "1:3")
    wait_for(lambda: len(_children(sup.pid)), until=lambda n: n == 1,
             message="autoscale 1:3 should start at MIN, one worker process")  # fmt: skip
    app = drumbeat.App(redis_url, namespace=namespace)
    try:
        # Twelve 1 s jobs for 2 slots: far more than one process starts within an interval.
        # The last ones run longer, so the pool shrinks while some of them still run.
        jobs = [app.enqueue("tests.apps.scale_app.work", n, 1.0 if n < 8 else 3.0)
                for n in range(12)]  # fmt: skip
        most = 0  # the pool the supervisor keeps (retired processes finishing jobs aside)

        def live() -> int:
            """Worker processes alive (children of the supervisor, retiring ones too)."""
            nonlocal most
            assert sup.poll() is None, "the supervisor exited"
            for me in read_signal(app).supervisors:
                most = max(most, me.desired, me.live)
            return len(_children(sup.pid))

        wait_for(live, until=lambda n: n == 3, timeout=30,
                 message="the pool should grow to MAX for the backlog")  # fmt: skip
        for job in jobs:
            job.result(timeout=60)
            live()
        assert most == 3, f"the pool reached {most} processes, MAX is 3"
        wait_for(live, until=lambda n: n == 1, timeout=40,
                 message="once idle, the pool should shrink back to MIN")  # fmt: skip
        _ran_once_each(r, namespace, 12)
        starts = {int(e[1]) for e in _events(r, namespace) if e[0] == "start"}
        stops = {int(e[1]) for e in _events(r, namespace) if e[0] == "stop"}
        assert len(starts) >= 3, starts
        assert stops == starts - _children(sup.pid), "each retired process stopped gracefully"
        sup.send_signal(signal.SIGTERM)
        assert sup.wait(30) == 0
    finally:
        app.close()


def test_autoscale_grows_for_a_saturated_core_with_free_slots_and_shrinks_once_it_cools(
    redis_url: str, namespace: str, started: list[subprocess.Popen[bytes]]
) -> None:
    # One job keeps its worker's core busy while 1 of 2 slots is free and nothing waits: only
    # the CPU the worker reports shows that this process cannot start more on time.
    # A lease of 5 s, not the file's 1 s: on a loaded 2-core CI host the burning job's 1-s lease
    # lapsed four times in a row and it was dead-lettered (the heartbeat thread of a process
    # that burns its core waits for the GIL at each socket call). The default lease is 15 s;
    # nothing here needs a lapse.
    env = _env(redis_url, namespace, DRUMBEAT_SCALE_DOWN_AFTER="1.0", DRUMBEAT_LEASE="5.0")
    sup = _supervise(started, env, "1:2")
    wait_for(lambda: len(_children(sup.pid)), until=lambda n: n == 1,
             message="autoscale 1:2 should start at MIN, one worker process")  # fmt: skip
    app = drumbeat.App(redis_url, namespace=namespace)
    try:
        job = app.enqueue("tests.apps.scale_app.burn", 8.0)

        def reasons() -> list[str]:
            assert sup.poll() is None, "the supervisor exited"
            return [s.reason for s in read_signal(app).supervisors if s.desired == 2]

        why = wait_for(reasons, until=bool, timeout=30,
                       message="a worker using its whole core should get a sibling")  # fmt: skip
        # It scaled with nothing waiting, on the CPU the worker reported.
        assert why[0].startswith("0 ready"), why
        used = re.search(r"cpu (\d+\.\d+)", why[0])
        # Over CPU_TARGET: the reason rounds it to 2 decimals (0.7004 reads "0.70").
        assert used and float(used[1]) >= CPU_TARGET, why
        job.result(timeout=60)
        wait_for(lambda: len(_children(sup.pid)), until=lambda n: n == 1, timeout=40,
                 message="once the core cools, the pool should shrink back to MIN")  # fmt: skip
        sup.send_signal(signal.SIGTERM)
        assert sup.wait(30) == 0
    finally:
        app.close()


def test_a_busy_start_is_not_taken_for_a_saturated_worker(
    redis_url: str, namespace: str, r: redis.Redis, started: list[subprocess.Popen[bytes]]
) -> None:
    # Each process burns a core for 1.5 s while it starts, then idles. Read as load, that start
    # would grow the pool, and each new process's start would grow it again, up to MAX.
    env = _env(redis_url, namespace, DRUMBEAT_TEST_STARTUP_BURN="1.5")
    sup = _supervise(started, env, "1:3")
    app = drumbeat.App(redis_url, namespace=namespace)
    try:
        wait_for(lambda: read_signal(app).workers, until=lambda n: n == 1, timeout=30,
                 message="the first worker should register")  # fmt: skip
        seen = 0
        deadline = time.monotonic() + 4.0  # a dozen worker beats and twenty decisions
        while time.monotonic() < deadline:
            assert sup.poll() is None, "the supervisor exited"
            seen = max(
                seen, len(_children(sup.pid)), *(s.desired for s in read_signal(app).supervisors)
            )
            time.sleep(0.05)
        starts = [e for e in _events(r, namespace) if e[0] == "start"]
        assert seen == 1 and len(starts) == 1, f"an idle pool grew to {seen} ({starts})"
        sup.send_signal(signal.SIGTERM)
        assert sup.wait(30) == 0
    finally:
        app.close()


def test_two_supervisors_share_one_backlog_by_their_max(
    redis_url: str, namespace: str, r: redis.Redis, started: list[subprocess.Popen[bytes]]
) -> None:
    # Scale-downs slow enough not to interleave with what the test watches.
    env = _env(redis_url, namespace, DRUMBEAT_SCALE_DOWN_AFTER="30")
    sups = [_supervise(started, env, "1:3"), _supervise(started, env, "1:3")]
    app = drumbeat.App(redis_url, namespace=namespace)
    try:
        wait_for(lambda: read_signal(app).supervisors, until=lambda s: len(s) == 2,
                 message="both supervisors should register")  # fmt: skip
        wait_for(lambda: [len(_children(s.pid)) for s in sups], until=lambda n: n == [1, 1],
                 message="each should start at MIN")  # fmt: skip
        most = [1, 1]

        def live() -> list[int]:
            counts = [len(_children(s.pid)) for s in sups]
            for i, n in enumerate(counts):
                assert sups[i].poll() is None, "a supervisor exited"
                most[i] = max(most[i], n)
            return counts

        # A small backlog: 6 jobs of 2 s on 4 slots need 3 processes of 2 slots in all, so
        # each takes ceil(3 * 3/6) = 2, not its MAX of 3.
        small = [app.enqueue("tests.apps.scale_app.work", n, 2.0) for n in range(6)]
        wait_for(live, until=lambda n: sum(n) >= 3,
                 message="the two should grow for the backlog")  # fmt: skip
        for job in small:
            job.result(timeout=60)
            live()
        assert max(most) <= 2, f"a small backlog took a supervisor to MAX: most live {most}"

        # A big backlog: both grow to MAX, and together never past the sum of the MAXes.
        big = [app.enqueue("tests.apps.scale_app.work", n, 1.0) for n in range(6, 40)]
        wait_for(live, until=lambda n: n == [3, 3], timeout=30,
                 message="both should grow to MAX for a big backlog")  # fmt: skip
        for job in big:
            job.result(timeout=60)
            live()
        assert most == [3, 3], f"past MAX: most live {most}"
        _ran_once_each(r, namespace, 40)
        for sup in sups:
            sup.send_signal(signal.SIGTERM)
        assert [s.wait(30) for s in sups] == [0, 0]
        assert read_signal(app).supervisors == (), "a stopped supervisor deregisters"
    finally:
        app.close()
