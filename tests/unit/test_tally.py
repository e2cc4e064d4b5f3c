"""The worker's metrics counts: what each outcome counts as, and the fields `tally.lua` gets."""

from __future__ import annotations

from drumbeat.outcomes import Again, Bury, Cancelled, Done, HandBack, RunDone
from drumbeat.worker.tally import DURATION_BUCKETS, Tally, outcome_name


def _fields(flat: list[str | int]) -> dict[str, int]:
    return {str(flat[i]): int(flat[i + 1]) for i in range(0, len(flat), 2)}


def test_each_outcome_counts_once_under_one_name() -> None:
    assert outcome_name(Done(b"", 0)) == "complete"
    assert outcome_name(Again(0)) == "retried"
    assert outcome_name(Bury(b"", 0, "x")) == "dead"
    assert outcome_name(Cancelled(b"", 0)) == "cancelled"
    assert outcome_name(RunDone("ok", 1, 0, 0, 0)) == "complete"
    assert outcome_name(RunDone("fail", 1, 0, 0, 0)) == "failed"
    # Not an end: the job runs again (handed back at shutdown) or the run never ran (misfire).
    assert outcome_name(HandBack()) is None
    assert outcome_name(RunDone("skip", 0, 0, 0, 0)) is None


def test_take_formats_the_fields_once_and_empties() -> None:
    tally = Tally()
    for seconds in (0.001, 0.001, 0.2, 9999.0):
        tally.add("a", Done(b"", 0), seconds)
    tally.add("b", Again(0), 0.05)
    tally.add("a", HandBack(), 1.0)  # not counted
    last = len(DURATION_BUCKETS)
    assert _fields(tally.take()) == {
        "j|complete|a": 4,
        "h|0|a": 2,
        f"h|{DURATION_BUCKETS.index(0.25)}|a": 1,
        f"h|{last}|a": 1,
        "s|a": 2000 + 200_000 + 9_999_000_000,
        "j|retried|b": 1,
        f"h|{DURATION_BUCKETS.index(0.05)}|b": 1,
        "s|b": 50_000,
    }
    assert not tally
    assert tally.take() == []


def test_taken_back_counts_cancel_out_and_put_back_keeps_fields() -> None:
    tally = Tally()
    tally.add("a", Done(b"", 0), 0.01)
    tally.add("a", Done(b"", 0), 0.01, -1)
    assert tally.take() == [], "a count taken back before sending sends nothing"
    tally.add("a", Bury(b"", 0, "x"), 0.01)
    sent = tally.take()
    tally.put_back(sent)
    tally.add("a", Bury(b"", 0, "x"), 0.01)
    assert _fields(tally.take()) == {k: 2 * v for k, v in _fields(sent).items()}
