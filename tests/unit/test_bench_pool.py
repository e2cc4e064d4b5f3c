"""The drain with several processes: how the harness counts the jobs of processes it did not
start itself (each writes its counts to a directory), and finds a pool's processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from bench.adapter import SINK_DIR_ENV, Sink, read_sink
from bench.core import descendants, pool_lines, tree_usage


def test_a_sink_writes_its_counts_for_the_harness(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SINK_DIR_ENV, str(tmp_path))
    sink = Sink()
    for _ in range(3):
        sink.noop()
    deadline = time.monotonic() + 10
    while (found := read_sink(str(tmp_path))) == {} or next(iter(found.values()))["count"] < 3:
        assert time.monotonic() < deadline, f"the sink wrote {found} within 10 s; expected 3"
        time.sleep(0.02)
    (entry,) = found.values()
    assert entry["count"] == 3 and entry["first_at"] is not None


def test_a_pools_processes_are_its_descendants() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        tree = descendants([child.pid])
        assert tree == [child.pid]
        assert child.pid in descendants([os.getpid()])
        cpu, hwm = tree_usage(tree)
        assert cpu >= 0 and hwm > 0, f"expected a live process's CPU and VmHWM, got {cpu}, {hwm}"
    finally:
        child.kill()
        child.wait()


def test_the_report_says_how_each_system_ran_several_processes() -> None:
    data = {
        "runs": {
            "drumbeat": [{"pool": "`drumbeat worker APP --processes N`"}],
            "arq": [{"pool": None}],
        }
    }
    lines = pool_lines(data)
    assert "- drumbeat: `drumbeat worker APP --processes N`" in lines
    assert "- arq: N copies of its one-process worker" in lines
