"""Issue 31's comparison: a callback after N no-op jobs, in drumbeat, Celery and RQ, in one run.

    python -m bench.workflows --peers              # 10,000 members, 3 runs each, 300 s bound
    python -m bench.workflows --peers --members 500 --runs 1 --bound 60   # a quick look

- drumbeat: ``app.batch([noop.prepare()] * N, on_complete=callback.prepare())`` (one MULTI);
  ``drumbeat worker --processes 2 --concurrency 10`` (2 processes, 10 slots each), async tasks.
- Celery: ``chord([noop.s()] * N)(callback.s())`` with the Redis broker and the Redis result
  backend (its native chord join: a counter per chord, the body sent by the member that ends
  last); ``celery worker`` with its default pool, prefork, ``--concurrency=2`` (2 children, as
  many as cores, Celery's default on this machine), prefetch multiplier 4 (default).
- RQ: ``Queue.enqueue_many`` of the N members (one pipeline), then
  ``Queue.enqueue(callback, depends_on=<the N jobs>)``; 2 ``rq worker -w
  rq.worker.SimpleWorker`` processes (RQ runs one job at a time per worker process; SimpleWorker
  runs it in the worker process, the default worker would fork a work horse per job).

Each run of each system gets a fresh redis-server (the broker, and for Celery the result
backend) and freshly started workers, warmed up by 20 logged tasks; a second redis-server takes
the callback's start time (``time.time()``, one clock for the enqueuer and the workers). The
figure is the time from just before the first enqueue call to the callback's start. Runs
alternate between the systems; a system that does not reach its callback within ``--bound``
seconds is stopped there, reported with the members it had ended, and not run again.

Celery and RQ run in ``bench/.venv-peers`` (``python -m bench.peers_env``, made on demand),
drumbeat in this venv. Writes ``bench/results/workflows-peers-<UTC stamp>.md``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
SYSTEMS = ("drumbeat", "celery", "rq")
WARM = 20
"""Warm-up tasks run (and waited for) before the timed enqueue."""
RESULT_PREFIX = "RESULT "

SETTINGS = {
    "drumbeat": (
        "`drumbeat worker bench.workflows_peers_apps:app --processes 2 --concurrency 10` "
        "(a supervisor and 2 worker processes of 10 slots), async no-op tasks; "
        "`app.batch(members, on_complete=callback.prepare())`"
    ),
    "celery": (
        "`celery worker --pool=prefork --concurrency=2` (the default pool: a consumer and 2 "
        "forked children), prefetch multiplier 4, Redis broker and Redis result backend "
        "(defaults otherwise); `chord(header)(callback.s())`"
    ),
    "rq": (
        "2 processes of `rq worker -w rq.worker.SimpleWorker default` (one job at a time "
        "each); `Queue.enqueue_many(members)` then `Queue.enqueue(callback, "
        "depends_on=members)`"
    ),
}


# ---------------------------------------------------------------- one run (in the system's venv)


def _worker_argv(system: str, url: str) -> list[list[str]]:
    py = sys.executable
    if system == "drumbeat":
        return [[py, "-m", "drumbeat", "worker", "bench.workflows_peers_apps:app",
                 "--processes", "2", "--concurrency", "10", "--log-level", "warning"]]  # fmt: skip
    if system == "celery":
        return [[py, "-m", "celery", "-A", "bench.workflows_peers_apps:celery_app", "worker",
                 "--pool=prefork", "--concurrency=2", "--loglevel=WARNING"]]  # fmt: skip
    rq = str(Path(py).parent / "rq")
    return [[rq, "worker", "-u", url, "-w", "rq.worker.SimpleWorker", "--quiet", "default"]] * 2


def _enqueue_warm(system: str, apps: Any, url: str) -> None:
    if system == "drumbeat":
        apps.app.enqueue_many([apps.d_warm.prepare() for _ in range(WARM)])
    elif system == "celery":
        for _ in range(WARM):
            apps.c_warm.apply_async(ignore_result=True)
    else:
        import redis
        from rq import Queue

        q = Queue("default", connection=redis.Redis.from_url(url))
        for _ in range(WARM):
            q.enqueue(apps.warm, result_ttl=0)


def _warm_up(
    system: str, apps: Any, url: str, lc: Any, *, procs: list[Any], logs: list[Path]
) -> None:
    """Rounds of WARM logged tasks until each worker process ran some (or 5 rounds ran)."""
    want = 2  # worker processes running tasks, for every system here
    deadline = time.monotonic() + 120
    for round_ in range(1, 6):
        _enqueue_warm(system, apps, url)
        while lc.llen("warm") < WARM * round_:
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                tails = [p.read_text()[-2000:] for p in logs if p.exists()]
                raise RuntimeError(f"{system}: workers not warm in 120 s:\n" + "\n".join(tails))
            time.sleep(0.05)
        if len(set(lc.lrange("warm", 0, -1))) >= want:
            return


def _enqueue(system: str, apps: Any, url: str, n: int) -> Any:
    """The timed part's enqueue; returns what `_reached` needs."""
    if system == "drumbeat":
        return apps.app.batch(
            [apps.d_noop.prepare() for _ in range(n)], on_complete=apps.d_callback.prepare()
        )
    if system == "celery":
        from celery import chord

        return chord(apps.c_noop.s() for _ in range(n))(apps.c_callback.s())
    import redis
    from rq import Queue

    q = Queue("default", connection=redis.Redis.from_url(url))
    members = q.enqueue_many([Queue.prepare_data(apps.noop) for _ in range(n)])
    return q.enqueue(apps.callback, depends_on=members)


