"""`drumbeat worker --processes N`: a supervisor keeps N workers running, restarts one that
dies, replaces one that hangs (and only then), stops them all on SIGTERM, and stops itself on a
crash loop."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

import drumbeat
from drumbeat.keys import Keys
from drumbeat.supervisor import Supervisor
from tests.helpers import wait_for

pytestmark = pytest.mark.process

ROOT = Path(__file__).resolve().parents[2]


def _events(r: redis.Redis, namespace: str) -> list[tuple[str, int]]:
    raw = r.lrange(f"test:{{{namespace}}}:sup", 0, -1)
    return [(kind, int(pid)) for kind, pid in (e.decode().split("|") for e in raw)]


def _pids(r: redis.Redis, namespace: str, kind: str) -> set[int]:
    return {pid for k, pid in _events(r, namespace) if k == kind}


@pytest.fixture
def supervise(redis_url: str, namespace: str) -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            # Its workers too: orphaned, a hung one would never exit.
            for child in _children(proc.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child, signal.SIGKILL)
            proc.kill()
            proc.wait(10)


def _start(
    started: list[subprocess.Popen[bytes]],
    url: str,
    namespace: str,
    processes: int,
    *more: str,
    new_session: bool = False,
    app: str = "tests.apps.sup_app:app",
    log: Path | None = None,
    **env: str,
) -> subprocess.Popen[bytes]:
    environ = {**os.environ, "DRUMBEAT_REDIS_URL": url, "DRUMBEAT_NAMESPACE": namespace,
               "DRUMBEAT_LEASE": "1.0", "DRUMBEAT_MAINTENANCE_INTERVAL": "0.2",
               "PYTHONPATH": str(ROOT), **env}  # fmt: skip
    if log is not None:
        environ["COLUMNS"] = "1000"  # one log line a record: the tests look for them
    with contextlib.ExitStack() as stack:
        stderr = None if log is None else stack.enter_context(log.open("wb"))
        proc = subprocess.Popen(
            [sys.executable, "-m", "drumbeat", "worker", app, "--processes", str(processes),
             "--concurrency", "4", *more],
            cwd=ROOT, env=environ, start_new_session=new_session, stderr=stderr,
        )  # fmt: skip
    started.append(proc)
    return proc


def test_n_workers_run_their_hooks_a_killed_one_is_replaced_and_sigterm_stops_all(
    redis_url: str, namespace: str, r: redis.Redis, supervise: list[subprocess.Popen[bytes]]
) -> None:
    sup = _start(supervise, redis_url, namespace, 3)
    wait_for(lambda: len(_pids(r, namespace, "start")), until=lambda n: n == 3,
             message="three worker processes should start, each running on_startup")  # fmt: skip
    first = _pids(r, namespace, "start")
    assert sup.pid not in first, "the supervisor ran a worker itself"
    app = drumbeat.App(redis_url, namespace=namespace)
    try:
        job = app.enqueue("tests.apps.sup_app.nap", 0.5)
        victim = job.result(timeout=20)  # a pid that ran a job: kill it
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: _pids(r, namespace, "start") - first, until=bool,
                 message="the killed worker was not replaced")  # fmt: skip
        jobs = [app.enqueue("tests.apps.sup_app.nap", 0.05) for _ in range(12)]
        ran_on = {j.result(timeout=20) for j in jobs}
        assert victim not in ran_on
        sup.send_signal(signal.SIGTERM)
        assert sup.wait(30) == 0
    finally:
        app.close()
    alive = _pids(r, namespace, "start") - {victim}
    assert len(alive) == 3
    assert _pids(r, namespace, "stop") == alive, "each live worker ran on_shutdown once"


def test_a_crash_loop_stops_the_supervisor_with_an_error(
    redis_url: str, namespace: str, supervise: list[subprocess.Popen[bytes]]
) -> None:
    sup = _start(supervise, redis_url, namespace, 2, SUP_APP_BROKEN="1")
    assert sup.wait(60) == 1, "a worker that dies at start-up over and over is not retried forever"


def _children(pid: int) -> set[int]:
    """The live child processes of ``pid`` (from /proc)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return {int(c) for c in f.read().split()}
    except OSError:
        return set()


