"""A probe for issue 15, not a part of drumbeat: Redis instructions per schedule run with a flat
schedule (one zset of schedules by next run and one hash of records per shard) against the
timing wheel of today, with the same work per run.

    python -m bench.flat_probe [--n 100000] [--due 100] [--rounds 4]

Registers ``--n`` schedules (as ``bench.redis_cpu harness`` does), copies their records and
next run times into one hash and one zset, makes s0..s<due - 1> due, then in each round claims
them with ``flat_probe/claim_flat.lua`` (100 a call) and settles them with finish_runs.lua whose
step per bucket is replaced by ``flat_probe/settle_flat.lua`` (one records hash and one zset in
place of the buckets), counting Redis's instructions with callgrind as the harness does. The
wheel's figure for the same case is ``python -m bench.redis_cpu harness --n 100000 --due 100
--rounds 4 --callgrind`` (each due run in a bucket of its own, as at low densities) or with
``--whole-buckets`` (a bucket's schedules due together, as at 100,000). Also prints Redis
memory per schedule of both layouts (``INFO`` used_memory, without valgrind).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

import redis

from bench._redis import RedisServer
from bench.redis_cpu import NAMESPACE, Callgrind, _register

HERE = Path(__file__).parent / "flat_probe"
BATCH = 100


def _wheel_copy(r: redis.Redis, n: int) -> tuple[dict[Any, Any], dict[Any, float]]:
    """Every bucket's records and next run times."""
    from drumbeat.keys import WHEEL_BUCKETS, Keys

    k = Keys(NAMESPACE)
    pipe = r.pipeline(transaction=False)
    for b in range(WHEEL_BUCKETS):
        pipe.hgetall(k.schedules(b))
        pipe.zrange(k.wheel(b), 0, -1, withscores=True)
    got = pipe.execute()
    fields: dict[Any, Any] = {}
    scores: dict[Any, float] = {}
    for h, z in zip(got[::2], got[1::2], strict=True):
        fields.update(h)
        scores.update(dict(z))
    assert len(fields) == n, f"found {len(fields)} records of {n}"
    return fields, scores


def _drop_wheel(r: redis.Redis) -> None:
    from drumbeat.keys import WHEEL_BUCKETS, Keys

    k = Keys(NAMESPACE)
    pipe = r.pipeline(transaction=False)
    for b in range(WHEEL_BUCKETS):
        pipe.delete(k.schedules(b), k.wheel(b))
    pipe.delete(k.due)
    pipe.execute()


def _write_flat(
    r: redis.Redis, fields: dict[Any, Any], scores: dict[Any, float]
) -> tuple[str, str]:
    """One hash of the records, one zset of the next run times; returns their keys."""
    records, sched = f"drumbeat:{{{NAMESPACE}}}:records", f"drumbeat:{{{NAMESPACE}}}:flat"
    items, pairs = list(fields.items()), list(scores.items())
    for lo in range(0, len(items), 10_000):
        r.hset(records, mapping=dict(items[lo : lo + 10_000]))
        r.zadd(sched, dict(pairs[lo : lo + 10_000]))
    return records, sched


def memory(n: int) -> tuple[float, float]:
    """Redis bytes per schedule (INFO used_memory): the wheel's keys (buckets and markers),
    then the flat ones."""
    with RedisServer() as server, server.client() as r:
        app = _register(server.url, n)
        try:
            fields, scores = _wheel_copy(r, n)
            with_wheel = int(r.info("memory")["used_memory"])
            _drop_wheel(r)
            empty = int(r.info("memory")["used_memory"])
            _write_flat(r, fields, scores)
            with_flat = int(r.info("memory")["used_memory"])
        finally:
            app.close()
    return (with_wheel - empty) / n, (with_flat - empty) / n


def one_round(
    r: redis.Redis, scripts: tuple[Any, Any], keys: tuple[list[str], list[str]], due: int,
    cg: Callgrind | None,
) -> tuple[int, int, int]:  # fmt: skip
    """Claims the due runs (BATCH a call) and settles them, their next runs due at once again;
    returns the runs and the instructions of each phase (0 without ``cg``)."""
    from drumbeat.replies import parse_claim

    claim, settle = scripts
    if cg:
        cg.on()
    jobs: list[Any] = []
    while len(jobs) < due:
        got = parse_claim(claim(keys=keys[0], args=[BATCH])).jobs
        assert got, f"claimed {len(jobs)} of {due} runs, then nothing"
        jobs += got
    claim_ir = cg.take() if cg else 0
    now = int(r.time()[0]) * 1000
    if cg:
        cg.on()
    for lo in range(0, len(jobs), BATCH):
        packed = []
        for job in jobs[lo : lo + BATCH]:
            was, grid, gen, _manual = job.extra.split(":")
            packed.append(
                f"{job.id}|{job.token}|ok|1|{gen}|{int(grid) + 5000}|{now - 1000}|{was}|0/1|"
            )
        out = settle(keys=keys[1], args=packed)
        assert all(x == 1 for x in out), f"settle refused runs: {out}"
    return len(jobs), claim_ir, cg.take() if cg else 0