def _send(sent: dict[str, Any], system: str, apps: Any, url: str, *, n: int, t0: float) -> None:
    """`_enqueue` in a thread of its own; what it sent, its time or its error go in ``sent``."""
    try:
        sent["handle"] = _enqueue(system, apps, url, n)
        sent["enqueue_s"] = time.time() - t0
    except Exception as exc:
        sent["error"] = exc


def _reached(system: str, handle: Any, url: str, n: int) -> int | None:
    """Members ended so far (read from the system's own records, the members log nothing;
    the callback's own record, once it ran, is not counted)."""
    if system == "drumbeat":
        if handle is None:
            return None  # its one MULTI had not returned
        status = handle.status()
        return min(n, int(status.succeeded + status.failed))
    if system == "celery":
        import redis

        with redis.Redis.from_url(url) as r:
            return min(n, sum(1 for _ in r.scan_iter("celery-task-meta-*", count=1000)))
    import redis
    from rq import Queue

    q = Queue("default", connection=redis.Redis.from_url(url))
    return min(n, int(q.finished_job_registry.count + q.failed_job_registry.count))


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    for p in procs:
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def run_one(system: str, n: int, bound: float) -> dict[str, Any]:
    """One run: fresh servers, workers started and warmed up, N members and a callback."""
    import redis

    from bench._redis import RedisServer

    with RedisServer() as broker, RedisServer() as log, tempfile.TemporaryDirectory() as tmp:
        env = {"BENCH_PEER": system, "BENCH_BROKER_URL": broker.url,
               "BENCH_LOG_URL": log.url, "PYTHONPATH": _pythonpath()}  # fmt: skip
        os.environ.update(env)
        apps = importlib.import_module("bench.workflows_peers_apps")
        logs = [Path(tmp) / f"worker{i}.log" for i in range(3)]
        procs = []
        for argv, path in zip(_worker_argv(system, broker.url), logs, strict=False):
            with path.open("wb") as out:
                procs.append(subprocess.Popen(argv, env={**os.environ, **env}, cwd=REPO,
                                              start_new_session=True, stdout=out,
                                              stderr=subprocess.STDOUT))  # fmt: skip
        lc = redis.Redis.from_url(log.url)
        result: dict[str, Any] = {"system": system, "members": n, "bound_s": bound}
        try:
            _warm_up(system, apps, broker.url, lc, procs=procs, logs=logs)
            result["warm_pids"] = len(set(lc.lrange("warm", 0, -1)))
            sent: dict[str, Any] = {}
            t0 = time.time()
            # the enqueue in a thread: RQ's can outlast the bound itself
            thread = threading.Thread(target=_send, args=(sent, system, apps, broker.url),
                                      kwargs={"n": n, "t0": t0}, daemon=True)  # fmt: skip
            thread.start()
            got = None
            while got is None and time.time() - t0 < bound and "error" not in sent:
                # short BLPOPs: redis-py 8 reads with a socket timeout of its own
                got = lc.blpop(["callback"], timeout=1)
            if "error" in sent:
                raise sent["error"]
            if got is not None:  # RQ's enqueue call may return just after its callback started
                thread.join(30)
            result["enqueue_s"] = sent.get("enqueue_s")  # None: still enqueueing at the bound
            if got is not None:
                result["finished"] = True
                result["seconds"] = float(got[1]) - t0
                time.sleep(1.0)  # a second callback, if any, would show here
                result["callbacks"] = 1 + int(lc.llen("callback"))
            else:  # stopped at the bound (an enqueue still running is left to its thread)
                result["finished"] = False
                result["seconds"] = time.time() - t0
                result["callbacks"] = 0
            result["reached"] = _reached(system, sent.get("handle"), broker.url, n)
        finally:
            lc.close()
            _stop(procs)
    return result


