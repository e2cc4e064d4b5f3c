"""Checkpoints, measured: what `drumbeat.checkpoint()` costs when nothing waits, and how soon
urgent jobs start behind long ones when the long ones checkpoint, side by side with the same
long jobs without checkpoints (the baseline: urgent work waits for a free slot).

    python -m bench.checkpoints                  # both parts, 3 repetitions
    python -m bench.checkpoints --quick          # one short repetition (CI)

"Urgent behind long jobs": one worker process with 4 slots, each busy with a long job
(priority 0, 400 units of 10 ms, a checkpoint after each unit, or none in the baseline); 100
urgent jobs (priority 9) enqueued one at a time at 20/s. Reported: enqueue->start p50/p99 of
the urgent jobs, and the long jobs' total time (first start to last end).

"Cost": one job calls `checkpoint()` N times with nothing waiting (ns per call, beside an
empty function call), and a job of 1,000 units of 1 ms of busy work with and without a
checkpoint after each unit (the extra time, %), interleaved, median of the repetitions.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import redis

from bench._redis import RedisServer
from bench.machine import cpu_model

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
NAMESPACE = "ckpt"


# -- the tasks (imported by the worker process as bench.checkpoints) --------------------------


def _app() -> Any:
    import drumbeat

    return drumbeat.App(
        os.environ["DRUMBEAT_REDIS_URL"], namespace=NAMESPACE, progress_interval=1.0
    )


if os.environ.get("DRUMBEAT_BENCH_WORKER"):
    import drumbeat

    app = _app()
    _log = redis.Redis.from_url(os.environ["DRUMBEAT_REDIS_URL"])

    def _busy(seconds: float) -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass

    @app.task(name="long", priority=0)
    def long(units: int, unit_s: float, checkpoints: bool) -> None:
        start = drumbeat.current_job().progress or 0
        _log.rpush("long", json.dumps(["start", time.time()]))
        for i in range(start, units):
            time.sleep(unit_s)
            if checkpoints:
                drumbeat.checkpoint(progress=i + 1)
        _log.rpush("long", json.dumps(["end", time.time()]))

    @app.task(name="urgent", priority=9)
    def urgent(enqueued: float) -> None:
        _log.rpush("urgent", time.time() - enqueued)

    @app.task(name="cost")
    def cost(n: int) -> dict[str, float]:
        def empty(progress: Any = None) -> None:
            pass

        t0 = time.perf_counter()
        for _ in range(n):
            empty()
        t1 = time.perf_counter()
        for _ in range(n):
            drumbeat.checkpoint()
        t2 = time.perf_counter()
        return {"empty_ns": (t1 - t0) / n * 1e9, "checkpoint_ns": (t2 - t1) / n * 1e9}

    @app.task(name="units")
    def units(n: int, unit_s: float, checkpoints: bool) -> float:
        t0 = time.perf_counter()
        for i in range(n):
            _busy(unit_s)
            if checkpoints:
                drumbeat.checkpoint(progress=i + 1)
        return time.perf_counter() - t0


# -- the driver -------------------------------------------------------------------------------


def _worker(url: str, concurrency: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "DRUMBEAT_REDIS_URL": url, "DRUMBEAT_BENCH_WORKER": "1"}
    code = (
        "import drumbeat, bench.checkpoints as b; "
        f"drumbeat.run_worker(b.app, concurrency={concurrency})"
    )
    return subprocess.Popen([sys.executable, "-c", code], env=env, cwd=REPO)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def urgent_behind_long(url: str, checkpoints: bool, units: int, n_urgent: int) -> dict[str, Any]:
    import drumbeat
    from drumbeat.task import Options, Prepared

    client = redis.Redis.from_url(url)
    client.flushall()
    app = drumbeat.App(url, namespace=NAMESPACE)
    worker = _worker(url, 4)
    try:
        jobs = [app.enqueue("long", units, 0.01, checkpoints) for _ in range(4)]
        deadline = time.monotonic() + 30
        while client.llen("long") < 4:  # every slot busy with a long job
            if time.monotonic() > deadline:
                raise RuntimeError("the long jobs did not start")
            time.sleep(0.01)
        t0 = time.monotonic()
        for i in range(n_urgent):  # one at a time at 20/s
            urgent = Prepared("urgent", [time.time()], {}, Options(priority=9))
            app.enqueue_many([urgent])
            time.sleep(max(0.0, t0 + (i + 1) / 20 - time.monotonic()))
        for job in jobs:
            job.result(timeout=300)
        deadline = time.monotonic() + 60
        while client.llen("urgent") < n_urgent and time.monotonic() < deadline:
            time.sleep(0.01)
        waits = [float(x) * 1000 for x in client.lrange("urgent", 0, -1)]
        marks = [json.loads(x) for x in client.lrange("long", 0, -1)]
        starts = [t for kind, t in marks if kind == "start"]
        ends = [t for kind, t in marks if kind == "end"]
        return {
            "urgent_p50_ms": _pct(waits, 50),
            "urgent_p99_ms": _pct(waits, 99),
            "urgent_max_ms": max(waits),
            "long_total_s": max(ends) - min(starts),
        }
    finally:
        _stop(worker)
        app.close()
        client.close()


def cost(url: str, n_calls: int, n_units: int, repeat: int) -> dict[str, Any]:
    import drumbeat

    redis.Redis.from_url(url).flushall()
    app = drumbeat.App(url, namespace=NAMESPACE)
    worker = _worker(url, 1)
    try:
        calls = [app.enqueue("cost", n_calls).result(timeout=120) for _ in range(repeat)]
        with_, without = [], []
        for _ in range(repeat):  # interleaved, so drift on the machine hits both alike
            without.append(app.enqueue("units", n_units, 0.001, False).result(timeout=120))
            with_.append(app.enqueue("units", n_units, 0.001, True).result(timeout=120))
        m_with, m_without = statistics.median(with_), statistics.median(without)
        return {
            "checkpoint_ns": statistics.median(c["checkpoint_ns"] for c in calls),
            "empty_call_ns": statistics.median(c["empty_ns"] for c in calls),
            "job_with_s": m_with,
            "job_without_s": m_without,
            "extra_pct": (m_with - m_without) / m_without * 100,
        }
    finally:
        _stop(worker)
        app.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one short repetition (CI)")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    repeat = 1 if args.quick else args.repeat
    units, n_urgent = (100, 20) if args.quick else (400, 100)
    command = "python -m bench.checkpoints" + (" --quick" if args.quick else "")
    print(f"$ {command}\n  CPU: {cpu_model()}, {os.cpu_count()} cores")
    load_start = os.getloadavg()
    with RedisServer() as server:
        rows: dict[str, list[dict[str, Any]]] = {"checkpoints": [], "no checkpoints": []}
        for _ in range(repeat):
            for mode, flag in (("checkpoints", True), ("no checkpoints", False)):
                rows[mode].append(urgent_behind_long(server.url, flag, units, n_urgent))
        costs = cost(server.url, 200_000 if args.quick else 1_000_000, 1000, repeat)
    load = " ".join(f"{x:.2f}" for x in load_start)
    load_end = " ".join(f"{x:.2f}" for x in os.getloadavg())
    medians = {
        mode: {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        for mode, runs in rows.items()
    }
    lines = [
        f"# Checkpoints ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})",
        "",
        f"- command: `{command}`",
        f"- median of {repeat} repetition(s)",
        f"- CPU: {cpu_model()}, {os.cpu_count()} cores",
        f"- load average (1/5/15 min): {load} at start, {load_end} at end (other work on "
        "the 2 cores shows up here)",
        "",
        f"## Urgent behind long jobs (4 slots, 4 x {units} units of 10 ms, "
        f"{n_urgent} urgent at 20/s)",
        "",
        "| long jobs | urgent start p50 | p99 | max | long jobs' total |",
        "|---|---:|---:|---:|---:|",
    ]
    for mode, m in medians.items():
        lines.append(
            f"| {mode} | {m['urgent_p50_ms']:.1f} ms | {m['urgent_p99_ms']:.1f} ms | "
            f"{m['urgent_max_ms']:.1f} ms | {m['long_total_s']:.2f} s |"
        )
    ratio = medians["no checkpoints"]["urgent_p99_ms"] / medians["checkpoints"]["urgent_p99_ms"]
    lines += [
        "",
        f"Urgent p99 without checkpoints / with: **{ratio:.0f}x**.",
        "",
        "## Cost with nothing waiting",
        "",
        f"- `checkpoint()`: {costs['checkpoint_ns']:.0f} ns per call "
        f"(an empty function call: {costs['empty_call_ns']:.0f} ns)",
        f"- a job of 1,000 x 1 ms units: {costs['job_without_s'] * 1000:.1f} ms without, "
        f"{costs['job_with_s'] * 1000:.1f} ms with a checkpoint per unit: "
        f"**{costs['extra_pct']:+.2f} %**",
    ]
    report = "\n".join(lines) + "\n"
    print(report)
    if not args.quick:
        RESULTS.mkdir(exist_ok=True)
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        (RESULTS / f"checkpoints-{stamp}.md").write_text(report)


if __name__ == "__main__":
    main()
