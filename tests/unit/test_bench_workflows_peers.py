"""bench.workflows_peers' pure parts: the child's RESULT line, the medians and ratios against
drumbeat, and the table naming a peer stopped at the bound with what it reached."""

from __future__ import annotations

import json

import pytest
from bench.workflows_peers import _run_note, format_table, parse_result, summarize


def _run(system: str, seconds: float, finished: bool = True, reached: int = 100) -> dict:
    return {"system": system, "seconds": seconds, "finished": finished, "enqueue_s": 0.5,
            "reached": reached}  # fmt: skip


def test_parse_result_takes_the_last_result_line_among_other_output() -> None:
    first, last = _run("rq", 1.0), _run("rq", 2.0)
    out = f"noise\nRESULT {json.dumps(first)}\nmore noise\nRESULT {json.dumps(last)}\n"
    assert parse_result(out) == last


@pytest.mark.parametrize("out", ["", "no result here\n", "RESULT [1, 2]\n"])
def test_parse_result_refuses_output_without_a_result_object(out: str) -> None:
    with pytest.raises(ValueError):
        parse_result(out)


def test_summarize_gives_medians_and_ratios_against_drumbeat() -> None:
    summary = summarize({
        "drumbeat": [_run("drumbeat", s) for s in (1.0, 3.0, 2.0)],
        "celery": [_run("celery", s) for s in (9.0, 7.0, 8.0)],
    })  # fmt: skip
    assert summary["drumbeat"]["median"] == 2.0 and summary["drumbeat"]["ratio"] == 1.0
    assert summary["celery"]["median"] == 8.0 and summary["celery"]["ratio"] == 4.0
    assert summary["celery"]["seconds"] == [9.0, 7.0, 8.0], "runs kept in the order they ran"


def test_a_peer_stopped_at_the_bound_has_no_median_and_says_what_it_reached() -> None:
    summary = summarize({
        "drumbeat": [_run("drumbeat", 2.0)],
        "rq": [_run("rq", 300.4, finished=False, reached=6_543)],
    })  # fmt: skip
    assert summary["rq"]["median"] is None and summary["rq"]["ratio"] is None
    assert not summary["rq"]["finished"]
    table = format_table(summary, 10_000, 300)
    rq_line = next(x for x in table.splitlines() if x.startswith("rq"))
    assert "> 300 s" in rq_line and "6,543 of 10,000 members ended" in rq_line, rq_line
    assert "> 150x slower" in rq_line, rq_line
    db_line = next(x for x in table.splitlines() if x.startswith("drumbeat"))
    assert "2.00 s" in db_line and "1.0x" in db_line, db_line


def test_a_peer_still_enqueueing_at_the_bound_is_told_apart() -> None:
    row = {**_run("rq", 300.2, finished=False, reached=968), "enqueue_s": None}
    summary = summarize({"drumbeat": [_run("drumbeat", 2.0)], "rq": [row]})
    assert summary["rq"]["enqueue"] is None
    rq_line = next(x for x in format_table(summary, 2_000, 300).splitlines() if x.startswith("rq"))
    assert "unreturned" in rq_line and "968 of 2,000 members ended" in rq_line, rq_line
    assert _run_note(row).startswith("its enqueue call had not returned, 968 members ended")