# ---------------------------------------------------------------- pure helpers (unit-tested)


def parse_result(stdout: str) -> dict[str, Any]:
    """The result a `--one` child printed (its last ``RESULT {json}`` line)."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            parsed = json.loads(line[len(RESULT_PREFIX) :])
            if not isinstance(parsed, dict):
                raise ValueError(f"not a result object: {line!r}")
            return parsed
    raise ValueError("no RESULT line in the child's output")


def _enqueue_times(rows: list[dict[str, Any]]) -> list[float]:
    return [float(r["enqueue_s"]) for r in rows if r.get("enqueue_s") is not None]


def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per system: its finished runs' seconds, their median, and whether every run finished;
    a ratio to drumbeat's median (peer / drumbeat) where both finished."""
    out: dict[str, dict[str, Any]] = {}
    for system, rows in runs.items():
        done = [float(r["seconds"]) for r in rows if r.get("finished")]
        all_done = bool(rows) and len(done) == len(rows)
        out[system] = {
            "seconds": done,
            "median": statistics.median(done) if all_done else None,
            "finished": all_done,
            "unfinished": [r for r in rows if not r.get("finished")],
            "enqueue": statistics.median(enq) if (enq := _enqueue_times(rows)) else None,
        }
    base = out.get("drumbeat", {}).get("median")
    for row in out.values():
        row["ratio"] = row["median"] / base if base and row["median"] is not None else None
    return out


def _run_note(row: dict[str, Any]) -> str:
    enq = row.get("enqueue_s")
    reached = row.get("reached")
    return ", ".join([
        f"enqueue {enq:.2f} s" if enq is not None else "its enqueue call had not returned",
        f"{reached:,} members ended" if reached is not None else "members ended unknown",
        f"callbacks {row.get('callbacks')}, warm pids {row.get('warm_pids')}",
    ])  # fmt: skip


def format_table(summary: dict[str, dict[str, Any]], n: int, bound: float) -> str:
    lines = [
        f"{n:,} no-op members, first enqueue -> callback start (median of the runs)",
        f"{'system':10}{'median':>10}  {'runs (s)':26}{'enqueue':>10}  vs drumbeat",
    ]
    for system, row in summary.items():
        runs = ", ".join(f"{s:.2f}" for s in row["seconds"])
        enq = f"{row['enqueue']:.2f} s" if row["enqueue"] is not None else "-"
        if row["finished"]:
            ratio = f"{row['ratio']:.1f}x slower" if system != "drumbeat" else "1.0x"
            if system != "drumbeat" and row["ratio"] is not None and row["ratio"] < 1:
                ratio = f"{1 / row['ratio']:.1f}x faster"
            lines.append(f"{system:10}{row['median']:>8.2f} s  {runs:26}{enq:>10}  {ratio}")
            continue
        miss = row["unfinished"][0] if row["unfinished"] else {}
        reached = miss.get("reached")
        what = f"{reached:,} of {n:,} members ended" if reached is not None else "?"
        base = summary.get("drumbeat", {}).get("median")
        ratio = f"> {bound / base:.0f}x slower" if base else "-"
        enq = enq if row["enqueue"] is not None else "unreturned"
        lines.append(
            f"{system:10}{'> ' + format(bound, '.0f') + ' s':>10}  {'-':26}{enq:>10}  {ratio}; "
            f"not finished: {what} at the bound"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------- the whole comparison


def _pythonpath() -> str:
    """The repo, after a snapshot of drumbeat's ``src`` at HEAD if `compare` made one."""
    return os.pathsep.join(p for p in (os.environ.get("BENCH_DRUMBEAT_SRC"), str(REPO)) if p)


def _snapshot_src(into: str) -> str | None:
    """Others edit src/ in this working tree meanwhile: when it differs from HEAD, the drumbeat
    measured is HEAD's (``git archive HEAD src``, first on PYTHONPATH); returns its path."""
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "src"], cwd=REPO,
                           capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    if not dirty:
        return None
    archive = subprocess.run(["git", "archive", "HEAD", "src"], cwd=REPO, capture_output=True,
                             check=True).stdout  # fmt: skip
    subprocess.run(["tar", "-x", "-C", into], input=archive, check=True)
    return str(Path(into) / "src")


