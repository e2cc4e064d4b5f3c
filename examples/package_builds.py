"""`make demo-builds`: a long low-priority job lends its slot to urgent work at its checkpoints.

A studio uploads a mother package; one job builds its 200 child packages at idle priority,
checkpointing after each child. While it runs, urgent single-child builds arrive at the top
priority. The worker has one slot, so without checkpoints each urgent build would wait for all
200 children; with them it starts at the next checkpoint, and the long job resumes where it was.
Then the worker is stopped mid-way and restarted: the long job is handed back with its progress
and carries on from it. The builds are one batch (docs/workflows.md, batches): the long job and
each urgent build as it arrives are its members, and the publish step runs once, after the last
of them ended, however they were interrupted. A timeline of what ran when is printed; exits 0
when all is done.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

import drumbeat

ROOT = Path(__file__).resolve().parents[1]
app = drumbeat.App(namespace="builds", progress_interval=0.2)
CHILDREN = 200
TIMELINE = "builds:timeline"


def _note(what: str) -> None:
    app.redis.rpush(TIMELINE, f"{time.time():.3f} {what}")


@app.task(name="builds.children", priority=0)
def build_children(root_id: int, child_ids: list[int]) -> int:
    """The long job: resumes from the last child it saved, lends its slot between children."""
    start = drumbeat.current_job().progress or 0
    _note(f"long job starts at child {start} (attempt {drumbeat.current_job().attempt})")
    for i in range(start, len(child_ids)):
        time.sleep(0.02)  # building child package child_ids[i] of root_id
        drumbeat.checkpoint(progress=i + 1)
    _note("long job done")
    return len(child_ids)


@app.task(name="builds.urgent", priority=9)
def build_urgent(child_id: int, enqueued: float) -> float:
    waited = time.time() - enqueued
    _note(f"urgent child {child_id} starts after {waited * 1000:.0f} ms")
    time.sleep(0.02)
    return waited


@app.task(name="builds.publish", priority=5)
def publish(root_id: int) -> None:
    """The batch's callback: runs once every build of the package ended."""
    batch = drumbeat.current_job().batch
    assert batch is not None
    status = batch.status()
    _note(
        f"publish package {root_id}: {status.succeeded} builds succeeded, "
        f"{status.failed + status.cancelled} did not"
    )


def _worker() -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "drumbeat", "worker", "examples.package_builds:app",
         "--concurrency", "1", "--log-level", "warning"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip


def _reset_namespace() -> None:
    r = app.redis
    for key in [*r.scan_iter(match=f"drumbeat:{app.keys.tag}:*", count=1000), TIMELINE]:
        r.delete(key)


def main() -> int:
    console = Console()
    console.print(f"[bold]package builds[/] on the embedded Redis at [cyan]{app.url}[/]")
    _reset_namespace()
    t0 = time.time()
    # Open: urgent builds join it as they arrive; closed once the last one was added.
    batch = app.batch(
        [build_children.prepare(1, list(range(1000, 1000 + CHILDREN)))],
        on_complete=publish.prepare(1),
        open=True,
    )
    long = batch.jobs[0]
    worker = _worker()
    codes: list[int] = []
    try:
        while (long.progress() or 0) < 20:
            time.sleep(0.01)
        urgent = []
        for child in (1017, 1101, 1150):
            urgent += batch.add([build_urgent.prepare(child, time.time())])
            time.sleep(0.3)
        batch.close()
        waits = [job.result(timeout=30) for job in urgent]
        while (long.progress() or 0) < 120:
            time.sleep(0.01)
        _note(f"worker stopped (SIGTERM) at child {long.progress()}")
        worker.send_signal(signal.SIGTERM)
        codes.append(worker.wait(30))
        _note(f"long job handed back with progress {long.progress()}; a new worker starts")
        worker = _worker()
        built = long.result(timeout=60)
        ended = batch.wait(timeout=30)
        assert batch.on_complete is not None
        batch.on_complete.result(timeout=30)
    finally:
        worker.send_signal(signal.SIGTERM)
        codes.append(worker.wait(30))

    table = Table(title="What ran when")
    table.add_column("t (s)", justify="right")
    table.add_column("event")
    for line in app.redis.lrange(TIMELINE, 0, -1):
        at, what = (line.decode() if isinstance(line, bytes) else line).split(" ", 1)
        table.add_row(f"{float(at) - t0:.2f}", what)
    console.print(table)
    console.print(
        f"{built} children built; urgent builds started after "
        + ", ".join(f"{w * 1000:.0f} ms" for w in waits)
        + f" (without checkpoints they would wait for the {CHILDREN} children, about "
        f"{CHILDREN * 0.02:.0f} s); the batch of {ended.total} builds ended, published once; "
        f"worker exit codes {codes}"
    )
    ok = built == CHILDREN and ended.succeeded == ended.total == 4
    return 0 if ok and all(c == 0 for c in codes) else 1


if __name__ == "__main__":
    sys.exit(main())
