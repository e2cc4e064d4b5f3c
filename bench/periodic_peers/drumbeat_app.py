"""The drumbeat app of the periodic benchmark for ``drumbeat worker
bench.periodic_peers.drumbeat_app:app --processes N`` (or ``--autoscale MIN:MAX``): the
supervisor and each worker process import it; the Redis URL and the namespace come from
``DRUMBEAT_REDIS_URL`` and ``DRUMBEAT_NAMESPACE``, the runs directory and the task's sleep from
`RUNS_DIR_ENV` and `SLEEP_ENV` (set by `bench.periodic_peers.drumbeat`). Each worker process
records its runs in a file of its own (`_common.Recorder`), flushed at its shutdown too."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import drumbeat

from ._common import RUNS_DIR_ENV, SLEEP_ENV, Recorder

TASK = "bench.periodic.noop"

app = drumbeat.App()
recorder = Recorder(Path(os.environ.get(RUNS_DIR_ENV, ".")), "worker")
_sleep = float(os.environ.get(SLEEP_ENV) or 0)


@app.task(name=TASK)
async def noop(i: int) -> None:
    due_ms = drumbeat.current_job().due_ms
    recorder.record(i, due_ms / 1000 if due_ms is not None else float("nan"), time.time())
    if _sleep:
        await asyncio.sleep(_sleep)  # I/O standing in for the monitor's HTTP search


@app.on_shutdown
def _flush() -> None:
    recorder.flush()
