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

from drumbeat.scripts import Claimed

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

    @property
    def key(self) -> ClaimKey:
        return (self.job.id, self.job.token)


class ClaimTable:
    """What this worker holds (for the heartbeat and hand-back) and what runs (for slots).

    Mutated on the event loop only; the heartbeat thread reads `owned`, which copies the table
    in one C call (atomic under the GIL).
    """

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self._held: dict[ClaimKey, Claim] = {}
        self._running: dict[ClaimKey, Claim] = {}
        self.slot_free = asyncio.Event()
        """Set whenever a run ends (and by a stop), so a full claim loop looks again."""

    @property
    def free(self) -> int:
        return self.slots - len(self._running)

    @property
    def running(self) -> int:
        return len(self._running)

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
        self._running[claim.key] = claim

    def ended(self, claim: Claim) -> None:
        """The run is over (whatever its outcome): its slot is free."""
        self._running.pop(claim.key, None)
        self.slot_free.set()

    def release(self, claim: Claim) -> None:
        """Stops holding the claim: settled, handed back, or given up to its lease."""
        if self._held.get(claim.key) is claim:
            del self._held[claim.key]

    def lose(self, key: ClaimKey) -> Claim | None:
        """The lease on ``key`` was taken over: released, marked lost; returns it if held."""
        claim = self._held.pop(key, None)
        if claim is not None:
            claim.lost = True
        return claim

    def runs(self) -> list[asyncio.Task[None]]:
        return [c.task for c in self._running.values() if c.task is not None]

    def owned(self) -> dict[int, list[ClaimKey]]:
        """Per shard, the (id, token) of every claim held; safe to call from another thread."""
        by_shard: dict[int, list[ClaimKey]] = defaultdict(list)
        for claim in self._held.copy().values():
            by_shard[claim.shard].append(claim.key)
        return by_shard
