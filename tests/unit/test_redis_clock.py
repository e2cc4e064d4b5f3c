"""RedisClock: Redis' time as a worker waits for a granted start by it (worker/limiting.py)."""

from __future__ import annotations

from drumbeat.worker.limiting import RedisClock


def test_the_fastest_reply_of_the_window_gives_the_offset() -> None:
    """Each reply bounds the offset from below by its Redis time minus when it was read; the
    reply read soonest after Redis answered (the largest bound) sets the clock, not the latest
    reply, whose delay would make a start wait on top of its turn."""
    clock = RedisClock()
    clock.observe(10_000, read_ms=10_002)  # came back 2 ms late: bound -2
    clock.observe(10_100, read_ms=10_100.5)  # 0.5 ms: bound -0.5
    clock.observe(10_200, read_ms=10_212)  # 12 ms: bound -12
    assert clock.now_ms(0, local_ms=10_300) == 10_299.5
    # Another lower bound that is tighter wins; one that is looser does not.
    assert clock.now_ms(10_300, local_ms=10_300) == 10_300
    assert clock.now_ms(10_250, local_ms=10_300) == 10_299.5


def test_a_bound_older_than_the_window_is_dropped() -> None:
    """A clock step is followed within WINDOW_MS: older bounds no longer count."""
    clock = RedisClock()
    clock.observe(10_000, read_ms=10_000)  # bound 0
    clock.observe(10_500, read_ms=10_510)  # bound -10
    later = 10_000 + RedisClock.WINDOW_MS + 1
    assert clock.now_ms(0, local_ms=later) == later - 10
    assert clock.now_ms(0, local_ms=10_510 + RedisClock.WINDOW_MS + 1) == 0, (
        "with no bound in the window, the clock is what the caller knows"
    )