def _child(system: str, n: int, bound: float) -> dict[str, Any]:
    if system == "drumbeat":
        python = sys.executable
    else:
        from bench.peers_env import peers_python

        python = str(peers_python())
    argv = [python, "-m", "bench.workflows_peers", "--one", system, "--members", str(n),
            "--bound", str(bound)]  # fmt: skip
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, check=False,
                          env={**os.environ, "PYTHONPATH": _pythonpath()},
                          timeout=bound + 300)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"{shlex.join(argv)} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return parse_result(done.stdout)


def _versions() -> str:
    from importlib.metadata import version

    from bench.peers_env import peers_python

    code = (
        "from importlib.metadata import version as v; "
        "print(', '.join(f'{p} {v(p)}' for p in ('celery', 'kombu', 'rq', 'redis')))"
    )
    peers = subprocess.run([str(peers_python()), "-c", code], capture_output=True, text=True,
                           check=True).stdout.strip()  # fmt: skip
    return f"drumbeat {version('drumbeat')} (redis-py {version('redis')}); peers venv: {peers}"


def compare(command: str, n: int, runs: int, bound: float, systems: Sequence[str]) -> int:
    from bench._redis import RedisServer
    from bench.core import _git_revision, bench_lock
    from bench.machine import cpu_model

    with RedisServer() as probe:
        redis_version = probe.info()["version"]
    snapshot_dir = tempfile.TemporaryDirectory(prefix="wfpeers-src-")
    src = _snapshot_src(snapshot_dir.name)
    if src:
        os.environ["BENCH_DRUMBEAT_SRC"] = src
    drumbeat_src = (
        "drumbeat's src/ as committed at that revision (the working tree's had uncommitted edits)"
        if src
        else "drumbeat's src/ clean at that revision"
    )
    head = [
        f"$ {command}",
        f"CPU: {cpu_model()}, {os.cpu_count()} cores; git {_git_revision()}; "
        f"Python {sys.version.split()[0]}; Redis {redis_version}",
        f"{_versions()}; {drumbeat_src}",
    ]
    print("\n".join(head), flush=True)
    results: dict[str, list[dict[str, Any]]] = {s: [] for s in systems}
    with bench_lock(True):
        load = os.getloadavg()
        print(f"load average at start {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}", flush=True)
        for i in range(runs):
            for system in systems:
                if any(not r.get("finished") for r in results[system]):
                    continue  # stopped at the bound once: not run again
                row = _child(system, n, bound)
                results[system].append(row)
                state = f"{row['seconds']:.2f} s" if row["finished"] else "not finished"
                print(f"  run {i + 1} {system}: {state}, {_run_note(row)}", flush=True)
        end = os.getloadavg()
    summary = summarize(results)
    table = format_table(summary, n, bound)
    tail = f"load average at end {end[0]:.2f} {end[1]:.2f} {end[2]:.2f}"
    print(f"\n{table}\n{tail}")
    RESULTS.mkdir(exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out = RESULTS / f"workflows-peers-{stamp}.md"
    settings = "\n".join(f"- {s}: {SETTINGS[s]}" for s in systems)
    per_run = "\n".join(f"- {json.dumps(r)}" for s in systems for r in results[s])
    out.write_text(
        f"# Batch callback vs Celery chord vs RQ depends_on ({stamp})\n\n"
        f"- command: `{command}`\n- {head[1]}\n- {head[2]}\n"
        f"- load average at start {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; {tail}\n\n"
        f"## Settings\n\n{settings}\n\n## Result\n\n```\n{table}\n```\n\n"
        f"## Runs\n\n{per_run}\n"
    )
    print(f"written: {out.relative_to(REPO)}")
    snapshot_dir.cleanup()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--one", choices=SYSTEMS, help=argparse.SUPPRESS)
    parser.add_argument("--members", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--bound", type=float, default=300.0)
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    args = parser.parse_args(argv)
    if args.one:
        print(RESULT_PREFIX + json.dumps(run_one(args.one, args.members, args.bound)), flush=True)
        return 0
    systems = [s for s in args.systems.split(",") if s]
    unknown = sorted(set(systems) - set(SYSTEMS))
    if unknown:
        parser.error(f"unknown systems {unknown}")
    command = shlex.join(["python", "-m", "bench.workflows", "--peers", *argv])
    return compare(command, args.members, args.runs, args.bound, systems)


if __name__ == "__main__":
    raise SystemExit(main())