def test_max_jobs_recycles_workers_without_a_capacity_dip(
    redis_url: str, namespace: str, r: redis.Redis, supervise: list[subprocess.Popen[bytes]]
) -> None:
    """Jobs flow until two recycles are done; throughout, two workers live and two serve (are
    registered): a recycling worker claims on until its successor serves."""
    sup = _start(supervise, redis_url, namespace, 2, "--max-jobs", "5")
    wait_for(lambda: _registered(r, namespace), until=lambda pids: len(pids) == 2,
             message="two workers should register")  # fmt: skip
    app = drumbeat.App(redis_url, namespace=namespace)
    fewest, fewest_registered = 2, 2
    jobs: list[drumbeat.Job[int]] = []
    deadline = time.monotonic() + 90
    try:
        while len(_pids(r, namespace, "stop")) < 2:  # until two workers have retired
            assert time.monotonic() < deadline, f"no two recycles: {_events(r, namespace)}"
            if sum(j.status() is not drumbeat.JobStatus.COMPLETE for j in jobs[-8:]) < 8:
                jobs.append(app.enqueue("tests.apps.sup_app.nap", 0.05))
            fewest = min(fewest, len(_children(sup.pid)))
            fewest_registered = min(fewest_registered, len(_registered(r, namespace)))
            assert sup.poll() is None, "the supervisor exited"
            time.sleep(0.01)
        ran_on = {j.result(timeout=20) for j in jobs}
        sup.send_signal(signal.SIGTERM)
        assert sup.wait(30) == 0
    finally:
        app.close()
    assert len(ran_on) >= 3, f"{len(jobs)} jobs at --max-jobs 5 ran on {len(ran_on)} processes"
    assert len(_pids(r, namespace, "start")) >= 4, "retired workers were not replaced"
    assert fewest >= 2, f"capacity dipped to {fewest} live workers during a recycle"
    assert fewest_registered >= 2, (
        f"capacity dipped to {fewest_registered} serving (registered) workers during a recycle"
    )


def test_sighup_restarts_every_worker_one_at_a_time_without_a_capacity_gap(
    redis_url: str, namespace: str, r: redis.Redis, supervise: list[subprocess.Popen[bytes]]
) -> None:
    sup = _start(supervise, redis_url, namespace, 2)
    wait_for(lambda: len(_pids(r, namespace, "start")), until=lambda n: n == 2,
             message="two worker processes should start")  # fmt: skip
    old = _pids(r, namespace, "start")
    sup.send_signal(signal.SIGHUP)
    fewest = 2
    deadline = time.monotonic() + 60
    while not (old <= _pids(r, namespace, "stop") and len(_pids(r, namespace, "start")) == 4):
        assert time.monotonic() < deadline, (
            f"the rolling restart did not finish: {_events(r, namespace)}"
        )
        fewest = min(fewest, len(_children(sup.pid)))
        time.sleep(0.02)
    assert fewest >= 2, f"capacity dipped to {fewest} live workers during the rolling restart"
    new = _pids(r, namespace, "start") - old
    assert len(new) == 2
    wait_for(lambda: _children(sup.pid), until=lambda live: live == new,
             message="the old workers should exit, leaving the new ones")  # fmt: skip
    app = drumbeat.App(redis_url, namespace=namespace)
    try:
        assert app.enqueue("tests.apps.sup_app.nap", 0.01).result(timeout=20) in new
    finally:
        app.close()
    sup.send_signal(signal.SIGTERM)
    assert sup.wait(30) == 0


# The app of the rolling-restart test, in a module of its own: the test changes it on disk
# (VERSION, and a start-up that now takes START seconds: the new code warms a cache) before
# SIGHUP, as a deploy does.
_ROLLING_APP = """
import asyncio
import os

import redis

import drumbeat
from drumbeat.keys import Keys

VERSION = "@VERSION@"
START = @START@
app = drumbeat.App()
_log = redis.Redis.from_url(os.environ["DRUMBEAT_REDIS_URL"])
PREFIX = "test:{" + app.keys.namespace + "}:"


@app.on_startup
async def warm() -> None:
    await asyncio.sleep(START)


@app.task
async def work(n: int) -> str:
    _log.rpush(PREFIX + "began", f"{n}|{os.getpid()}|{VERSION}")
    await asyncio.sleep(0.05)
    _log.rpush(PREFIX + "ended", f"{n}|{os.getpid()}|{VERSION}")
    return VERSION
"""


def _write_app(path: Path, version: str, start: float) -> None:
    path.write_text(_ROLLING_APP.replace("@VERSION@", version).replace("@START@", repr(start)))


def _runs(r: redis.Redis, namespace: str, which: str) -> list[tuple[int, int, str]]:
    """(job number, pid, code version) of each job that began or ended."""
    out = []
    for raw in r.lrange(f"test:{{{namespace}}}:{which}", 0, -1):
        n, pid, version = raw.decode().split("|")
        out.append((int(n), int(pid), version))
    return out


def _registered(r: redis.Redis, namespace: str) -> set[int]:
    """The pids of the workers registered in Redis: those `drumbeat status` lists."""
    return {int(json.loads(raw)["pid"]) for raw in r.hvals(Keys(namespace).workerinfo)}


