"""How long the dashboard's pages take with a lot in Redis (issue 14: < 200 ms p95 with
1,000,000 schedules and 100,000 queued jobs).

    python -m bench.dashboard [--schedules 1000000] [--jobs 100000] [--requests 30]

A private redis-server on a free port; the dashboard served by uvicorn in a thread, fetched
over HTTP one request at a time (what a person clicking, or a Prometheus scrape, does).
"""

from __future__ import annotations

import argparse
import shutil
import socket
import statistics
import subprocess
import tempfile
import threading
import time

import httpx
import redis
import uvicorn

import drumbeat
from drumbeat.dashboard import Guard, create_app

PATHS = ("/", "/dead", "/api/overview", "/api/dead", "/metrics")


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
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--schedules", type=int, default=1_000_000)
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--requests", type=int, default=30)
    args = parser.parse_args()

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
    for i in range(0, args.jobs, 10_000):
        app.enqueue_many(
            [
                drumbeat.Prepared("check", [str(j)], {}, drumbeat.Options(priority=j % 10))
                for j in range(i, min(i + 10_000, args.jobs))
            ]
        )
    print(f"{args.schedules:,} schedules and {args.jobs:,} queued jobs written in "
          f"{time.monotonic() - started:.0f} s")  # fmt: skip

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
        print("| path | p50 (ms) | p95 (ms) | max (ms) |\n|---|---:|---:|---:|")
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
            for path in PATHS:
                took = []
                for _ in range(args.requests):
                    t = time.perf_counter()
                    http.get(path).raise_for_status()
                    took.append((time.perf_counter() - t) * 1000)
                took.sort()
                p95 = took[max(0, round(0.95 * len(took)) - 1)]
                print(f"| {path} | {statistics.median(took):.0f} | {p95:.0f} | {took[-1]:.0f} |")
    finally:
        server.should_exit = True
        thread.join(30)
        app.close()
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
