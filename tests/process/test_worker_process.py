"""Worker processes under signals and kill -9: no job is lost, none is held past its lease."""

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
from tests.conftest import reap_call
from tests.helpers import leased, redis_now_ms, wait_for

pytestmark = pytest.mark.process

ROOT = Path(__file__).resolve().parents[2]


class Proc:
    def __init__(self, url: str, namespace: str, **settings: object) -> None:
        env = {**os.environ, "DRUMBEAT_REDIS_URL": url, "DRUMBEAT_NAMESPACE": namespace}
        env.update({f"DRUMBEAT_{k.upper()}": str(v) for k, v in settings.items()})
        env["PYTHONPATH"] = str(ROOT)
        code = "import drumbeat; from tests.apps.proc_app import app; drumbeat.run_worker(app)"
        self.popen = subprocess.Popen([sys.executable, "-c", code], env=env, cwd=ROOT)

    def signal(self, sig: int) -> None:
        self.popen.send_signal(sig)

    def wait(self, timeout: float) -> int:
        return self.popen.wait(timeout)

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


def _app(url: str, namespace: str, **settings: object) -> drumbeat.App:
    return drumbeat.App(url, namespace=namespace, **settings)  # type: ignore[arg-type]


def _log(r: redis.Redis, namespace: str) -> list[list[str]]:
    return [e.decode().split("|") for e in r.lrange(f"test:{{{namespace}}}:log", 0, -1)]


def _wait_for_starts(r: redis.Redis, namespace: str, n: int) -> None:
    wait_for(
        lambda: _log(r, namespace),
        lambda log: len(log) == n,
        message=f"the worker process should start {n} job(s) (its log)",
    )


def test_kill_9_mid_job_runs_again_elsewhere_after_the_lease(
    redis_url: str, namespace: str, r: redis.Redis, procs: list[Proc]
) -> None:
    app = _app(redis_url, namespace, lease=1.0)
    job = app.enqueue("tests.apps.proc_app.nap", 1.0)
    victim = Proc(redis_url, namespace, lease=1.0)
    procs.append(victim)
    _wait_for_starts(r, namespace, 1)
    victim.popen.send_signal(signal.SIGKILL)
    victim.wait(10)
    killed_at = time.monotonic()
    procs.append(Proc(redis_url, namespace, lease=1.0, maintenance_interval=0.2))
    assert job.result(timeout=20) == "rested"
    # It came back only once the 1 s lease had lapsed, as attempt 2, in the other process.
    assert time.monotonic() - killed_at >= 0.5
    log = _log(r, namespace)
    starts = [e for e in log if e[0] == "start"]
    assert [int(e[2]) for e in starts] == [1, 2]
    assert starts[0][3] != starts[1][3]
    assert [e[0] for e in log].count("end") == 1
    app.close()


def test_a_worker_process_freezes_its_start_up_objects_and_collects_young_ones_less_often(
    redis_url: str, namespace: str, procs: list[Proc]
) -> None:
    app = _app(redis_url, namespace)
    procs.append(Proc(redis_url, namespace))
    young, frozen = app.enqueue("tests.apps.proc_app.gc_settings").result(timeout=20)
    app.close()
    assert young == 10_000, "CPython's default is 700"
    assert frozen > 1_000, "the app and its modules should be frozen out of collections"


def test_a_worker_frozen_past_its_lease_then_resumed_cannot_overwrite_the_outcome(
    redis_url: str, namespace: str, r: redis.Redis, procs: list[Proc]
) -> None:
    # SIGSTOP: the process, its heartbeat thread included, stops; its lease lapses, another
    # worker runs the job. Resumed, the first cannot change the outcome.
    app = _app(redis_url, namespace, lease=1.0)
    job = app.enqueue("tests.apps.proc_app.whoami", 1.0)
    frozen = Proc(redis_url, namespace, lease=1.0)
    procs.append(frozen)
    _wait_for_starts(r, namespace, 1)
    frozen.signal(signal.SIGSTOP)
    other = Proc(redis_url, namespace, lease=1.0, maintenance_interval=0.2)
    procs.append(other)
    assert job.result(timeout=30) == other.popen.pid, "the second worker should run the job"
    # Resumed, then stopped: its stale run finishes, or is cancelled once it finds its lease
    # taken over (which comes first depends on timing); either way it settles what it holds
    # (refused) before it exits.
    frozen.signal(signal.SIGCONT)
    frozen.signal(signal.SIGTERM)
    assert frozen.wait(30) == 0
    assert job.result(timeout=5) == other.popen.pid, "a stale worker overwrote the outcome"
    # (The frozen worker's idle claim, already sent, may take the job back while it is still
    # stopped: that claim's lease lapses too, and the run it starts on resuming is cancelled.)
    ran = {(e[0], e[3]) for e in _log(r, namespace)}
    assert {("start", str(other.popen.pid)), ("end", str(other.popen.pid))} <= ran
    assert r.zcard(app.keys.dead) == 0
    app.close()


