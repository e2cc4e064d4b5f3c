"""Running claimed jobs: each as an asyncio task, seen through to an outcome for the settler,
with the hooks around it; and what a run must stop for (a lease taken over, a cancel).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from drumbeat.outcomes import (
    Again,
    Bury,
    Cancelled,
    Done,
    HandBack,
    Outcome,
    Parked,
    Queued,
    RunDone,
    Unknown,
)
from drumbeat.replies import Claimed
from drumbeat.runner import Runner

from .claims import Claim, ClaimKey, ClaimTable
from .hooks import Hooks, JobEnd, JobInfo
from .settling import Settler

if TYPE_CHECKING:
    from .checkpoints import Control

log = logging.getLogger("drumbeat.worker")

_END_NAMES: dict[type[Outcome], str] = {
    Done: "done", Again: "retry", Bury: "dead", Cancelled: "cancelled", HandBack: "handback",
    Unknown: "handback", Parked: "limited", Queued: "queued",
}  # fmt: skip


def _end_name(outcome: Outcome) -> str:
    return outcome.outcome if isinstance(outcome, RunDone) else _END_NAMES[type(outcome)]


def _end_error(outcome: Outcome | None) -> str:
    if isinstance(outcome, Again | RunDone):
        return outcome.error
    return outcome.reason if isinstance(outcome, Bury) else ""


class Runs:
    """Starts claimed jobs and sees each to its end. Whatever happens, a claim ends settled,
    handed back at shutdown, or released to its lease: never held forever."""

    def __init__(self, table: ClaimTable, runner: Runner, settler: Settler, hooks: Hooks) -> None:
        self.table = table
        self.runner = runner
        self.settler = settler
        self.hooks = hooks
        self.now_ms: Callable[[], int] = lambda: int(time.time() * 1000)
        """Redis time (the claimer's clock)."""
        self.control: Callable[[Claim], Control] | None = None
        """Makes each run's checkpoints (`checkpoints.Lending.control`)."""
        self.release: Callable[[int, str, int, list[str]], Awaitable[None]] | None = None
        """Frees the concurrency permits of a run that ended (`limiting.Gate.release`)."""

    def start(self, shard: int, job: Claimed) -> None:
        claim = self.table.hold(shard, job)
        self.table.started(claim, self._task(claim))

    def start_lent(self, shard: int, job: Claimed) -> Claim:
        """Starts an urgent job in a slot a paused run lent at a checkpoint."""
        claim = self.table.hold(shard, job)
        claim.lent = True
        self.table.started(claim, self._task(claim))
        return claim

    def _task(self, claim: Claim) -> asyncio.Task[None]:
        # The loop's own create_task names the task as it makes it (`asyncio.create_task` sets
        # the name afterwards, through a function of its own: a cost per run).
        return asyncio.get_running_loop().create_task(
            self._run(claim), name=f"drumbeat-job-{claim.job.id}"
        )

    async def _run(self, claim: Claim) -> None:
        job, hooks, started = claim.job, self.hooks, time.monotonic()
        end, info = "crashed", None
        outcome: Outcome | None = None  # named for the hooks only: `end` is made when they run
        if self.control is not None:
            claim.control = self.control(claim)
        try:
            if hooks.per_job:
                info = JobInfo(job)
                await hooks.before(info)
            try:
                outcome = await self.runner.run(job, self.now_ms, claim.control, claim)
                if type(outcome) is Queued and outcome.queue in self.settler.served:
                    # A limited or routed schedule's run: it becomes a job this worker holds,
                    # and runs on here as one (its limits acquired as a job's are).
                    taken = await self.settler.take(claim, outcome)
                    if taken is None:  # not this worker's to run (`Settler.take`)
                        return
                    self.table.rekey(claim, taken)
                    job = taken
                    outcome = await self.runner.run(job, self.now_ms, claim.control, claim)
            except asyncio.CancelledError:
                if not claim.cancelled or claim.lost:
                    raise  # a stop (the claim is handed back) or a lost lease
                outcome = self.runner.cancelled(job, self.now_ms())  # Job.cancel
            claim.seconds = time.monotonic() - started
            self._settle(claim, outcome)
        except asyncio.CancelledError:
            end = "cancelled"
            raise
        except Exception:
            # A bug in running or deciding the outcome: the lease lapses, and the job runs
            # again (and is dead-lettered after `max_stalls`), rather than being held forever.
            log.exception("running job %s failed inside the worker; it runs again when its "
                          "lease expires", job.id)  # fmt: skip
            self.table.release(claim)
        finally:
            self.table.ended(claim)
            if claim.held_limits and not claim.lost and self.release is not None:
                await self.release(claim.shard, job.id, job.token, claim.held_limits)
            if hooks.per_job:
                end = end if outcome is None else _end_name(outcome)
                error = "the worker failed running it" if end == "crashed" else _end_error(outcome)
                info = info or JobInfo(job)  # a hook added while it ran
                await hooks.after(JobEnd(info, end, time.monotonic() - started, error))

    def _settle(self, claim: Claim, outcome: Outcome) -> None:
        if isinstance(outcome, Bury):
            log.error("job %s dead-lettered: %s", claim.job.id, outcome.reason)
        if isinstance(outcome, Parked):  # no longer claimed: nothing to settle
            self.table.release(claim)
        elif not claim.lost:
            self.settler.add(claim, outcome)

    def cancel(self, job_id: str) -> None:
        """`Job.cancel` of a job this worker may be running (a signal, or the heartbeat)."""
        for claim in self.table.of_job(job_id):
            if claim.cancelled:
                continue
            claim.cancelled = True
            control, task = claim.control, claim.task
            if control is not None and control.is_async and task is not None and not task.done():
                log.info("job %s cancelled; stopping its run", job_id)
                task.cancel("cancelled")
            else:
                log.info("job %s cancelled; its run stops at its next checkpoint", job_id)

    def lost(self, lost: list[ClaimKey]) -> None:
        """Leases taken over (fencing): those runs may no longer settle anything."""
        for key in lost:
            claim = self.table.lose(key)
            if claim is not None and claim.acquiring:
                continue  # given up to wait for its limits (or lost: the gate logs that)
            if claim is not None and claim.task is not None and not claim.task.done():
                log.warning("lease on job %s (token %s) was taken over; cancelling this run",
                            *key)  # fmt: skip
                claim.task.cancel("lease lost")