def _supervisor_live(r: redis.Redis, namespace: str) -> list[tuple[int, int]]:
    """(live, desired) of each supervisor's record in Redis."""
    infos = [json.loads(raw) for raw in r.hvals(Keys(namespace).supervisorinfo)]
    return [(info["live"], info["desired"]) for info in infos]


def test_sighup_rolls_new_code_onto_every_worker_while_jobs_flow(
    redis_url: str,
    namespace: str,
    r: redis.Redis,
    supervise: list[subprocess.Popen[bytes]],
    tmp_path: Path,
) -> None:
    """A deploy: the app changes on disk, SIGHUP. Each worker is replaced by one running the new
    code, one at a time, and an old one leaves only once its successor serves, even when the
    new code takes longer to start than the old (here 3 s, where the old took none); every job
    runs once, none is lost."""
    module = f"rolling_{namespace.replace('-', '_')}"
    source = tmp_path / f"{module}.py"
    _write_app(source, "old", 0.0)
    sup = _start(supervise, redis_url, namespace, 2, app=f"{module}:app",
                 PYTHONPATH=f"{ROOT}{os.pathsep}{tmp_path}",
                 PYTHONDONTWRITEBYTECODE="1")  # fmt: skip
    old = wait_for(lambda: _registered(r, namespace), until=lambda pids: len(pids) == 2,
                   message="two worker processes should register")  # fmt: skip
    wait_for(lambda: _supervisor_live(r, namespace), until=lambda s: s == [(2, 2)],
             message="the supervisor should register 2 live of 2 desired")  # fmt: skip
    app = drumbeat.App(redis_url, namespace=namespace)
    jobs: list[drumbeat.Job[Any]] = []
    fewest_registered, fewest_live, most_children = 2, 2, 2
    try:
        _write_app(source, "new", 3.0)
        sup.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 90
        while True:  # jobs flow all along; watch the pool between them
            jobs.append(app.enqueue(f"{module}.work", len(jobs)))
            registered = _registered(r, namespace)
            fewest_registered = min(fewest_registered, len(registered))
            fewest_live = min([fewest_live, *(live for live, _ in _supervisor_live(r, namespace))])
            most_children = max(most_children, len(_children(sup.pid)))
            if len(registered) == 2 and not registered & old:
                break
            assert sup.poll() is None, "the supervisor exited"
            assert time.monotonic() < deadline, (
                f"the rolling restart did not finish: {len(registered)} registered workers, "
                f"{len(registered & old)} of them old"
            )
            time.sleep(0.02)
        new = registered
        jobs += [app.enqueue(f"{module}.work", len(jobs) + i) for i in range(8)]
        results = [job.result(timeout=30) for job in jobs]
        wait_for(lambda: _children(sup.pid), until=lambda live: live == new,
                 message="the old workers should exit, leaving the new ones")  # fmt: skip
    finally:
        app.close()
    sup.send_signal(signal.SIGTERM)
    assert sup.wait(30) == 0
    assert fewest_registered >= 2, (
        f"capacity dipped to {fewest_registered} registered workers during the rolling restart: "
        "an old worker left before its successor served"
    )
    assert fewest_live >= 2, f"the supervisor's record showed {fewest_live} live of 2"
    assert most_children <= 3, (
        f"{most_children} worker processes at once: the restart should replace one at a time"
    )
    began, ended = _runs(r, namespace, "began"), _runs(r, namespace, "ended")
    numbers = sorted(n for n, _, _ in began)
    assert numbers == list(range(len(jobs))), "each job should begin exactly once"
    assert sorted(n for n, _, _ in ended) == numbers, "each job should end exactly once"
    assert {pid for _, pid, _ in began} <= old | new
    for _, pid, version in began:
        assert version == ("old" if pid in old else "new"), (
            f"pid {pid} ran {version} code: old workers run the old code, new ones the new"
        )
    assert {pid for _, pid, _ in began} & new == new, "each new worker should serve"
    assert results[-8:] == ["new"] * 8, "jobs sent after the restart run the new code"


# A deploy that breaks the code: the app's import fails, or its on_startup hook raises (each
# process that tries notes its pid first). The tests below write it over a working one.
_BROKEN_APP = """
import os

import redis

import drumbeat

_log = redis.Redis.from_url(os.environ["DRUMBEAT_REDIS_URL"])
PREFIX = "test:{" + os.environ["DRUMBEAT_NAMESPACE"] + "}:"
if "@HOW@" == "import":
    _log.rpush(PREFIX + "failed", os.getpid())
    raise ImportError("the new code does not import: a module it needs is missing")
app = drumbeat.App()


@app.on_startup
def open_db() -> None:
    _log.rpush(PREFIX + "failed", os.getpid())
    raise ConnectionRefusedError("the new code's database is not there")


@app.task
async def work(n: int) -> str:
    return "broken"
"""


