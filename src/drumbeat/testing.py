"""Testing an app that uses drumbeat: run what is queued with a real worker, then return.

The pytest fixtures built on it are in `drumbeat.pytest_plugin` (loaded when drumbeat is
installed); docs/testing.md shows both.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING

from drumbeat.errors import ConfigurationError, NotIdle
from drumbeat.worker.idle import until_idle
from drumbeat.worker.process import Worker

if TYPE_CHECKING:
    from drumbeat.app import App

__all__ = ["NotIdle", "arun_until_idle", "run_until_idle"]

#: Seconds `run_until_idle` waits for the work to end unless told otherwise.
DEFAULT_TIMEOUT = 10.0


async def arun_until_idle(
    app: App,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    concurrency: int | None = None,
    queues: Sequence[str] | None = None,
) -> int:
    """Run a worker of ``app`` on this event loop until it is idle; return how many runs it
    made (each attempt counts: a job that failed once, then succeeded, counts 2; so does an
    attempt that ended without running the task for good, such as a job dead-lettered as
    unreadable or a schedule's run failed past ``max_stalls``).

    The worker is a `drumbeat.Worker`, as ``drumbeat worker`` runs: the same codec, options,
    retries, limits and errors. It is idle when, over the queues it serves, nothing is ready,
    running or parked on a rate or concurrency limit, and no delayed job or retry comes due
    within what is left of ``timeout`` (one due later is left waiting, and not counted).

    Schedules: the runs already due when it is called, and those made due by `App.run_now`
    (before the call or during it, say by a task), are run and waited for, like jobs. A
    periodic schedule is never done (it is due again within any timeout), so its later runs
    are not waited for: one that comes due while other work keeps the worker busy is taken
    and counted, and waited for while it runs. Nor are the jobs of a paused queue
    (`App.pause_queue`): no worker takes them until it is resumed, so they are left waiting
    (and logged at INFO), not waited for; while the default queue is paused, so are the
    schedules' runs.

    Args:
        app: the app whose tasks to run.
        timeout: seconds; past it, `NotIdle` is raised.
        concurrency: the worker's slots (default: the app's settings).
        queues: the queues it serves (default: every queue the app's tasks name).

    Raises:
        NotIdle: work was still pending after ``timeout`` (the message says what); the worker
            stopped at once, and jobs it was running come back when their leases expire.
        WorkerCrashed: the worker itself failed.
    """
    if timeout <= 0:
        raise ConfigurationError(f"timeout must be a number of seconds > 0, got {timeout!r}")
    worker = Worker(app, concurrency=concurrency, queues=queues)
    return await until_idle(worker, wait=None, timeout=timeout)


def run_until_idle(
    app: App,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    concurrency: int | None = None,
    queues: Sequence[str] | None = None,
) -> int:
    """`arun_until_idle` for synchronous code: runs it on an event loop of its own.

    Raises:
        ConfigurationError: called from a running event loop (use `arun_until_idle` there).
        NotIdle: as `arun_until_idle`.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise ConfigurationError(
            "run_until_idle was called inside a running event loop; await "
            "drumbeat.testing.arun_until_idle(app) there instead"
        )
    return asyncio.run(
        arun_until_idle(app, timeout=timeout, concurrency=concurrency, queues=queues)
    )
