"""bench.periodic's drumbeat-only options: a supervised pool of worker processes and a task
that sleeps, passed to drumbeat's worker role and to nothing else."""

from __future__ import annotations

import pytest
from bench.periodic import parse_args
from bench.periodic_peers.drumbeat import Pool, split_args


def test_processes_reach_drumbeats_worker_role_as_its_own_options() -> None:
    _, cfg = parse_args(["--systems", "drumbeat", "--processes", "2", "--task-sleep", "0.3"])
    flags = cfg.drumbeat_flags()
    assert flags == ["--processes", "2", "--task-sleep", "0.3"]
    pool, rest = split_args(["worker", "--url", "redis://x", *flags, "--n", "5"])
    assert pool == Pool(processes=2, task_sleep=0.3)
    assert pool.flags() == ["--processes", "2"]
    assert rest == ["worker", "--url", "redis://x", "--n", "5"]
    assert split_args(["worker", "--autoscale", "1:2"])[0].flags() == ["--autoscale", "1:2"]
    assert split_args(["worker"])[0].flags() == [], "no pool: the worker runs in-process"


@pytest.mark.parametrize(
    "argv",
    [
        ["--systems", "drumbeat,saq", "--processes", "2"],
        ["--task-sleep", "0.3"],
        ["--systems", "drumbeat", "--processes", "2", "--autoscale", "1:2"],
    ],
)
def test_drumbeat_only_options_are_refused_elsewhere(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(argv)
