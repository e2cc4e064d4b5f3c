"""Limits across worker processes: a rate limit's 1-s windows and utilisation, a concurrency
limit per limit_by value under load, and a permit freed by kill -9 with its lease."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

import drumbeat
from drumbeat.keys import Keys
from drumbeat.task import Prepared
from tests.helpers import wait_for

pytestmark = pytest.mark.process

ROOT = Path(__file__).resolve().parents[2]


class Proc:
    def __init__(self, url: str, namespace: str, **settings: object) -> None:
        env = {**os.environ, "DRUMBEAT_REDIS_URL": url, "DRUMBEAT_NAMESPACE": namespace}
        env.update({f"DRUMBEAT_{k.upper()}": str(v) for k, v in settings.items()})
        env["PYTHONPATH"] = str(ROOT)
        code = "import drumbeat; from tests.apps.limits_app import app; drumbeat.run_worker(app)"
        self.popen = subprocess.Popen([sys.executable, "-c", code], env=env, cwd=ROOT)

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(10)


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    started: list[Proc] = []
    yield started
    for p in started:
        p.kill()


def _enqueue(url: str, namespace: str, task: str, calls: list[tuple[object, ...]]) -> list[str]:
    """Enqueues by name (a producer that does not import the tasks), as given."""
    app = drumbeat.App(url, namespace=namespace)
    try:
        name = f"tests.apps.limits_app.{task}"
        return [j.id for j in app.enqueue_many([Prepared(name, args, {}) for args in calls])]
    finally:
        app.close()


def _log(r: redis.Redis, namespace: str) -> list[list[str]]:
    """(event, key, job id, attempt, pid, Redis ms, running count) per note, in order."""
    return [e.decode().split("|") for e in r.lrange(f"test:{{{namespace}}}:log", 0, -1)]


def _starts(log: list[list[str]], key: str) -> list[list[str]]:
    return [e for e in log if e[0] == "start" and e[1] == key]


def test_a_rate_limit_holds_in_every_window_across_two_processes(
    redis_url: str, namespace: str, r: redis.Redis, procs: list[Proc]
) -> None:
    """10/s for 3 s of backlog, two worker processes of 4 slots: no 1-s window sees more than
    rate + burst (11) starts, and the backlog runs near the rate (the issue's >= 95 % is a
    figure of `bench.limits`: here, starts are timed as the tasks saw them, which a loaded
    machine delays; a limiter that idles between grants or retries on a poll falls far short)."""
    n = 32
    _enqueue(redis_url, namespace, "tick", [(i,) for i in range(n)])
    procs += [Proc(redis_url, namespace, concurrency=4) for _ in range(2)]
    log = wait_for(
        lambda: _starts(_log(r, namespace), "tick"),
        lambda starts: len(starts) >= n,
        message=f"all {n} rate-limited jobs should start",
        timeout=30,
    )
    times = sorted(int(e[5]) for e in log)
    assert len(log) == n, f"each job should start once, got {len(log)} starts"
    assert len({e[4] for e in log}) == 2, "both worker processes should start jobs"
    worst = max(sum(1 for t in times if s <= t < s + 1000) for s in times)
    assert worst <= 11, f"a 1-s window saw {worst} starts; 10/s with burst 1 allows 11"
    # n starts spaced 100 ms apart take (n - 1) * 100 ms at the full rate.
    span = times[-1] - times[0]
    assert span <= (n - 1) * 100 / 0.8, f"{n} starts took {span} ms: under 80 % of 10/s"
    assert all(e[3] == "1" for e in log), "waiting for the rate must not count as an attempt"


def test_a_concurrency_limit_per_value_is_never_exceeded_under_load(
    redis_url: str, namespace: str, r: redis.Redis, procs: list[Proc]
) -> None:
    """concurrency_limit=2 by user_id, 3 users x 15 jobs, two processes of 8 slots (more slots
    than the limits allow): each user runs at most 2 at once, and reaches 2."""
    jobs = _enqueue(redis_url, namespace, "order", [(u, 0.05) for _ in range(15) for u in range(3)])
    procs += [Proc(redis_url, namespace, concurrency=8) for _ in range(2)]
    log = wait_for(
        lambda: [e for e in _log(r, namespace) if e[0] == "end"],
        lambda ends: len(ends) >= len(jobs),
        message=f"all {len(jobs)} jobs should run",
        timeout=60,
    )
    peaks: dict[str, int] = defaultdict(int)
    for e in _log(r, namespace):
        if e[0] == "start":
            peaks[e[1]] = max(peaks[e[1]], int(e[6]))
    assert dict(peaks) == {"user0": 2, "user1": 2, "user2": 2}, f"peak runs per user: {peaks}"
    assert len(log) == len(jobs)


def test_kill_9_frees_the_permit_with_its_lease(
    redis_url: str, namespace: str, r: redis.Redis, procs: list[Proc]
) -> None:
    """A worker process holding the only permit of a concurrency-1 task is killed mid-run: once
    the dead run's lease lapses, its permit goes too, and both the job parked on the key and the
    killed job (requeued by the reaper; quick on its second attempt) run, one at a time."""
    (first,) = _enqueue(redis_url, namespace, "solo", [(30.0,)])
    victim = Proc(redis_url, namespace, lease=1.0)
    procs.append(victim)
    wait_for(lambda: _starts(_log(r, namespace), "solo"), message="the first job should start")
    (second,) = _enqueue(redis_url, namespace, "solo", [(0.0,)])
    parked = Keys(namespace).parked("t:tests.apps.limits_app.solo")
    wait_for(lambda: r.zscore(parked, second), message="the second job should be parked")
    victim.popen.send_signal(signal.SIGKILL)
    victim.popen.wait(10)
    procs.append(Proc(redis_url, namespace, lease=1.0, maintenance_interval=0.2))
    log = wait_for(
        lambda: _log(r, namespace),
        lambda log: sum(e[0] == "end" for e in log) == 2,
        message="the parked job and the killed one should both run after the lease lapses",
        timeout=30,
    )
    runs = [(e[0], e[2], e[3]) for e in log]
    assert sorted(runs[1:]) == sorted([("start", first, "2"), ("end", first, "2"),
                                       ("start", second, "1"), ("end", second, "1")])  # fmt: skip
    assert runs[1][1] == runs[2][1], f"the two runs after the kill overlapped: {runs}"


def test_kill_9_frees_the_permit_of_a_run_that_does_not_come_back(
    redis_url: str, namespace: str, r: redis.Redis, procs: list[Proc]
) -> None:
    """As above, but the killed run is dead-lettered when its lease lapses (max_stalls=0): no
    run of it will release the permit, so the key's marker (due at the permit's lease
    deadline) has a worker purge the lapsed permit and move the parked job on."""
    (first,) = _enqueue(redis_url, namespace, "solo", [(30.0,)])
    victim = Proc(redis_url, namespace, lease=1.0)
    procs.append(victim)
    wait_for(lambda: _starts(_log(r, namespace), "solo"), message="the first job should start")
    (second,) = _enqueue(redis_url, namespace, "solo", [(0.0,)])
    parked = Keys(namespace).parked("t:tests.apps.limits_app.solo")
    wait_for(lambda: r.zscore(parked, second), message="the second job should be parked")
    victim.popen.send_signal(signal.SIGKILL)
    victim.popen.wait(10)
    procs.append(Proc(redis_url, namespace, lease=1.0, maintenance_interval=0.2, max_stalls=0))
    starts = wait_for(
        lambda: _starts(_log(r, namespace), "solo"),
        lambda s: any(e[2] == second for e in s),
        message="the parked job should run once the dead run's permit lapses",
        timeout=30,
    )
    assert [(e[2], e[3]) for e in starts] == [(first, "1"), (second, "1")]
    # The lapsed permit goes when its lease deadline passes; the reaper, every 0.2 s, then
    # dead-letters the killed job (on a loaded machine, after the second job started).
    wait_for(lambda: r.zscore(Keys(namespace).dead, first), lambda at: at is not None,
             message="the killed job is dead-lettered", timeout=10)  # fmt: skip
