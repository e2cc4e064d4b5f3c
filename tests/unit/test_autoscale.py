"""The autoscaling decision (pure): the plan a signal asks for, and the policy's hysteresis."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from drumbeat.autoscale import CompletionRate, Policy, Signal, SupervisorInfo, plan
from drumbeat.cli.tables import due_runs_text


def signal(
    ready: int = 0,
    *,
    priority: int = 0,
    running: int = 0,
    slots: int = 4,
    due_now: int = 0,
    lag_ms: int = 0,
    p99: float | None = None,
    supervisors: tuple[SupervisorInfo, ...] = (),
    cpu: float = 0.0,
) -> Signal:
    counts = [0] * 10
    counts[priority] = ready
    return Signal(
        now_ms=1_000_000, ready_by_priority=tuple(counts), due_now=due_now, lag_ms=lag_ms,
        running=running, slots=slots, workers=slots // 4, processed={},
        lateness_p99_ms=p99, supervisors=supervisors, cpu=cpu,
    )  # fmt: skip


def mine(sig: Signal, **kw: Any) -> int:
    args: dict[str, Any] = dict(
        me="a", minimum=1, maximum=8, live=1, slots=4, concurrency=4, rate=None, interval=1.0
    )
    return plan(sig, **(args | kw)).mine


def sup(sid: str, maximum: int, live: int = 1, slots: int = 4) -> SupervisorInfo:
    return SupervisorInfo(id=sid, heartbeat_ms=0, maximum=maximum, live=live, slots=slots)


def test_a_backlog_the_slots_cannot_start_within_an_interval_asks_for_as_many_as_it_needs() -> None:
    # 4 slots busy, 20 waiting, nothing known to finish: 24 slots = 6 processes at once.
    assert mine(signal(20, running=4)) == 6
    # Never past MAX, whatever the backlog.
    assert mine(signal(5000, running=4)) == 8


def test_what_the_busy_slots_will_start_within_an_interval_needs_no_new_process() -> None:
    # 4 busy slots finishing 30 jobs/s start 20 waiting jobs within one second.
    assert mine(signal(20, running=4), rate=30.0) == 1
    # At 10 jobs/s, 10 of them wait longer: 14 slots, 4 processes.
    assert mine(signal(20, running=4), rate=10.0) == 4


def test_idle_pool_stays_at_min_and_busy_slots_alone_size_it() -> None:
    assert mine(signal(0, running=0), minimum=2) == 2
    assert mine(signal(0, running=9, slots=12), live=3, slots=12) == 3


def test_a_saturated_core_asks_for_a_process_though_slots_are_free_and_nothing_waits() -> None:
    # One worker of 4 slots, 1 busy, nothing waiting: its core at 95 % starts runs late.
    assert mine(signal(0, running=1, slots=4, cpu=0.95)) == 2
    # Two workers using 1.2 cores between them still fit in two; 0.6 fits in one.
    assert mine(signal(0, running=1, slots=8, cpu=1.2), live=2, slots=8) == 2
    assert mine(signal(0, running=1, slots=8, cpu=0.6), live=2, slots=8) == 1
    # A worker no supervisor runs carries its own CPU.
    assert mine(signal(0, running=1, slots=8, cpu=1.3), live=1, slots=4) == 1


def test_every_priority_and_unpromoted_due_entries_count_as_backlog() -> None:
    assert mine(signal(7, priority=9, running=4)) == 3
    assert mine(signal(0, running=4, due_now=8)) == 3


def test_two_supervisors_split_the_need_by_their_max() -> None:
    others = (sup("b", maximum=3),)
    # 24 slots = 6 processes in all; each of two 1:3 supervisors takes half.
    assert mine(signal(20, running=4, slots=8, supervisors=others), maximum=3) == 3
    # A small backlog: 3 processes in all, so 2 each (ceil), not both MAX.
    small = signal(8, running=4, slots=8, supervisors=others)
    assert mine(small, maximum=3) == 2
    # Unequal MAXes: 12 processes in all, 8 of 8+4 → 8, and the other 4 of 12 → 4.
    big = signal(44, running=4, slots=8, supervisors=(sup("b", maximum=4),))
    assert mine(big, maximum=8) == 8
    assert plan(big, me="b", minimum=1, maximum=4, live=1, slots=4, concurrency=4, rate=None,
                interval=1.0).mine == 4  # fmt: skip


def test_slots_of_workers_no_supervisor_runs_are_subtracted() -> None:
    # 40 slots registered, 4 of them ours: 36 slots of plain workers cover 36 of the 40 needed.
    assert mine(signal(30, running=10, slots=40)) == 1
    assert mine(signal(50, running=10, slots=40)) == 6  # 60 - 36 = 24 slots


def test_pressure_grows_the_supervised_processes_by_half() -> None:
    assert mine(signal(0, running=4), pressure=True) == 2
    others = (sup("b", maximum=8, live=4, slots=16),)
    # 4 + 4 live → at least 12 in all, 6 here (share 8/16).
    assert mine(signal(0, running=32, slots=32, supervisors=others), live=4, slots=16,
                pressure=True) == 6  # fmt: skip


def test_policy_scales_up_at_once_and_down_one_at_a_time_after_the_quiet_period() -> None:
    p = Policy(1, 8, scale_down_after=30)
    assert p.step(0.0, 6, "backlog") == 6 and p.changed
    assert p.step(1.0, 1, "idle") == 6, "down waits for scale_down_after"
    assert p.step(30.0, 1, "idle") == 6
    assert p.step(31.0, 1, "idle") == 5 and p.changed and "retiring one" in p.reason
    assert p.step(40.0, 1, "idle") == 5, "the next one waits as long again"
    assert p.step(61.0, 1, "idle") == 4


def test_policy_does_not_flap_a_plan_back_at_the_pool_resets_the_quiet_period() -> None:
    p = Policy(1, 8, scale_down_after=10)
    p.step(0.0, 4, "backlog")
    p.step(1.0, 3, "less")
    p.step(9.0, 4, "more again")  # not continuously below: the timer starts over
    assert p.step(15.0, 3, "less") == 4
    assert p.step(24.0, 3, "less") == 4
    assert p.step(25.0, 3, "less") == 3


def test_policy_stays_within_min_and_max() -> None:
    p = Policy(2, 3, scale_down_after=0)
    assert p.desired == 2
    assert p.step(0.0, 50, "x") == 3
    assert p.step(1.0, 0, "x") == 2
    assert p.step(2.0, 0, "x") == 2
    with pytest.raises(ValueError, match="MIN <= MAX"):
        Policy(4, 2, scale_down_after=1)


def test_pressure_is_lag_growing_past_an_interval_or_recent_lateness() -> None:
    p = Policy(1, 4, scale_down_after=30)
    assert p.pressure(signal(lag_ms=500), 1.0, 0.0) is None
    assert p.pressure(signal(lag_ms=1500), 1.0, 0.0) == "schedule lag 1500 ms and growing"
    assert p.pressure(signal(lag_ms=1200), 1.0, 1.0) is None, "lag shrinking: capacity caught up"
    assert p.pressure(signal(p99=2500.0), 1.0, 2.0) == "lateness p99 2500 ms"
    assert p.pressure(signal(p99=2500.0), 1.0, 3.0) is None, "old lateness counts once per 20 s"
    assert p.pressure(signal(p99=2500.0), 1.0, 22.0) is not None


def test_completion_rate_over_a_window_of_beats() -> None:
    rate = CompletionRate(window_ms=10_000)
    assert rate.add(0, {"w1": 0}) is None
    assert rate.add(5_000, {"w1": 50, "w2": 7}) == pytest.approx(10.0), "w2 is new: not counted"
    assert rate.add(10_000, {"w1": 100, "w2": 57}) == pytest.approx(10.0)
    # The window slides: from 5 s to 15 s, w1 did 50 and w2 100.
    assert rate.add(15_000, {"w1": 100, "w2": 107}) == pytest.approx(15.0)


def test_no_scale_down_to_a_pool_that_would_at_once_ask_to_grow_again() -> None:
    # 4 processes of 10 slots, 30 busy, 18 waiting, 20 jobs/s done: the 4 start the 18 within
    # an interval, and 30 slots would do (3 processes)...
    four = signal(18, running=30, slots=40)
    assert plan(four, me="a", minimum=1, maximum=8, live=4, slots=40, concurrency=10,
                rate=20.0, interval=1.0).slots == 30  # fmt: skip
    # ...but 3 of them finish 15 jobs/s, not 20: 3 of the 18 wait, so a pool of 3 asks for 4
    # at its next look (the flap 4 -> 3 -> 4).
    three = signal(18, running=30, slots=30)
    assert mine(three, live=3, slots=30, concurrency=10, rate=15.0) == 4
    # So the pool of 4 stays.
    assert mine(four, live=4, slots=40, concurrency=10, rate=20.0) == 4
    # With a backlog 3 processes still start within an interval, it goes down to 3.
    assert mine(signal(12, running=30, slots=40), live=4, slots=40, concurrency=10,
                rate=20.0) == 3  # fmt: skip
    # And an idle pool all the way to MIN (here 1 process), as before.
    assert mine(signal(0, running=2, slots=40), live=4, slots=40, concurrency=10,
                rate=20.0) == 1  # fmt: skip


def test_no_scale_down_while_the_policy_sees_a_plan_that_would_flap() -> None:
    """The policy retires on the plan alone: fed the plan of a pool that would grow back, it
    waits; fed one that stays, it retires after the quiet period."""
    p = Policy(1, 8, scale_down_after=5)
    p.step(0.0, 4, "backlog")
    four = signal(18, running=30, slots=40)
    for t in range(1, 20):
        target = mine(four, live=4, slots=40, concurrency=10, rate=20.0)
        assert p.step(float(t), target, "steady") == 4, f"retired at {t} s into a flap"


def test_status_says_what_holds_the_schedule_runs_due() -> None:
    """`drumbeat status` names why due runs wait: no worker, every slot busy, or catching up."""

    def due(running: int, slots: int) -> Signal:
        sig = signal(running=running, slots=slots, due_now=1200, lag_ms=340)
        return dataclasses.replace(sig, due_runs=1200)

    assert due_runs_text(signal()) == "0"
    assert due_runs_text(due(0, 0)).endswith("no live worker")
    busy = due(200, 200)
    assert busy.waiting_for_slots
    assert due_runs_text(busy) == (
        "~1,200, the oldest 340ms late; every worker slot busy (200 of 200): waiting for free slots"
    )
    free = due(150, 200)
    assert not free.waiting_for_slots
    assert due_runs_text(free).endswith("50 of 200 worker slots free: catching up")