def _failed(r: redis.Redis, namespace: str) -> list[int]:
    """The pids of the processes that ran the broken code, in order."""
    return [int(pid) for pid in r.lrange(f"test:{{{namespace}}}:failed", 0, -1)]


def _logged(path: Path, text: str) -> list[str]:
    """The lines of the supervisor's log (its stderr and its workers') that contain ``text``."""
    return [line for line in path.read_text(errors="replace").splitlines() if text in line]


def test_a_recycled_worker_serves_on_while_its_successors_fail_to_start(
    redis_url: str,
    namespace: str,
    r: redis.Redis,
    supervise: list[subprocess.Popen[bytes]],
    tmp_path: Path,
) -> None:
    """A deploy without a reload breaks the code on disk; then a worker spends its --max-jobs.
    Its successor fails to import: it is restarted with backoff, the old worker claiming on all
    along; once the successors crash-loop, the recycle is given up (reported), and the old
    worker serves on past its budget: the pool keeps its capacity, the supervisor runs on."""
    module = f"recycled_{namespace.replace('-', '_')}"
    source = tmp_path / f"{module}.py"
    _write_app(source, "old", 0.0)
    log = tmp_path / "supervisor.log"
    sup = _start(supervise, redis_url, namespace, 1, "--max-jobs", "2", app=f"{module}:app",
                 log=log, PYTHONPATH=f"{ROOT}{os.pathsep}{tmp_path}",
                 PYTHONDONTWRITEBYTECODE="1")  # fmt: skip
    (old,) = wait_for(lambda: _registered(r, namespace), until=lambda pids: len(pids) == 1,
                      message="the worker process should register")  # fmt: skip
    source.write_text(_BROKEN_APP.replace("@HOW@", "import"))
    app = drumbeat.App(redis_url, namespace=namespace)
    jobs: list[drumbeat.Job[Any]] = []
    deadline = time.monotonic() + 50  # an old worker was told to retire after 60 s
    try:
        # Jobs flow all along: the first two spend the budget, the rest run on the old worker.
        while not _logged(log, "recycling given up"):
            assert time.monotonic() < deadline, (
                "the successors should be restarted until they crash-loop; "
                f"{_failed(r, namespace)} failed so far"
            )
            assert sup.poll() is None, "the supervisor exited"
            assert _registered(r, namespace) == {old}, "the old worker should serve on"
            if sum(j.status() is not drumbeat.JobStatus.COMPLETE for j in jobs) < 2:
                jobs.append(app.enqueue(f"{module}.work", len(jobs)))
            time.sleep(0.05)
        failed = _failed(r, namespace)
        assert len(failed) == 5, f"a crash loop is 5 quick deaths, got {failed}"
        (line,) = _logged(log, "recycling given up")
        assert f"pid {old} serves on past its budget" in line, line
        assert "exited with 1" in line, line
        assert len(_logged(log, "before it served")) == 4, "each death should be logged"
        assert _children(sup.pid) == {old}, "the failed successors should be gone"
        jobs += [app.enqueue(f"{module}.work", len(jobs) + i) for i in range(4)]
        assert {job.result(timeout=30) for job in jobs} == {"old"}
        assert _registered(r, namespace) == {old}
        sup.send_signal(signal.SIGTERM)
        assert sup.wait(30) == 0, "no worker slot was lost: a graceful stop exits 0"
    finally:
        app.close()