def test_sigterm_lets_running_jobs_finish(
    redis_url: str, namespace: str, r: redis.Redis, procs: list[Proc]
) -> None:
    app = _app(redis_url, namespace)
    job = app.enqueue("tests.apps.proc_app.nap", 0.5)
    p = Proc(redis_url, namespace, shutdown_grace=10)
    procs.append(p)
    _wait_for_starts(r, namespace, 1)
    p.signal(signal.SIGTERM)
    assert p.wait(15) == 0
    assert job.status() is drumbeat.JobStatus.COMPLETE
    assert r.zcard(app.keys.workers) == 0, "a stopped worker deregisters"
    app.close()


def test_sigterm_hands_unfinished_jobs_back_at_once(
    redis_url: str, namespace: str, r: redis.Redis, procs: list[Proc]
) -> None:
    # The lease is 60 s: a job that came back by lease expiry would not be queued in time.
    app = _app(redis_url, namespace, lease=60)
    jobs = [app.enqueue("tests.apps.proc_app.nap", 30) for _ in range(2)]
    p = Proc(redis_url, namespace, lease=60, shutdown_grace=0.3)
    procs.append(p)
    _wait_for_starts(r, namespace, 2)
    p.signal(signal.SIGTERM)
    assert p.wait(15) == 0
    for job in jobs:
        assert job.status() is drumbeat.JobStatus.QUEUED
    assert leased(r, app.keys.leases) == 0
    # A hand-back does not spend an attempt.
    claimed = app.scripts.claim("check", 2, 1000, 10).run(r).jobs
    assert [c.attempt for c in claimed] == [1, 1]
    app.close()


def test_second_signal_stops_at_once_and_jobs_return_by_lease(
    redis_url: str, namespace: str, r: redis.Redis, procs: list[Proc]
) -> None:
    app = _app(redis_url, namespace, lease=1.0)
    job = app.enqueue("tests.apps.proc_app.nap", 30)
    p = Proc(redis_url, namespace, lease=1.0, shutdown_grace=60)
    procs.append(p)
    _wait_for_starts(r, namespace, 1)
    p.signal(signal.SIGTERM)

    def stopped() -> bool:
        # Signals of one kind sent before the process handles the first merge into one (on a
        # loaded machine it may not run in between): send more until it stops. The first one
        # handled starts the 60 s grace, so only a later one can stop it this soon.
        if p.popen.poll() is not None:
            return True
        p.signal(signal.SIGTERM)
        return False

    wait_for(stopped, message="a second SIGTERM should stop the worker at once", interval=0.2)
    p.wait(10)
    assert job.status() is drumbeat.JobStatus.RUNNING, "a hard stop hands nothing back"
    wait_for(
        lambda: reap_call(app, limit=10).run(r).requeued,
        lambda requeued: requeued == 1,
        message="the job should be requeued once its 1 s lease lapsed",
        timeout=10,
    )
    assert job.status() is drumbeat.JobStatus.QUEUED
    app.close()


@pytest.mark.parametrize("task", ["spin", "hog"])
def test_leases_are_renewed_while_a_task_hogs_the_cpu_or_the_loop(
    task: str, redis_url: str, namespace: str, r: redis.Redis, procs: list[Proc]
) -> None:
    app = _app(redis_url, namespace, lease=0.6)
    job = app.enqueue(f"tests.apps.proc_app.{task}", 2.5)
    procs.append(Proc(redis_url, namespace, lease=0.6, maintenance_interval=0.1))
    # A second worker would take the job over if the first one's lease ever lapsed.
    procs.append(Proc(redis_url, namespace, lease=0.6, maintenance_interval=0.1))
    job.result(timeout=30)
    starts = [e for e in _log(r, namespace) if e[0] == "start"]
    assert len(starts) == 1, f"the job ran {len(starts)} times: its lease lapsed"
    app.close()


