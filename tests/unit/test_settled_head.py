"""The head of a schedule's record a worker builds for its run's settle
(`protocol.settled_heads`, sent by `Settler` through `Scripts.finish_runs`). That it is what
finish_runs.lua would write is checked against the script itself in
tests/integration/test_wheel_batches.py."""

from __future__ import annotations

from drumbeat.outcomes import RunDone
from drumbeat.protocol import record_head, settled_heads
from drumbeat.replies import Claimed
from drumbeat.worker.settling import _heads

HEAD = "3|100000|4|120|2|1|-4998|12|3|"
RECORD = HEAD.encode() + b'12|[["a|b"],{}]'


def _after(outcome: str, started_ms: int, due_ms: int | None, record: bytes = RECORD) -> str:
    old, new = settled_heads(
        record, outcome, duration_ms=42, grid_ms=105000, started_ms=started_ms, due_ms=due_ms
    )
    assert old == record_head(record)
    return new


def test_the_head_of_a_record_is_every_field_before_its_task_code() -> None:
    assert record_head(RECORD) == HEAD
    never = b"1|100000|0|0|0|0||0|0|"
    assert record_head(never + b"3|[]") == never.decode()


def test_a_run_that_ran_counts_and_records_its_start_duration_and_lateness() -> None:
    assert _after("ok", 100020, 100000) == "3|105000|4|121|2|1|-4980|42|20|"
    assert _after("fail", 100020, 100000) == "3|105000|4|121|3|1|-4980|42|20|"
    # Started before its due time (promoted a little early): no lateness.
    assert _after("ok", 99990, 100000) == "3|105000|4|121|2|1|-5010|42|0|"
    # Its due time unknown: no lateness either.
    assert _after("ok", 100020, None) == "3|105000|4|121|2|1|-4980|42|0|"


def test_a_skipped_run_counts_a_misfire_and_keeps_the_last_start_where_it_was() -> None:
    # The last start was at 100000 - 4998 = 95002: relative to the next slot now.
    assert _after("skip", 100020, 100000) == "3|105000|4|120|2|2|-9998|12|3|"
    never = b"1|100000|0|0|0|0||0|0|3|[]"
    assert _after("skip", 100020, 100000, never) == "1|105000|0|0|0|1||0|0|"


def test_the_worker_sends_a_head_for_a_run_from_its_bucket_that_did_not_fail() -> None:
    due = "100000:100000:3:0"
    run = Claimed("s:a", b"t|[]", 1, 0, 9, 4, due, None, None, RECORD, 100020)
    done = RunDone("ok", 42, 3, 105000, 105003)
    assert _heads(run, done) == (HEAD, "3|105000|4|121|2|1|-4980|42|20|")
    assert _heads(run, RunDone("fail", 42, 3, 105000, 105003, "boom")) is None, (
        "a failure's error goes through the script's own path (faults)"
    )
    queued = Claimed("s:a", b"t|[]", 1, 0, 9, 4, due, None, None, None, 100020)
    assert _heads(queued, done) is None, "no record: a run that went through `ready`"