def test_sighup_onto_code_that_fails_to_start_stops_the_roll_and_keeps_the_old_workers(
    redis_url: str,
    namespace: str,
    r: redis.Redis,
    supervise: list[subprocess.Popen[bytes]],
    tmp_path: Path,
) -> None:
    """A deploy whose on_startup hook raises, then SIGHUP: the first new worker dies before it
    serves; the roll stops there (logged with its pid and exit), no old worker is stopped, and
    a fixed deploy with another SIGHUP rolls on."""
    module = f"rollback_{namespace.replace('-', '_')}"
    source = tmp_path / f"{module}.py"
    _write_app(source, "old", 0.0)
    log = tmp_path / "supervisor.log"
    sup = _start(supervise, redis_url, namespace, 2, app=f"{module}:app", log=log,
                 PYTHONPATH=f"{ROOT}{os.pathsep}{tmp_path}",
                 PYTHONDONTWRITEBYTECODE="1")  # fmt: skip
    old = wait_for(lambda: _registered(r, namespace), until=lambda pids: len(pids) == 2,
                   message="two worker processes should register")  # fmt: skip
    source.write_text(_BROKEN_APP.replace("@HOW@", "hook"))
    sup.send_signal(signal.SIGHUP)
    app = drumbeat.App(redis_url, namespace=namespace)
    fewest = 2
    try:
        deadline = time.monotonic() + 60
        while not _logged(log, "rolling restart stopped"):
            assert time.monotonic() < deadline, f"the roll did not stop: {_failed(r, namespace)}"
            assert sup.poll() is None, "the supervisor exited"
            fewest = min(fewest, len(_registered(r, namespace) & old))
            time.sleep(0.05)
        (failed,) = _failed(r, namespace)
        (line,) = _logged(log, "rolling restart stopped")
        assert f"pid {failed} " in line and "exited with 1" in line, line
        assert "2 remaining old workers keep serving" in line, line
        assert fewest == 2, "an old worker was stopped while its successor failed"
        assert _children(sup.pid) == old
        jobs = [app.enqueue(f"{module}.work", n) for n in range(8)]
        assert {job.result(timeout=30) for job in jobs} == {"old"}
        assert _registered(r, namespace) == old
        assert _failed(r, namespace) == [failed], "the roll should not try the next slot"
        _write_app(source, "new", 0.0)  # the fix
        sup.send_signal(signal.SIGHUP)
        new = wait_for(lambda: _registered(r, namespace),
                       until=lambda pids: len(pids) == 2 and not pids & old, timeout=60,
                       message="a SIGHUP after the fix should roll the new code on")  # fmt: skip
        assert app.enqueue(f"{module}.work", 8).result(timeout=30) == "new"
        wait_for(lambda: _children(sup.pid), until=lambda live: live == new,
                 message="the old workers should exit, leaving the new ones")  # fmt: skip
    finally:
        app.close()
    sup.send_signal(signal.SIGTERM)
    assert sup.wait(30) == 0


@pytest.mark.parametrize("how", ["recycle", "sighup"])
def test_a_lowered_ready_wait_gives_up_on_a_silent_successor_after_it_not_after_60_s(
    redis_url: str,
    namespace: str,
    r: redis.Redis,
    supervise: list[subprocess.Popen[bytes]],
    tmp_path: Path,
    *,
    how: str,
) -> None:
    """DRUMBEAT_READY_WAIT=2: the new code's start-up outlasts the test (its worker beats, but
    never says it serves), so the supervisor stops the old worker once ready_wait has passed,
    whether the old one recycles (--max-jobs) or a SIGHUP replaces it. The default (60 s) would
    still be waiting at the deadline."""
    module = f"silent_{how}_{namespace.replace('-', '_')}"
    source = tmp_path / f"{module}.py"
    _write_app(source, "old", 0.0)
    log = tmp_path / "supervisor.log"
    sup = _start(supervise, redis_url, namespace, 1, "--max-jobs", "1", app=f"{module}:app",
                 log=log, PYTHONPATH=f"{ROOT}{os.pathsep}{tmp_path}",
                 PYTHONDONTWRITEBYTECODE="1", DRUMBEAT_READY_WAIT="2",
                 DRUMBEAT_SHUTDOWN_GRACE="1")  # fmt: skip
    (old,) = wait_for(lambda: _registered(r, namespace), until=lambda pids: len(pids) == 1,
                      message="the worker process should register")  # fmt: skip
    _write_app(source, "new", 3600.0)
    app = drumbeat.App(redis_url, namespace=namespace)
    try:
        if how == "recycle":
            assert app.enqueue(f"{module}.work", 0).result(timeout=30) == "old"
        else:
            sup.send_signal(signal.SIGHUP)
        # Well short of the default 60 s, on a loaded machine too.
        wait_for(lambda: _logged(log, "has not said it serves after"), timeout=40,
                 message="the supervisor should give up waiting for the silent successor "
                 "after ready_wait (2 s)")  # fmt: skip
        wait_for(lambda: _children(sup.pid), until=lambda live: len(live) == 1 and old not in live,
                 timeout=40, message="the old worker should be stopped and exit, leaving the "
                 "silent successor")  # fmt: skip
        (line,) = _logged(log, "has not said it serves after")
        assert "DRUMBEAT_READY_WAIT" in line, line
        assert not _registered(r, namespace) - {old}, "the new worker never serves here"
        assert sup.poll() is None, "the supervisor exited"
    finally:
        # No graceful stop: a worker still in its on_startup hook waits that out before it
        # heeds SIGTERM, so the supervisor would kill it only after shutdown_grace + 10 s.
        # The fixture kills both.
        app.close()


