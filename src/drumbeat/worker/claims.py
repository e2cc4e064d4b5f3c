"""The claims a worker holds, keyed by (job id, fencing token).

A job can be claimed again by the same worker before its previous attempt is settled (a
`Retry(delay=0)`, a schedule whose next slot is already due): keyed by id alone, settling the
old attempt would forget the new one's lease, and a late "lease lost" for the old token would
cancel the new run. With the token in the key, two claims of one job never share an entry.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from drumbeat.replies import Claimed

if TYPE_CHECKING:
    from .checkpoints import Control

ClaimKey = tuple[str, int]
"""(job id, fencing token): one claim of one job."""


@dataclass(slots=True, eq=False)
class Claim:
    """One claimed job: held (its lease renewed) from the claim until its outcome is settled,
    handed back, or its lease is lost."""

    shard: int
    job: Claimed
    task: asyncio.Task[None] | None = None
    """The run, while it runs."""
    lost: bool = field(default=False)
    """Its lease was taken over: nothing of this run may be settled."""
    cancelled: bool = field(default=False)
    """`Job.cancel` asked for it to stop (at its next checkpoint, or at once if async)."""
    lent: bool = field(default=False)
    """It runs in a slot another run lent at a checkpoint (and does not count as taking one)."""
    control: Control | None = None
    """The run's checkpoints."""
    task_name: str = "?"
    """The task, once the runner decoded the record (for the metrics counters)."""
    seconds: float = 0.0
    """How long the run took, once it ended."""
    held_limits: list[str] = field(default_factory=list)
    """Limiter keys whose concurrency permits the run holds (released when it ends)."""
    acquiring: bool = False
    """Its limits are being acquired: a lease the heartbeat finds gone meanwhile was given up
    by acquire_limits.lua (the job waits for its limits), not taken over."""
    key: ClaimKey = field(init=False)
    """(job id, fencing token): made once, as the table looks it up several times per run."""

    def __post_init__(self) -> None:
        self.key = (self.job.id, self.job.token)


class ClaimTable:
    """What this worker holds (for the heartbeat and hand-back) and what runs (for slots).

    Mutated on the event loop only; the heartbeat thread reads `owned`, which copies the table
    in one C call (atomic under the GIL).
    """

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self._held: dict[ClaimKey, Claim] = {}
        # Runs in slots of their own, and runs in lent slots (whose lender waits meanwhile: a
        # lender and its borrower together take one slot).
        self._running: dict[ClaimKey, Claim] = {}
        self._lent: dict[ClaimKey, Claim] = {}
        self.slot_free = asyncio.Event()
        """Set whenever a run ends (and by a stop), so a full claim loop looks again."""
        self.emptied = asyncio.Event()
        """Set whenever the last claim held is let go, so a wait for the worker to be idle
        (`idle.until_idle`) reads what is left at once rather than at its next poll."""

    @property
    def free(self) -> int:
        return self.slots - len(self._running)

    @property
    def running(self) -> int:
        """Runs under way, in slots of their own or lent ones."""
        return len(self._running) + len(self._lent)

    def __len__(self) -> int:
        return len(self._held)

    def __contains__(self, key: ClaimKey) -> bool:
        return key in self._held

    def hold(self, shard: int, job: Claimed) -> Claim:
        claim = Claim(shard, job)
        self._held[claim.key] = claim
        return claim

    def started(self, claim: Claim, task: asyncio.Task[None]) -> None:
        claim.task = task
        (self._lent if claim.lent else self._running)[claim.key] = claim

    def ended(self, claim: Claim) -> None:
        """The run is over (whatever its outcome): its slot is free (a lent one goes back to
        its lender)."""
        if claim.lent:
            self._lent.pop(claim.key, None)
        else:
            self._running.pop(claim.key, None)
        self.slot_free.set()

    def rekey(self, claim: Claim, job: Claimed) -> None:
        """The run goes on as ``job`` (a time-slot run its worker took as a job, with a lease
        and token of its own): held, and running, under its new key."""
        running = self._lent if claim.lent else self._running
        running.pop(claim.key, None)
        claim.job, claim.key = job, (job.id, job.token)
        self._held[claim.key] = claim
        running[claim.key] = claim

    def release(self, claim: Claim) -> None:
        """Stops holding the claim: settled, handed back, or given up to its lease."""
        if self._held.get(claim.key) is claim:
            del self._held[claim.key]
            if not self._held:
                self.emptied.set()

    def lose(self, key: ClaimKey) -> Claim | None:
        """The lease on ``key`` was taken over: released, marked lost; returns it if held."""
        claim = self._held.pop(key, None)
        if claim is not None:
            claim.lost = True
            if not self._held:
                self.emptied.set()
        return claim

    def runs(self) -> list[asyncio.Task[None]]:
        claims = [*self._running.values(), *self._lent.values()]
        return [c.task for c in claims if c.task is not None]

    def running_controls(self) -> list[Control]:
        """The checkpoints of the runs in slots of their own (lent runs' lenders are among
        them)."""
        return [c.control for c in self._running.values() if c.control is not None]

    def of_job(self, job_id: str) -> list[Claim]:
        """Every claim held of ``job_id`` (more than one only while an old one is settled)."""
        return [c for c in self._held.values() if c.job.id == job_id]

    def owned(self) -> dict[int, list[ClaimKey]]:
        """Per shard, the (id, token) of every claim held with a lease of its own (not a
        time-slot run's); safe to call from another thread."""
        by_shard: dict[int, list[ClaimKey]] = defaultdict(list)
        for claim in self._held.copy().values():
            if claim.job.slot_run is None:
                by_shard[claim.shard].append(claim.key)
        return by_shard

    def owned_by_queue(self) -> dict[tuple[int, str], list[ClaimKey]]:
        """Per (shard, queue), the (id, token) of every claim held with a lease of its own (a
        hand-back writes to the job's queue)."""
        grouped: dict[tuple[int, str], list[ClaimKey]] = defaultdict(list)
        for claim in self._held.copy().values():
            if claim.job.slot_run is None:
                grouped[claim.shard, claim.job.queue].append(claim.key)
        return grouped

    def slot_runs(self) -> list[Claim]:
        """The time-slot runs held (their lease is the worker's incarnation's)."""
        return [c for c in self._held.copy().values() if c.job.slot_run is not None]
