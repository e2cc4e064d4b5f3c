"""Recycling: a worker past its job or memory budget stops claiming, finishes its jobs (however
long they take: nothing is handed back) and exits, so whatever a long-lived process accumulates
(leaks, stale state) goes with it. Under a supervisor it first asks for its replacement and
goes on claiming until the supervisor says the replacement serves (SIGUSR1), so capacity never
dips: the budget is exceeded by the jobs it claims meanwhile (a replacement's start-up), which
is what Celery's ``--max-tasks-per-child`` and gunicorn's ``--max-requests`` do too (the limit
is checked after work, not before it). While its successors fail to start (new code that does
not import, a failing ``on_startup``) it serves on, past its budget if need be: a recycle
refreshes a process, it must not cost capacity.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
from collections.abc import Callable
from dataclasses import dataclass

from .liveness import SUPERVISOR_HOLDS, SUPERVISOR_READY, tell_supervisor

log = logging.getLogger("drumbeat.worker")


@dataclass(frozen=True, slots=True)
class Budget:
    """When a worker retires: after ``max_jobs`` jobs, or past ``max_memory`` MiB resident."""

    max_jobs: int | None = None
    max_memory: float | None = None

    def __post_init__(self) -> None:
        if self.max_jobs is not None and self.max_jobs < 1:
            raise ValueError(f"max_jobs must be >= 1, got {self.max_jobs}")
        if self.max_memory is not None and self.max_memory <= 0:
            raise ValueError(f"max_memory must be > 0 MiB, got {self.max_memory}")

    @property
    def limited(self) -> bool:
        return self.max_jobs is not None or self.max_memory is not None


def resident_mib() -> float:
    """This process's resident memory now (its peak where /proc is missing)."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class Recycler:
    """Retires the worker once ``budget`` is spent.

    Args:
        handover_wait: a worker that asked for its replacement retires on its own after this
            long if the supervisor has not told it to (SIGUSR1) by then
            (`Settings.handover_deadline`: the supervisor's own wait for a successor to serve,
            `Settings.ready_wait`, plus a margin). Only under an older supervisor: one that sets
            `SUPERVISOR_HOLDS` always tells, and may hold the worker while its successors fail.
    """

    def __init__(
        self,
        budget: Budget,
        done: Callable[[], int],
        retire: Callable[[], None],
        stopping: asyncio.Event,
        *,
        handover_wait: float,
        interval: float = 0.1,
    ) -> None:
        self.budget = budget
        self.done = done
        self.retire = retire
        self.stopping = stopping
        self.interval = interval
        self.handover_wait = handover_wait

    def over(self) -> str | None:
        """Why the worker should retire now, or None."""
        b = self.budget
        if b.max_jobs is not None and self.done() >= b.max_jobs:
            return f"{self.done()} jobs done (--max-jobs {b.max_jobs})"
        if b.max_memory is not None and (mib := resident_mib()) > b.max_memory:
            return f"{mib:.0f} MiB resident (--max-memory {b.max_memory:g})"
        return None

    async def run(self) -> None:
        while not self.stopping.is_set():
            why = self.over()
            if why is not None:
                asked = tell_supervisor("retire")  # "start my replacement now"
                if asked and os.environ.get(SUPERVISOR_READY):
                    # The supervisor sends SIGUSR1 (`retire`) once the replacement serves.
                    log.info("recycling this worker: %s; claiming on until its replacement "
                             "serves, then finishing its jobs and exiting", why)  # fmt: skip
                    holds = bool(os.environ.get(SUPERVISOR_HOLDS))
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(
                            self.stopping.wait(), None if holds else self.handover_wait
                        )
                    if self.stopping.is_set():
                        return
                    log.warning(
                        "recycling: no word from the supervisor %.0f s after asking "
                        "for a replacement; retiring all the same",
                        self.handover_wait,
                    )
                else:
                    log.info("recycling this worker: %s; finishing its jobs, then exiting", why)
                self.retire()
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), self.interval)