def test_a_worker_whose_loop_is_blocked_is_replaced_and_its_job_finishes_on_the_next(
    redis_url: str, namespace: str, r: redis.Redis, supervise: list[subprocess.Popen[bytes]]
) -> None:
    sup = _start(supervise, redis_url, namespace, 1, DRUMBEAT_HANG_TIMEOUT="3")
    wait_for(lambda: _pids(r, namespace, "start"), until=lambda pids: len(pids) == 1,
             message="one worker process should start")  # fmt: skip
    (first,) = _pids(r, namespace, "start")
    app = drumbeat.App(redis_url, namespace=namespace)
    try:
        job = app.enqueue("tests.apps.sup_app.block_once", f"test:{{{namespace}}}:blocked")
        ran_on = job.result(timeout=60)
        assert ran_on != first, "the job should finish on the process that replaced the hung one"
        assert _pids(r, namespace, "start") == {first, ran_on}
        wait_for(lambda: _children(sup.pid), until=lambda live: live == {ran_on},
                 message="the hung worker should be gone, its successor serving")  # fmt: skip
        assert r.get(f"test:{{{namespace}}}:blocked") == str(first).encode()
        sup.send_signal(signal.SIGTERM)
        assert sup.wait(30) == 0
    finally:
        app.close()


def test_a_worker_with_every_task_thread_stuck_past_its_timeout_is_replaced(
    redis_url: str, namespace: str, r: redis.Redis, supervise: list[subprocess.Popen[bytes]]
) -> None:
    # One slot: its task pool has 10 threads (one per priority level, for lending).
    sup = _start(supervise, redis_url, namespace, 1, "--concurrency", "1",
                 DRUMBEAT_HANG_TIMEOUT="3")  # fmt: skip
    wait_for(lambda: _pids(r, namespace, "start"), until=lambda pids: len(pids) == 1,
             message="one worker process should start")  # fmt: skip
    (first,) = _pids(r, namespace, "start")
    app = drumbeat.App(redis_url, namespace=namespace)
    try:
        stuck = [app.enqueue("tests.apps.sup_app.stick") for _ in range(10)]
        for job in stuck:  # each times out, and its thread sleeps on
            with pytest.raises(drumbeat.JobFailed, match="timed out"):
                job.result(timeout=30)
        wait_for(lambda: _pids(r, namespace, "start") - {first}, until=bool,
                 message="a worker with every task thread stuck should be replaced")  # fmt: skip
        (second,) = _pids(r, namespace, "start") - {first}
        wait_for(lambda: _children(sup.pid), until=lambda live: live == {second},
                 message="the wedged worker process should be gone")  # fmt: skip
        assert app.enqueue("tests.apps.sup_app.doze", 0.01).result(timeout=20) == second
        sup.send_signal(signal.SIGTERM)
        assert sup.wait(30) == 0
    finally:
        app.close()


def test_a_busy_healthy_worker_is_not_taken_for_hung(
    redis_url: str, namespace: str, r: redis.Redis, supervise: list[subprocess.Popen[bytes]]
) -> None:
    sup = _start(supervise, redis_url, namespace, 1, "--concurrency", "2",
                 DRUMBEAT_HANG_TIMEOUT="3")  # fmt: skip
    wait_for(lambda: _pids(r, namespace, "start"), until=lambda pids: len(pids) == 1,
             message="one worker process should start")  # fmt: skip
    (first,) = _pids(r, namespace, "start")
    app = drumbeat.App(redis_url, namespace=namespace)
    try:
        # Each runs over three hang_timeouts: one awaiting, one in a thread within its timeout.
        jobs = [
            app.enqueue("tests.apps.sup_app.nap", 10),
            app.enqueue("tests.apps.sup_app.doze", 10),
        ]
        assert [j.result(timeout=60) for j in jobs] == [first, first]
        assert _pids(r, namespace, "start") == {first}, "a healthy worker was replaced"
        sup.send_signal(signal.SIGTERM)
        assert sup.wait(30) == 0
    finally:
        app.close()


def test_ctrl_c_in_a_terminal_stops_the_workers_gracefully(
    redis_url: str, namespace: str, r: redis.Redis, supervise: list[subprocess.Popen[bytes]]
) -> None:
    """A terminal's Ctrl-C signals the whole foreground process group: the supervisor and its
    workers at once. The workers leave it to the supervisor, whose SIGTERM is then their first
    signal (a graceful stop), not their second (a hard stop that hands every job back)."""
    sup = _start(supervise, redis_url, namespace, 1, new_session=True)
    wait_for(lambda: _pids(r, namespace, "start"), until=bool,
             message="the worker process should start")  # fmt: skip
    app = drumbeat.App(redis_url, namespace=namespace)
    try:
        job = app.enqueue("tests.apps.sup_app.nap", 2.0)
        wait_for(job.status, until=lambda s: s == drumbeat.JobStatus.RUNNING,
                 message="the job should start")  # fmt: skip
        os.killpg(sup.pid, signal.SIGINT)  # as Ctrl-C does: the group
        assert sup.wait(30) == 0
        assert job.status() == drumbeat.JobStatus.COMPLETE, (
            f"the running job should finish within the grace, not be handed back: it is "
            f"{job.status()}"
        )
    finally:
        app.close()


