"""A worker as its process's main work (`drumbeat.run_worker`, `drumbeat worker`, the
supervisor's children): its garbage collector tuned for it, run until a signal stops it."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .process import Worker

if TYPE_CHECKING:
    from drumbeat.app import App

    from .recycling import Budget

# A worker makes a few dozen objects a run, and most are still alive (the runs in flight) when
# CPython's young generation fills at its default 700 allocations: each collection traverses
# them, then promotes them to be traversed again. At 10,000 most have died (by their reference
# counts) before the collector looks: the collector was 9 % of a run's instructions in the
# worker, and this cuts a run by about 5 % (`bench.worker_cpu`). Cyclic garbage (a failed task's
# traceback) waits a little longer to be freed.
_GC_YOUNG = 10_000


def tune_gc() -> None:
    """Sets the garbage collector up for a process that runs a worker: what exists at start
    (the app, its modules) is frozen out of every later collection, and the young generation
    is larger. A threshold set higher (or a collector disabled) by the app is kept."""
    gc.collect()
    gc.freeze()
    young, *older = gc.get_threshold()
    if young < _GC_YOUNG:
        gc.set_threshold(_GC_YOUNG, *older)


def run_worker(
    app: App,
    *,
    concurrency: int | None = None,
    budget: Budget | None = None,
    queues: Sequence[str] | None = None,
) -> Worker:
    """Run a worker in this process until SIGTERM/SIGINT (or its `budget` is spent); returns
    it (for its counters). The process is the worker's: its garbage collector is tuned for it
    (`tune_gc`)."""
    worker = Worker(app, concurrency=concurrency, budget=budget, queues=queues)
    tune_gc()

    async def main() -> None:
        worker.install_signal_handlers()
        await worker.run()

    asyncio.run(main())
    return worker
