"""The worker's time-slot lane keeps the slots a claim passed that may still hold entries (not
due when it ran, or left when its room ran out) for its next claim, and claims at most every
`_PACE_MS` while the next slot was not due by the last claim."""

from __future__ import annotations

import asyncio

from drumbeat.config import Settings
from drumbeat.keys import Keys
from drumbeat.schedules.slots import SlotClaim
from drumbeat.worker.slotted import _PACE_MS, SlotLane


def _lane(known: list[int]) -> SlotLane:
    lane = SlotLane("w", [Keys("ns")], Settings(), held=[0])
    lane._upcoming[0] = known
    return lane


def _passed(lane: SlotLane, room: int, now_ms: int) -> list[int]:
    """The slots a claim of ``room`` runs sent at ``now_ms`` passes."""
    call = lane.calls(0, room, now_ms)[0]
    return [int(ms) for ms in call.args[6:]]


def _took(lane: SlotLane, now_ms: int, taken: list[int]) -> None:
    """The claim's reply: it ran at ``now_ms`` and took ``taken`` per slot passed (no reads)."""
    reply = SlotClaim(now_ms, False, None, None, taken)
    asyncio.run(lane.took(0, [reply, *([None] * len(taken))], client=None))  # type: ignore[arg-type]


def test_slots_not_due_when_the_claim_ran_are_passed_again() -> None:
    lane = _lane([1000, 1001, 1003, 1005, 1200])
    assert _passed(lane, room=100, now_ms=1000) == [1000, 1001, 1003, 1005]
    _took(lane, now_ms=1001, taken=[0, 0, 0, 0])  # 1000 and 1001 found empty: others took them
    # Dropped, 1003 and 1005 waited for the next list of upcoming slots (tens of ms).
    assert lane._upcoming[0] == [1003, 1005, 1200]


def test_due_slots_left_when_the_room_ran_out_are_passed_again() -> None:
    lane = _lane([1000, 1001, 1002, 1200])
    assert _passed(lane, room=5, now_ms=1002) == [1000, 1001, 1002]
    # 1001 may hold more; 1002 was not reached. (`took` adds these to the list, as above.)
    left = lane._left(0, SlotClaim(1002, False, None, None, [2, 3, 0]))
    assert left == [1001, 1002]


def test_claims_are_paced_unless_the_next_slot_was_due_by_the_last() -> None:
    lane = _lane([1000, 1001, 1200])
    reply = SlotClaim(1000, False, None, None, [])
    _passed(lane, room=1, now_ms=1000)
    lane._upcoming[0] = [1001, 1200]
    assert lane.next_due(0, reply) == 1000 + _PACE_MS, "1001 waits for slots due with it"
    lane._upcoming[0] = [999, 1200]
    assert lane.next_due(0, reply) == 999, "a slot due by the last claim is claimed at once"
    lane._upcoming[0] = [1300]
    assert lane.next_due(0, reply) == 1300


def test_a_backlog_is_claimed_from_a_stretch_at_random_not_from_its_head() -> None:
    """Every worker's list names the same oldest due slots: claims that all passed its head
    found them taken by one of them (cold start, 100,000 schedules due: 11k runs/s drained)."""
    due = list(range(1000, 1128))  # a full list of due slots, 1 entry each lately
    starts = set()
    for _ in range(20):
        lane = _lane(list(due))
        passed = _passed(lane, room=5, now_ms=2000)
        assert len(passed) == 5 + 2, "the room's slots and the spare ones"
        assert passed == due[due.index(passed[0]) : due.index(passed[0]) + 7], "a stretch"
        assert sorted(lane._upcoming[0] + passed) == due, "the rest stays known"
        starts.add(passed[0])
    assert len(starts) > 1, "every claim passed the same slots"
    lane = _lane([1000, 1001, 1002, 1003, 1200])
    assert _passed(lane, room=100, now_ms=1010) == [1000, 1001, 1002, 1003], "no backlog: all"
