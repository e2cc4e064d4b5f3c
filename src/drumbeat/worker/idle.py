"""A worker that stops once nothing is left for it: what `drumbeat.testing.run_until_idle` and
`drumbeat worker --burst` share. `Pending` says what is left; `until_idle` runs a `Worker`
until it is nothing."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from drumbeat import connections
from drumbeat.errors import NotIdle
from drumbeat.keys import DEFAULT_QUEUE

from .hooks import JobEnd, JobInfo
from .main import tune_gc
from .process import Worker
from .recycling import Budget

if TYPE_CHECKING:
    import redis.asyncio as aredis

    from drumbeat.app import App
    from drumbeat.scripts import Scripts

log = logging.getLogger("drumbeat.worker")

#: How often the pending work is read while jobs run (a worker with nothing pending is seen
#: idle after one read). Its own work is seen ended sooner: the worker letting go of its last
#: claim (`ClaimTable.emptied`) ends the wait; the poll is for what it does not hold (other
#: workers' runs, parked jobs, due times). Waiting out the poll instead was 15 ms of the 28 ms
#: a `run_until_idle` of one no-op job took (bench/README.md, issue 32).
POLL = 0.02
#: The most entries `count_pending.lua` reads from each `due`: markers of limiter keys are
#: skipped among them, and a test has far fewer delayed jobs than this.
DUE_READ = 1000

# The ends of a run that count as an attempt: the task ran, or the run ended without it for
# good (dead-lettered unread, or failed past `max_stalls`). A hand-back, a park or a stop ran
# nothing, or will run it again.
_RAN = frozenset({"done", "retry", "dead", "ok", "fail"})


@dataclass(frozen=True, slots=True)
class Pending:
    """The work left for a worker: in Redis over the shards and queues it serves, and in its
    own hands. Of the schedules, the runs due when the worker started, or made due by
    `App.run_now` since, are counted, and any run held (running or retrying); a periodic run
    due later is not waited for (a schedule is never done)."""

    ready: int
    """Jobs (and schedule runs queued as jobs) waiting in `ready`."""
    due: int
    """Delayed jobs and retries backing off that come due within the window asked for."""
    running: int
    """Claims under way: leases held (running, or finished and not settled yet), time-slot
    runs held, and the claims this worker holds."""
    parked: int
    """Jobs waiting for a rate or concurrency limit."""
    next_due: float | None = None
    """Seconds until the first of ``due`` comes due (None: none)."""
    paused: int = 0
    """Jobs of paused queues (`App.pause_queue`): ready, due within the window or parked; and
    the schedule runs due while the default queue is paused. Not pending: no worker takes them
    until their queue is resumed, so waiting for them could only time out."""
    schedule_runs: int = 0
    """Schedule runs waiting in due time slots: those due when the reads began, those made
    due by `App.run_now` since, and those back from a lapsed lease."""

    @property
    def idle(self) -> bool:
        return not (self.ready or self.due or self.running or self.parked or self.schedule_runs)

    def __str__(self) -> str:
        due = f"{self.due} delayed or retrying"
        if self.next_due is not None:
            due += f" (the first due in {self.next_due:.1f} s)"
        text = f"{self.ready} ready, {self.running} running, {due}, {self.parked} parked"
        if self.schedule_runs:
            text += f", {self.schedule_runs} schedule runs due"
        if self.paused:
            text += f" ({self.paused} more wait in paused queues, not counted)"
        return text


@dataclass(slots=True)
class _Shard:
    """One shard `Reader` reads: its scripts, the queues it holds for the worker, and what the
    last read learnt of its time slots."""

    scripts: Scripts
    queues: Sequence[str]
    slotted: bool
    """It holds schedules, and the worker runs them (it serves the default queue)."""
    cutoff: int = -1
    """Redis' ms at the first read: a slot due by it counts whole."""
    slots: Sequence[int] = ()
    """The slots the last reply listed."""


