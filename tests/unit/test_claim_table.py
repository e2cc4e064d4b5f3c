"""`ClaimTable.emptied`: set when the last claim held is let go, however it goes (the wait of
`run_until_idle` reads what is left then, not at its next poll)."""

from __future__ import annotations

from drumbeat.replies import Claimed
from drumbeat.worker.claims import ClaimTable


def _job(n: int) -> Claimed:
    return Claimed(id=f"j{n}", spec=None, attempt=1, stalls=0, token=n, priority=0, extra="")


async def test_emptied_is_set_when_the_last_claim_is_released_or_lost() -> None:
    table = ClaimTable(2)
    first, second = table.hold(0, _job(1)), table.hold(0, _job(2))
    table.release(first)
    assert not table.emptied.is_set(), "one claim is still held"
    table.release(first)  # let go already: nothing changes
    assert not table.emptied.is_set()
    table.release(second)
    assert table.emptied.is_set()

    table.emptied.clear()
    third = table.hold(0, _job(3))
    assert table.lose(third.key) is third and third.lost
    assert table.emptied.is_set(), "a claim lost to a takeover is let go too"
