"""Counting settled jobs for ``GET /metrics``, in Redis, so every worker process on every
machine adds to the same counters.

The settler counts each batch as it sends it, and sends the counts in the same write as a
batch (one `tally.lua` call: no round trip of its own), at most once per `TALLY_INTERVAL`
(alone when no batch comes by then). An outcome Redis refuses (its lease was lost, or the call
must be sent again) is taken back with a negative count in a later write. Per job, counting is
a dict increment; fields are formatted once per `tally` call.

The `metrics` hash holds, per task: ``j|<outcome>|<task>`` attempts settled with that outcome,
``h|<i>|<task>`` attempts whose run took at most ``DURATION_BUCKETS[i]`` seconds (not
cumulative; ``i == len(DURATION_BUCKETS)``: longer), and ``s|<task>`` their run time summed in
microseconds. Task names cannot hold ``|`` (`names.check_name`), so a field splits unambiguously.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict

from drumbeat.outcomes import Again, Bury, Cancelled, Done, Outcome, RunDone

__all__ = ["DURATION_BUCKETS", "OUTCOMES", "TALLY_INTERVAL", "Tally", "outcome_name"]

#: Seconds between two writes of a worker's counts: what `/metrics` may lag behind.
TALLY_INTERVAL = 0.5

#: Upper bounds (seconds) of the job duration histogram's buckets (Prometheus' defaults,
#: stretched to the minutes a job may take).
DURATION_BUCKETS: tuple[float, ...] = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0,
)  # fmt: skip

#: What `drumbeat_jobs_total{outcome}` says: every settled attempt counts once, under one.
OUTCOMES = ("complete", "failed", "retried", "dead", "cancelled")

_NAMES: dict[type[Outcome], str] = {
    Done: "complete", Again: "retried", Bury: "dead", Cancelled: "cancelled"
}  # fmt: skip


def outcome_name(outcome: Outcome) -> str | None:
    """The counted outcome: a job's attempt completes, is retried, dead-lettered or
    cancelled; a schedule's run completes or fails (it is neither retried nor dead-lettered).
    A job handed back, or a run skipped (a misfire), is not counted: it did not end."""
    if isinstance(outcome, RunDone):
        return {"ok": "complete", "fail": "failed"}.get(outcome.outcome)
    return _NAMES.get(type(outcome))


class Tally:
    """Counts not yet sent: runs keyed by (task, outcome, duration bucket), run time by task,
    and fields put back as they were."""

    def __init__(self) -> None:
        self._runs: defaultdict[tuple[str, str, int], int] = defaultdict(int)
        self._micros: defaultdict[str, int] = defaultdict(int)
        self._fields: defaultdict[str, int] = defaultdict(int)

    def add(self, task: str, outcome: Outcome, seconds: float, sign: int = 1) -> None:
        name = outcome_name(outcome)
        if name is None:
            return
        self._runs[task, name, bisect_left(DURATION_BUCKETS, seconds)] += sign
        self._micros[task] += sign * round(seconds * 1_000_000)

    def __bool__(self) -> bool:
        return bool(self._runs or self._fields)

    def take(self) -> list[str | int]:
        """The counts as `Scripts.tally` fields (pairs of field, increment); empties it."""
        fields = self._fields
        for (task, name, bucket), n in self._runs.items():
            fields[f"j|{name}|{task}"] += n
            fields[f"h|{bucket}|{task}"] += n
        for task, micros in self._micros.items():
            fields[f"s|{task}"] += micros
        out: list[str | int] = []
        for field, n in fields.items():
            if n:
                out += (field, n)
        self._runs.clear()
        self._micros.clear()
        self._fields = defaultdict(int)
        return out

    def put_back(self, fields: list[str | int]) -> None:
        """Counts `take` gave that Redis did not take (a `tally` call refused for now)."""
        for i in range(0, len(fields), 2):
            self._fields[str(fields[i])] += int(fields[i + 1])