class Reader:
    """Reads what is left for ``worker``: one `count_pending.lua` call per shard it claims
    from (each atomic: a job or a run moving between sets is never missed)."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        jobs = len(worker.app.job_scripts)
        self.shards: list[_Shard] = []
        for i, shard in enumerate(worker.shards):
            # Schedule shards apart from the job shards hold the default queue's runs only.
            queues = worker.queues if i < jobs else [DEFAULT_QUEUE]
            if DEFAULT_QUEUE in queues or i < jobs:
                # Schedules live in the main shard and the schedule shards apart; the lane
                # (there when the worker serves the default queue) runs them.
                slotted = worker.lane is not None and (i == 0 or i >= jobs)
                self.shards.append(_Shard(shard, queues, slotted))

    async def read(self, client: aredis.Redis, window: float) -> Pending:
        """What is left.

        Args:
            client: an asyncio client of the app's Redis.
            window: seconds ahead within which a delayed job or a retry counts as pending.
        """
        window_ms = max(0, round(window * 1000))
        replies: list[list[int]] = []
        for s in self.shards:
            cutoff = s.cutoff if s.slotted else None
            call = s.scripts.count_pending(
                s.queues, window_ms, DUE_READ, cutoff_ms=cutoff, slots=s.slots
            )
            reply = await call.arun(client)
            if s.slotted:
                s.cutoff, s.slots = reply[7], reply[8:]
            replies.append(reply)
        firsts = [r[4] for r in replies if r[4] >= 0]
        return Pending(
            ready=sum(r[0] for r in replies),
            due=sum(r[1] for r in replies),
            # This worker's claims hold leases too (until just after they are settled).
            running=max(sum(r[2] for r in replies), len(self.worker.table)),
            parked=sum(r[3] for r in replies),
            next_due=min(firsts) / 1000 if firsts else None,
            paused=sum(r[5] for r in replies),
            schedule_runs=sum(r[6] for r in replies),
        )


class Runs:
    """Counts a worker's runs through its job hooks: those started (every claim it took) and
    those that ran the task to an outcome."""

    def __init__(self, worker: Worker) -> None:
        self.started = 0
        self.ran = 0
        worker.hooks.before_job.append(self._before)
        worker.hooks.after_job.append(self._after)

    def _before(self, job: JobInfo) -> None:
        self.started += 1

    def _after(self, end: JobEnd) -> None:
        if end.outcome in _RAN:
            self.ran += 1


async def _next_read(
    serving: asyncio.Task[None], emptied: asyncio.Event, poll: float, runs: Runs, started: int
) -> None:
    """Waits until the next read of what is left: ``poll`` seconds, less if the worker stops,
    or lets go of its last claim (`ClaimTable.emptied`) once it has started ``started`` runs in
    all (as many as the last read found waiting). Before that, an empty claim table only means
    it is between two runs of a backlog (at concurrency 1, between every two): a read then
    would find the rest still waiting."""
    loop = asyncio.get_running_loop()
    end = loop.time() + poll
    while (rest := end - loop.time()) > 0:
        letgo = asyncio.ensure_future(emptied.wait())
        await asyncio.wait([serving, letgo], timeout=rest, return_when=asyncio.FIRST_COMPLETED)
        letgo.cancel()
        if serving.done() or (emptied.is_set() and runs.started >= started):
            return
        emptied.clear()


async def until_idle(
    worker: Worker, *, wait: float | None, timeout: float | None, poll: float = POLL
) -> int:
    """Runs ``worker`` on this loop until nothing is pending (`Pending.idle`), then stops it
    and returns the runs that ran their task (each attempt counts).

    Args:
        worker: a worker not yet run.
        wait: seconds ahead within which a delayed job or a retry is waited for; None: up to
            the timeout.
        timeout: seconds until `NotIdle` is raised; None: never.
        poll: seconds between reads while work is pending (and at once when the worker
            lets go of its last claim).

    Raises:
        NotIdle: the timeout passed with work still pending (the worker stopped first).
        WorkerCrashed: the worker itself failed.
    """
    runs = Runs(worker)
    reader = Reader(worker)
    emptied = worker.table.emptied
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    # A client of its own: the app's asyncio client would outlive a loop of `run_until_idle`.
    client = connections.async_client(worker.app.url)
    serving = asyncio.create_task(worker.run(), name="drumbeat-worker")
    try:
        while not serving.done():
            window = wait if wait is not None else max(0.0, (deadline or 0.0) - loop.time())
            before = (runs.started, runs.ran, len(worker.table))
            emptied.clear()  # set during the read: read again at once
            left = await reader.read(client, window)
            # Each shard is read atomically, but not all at once: a run ending between two
            # reads may have moved work into a shard read before. Such a run shows here.
            if left.idle and before == (runs.started, runs.ran, len(worker.table)):
                if left.paused:
                    log.info("idle: %d jobs wait in paused queues", left.paused)
                break
            if deadline is not None and loop.time() >= deadline:
                # At once: a job that hangs must not hold the caller for the shutdown grace.
                worker.stop(hard=True)
                raise NotIdle(
                    f"not idle within {timeout:g} s, still pending: {left}; {runs.ran} runs "
                    "ended meanwhile (the worker stopped; jobs it was running come back "
                    "when their leases expire)"
                )
            waiting = left.ready + left.due + left.parked + left.schedule_runs
            await _next_read(serving, emptied, poll, runs, before[0] + waiting)
    finally:
        worker.stop()
        try:
            await serving  # its crash (`WorkerCrashed`) is raised here
        finally:
            await client.aclose()
    return runs.ran


def run_burst(
    app: App,
    *,
    wait: float = 0.0,
    concurrency: int | None = None,
    budget: Budget | None = None,
    queues: Sequence[str] | None = None,
) -> int:
    """``drumbeat worker --burst``: a worker in this process until it is idle (delayed jobs and
    retries due within ``wait`` seconds waited for) or stopped by SIGTERM/SIGINT; returns the
    runs it made."""
    worker = Worker(app, concurrency=concurrency, budget=budget, queues=queues)
    tune_gc()

    async def main() -> int:
        worker.install_signal_handlers()
        return await until_idle(worker, wait=wait, timeout=None)

    ran = asyncio.run(main())
    log.info("burst: nothing left to run after %d runs; exiting", ran)
    return ran
