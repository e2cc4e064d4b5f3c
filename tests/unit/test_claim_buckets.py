"""A worker passes a claim only the upcoming schedule buckets due by the time the claim runs:
each bucket passed costs Redis about 2 µs, due or not (`bench.cluster_periodic`)."""

from __future__ import annotations

import asyncio

from drumbeat.config import Settings
from drumbeat.keys import Keys
from drumbeat.protocol import UPCOMING
from drumbeat.replies import ClaimResult
from drumbeat.scripts import Scripts
from drumbeat.worker.claiming import _UPCOMING_AHEAD_MS, _UPCOMING_SLACK_MS, Claimer
from drumbeat.worker.claims import ClaimTable


def _call(claimer: Claimer) -> tuple[list[int], int]:
    """The buckets a claim passes, and how many upcoming ones it asks for."""
    call = claimer._claim_call(0, 10)
    n_queues, n_others = int(call.args[4]), int(call.args[5])
    return [int(b) for b in call.args[7 + n_queues + n_others :]], int(call.args[6])


def _passed(claimer: Claimer) -> list[int]:
    return _call(claimer)[0]


def _claimer() -> Claimer:
    claimer = Claimer(
        worker_id="w", shards=[Scripts(Keys("ns"))], settings=Settings(), table=ClaimTable(4),
        start=lambda shard, job: None, stopping=asyncio.Event(),
    )  # fmt: skip
    # A frozen clock: these cases sit 1 ms either side of a boundary, and a real clock may
    # tick between the test's reading and the claim's (it did, in CI).
    frozen = claimer.now_ms()
    claimer.now_ms = lambda: frozen  # type: ignore[method-assign]
    return claimer


def test_only_the_upcoming_buckets_due_by_the_claim_are_passed() -> None:
    claimer = _claimer()
    now = claimer.now_ms()
    claimer._upcoming[0] = [(1, now - 10), (2, now), (3, now + _UPCOMING_SLACK_MS - 1),
                            (4, now + 5_000), (5, now + 60_000)]  # fmt: skip
    assert _passed(claimer) == [1, 2, 3], "due, or due within the slack; not the later ones"
    claimer._upcoming[0] = []
    assert _passed(claimer) == []


def test_a_claim_asks_for_upcoming_buckets_only_when_its_list_runs_short() -> None:
    """The query costs Redis more than an empty claim (`bench.redis_cpu`): a list that still
    reaches well past this claim's buckets serves the next claims too, minus what they pass."""
    claimer = _claimer()
    now = claimer.now_ms()
    far = now + _UPCOMING_SLACK_MS + _UPCOMING_AHEAD_MS + 1_000
    claimer._upcoming[0] = [(1, now - 10), (2, now + 500), (3, far)]
    assert _call(claimer) == ([1], 0), "the list reaches far enough: none asked for"
    assert claimer._upcoming[0] == [(2, now + 500), (3, far)], "what was passed left it"
    claimer._upcoming[0] = [(1, now - 10), (2, now + _UPCOMING_SLACK_MS + 1)]
    assert _call(claimer) == ([1], UPCOMING), "it ends right after this claim's: asked"
    claimer._upcoming[0] = []
    assert _call(claimer) == ([], UPCOMING), "an empty list: asked"


def test_a_claim_passes_no_more_due_buckets_than_it_has_slots() -> None:
    """Each due bucket holds a run at least and a claim opens buckets only until its slots are
    filled: the others stay in the list, due, for the next claims."""
    claimer = _claimer()
    now = claimer.now_ms()
    claimer._upcoming[0] = [(b, now - 100 + b) for b in range(1, 15)] + [(99, now + 60_000)]
    assert _passed(claimer) == list(range(1, 11)), "ten slots: the ten due first"
    assert [b for b, _ in claimer._upcoming[0]] == [11, 12, 13, 14, 99]
    claimer._upcoming[0] = [(b, now - 100 + b) for b in range(1, 31)]
    assert _call(claimer) == (list(range(1, 11)), 0), (
        "twenty due left, two claims' worth: none asked for (a pool that fell behind asked on "
        "every claim, 1.3 M Redis instructions each)"
    )
    assert _call(claimer) == (list(range(11, 21)), 0)
    assert _call(claimer) == (list(range(21, 31)), UPCOMING), "the list ran out: asked"
    claimer._upcoming[0] = [(b, now - 100 + b) for b in range(11, 15)] + [(99, now + 60_000)]
    call = claimer._claim_call(0, 0)
    n_queues, n_others = int(call.args[4]), int(call.args[5])
    assert [int(b) for b in call.args[7 + n_queues + n_others :]] == [11, 12, 13, 14], (
        "a busy worker's claim (no slots) passes every due one"
    )


def test_buckets_passed_before_they_came_due_go_back_to_the_list() -> None:
    """A claim opens only the passed buckets whose markers are due (claim.lua); those due within
    the slack but not yet when the claim ran are passed again by the next claim, not dropped
    (dropped, the next claim reported them: a promote_runs call for each such claim)."""
    claimer = _claimer()
    now = claimer.now_ms()
    claimer._upcoming[0] = [(1, now - 10), (2, now + 2), (3, now + 3), (4, now + 5_000)]
    assert _passed(claimer) == [1, 2, 3]
    reply_now = now + 2  # the claim ran 2 ms later: bucket 2 came due, 3 not yet
    claimer._keep_passed(0, _reply(reply_now, asked=False))
    assert claimer._upcoming[0] == [(3, now + 3), (4, now + 5_000)]
    assert _passed(claimer) == [3], "passed again by the next claim"
    claimer._keep_passed(0, _reply(now + 4, asked=False))
    assert claimer._upcoming[0] == [(4, now + 5_000)], "due when that claim ran: it left the list"
    claimer._upcoming[0] = [(5, now + 4), (6, now + 6_000)]
    _passed(claimer)
    claimer._keep_passed(0, _reply(now, asked=True))
    assert claimer._upcoming[0] == [(6, now + 6_000)], (
        "nothing put back when the reply brings a fresh list (it holds bucket 5 if still due)"
    )


def _reply(now_ms: int, asked: bool) -> ClaimResult:
    return ClaimResult(now_ms, None, [], [], -1, [], [], [], [], asked)
