"""Recycling: a worker past its job or memory budget stops claiming, finishes its jobs (however
long they take: nothing is handed back) and exits, so whatever a long-lived process accumulates
(leaks, stale state) goes with it. Under a supervisor it first asks for its replacement, so
capacity never dips.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
from collections.abc import Callable
from dataclasses import dataclass

from .liveness import tell_supervisor

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
    def __init__(
        self,
        budget: Budget,
        done: Callable[[], int],
        retire: Callable[[], None],
        stopping: asyncio.Event,
        interval: float = 0.1,
    ) -> None:
        self.budget = budget
        self.done = done
        self.retire = retire
        self.stopping = stopping
        self.interval = interval

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
                log.info("recycling this worker: %s; finishing its jobs, then exiting", why)
                tell_supervisor("retire")  # "start my replacement now"
                self.retire()
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), self.interval)
