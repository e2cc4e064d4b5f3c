"""How long the dashboard's pages take with a lot in Redis (issue 14: < 200 ms p95 with
1,000,000 schedules and 100,000 queued jobs).

    python -m bench.dashboard [--schedules 1000000] [--jobs 100000] [--delayed 0] [--requests 50]

A private redis-server on a free port, filled with `App.schedule_many` and `App.enqueue_many`
(pipelined script calls, 10,000 per call; ``--delayed`` jobs more, due over the next two hours,
in `due` among the schedule buckets' markers); the dashboard served by uvicorn in a thread, fetched
over HTTP one request at a time (what a person clicking, or a Prometheus scrape, does), after
two unmeasured requests per path. Prints the command, the CPU and the load, then p50 / p95 /
max per path. Takes /tmp/drumbeat-bench.lock, as bench.core does, so two benchmarks never
load the machine at once.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import httpx
import redis
import uvicorn

import drumbeat
from bench.machine import cpu_model
from drumbeat.dashboard import Guard, create_app

#: What each path shows; ``{job}`` is the id of a queued job.
PATHS = (
    ("/", "Overview (counts, workers, charts)"),
    ("/jobs", "Jobs: running, first page of the best priority"),
    ("/jobs?id={job}", "Jobs: one job looked up, and the lists"),
    ("/jobs?priority=0&after={after}", "Jobs: a page deep in priority 0"),
    ("/jobs?due_after={due_after}", "Jobs: a page of delayed jobs deep in due"),
    ("/schedules", "Schedules: first page, with the total"),
    ("/schedules?prefix=mon:4242", "Schedules: a prefix matching 11 of 1,000,000"),
    ("/schedules?prefix=nomatch", "Schedules: a prefix matching none (first ~125,000 examined)"),
    ("/dead", "Dead letters"),
    ("/api/overview", "JSON of the overview"),
    ("/api/jobs/queued?priority=5", "JSON: a page of queued jobs"),
    ("/api/jobs/delayed", "JSON: the first page of delayed jobs"),
    ("/api/schedules?prefix=mon:1", "JSON: a page of schedules by prefix"),
    ("/metrics", "Prometheus metrics"),
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _redis() -> tuple[subprocess.Popen[bytes], str, str]:
    port, folder = _free_port(), tempfile.mkdtemp(prefix="drumbeat-bench-")
    binary = shutil.which("redis-server") or "redis-server"
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--save", "", "--appendonly", "no", "--dir", folder],
        stdout=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)
    deadline = time.monotonic() + 10
    while True:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    client.close()
    return proc, url, folder


def main() -> None:
    if os.environ.get("DRUMBEAT_BENCH_LOCKED") != "1":  # hold the lock for the whole run
        env = {**os.environ, "DRUMBEAT_BENCH_LOCKED": "1"}
        command = ["flock", LOCK, sys.executable, "-m", "bench.dashboard", *sys.argv[1:]]
        sys.exit(subprocess.call(command, env=env))
    _run()


LOCK = "/tmp/drumbeat-bench.lock"


def _delayed(app: drumbeat.App, n: int) -> str:
    """Enqueues ``n`` jobs due over the next two hours; returns a cursor halfway through `due`
    (its jobs and the buckets' markers): from the first member with the middle one's due time."""
    for i in range(0, n, 10_000):
        app.enqueue_many(
            [
                drumbeat.Prepared("check", [str(j)], {}, drumbeat.Options(delay=60 + j % 7200))
                for j in range(i, min(i + 10_000, n))
            ]
        )
    half = app.redis.zcard(app.keys.due) // 2
    middle = app.redis.zrange(app.keys.due, half, half, withscores=True)
    return f"{int(middle[0][1])}.0" if middle else "0.0"


def _run() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--schedules", type=int, default=1_000_000)
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--delayed", type=int, default=0)
    parser.add_argument("--requests", type=int, default=50)
    args = parser.parse_args()
    print("- command: `python -m bench.dashboard " + " ".join(sys.argv[1:]) + "`")
    print(f"- cpu: {cpu_model()}, {os.cpu_count()} cores; load average at start: "
          f"{os.getloadavg()[0]:.2f} (a shared machine)")  # fmt: skip

    proc, url, folder = _redis()
    app = drumbeat.App(url, namespace="bench")

    @app.task(name="check")
    def check(x: str) -> None: ...

    started = time.monotonic()
    for i in range(0, args.schedules, 10_000):
        upto = min(i + 10_000, args.schedules)
        app.schedule_many(
            [drumbeat.Schedule(f"mon:{j}", check, every=3600, args=("x",)) for j in range(i, upto)]
        )
    queued: list[drumbeat.Job[Any]] = []
    for i in range(0, args.jobs, 10_000):
        queued += app.enqueue_many(
            [
                drumbeat.Prepared("check", [str(j)], {}, drumbeat.Options(priority=j % 10))
                for j in range(i, min(i + 10_000, args.jobs))
            ]
        )
    due_after = _delayed(app, args.delayed)
    job = queued[len(queued) // 2].id if queued else "none"
    level = app.redis.zrange(app.keys.ready, -1, -1, withscores=True)  # the last of priority 0
    after = int(level[0][1]) - 500 if level else 0
    print(f"- {args.schedules:,} schedules, {args.jobs:,} queued jobs and {args.delayed:,} "
          f"delayed jobs written in {time.monotonic() - started:.0f} s")  # fmt: skip

    port = _free_port()
    config = uvicorn.Config(
        create_app(app, Guard(host="127.0.0.1")), host="127.0.0.1", port=port,
        log_level="warning", lifespan="off",
    )  # fmt: skip
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    try:
        print("| path | what | p50 (ms) | p95 (ms) | max (ms) |\n|---|---|---:|---:|---:|")
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
            for template, what in PATHS:
                path = template.format(job=job, after=after, due_after=due_after)
                for _ in range(2):
                    http.get(path).raise_for_status()
                took = []
                for _ in range(args.requests):
                    t = time.perf_counter()
                    http.get(path).raise_for_status()
                    took.append((time.perf_counter() - t) * 1000)
                took.sort()
                p95 = took[max(0, math.ceil(0.95 * len(took)) - 1)]
                print(
                    f"| `{template}` | {what} | {statistics.median(took):.0f} | {p95:.0f} "
                    f"| {took[-1]:.0f} |"
                )
        print(f"\nload average at end: {os.getloadavg()[0]:.2f}")
    finally:
        server.should_exit = True
        thread.join(30)
        app.close()
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
