"""A worker passes a claim only the upcoming schedule buckets due by the time the claim runs:
each bucket passed costs Redis about 2 µs, due or not (`bench.cluster_periodic`)."""

from __future__ import annotations

import asyncio

from drumbeat.config import Settings
from drumbeat.keys import Keys
from drumbeat.scripts import Scripts
from drumbeat.worker.claiming import _UPCOMING_SLACK_MS, Claimer
from drumbeat.worker.claims import ClaimTable


def _passed(claimer: Claimer) -> list[int]:
    call = claimer._claim_call(0, 10)
    n_queues, n_others = int(call.args[4]), int(call.args[5])
    return [int(b) for b in call.args[6 + n_queues + n_others :]]


def test_only_the_upcoming_buckets_due_by_the_claim_are_passed() -> None:
    claimer = Claimer(
        worker_id="w", shards=[Scripts(Keys("ns"))], settings=Settings(), table=ClaimTable(4),
        start=lambda shard, job: None, stopping=asyncio.Event(),
    )  # fmt: skip
    now = claimer.now_ms()
    claimer._upcoming[0] = [(1, now - 10), (2, now), (3, now + _UPCOMING_SLACK_MS - 1),
                            (4, now + 5_000), (5, now + 60_000)]  # fmt: skip
    assert _passed(claimer) == [1, 2, 3], "due, or due within the slack; not the later ones"
    claimer._upcoming[0] = []
    assert _passed(claimer) == []
