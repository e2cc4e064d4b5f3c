"""`python -m bench.slots_cpu` drives the time-slot scripts as a worker's lane does (claims with
the reads of their lots, then settles that Redis accepts whole) on a private redis-server; with
``--no-callgrind`` it counts nothing but runs the same cycles."""

from __future__ import annotations

import re

import pytest
from bench import slots_cpu
from bench._redis import RedisServer


def test_cycles_claim_and_settle_every_run_they_take(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--no-callgrind", "--n", "2000", "--every", "1", "--limit", "10", "--cycles", "3"]
    assert slots_cpu.main([*argv, "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    # The settle raises unless Redis settled every run it was sent.
    for phase in ("claim", "settle"):
        got = re.search(rf"{phase}: (\d+) runs", out)
        assert got is not None and 0 < int(got.group(1)) <= 30, out
    assert "Redis instructions per run (median of 1)" in out


def test_slots_fold_into_one_interval_and_where_follows() -> None:
    from drumbeat.keys import Keys

    k = Keys(slots_cpu.NAMESPACE)
    with RedisServer() as server, server.client() as r:
        for ms, ids in ((1000, ["a"]), (1500, ["b"]), (3000, ["c", "d"]), (6500, ["e"])):
            r.rpush(k.slot(ms), *(f"{i}|rec" for i in ids))
            r.zadd(k.slots, {str(ms): ms})
            r.hset(k.where, mapping=dict.fromkeys(ids, ms))
        slots_cpu._one_interval(r, 2000)
        assert [int(ms) for ms in r.zrange(k.slots, 0, -1)] == [1000, 1500, 2500]
        assert r.lrange(k.slot(1000), 0, -1) == [b"a|rec", b"c|rec", b"d|rec"]
        assert r.lrange(k.slot(2500), 0, -1) == [b"e|rec"]
        assert not r.exists(k.slot(3000), k.slot(6500))
        assert r.hgetall(k.where) == {b"a": b"1000", b"b": b"1500", b"c": b"1000",
                                      b"d": b"1000", b"e": b"2500"}  # fmt: skip
