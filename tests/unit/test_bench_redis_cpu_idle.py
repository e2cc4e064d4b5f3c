"""`python -m bench.redis_cpu idle` measures a claim that finds nothing due: one script call
per claim, on a private redis-server it starts and stops."""

from __future__ import annotations

import re

import pytest
from bench.redis_cpu import main


def test_idle_claims_find_nothing_and_report_one_call_each(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["idle", "--n", "300", "--calls", "5"]) == 0
    out = capsys.readouterr().out
    assert "idle claims: 300 schedules, none due, 5 calls" in out
    # (CPU time itself may read 0 over 5 calls where the kernel accounts it per tick.)
    cpu = re.search(r"Redis CPU per claim: [\d.]+ µs; commands per claim: (.*)", out)
    assert cpu is not None, out
    assert "evalsha 1" in cpu.group(1).split(", "), cpu.group(1)