def _settle_source() -> str:
    """finish_runs.lua up to its step per bucket (fencing, bookkeeping, runs grouped), then
    flat_probe/settle_flat.lua's step for the flat layout."""
    own = (Path(__file__).parents[1] / "src/drumbeat/lua/finish_runs.lua").read_text()
    start, cut = "-- (Defined here", "-- Totals and next runs, bucket by bucket"
    assert start in own and cut in own, "finish_runs.lua changed: update bench/flat_probe"
    return own[own.index(start) : own.index(cut)] + (HERE / "settle_flat.lua").read_text()


def prepare(
    r: redis.Redis, n: int, due: int
) -> tuple[tuple[Any, Any], tuple[list[str], list[str]]]:
    """The flat layout of the ``n`` schedules registered in ``NAMESPACE`` (their wheel dropped),
    s0..s<due - 1> due now and the rest a day later; returns the scripts and their keys."""
    from drumbeat.keys import Keys
    from drumbeat.scripts import _definitions, _with_lib

    lib = _definitions((Path(__file__).parents[1] / "src/drumbeat/lua/_lib.lua").read_text())
    k = Keys(NAMESPACE)
    fields, scores = _wheel_copy(r, n)
    _drop_wheel(r)
    now = int(r.time()[0]) * 1000
    for i in range(n):
        scores[f"s{i}".encode()] = now - 1000 if i < due else now + 86_400_000
    records, sched = _write_flat(r, fields, scores)
    scripts = (
        r.register_script(_with_lib((HERE / "claim_flat.lua").read_text(), lib)),
        r.register_script(_with_lib(_settle_source(), lib)),
    )
    keys = (
        [sched, records, k.tasks, k.state, k.owners, k.leases, k.fence, k.seq, k.lateness,
         k.ready],
        [k.due, k.leases, k.owners, k.state, k.faults, k.wake, k.jobs, records, sched],
    )  # fmt: skip
    return scripts, keys


def instructions(n: int, due: int, rounds: int) -> tuple[float, float]:
    """Median instructions per run, claiming and settling, over the rounds after the first."""
    cg = Callgrind()
    rows: list[tuple[float, float]] = []
    try:
        with RedisServer(binary=str(cg.wrapper)) as server, server.client() as r:
            assert server.proc is not None
            cg.pid = server.proc.pid
            app = _register(server.url, n)
            try:
                scripts, keys = prepare(r, n, due)
                for rnd in range(rounds):  # the first round warms Redis up
                    runs, claim_ir, settle_ir = one_round(
                        r, scripts, keys, due, cg if rnd else None
                    )
                    if rnd:
                        rows.append((claim_ir / runs, settle_ir / runs))
            finally:
                app.close()
    finally:
        cg.close()
    return statistics.median(c for c, _ in rows), statistics.median(f for _, f in rows)


def main() -> None:
    p = argparse.ArgumentParser(
        prog="python -m bench.flat_probe", description=__doc__.split("\n")[0]
    )
    p.add_argument("--n", type=int, default=100_000)
    p.add_argument("--due", type=int, default=100)
    p.add_argument("--rounds", type=int, default=4)
    a = p.parse_args()
    c, f = instructions(a.n, a.due, a.rounds)
    print(f"flat schedule, {a.n:,} schedules, {a.due} due per round, {a.rounds - 1} measured rounds"
          f" (medians): {(c + f) / 1e3:.1f} k Redis instructions per run (claiming {c / 1e3:.1f} k,"
          f" settling {f / 1e3:.1f} k)")  # fmt: skip
    wheel, flat = memory(a.n)
    print(f"Redis memory per schedule: wheel {wheel:.0f} B (buckets and markers), flat {flat:.0f} B"
          " (one zset, one hash)")  # fmt: skip


if __name__ == "__main__":
    main()
