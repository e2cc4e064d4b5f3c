"""`make demo-priorities`: jobs of several priorities on the embedded Redis, run by a worker
process.

The producer enqueues low-priority jobs first and urgent ones last, then starts a worker
(`drumbeat worker examples.demo:app`) in a separate process. The urgent jobs still run first,
a flaky task succeeds on its retry, and a summary is printed. Exits 0 when every job is done.
"""

from __future__ import annotations

import asyncio
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

import drumbeat

ROOT = Path(__file__).resolve().parents[1]
app = drumbeat.App(namespace="demo")


@app.task(name="demo.resize")
async def resize(image: int) -> dict[str, float]:
    """Async work: runs on the worker's event loop."""
    started = time.time()
    await asyncio.sleep(0.01)
    return {"started": started}


@app.task(name="demo.build", priority=0)
def build(package: int) -> dict[str, float]:
    """Plain function: runs in the worker's thread pool."""
    started = time.time()
    time.sleep(0.005)
    return {"started": started}


@app.task(name="demo.flaky", retries=2, backoff=0.05)
def flaky(n: int) -> dict[str, float]:
    started = time.time()
    if drumbeat.current_job().attempt == 1:
        raise ConnectionError("upstream hiccup (fails on the first attempt only)")
    return {"started": started}


def _reset_namespace() -> None:
    r = app.redis
    for key in r.scan_iter(match=f"drumbeat:{app.keys.tag}:*", count=1000):
        r.delete(key)


def main() -> int:
    console = Console()
    console.print(f"[bold]drumbeat demo[/] on the embedded Redis at [cyan]{app.url}[/]")
    _reset_namespace()

    plan = [build.options(priority=0).prepare(i) for i in range(300)]
    plan += [resize.options(priority=5).prepare(i) for i in range(100)]
    plan += [flaky.options(priority=5).prepare(i) for i in range(20)]
    urgent = [resize.options(priority=9).prepare(i) for i in range(30)]
    enqueued_at = time.time()
    jobs = app.enqueue_many(plan)
    jobs += app.enqueue_many(urgent)  # last in, yet first out
    console.print(f"enqueued {len(jobs)} jobs ({len(urgent)} urgent ones last) "
                  f"in {1000 * (time.time() - enqueued_at):.0f} ms")  # fmt: skip

    worker = subprocess.Popen(
        [sys.executable, "-m", "drumbeat", "worker", "examples.demo:app", "--concurrency", "8"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    try:
        results = [job.result(timeout=120) for job in jobs]
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(30)

    priorities = [0] * 300 + [5] * 120 + [9] * 30
    kinds = ["build"] * 300 + ["resize"] * 100 + ["flaky"] * 20 + ["resize"] * 30
    order = sorted(range(len(results)), key=lambda i: results[i]["started"])
    rank = {i: n for n, i in enumerate(order)}
    table = Table(title="What ran when")
    for col in ("priority", "jobs", "kinds", "first start (rank)", "median start (rank)"):
        table.add_column(col, justify="right")
    for prio in (9, 5, 0):
        idx = [i for i, p in enumerate(priorities) if p == prio]
        ranks = sorted(rank[i] for i in idx)
        table.add_row(str(prio), str(len(idx)), ", ".join(sorted({kinds[i] for i in idx})),
                      str(ranks[0]), str(int(statistics.median(ranks))))  # fmt: skip
    console.print(table)
    retried = sum(1 for k in kinds if k == "flaky")
    elapsed = max(r["started"] for r in results) - enqueued_at
    console.print(
        f"all {len(results)} jobs complete in {elapsed:.2f} s; {retried} flaky jobs succeeded "
        f"on their retry; worker exit code {worker.returncode}"
    )
    return 0 if worker.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