def test_a_recycled_worker_finishes_its_long_jobs_past_the_grace(
    redis_url: str, namespace: str, r: redis.Redis, supervise: list[subprocess.Popen[bytes]]
) -> None:
    """Past --max-jobs a worker retires as a scale-down does: it finishes every running job,
    however long, instead of handing back what outlasts `shutdown_grace`."""
    sup = _start(supervise, redis_url, namespace, 1, "--max-jobs", "1",
                 DRUMBEAT_SHUTDOWN_GRACE="0.5")  # fmt: skip
    wait_for(lambda: _pids(r, namespace, "start"), until=bool,
             message="the worker process should start")  # fmt: skip
    app = drumbeat.App(redis_url, namespace=namespace)
    try:
        long = app.enqueue("tests.apps.sup_app.nap", 3.0)
        wait_for(long.status, until=lambda s: s == drumbeat.JobStatus.RUNNING,
                 message="the long job should start")  # fmt: skip
        quick = app.enqueue("tests.apps.sup_app.nap", 0.0)  # its end spends the budget
        recycled = quick.result(timeout=20)
        assert long.result(timeout=30) == recycled, (
            "the long job should finish on the recycled worker, not be handed back to its "
            "successor after the grace"
        )
        sup.send_signal(signal.SIGTERM)
        assert sup.wait(30) == 0
    finally:
        app.close()


# -- the supervisor's bookkeeping, on stand-in processes -----------------------------------------

# A stand-in worker: exits 0 once a file named after its pid appears in STANDIN_DIR.
_STANDIN = (
    "import os, sys, time\n"
    "flag = os.path.join(os.environ['STANDIN_DIR'], str(os.getpid()))\n"
    "deadline = time.monotonic() + 60\n"
    "while not os.path.exists(flag) and time.monotonic() < deadline:\n"
    "    time.sleep(0.02)\n"
    "sys.exit(0)\n"
)


@pytest.fixture
def standins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Supervisor]]:
    monkeypatch.setenv("STANDIN_DIR", str(tmp_path))
    made: list[Supervisor] = []
    yield made
    for sup in made:
        for proc in sup._live():
            proc.kill()
            proc.wait(10)
        for slot in sup.slots:
            if slot.proc is not None:
                slot.proc.wait(10)
        for fd in (sup.pipe.read_fd, sup.pipe.write_fd):
            with contextlib.suppress(OSError):
                os.close(fd)


def _spare(sup: Supervisor) -> subprocess.Popen[bytes]:
    """The one live process the supervisor started outside its slots (a successor)."""
    held = {s.proc for s in sup.slots} | set(sup.retired)
    (spare,) = [p for p in sup._live() if p not in held]
    return spare


def _exit0(tmp_path: Path, proc: subprocess.Popen[bytes]) -> None:
    (tmp_path / str(proc.pid)).touch()
    proc.wait(20)
    assert proc.returncode == 0, f"the stand-in pid {proc.pid} should exit 0: {proc.returncode}"


def test_a_worker_exiting_0_unretired_does_not_take_the_successor_of_one_recycling(
    tmp_path: Path, standins: list[Supervisor]
) -> None:
    """Worker A recycles (asks for a successor, which starts at once, and finishes its jobs);
    meanwhile worker B exits 0 on its own (a task called sys.exit(0)). B's exit is a death: B's
    slot restarts; A's successor waits for A and takes A's slot when A leaves."""
    sup = Supervisor(["-c", _STANDIN], processes=2, shutdown_grace=1.0)
    standins.append(sup)
    assert sup._tend()
    a, b = (slot.proc for slot in sup.slots)
    assert a is not None and b is not None
    os.write(sup.pipe.write_fd, f"retire {a.pid}\n".encode())
    _exit0(tmp_path, b)
    started = set(sup._live())
    assert sup._tend()
    (successor,) = set(sup._live()) - started
    assert sup.slots[0].proc is a, "A is still finishing its jobs in its slot"
    assert sup.slots[1].proc is not successor, (
        "B exited 0 without retiring, and took the successor started for A"
    )
    assert _spare(sup) is successor, "A's successor should still wait for A"
    _exit0(tmp_path, a)
    assert sup._tend()
    assert sup.slots[0].proc is successor, "A's successor should take A's slot when A leaves"
    wait_for(lambda: (sup._tend(), sup.slots[1].proc)[1], until=lambda p: p not in (None, b),
             message="B's slot should restart with a new process")  # fmt: skip
    assert len(sup.pids) == 2