def test_a_loop_blocked_for_good_stops_renewing_its_leases_and_its_job_runs_elsewhere(
    redis_url: str, namespace: str, r: redis.Redis, procs: list[Proc]
) -> None:
    settings = {"lease": 0.6, "hang_timeout": 2.0}
    app = _app(redis_url, namespace, **settings)
    job = app.enqueue("tests.apps.proc_app.hog_once")
    hung = Proc(redis_url, namespace, **settings)
    procs.append(hung)
    _wait_for_starts(r, namespace, 1)
    # Its heartbeat thread runs on, but once the loop has been silent hang_timeout it must let
    # the lease lapse (no other worker runs yet: nothing reaps it meanwhile).
    wait_for(
        lambda: (r.zscore(app.keys.leases, job.id), redis_now_ms(r)),
        until=lambda seen: seen[0] is not None and seen[0] < seen[1],
        message="the lease of a job whose worker's loop is blocked for good was renewed on "
        "and on; expected it to lapse after hang_timeout",
    )
    other = Proc(redis_url, namespace, **settings, maintenance_interval=0.1)
    procs.append(other)
    assert job.result(timeout=30) == other.popen.pid, "another worker should finish the job"
    assert hung.popen.poll() is None, "the hung worker is blocked, not gone"
    app.close()


def test_kill_9_mid_job_resumes_from_its_saved_progress(
    redis_url: str, namespace: str, r: redis.Redis, procs: list[Proc]
) -> None:
    settings = {"lease": 1.0, "progress_interval": 0}
    app = _app(redis_url, namespace, **settings)
    job = app.enqueue("tests.apps.proc_app.units", 40, 0.05)
    victim = Proc(redis_url, namespace, **settings)
    procs.append(victim)
    wait_for(lambda: len(_log(r, namespace)) >= 8, message="the job did not get going")
    victim.popen.send_signal(signal.SIGKILL)
    victim.wait(10)
    saved = job.progress()
    done_before = [e for e, *_ in _log(r, namespace)]
    procs.append(Proc(redis_url, namespace, maintenance_interval=0.2, **settings))
    assert job.result(timeout=30) == 40
    log = _log(r, namespace)
    second = [int(e[4:]) for e, _, attempt, _ in log if attempt == "2"]
    assert second[0] == saved, "the next attempt did not start at the saved progress"
    units = [int(e[4:]) for e, *_ in log]
    assert sorted(set(units)) == list(range(40)), "a unit was skipped"
    repeated = [u for u in set(units) if units.count(u) > 1]
    # Only the unit in flight at the kill (begun, not yet checkpointed) runs twice.
    assert repeated in ([], [saved]), (repeated, saved, done_before)


def test_sigterm_hands_a_checkpointing_job_back_at_once_with_its_progress(
    redis_url: str, namespace: str, r: redis.Redis, procs: list[Proc]
) -> None:
    settings = {"shutdown_grace": 60.0}
    app = _app(redis_url, namespace, **settings)
    job = app.enqueue("tests.apps.proc_app.units", 400, 0.02)
    worker = Proc(redis_url, namespace, **settings)
    procs.append(worker)
    wait_for(lambda: len(_log(r, namespace)) >= 10, message="the job did not get going")
    signalled = time.monotonic()
    worker.signal(signal.SIGTERM)
    assert worker.wait(20) == 0
    took = time.monotonic() - signalled
    assert took < 10, f"the worker took {took:.1f} s: it waited for the job, not its checkpoint"
    assert job.status() is drumbeat.JobStatus.QUEUED, "the job was not handed back"
    saved = job.progress()
    assert saved == len(_log(r, namespace)), "the progress at the hand-back was not saved"
    procs.append(Proc(redis_url, namespace, **settings))
    assert job.result(timeout=30) == 400
    units = [int(e[4:]) for e, *_ in _log(r, namespace)]
    assert units == list(range(400)), "a unit was repeated or skipped across the hand-back"
