"""bench.periodic's drumbeat-only options: a supervised pool of worker processes and a task
that sleeps, passed to drumbeat's worker role and to nothing else."""

from __future__ import annotations

import pytest
from bench.periodic import parse_args, recovery
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


def test_recovery_is_when_every_second_after_the_squeeze_is_on_time_again() -> None:
    # 10 s window, squeezed for the first 3 s: late runs until 5.5 s, one late straggler at
    # 7.2 s, then on time.
    starts = [0.5, 1.5, 2.5, 3.5, 4.5, 5.5, 6.5, 7.2, 8.5, 9.5]
    lateness = [0.4, 0.9, 1.2, 0.8, 0.3, 0.2, 0.01, 0.15, 0.01, 0.02]
    got = recovery(starts, lateness, squeeze=3.0, duration=10.0)
    assert got["recovery_s"] == 5.0  # every second from 8 s on is under RECOVERED_S
    assert got["late_p99_squeezed"] == 1.2
    assert got["late_p99_recovered"] == 0.02
    never = recovery(starts, [1.0] * len(starts), squeeze=3.0, duration=10.0)
    assert never["recovery_s"] == 7.0 and "late_p99_recovered" not in never
    at_once = recovery(starts, [0.01] * len(starts), squeeze=3.0, duration=10.0)
    assert at_once["recovery_s"] == 0.0


def test_squeeze_is_an_option_for_every_system() -> None:
    _, cfg = parse_args(["--systems", "drumbeat,arq", "--squeeze", "10"])
    assert cfg.squeeze == 10.0