def test_a_successor_whose_slot_is_scaled_away_is_stopped_not_left_running(
    tmp_path: Path, standins: list[Supervisor]
) -> None:
    sup = Supervisor(["-c", _STANDIN], processes=1, shutdown_grace=1.0, maximum=2)
    standins.append(sup)
    sup.scale_to(2)
    assert sup._tend()
    a = sup.slots[1].proc
    assert a is not None
    os.write(sup.pipe.write_fd, f"retire {a.pid}\n".encode())
    assert sup._tend()
    successor = _spare(sup)
    sup.scale_to(1)  # A's slot goes, the newest: nothing is to take its place
    assert successor in sup.retired, "the successor of a slot scaled away was left running"
    wait_for(successor.poll, until=lambda code: code is not None,
             message="the successor of a slot scaled away should be stopped")  # fmt: skip


class _WantsFour:
    """A scaler that asks for 4 processes; a SIGTERM arrives while it decides."""

    def __init__(self) -> None:
        self.sup: Supervisor | None = None
        self.closed_with_live: int | None = None

    def decide(self, live: int, desired: int, retiring: int) -> int:
        assert self.sup is not None
        self.sup._on_signal(signal.SIGTERM, None)
        return 4

    def close(self) -> None:
        assert self.sup is not None
        self.closed_with_live = len(self.sup._live())


def test_no_scaling_decision_once_a_stop_began(
    standins: list[Supervisor], caplog: pytest.LogCaptureFixture
) -> None:
    scaler = _WantsFour()
    sup = Supervisor(["-c", _STANDIN], processes=1, shutdown_grace=1.0, maximum=4, scaler=scaler)
    scaler.sup = sup
    standins.append(sup)
    with caplog.at_level("INFO", logger="drumbeat.supervisor"):
        assert sup.run() == 0
    assert sup.desired == 1, "the supervisor scaled up after SIGTERM"
    assert not [r for r in caplog.records if "scaling" in r.getMessage()]
    assert scaler.closed_with_live == 1, (
        "the scaler should stop looking before the workers are stopped, not after"
    )


def test_a_successor_that_asks_for_its_own_before_it_took_its_slot_gets_one_once_it_has(
    tmp_path: Path, standins: list[Supervisor]
) -> None:
    """Worker A recycles; its successor S spends its own budget before A has left (A finishes
    a long job). S is not a slot's worker yet; it must get a successor once it is: a recycling
    worker waits for the supervisor's word without a deadline, so a dropped ask would keep S
    past its budget for good."""
    sup = Supervisor(["-c", _STANDIN], processes=1, shutdown_grace=1.0)
    standins.append(sup)
    assert sup._tend()
    a = sup.slots[0].proc
    assert a is not None
    os.write(sup.pipe.write_fd, f"retire {a.pid}\n".encode())
    assert sup._tend()
    s = _spare(sup)
    os.write(sup.pipe.write_fd, f"retire {s.pid}\n".encode())
    started = set(sup._live())
    assert sup._tend()
    assert set(sup._live()) == started, "S is not in its slot yet: no successor so early"
    _exit0(tmp_path, a)
    assert sup._tend()
    assert sup.slots[0].proc is s, "S should take A's slot when A leaves"
    assert sup._tend()
    assert _spare(sup) not in (a, s), "S, now a slot's worker, should get its successor"


def test_a_roll_stops_when_a_new_worker_that_took_its_place_unproven_dies_before_it_serves(
    standins: list[Supervisor],
) -> None:
    """New code whose start fails slower than ready_wait (here 0: stand-ins never say they
    serve): the first new worker takes its old one's place unproven, then dies before it
    serves. The roll stops there; the next old worker is not stopped for another such one."""
    sup = Supervisor(["-c", _STANDIN], processes=2, shutdown_grace=1.0, ready_wait=0.0)
    standins.append(sup)
    assert sup._tend()
    old0, old1 = (slot.proc for slot in sup.slots)
    assert old0 is not None and old1 is not None
    sup._on_hup(signal.SIGHUP, None)
    sup.restart.step()  # the roll starts, with a new worker for slot 0
    sup.restart.step()  # silent for ready_wait: it takes slot 0's place, the old one is stopped
    new0 = sup.slots[0].proc
    assert new0 is not None and new0 not in (old0, old1)
    wait_for(old0.poll, until=lambda code: code is not None,
             message="the old worker of slot 0 should be stopped")  # fmt: skip
    new0.kill()  # its start failed
    new0.wait(10)
    for _ in range(3):
        sup.restart.step()
    assert not sup.restart.roll, "the roll should stop"
    assert sup.slots[1].proc is old1 and old1.poll() is None, (
        "the old worker of slot 1 should serve on, not be replaced by another new worker"
    )
