"""What Redis spends on a run of a plain schedule in the time slots, in instructions (callgrind):
a figure the host's load does not move, for changes of a few per cent to the slot scripts.

    python -m bench.slots_cpu [--n 100000] [--every 5] [--limit 50] [--cycles 20]
                              [--rounds 3] [--keep DIR] [--no-callgrind]

Starts a private redis-server under ``valgrind --tool=callgrind --instr-atstart=no``, registers
``--n`` schedules every ``--every`` s (an async no-op task; drumbeat spreads their phases over
the interval: 20 a 1-ms slot at 100,000 every 5 s), waits an interval so that every one is due
(and folds their slots into one interval: `_one_interval`; the lateness ring is filled as a
Redis up for a while holds it: `_age_lateness`), then runs cycles as a worker's time-slot lane
that keeps up does (`Cycles.claim`): a claim of up to ``--limit`` runs with the reads of its
lots in one write (`SlotLane.calls`, `SlotLane.took`, through `Link`), each run's end built by
the runner's code (`decode_run`, `ScheduleRun.next`: ok, no time spent), and one settle of them
(`slot_item`, `SlotScripts.settle`, with the lots found all settled, as `Settler` sends it).
``--limit 50`` is about what each claim and each settle carried in `bench.periodic` at 100,000
every 5 s (its "Redis time per run": an `RENAME` per 20 runs, an `HMGET` of `where` per ~60).
Instrumentation is on only around the claims (in one round of ``--cycles`` cycles) or only
around the settles (in the next), so each figure is Redis's own work for those calls, with its
event loop's share; Redis's timer (`serverCron`, at ``hz 1``) is left out. A warm-up round
comes first. Prints the claiming and settling instructions per run of each round and their
medians. ``--keep DIR`` keeps each round's dump (``callgrind_annotate DIR/claim-1.callgrind``).
``--no-callgrind`` runs the same cycles on a plain redis-server (to try the harness quickly).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import redis.asyncio as aredis

from ._redis import RedisServer
from .machine import cpu_model
from .redis_cpu import Callgrind, _register

NAMESPACE = "slotcpu"
TASK = "bench.slots_cpu.noop"
# The lateness ring's window (LATENESS_WINDOW_MS in _lib.lua), and how close to its end a
# measured claim may start (callgrind_control takes a few hundred ms to switch counting on).
_WINDOW_MS = 10_000
_WINDOW_GUARD_MS = 2000
# A worker that keeps up claims from a shard at most every 5 ms (`slotted._PACE_MS`).
_PACED_MS = 5


class Cycles:
    """A worker's time-slot lane on shard 0, driven one claim and one settle at a time."""

    def __init__(self, client: aredis.Redis, settings: Any, limit: int) -> None:
        from drumbeat.keys import Keys
        from drumbeat.schedules.slots import SlotScripts
        from drumbeat.worker.link import Link
        from drumbeat.worker.slotted import SlotLane

        self.client, self.limit = client, limit
        self.link = Link(client)
        self.lane = SlotLane("bench-1", [Keys(NAMESPACE)], settings, [0])
        self.scripts = SlotScripts(Keys(NAMESPACE))
        self.now = 0

    async def claim(self) -> list[Any]:
        """One claim and the reads of its lots; the runs it took. The lane is told it is
        `_PACED_MS` past the oldest slot it knows (Redis's clock is far ahead: every slot is
        due), so it claims as a worker that keeps up does, the slots of its last few ms, and
        asks for the upcoming slots again only when its list runs low; told the real time, it
        would take a backlog's random stretches and ask for the upcoming slots every claim."""
        known = self.lane._upcoming[0]
        calls = self.lane.calls(0, self.limit, (known[0] if known else 0) + _PACED_MS)
        replies = await self.link.run(calls)
        result, runs = await self.lane.took(0, replies, self.client)
        self.now = result.now_ms
        return runs

    def ends(self, runs: Sequence[Any]) -> list[Any]:
        """Each run's settle, as the runner and the settler build it for a no-op that ended
        now."""
        from drumbeat.schedule_run import decode_run
        from drumbeat.worker.settle_kinds import slot_item

        out = []
        start = (self.now, time.monotonic())
        for job in runs:
            decoded = decode_run(job, None, start, lambda: self.now)
            done = decoded if not isinstance(decoded, tuple) else decoded[0].next("ok")
            out.append(slot_item(job, done))
        return out

    async def settle(self, runs: Sequence[Any], settled: Sequence[Any]) -> None:
        claims = self.lane.claims[0]
        call = self.scripts.settle(claims.incarnation, settled, claims.drops())
        (reply,) = await self.link.run([call])
        if any(r != 1 for r in reply):
            raise RuntimeError(f"settles refused or changed: {reply}")
        for job in runs:
            claims.done(job.slot_run.lot)


def _one_interval(client: Any, every_ms: int) -> None:
    """Folds the slots into one interval, from the earliest on: a registration that took
    longer than an interval spread each phase's first runs over several, where a worker that
    kept up finds each phase's runs in one slot (20 a slot at 100,000 every 5 s). `where`
    follows each entry."""
    from drumbeat.keys import Keys

    k = Keys(NAMESPACE)
    slots = [int(ms) for ms in client.zrange(k.slots, 0, -1)]
    first = slots[0]
    moves = [(ms, first + (ms - first) % every_ms) for ms in slots]
    moves = [(ms, to) for ms, to in moves if to != ms]
    for at in range(0, len(moves), 500):
        chunk = moves[at : at + 500]
        with client.pipeline(transaction=False) as pipe:
            for ms, _ in chunk:
                pipe.lrange(k.slot(ms), 0, -1)
            lists = pipe.execute()
        with client.pipeline(transaction=False) as pipe:
            for (ms, to), entries in zip(chunk, lists, strict=True):
                pipe.rpush(k.slot(to), *entries)
                pipe.delete(k.slot(ms))
                pipe.zrem(k.slots, ms)
                pipe.zadd(k.slots, {str(to): to})
                ids = [e.partition(b"|")[0] for e in entries]
                pipe.hset(k.where, mapping=dict.fromkeys(ids, to))
            pipe.execute()


def _age_lateness(client: Any) -> None:
    """Fills the lateness ring's other windows as a Redis up for a quarter of an hour holds
    them (a window, a max and the bins of 2-30 ms each: _lib.lua's record_lateness), so the
    hash is a hashtable (past 512 fields), as it is after that, and not the listpack of a fresh
    start, whose linear lookups would be counted against the claims."""
    from drumbeat.keys import Keys

    window = int(client.time()[0]) // 10  # LATENESS_WINDOW_MS
    fields: dict[str, int] = {}
    for w in range(window - 90, window):  # LATENESS_WINDOWS - 1 windows before this one
        slot = w % 91
        fields |= {f"w{slot}": w, f"m{slot}": 30}
        fields |= {f"b{slot}:{b}": 1000 for b in range(6, 20)}
    # The counters since the start, as a day at 20,000 runs a second leaves them: formatting
    # their sums costs more as they grow (glibc's printf of a large double), so a fresh ring
    # made each round dearer than the one before.
    fields |= {f"c{b}": 10**8 for b in range(64)} | {"cs": 2 * 10**10}
    client.hset(Keys(NAMESPACE).lateness, mapping=fields)


def _cron(dump: Path) -> int:
    """The instructions of Redis's timer (``serverCron``: memory stats, expiry, rehashing)
    in a dump: it runs by the clock, not per call, so it is left out."""
    out = subprocess.run(["callgrind_annotate", "--inclusive=yes", str(dump)],
                         check=True, capture_output=True, text=True).stdout  # fmt: skip
    for line in out.splitlines():
        if re.search(r":serverCron(\s|$)", line):  # "5,206,757 (14.42%)  ???:serverCron [...]"
            return int(line.split()[0].replace(",", ""))
    return 0


async def _new_window_soon(client: aredis.Redis) -> bool:
    """Waits past the lateness ring's next window (record_lateness) when it is due within
    `_WINDOW_GUARD_MS`; True if it did, and the next claim, which clears that window's slot
    of the ring (an HDEL of its 214 fields, once every 10 s in a worker's life: once per 200,000
    runs at 20,000 a second), is then left out of the count. Under valgrind a round's 1,000
    runs take about 10 s: counted, it would add about 0.8 k instructions a run to one round in
    two."""
    secs, us = await client.time()
    ms = secs * 1000 + us // 1000
    left = _WINDOW_MS - ms % _WINDOW_MS
    if left > _WINDOW_GUARD_MS:
        return False
    await asyncio.sleep((left + 20) / 1000)
    return True


def _both(c: Cycles, runs: list[Any]) -> tuple[list[Any], list[Any]]:
    return runs, c.ends(runs)


async def _round(c: Cycles, phase: str, cycles: int, cg: Callgrind | None) -> int:
    """``cycles`` claims and settles, counted around the claims or the settles (``phase``);
    returns the runs of the cycles counted."""
    runs_in_round = 0
    for _ in range(cycles):
        if await _new_window_soon(c.client):
            await c.settle(*_both(c, await c.claim()))  # not measured
        if cg is not None and phase == "claim":
            cg.on()
        runs = await c.claim()
        if cg is not None and phase == "claim":
            cg.off()
        settled = c.ends(runs)
        if cg is not None and phase == "settle":
            cg.on()
        await c.settle(runs, settled)
        if cg is not None and phase == "settle":
            cg.off()
        runs_in_round += len(runs)
    return runs_in_round


def _take(cg: Callgrind, dump: Path, keep: bool) -> int:
    """The instructions counted since the round began, less the timer's."""
    ir = cg.take(dump) - _cron(dump)
    if not keep:
        dump.unlink()
    return ir


async def _measure(
    url: str, settings: Any, args: argparse.Namespace, cg: Callgrind | None
) -> list[tuple[str, int, int]]:
    """(phase, instructions, runs) of each measured round."""
    client = aredis.Redis.from_url(url)
    c = None
    try:
        c = Cycles(client, settings, args.limit)
        await c.claim()  # registers the incarnation and learns the upcoming slots
        await _round(c, "warm-up", args.cycles, cg)
        out: list[tuple[str, int, int]] = []
        for n, phase in enumerate(["claim", "settle"] * args.rounds):
            runs = await _round(c, phase, args.cycles, cg)
            ir = 0
            if cg is not None:
                name = f"{phase}-{n // 2 + 1}.callgrind"
                dump = args.keep / name if args.keep is not None else Path(cg.dir) / name
                ir = _take(cg, dump, keep=args.keep is not None)
            out.append((phase, ir, runs))
            print(f"  {phase}: {runs} runs, {ir / max(runs, 1) / 1e3:.2f} k instructions a run",
                  flush=True)  # fmt: skip
        return out
    finally:
        if c is not None:
            await c.link.aclose()
        await client.aclose()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.slots_cpu", description=__doc__.split("\n")[0]
    )
    p.add_argument("--n", type=int, default=100_000, help="schedules registered")
    p.add_argument("--every", type=float, default=5.0, help="their interval (s)")
    p.add_argument("--limit", type=int, default=50, help="runs a claim takes at most")
    p.add_argument("--cycles", type=int, default=20, help="claims (and settles) a round")
    p.add_argument("--rounds", type=int, default=3, help="measured rounds of each phase")
    p.add_argument("--keep", type=Path, metavar="DIR", help="keep each round's callgrind dump")
    p.add_argument("--no-callgrind", action="store_true", help="a plain redis-server")
    args = p.parse_args(argv)
    if not args.no_callgrind and shutil.which("valgrind") is None:
        p.error("valgrind is missing (Debian: apt-get install valgrind)")
    print(f"$ python -m bench.slots_cpu --n {args.n} --every {args.every:g} --limit {args.limit}"
          f" --cycles {args.cycles} --rounds {args.rounds}"
          + (" --no-callgrind" if args.no_callgrind else ""))  # fmt: skip
    print(f"CPU: {cpu_model()}; Python {sys.version.split()[0]}")
    cg = None if args.no_callgrind else Callgrind(args.keep)
    try:
        with RedisServer(binary=str(cg.wrapper) if cg else None) as server:
            if cg is not None:
                assert server.proc is not None
                cg.pid = server.proc.pid
            with server.client() as r:
                r.config_set("hz", 1)  # the timer's instructions are left out (`_cron`)
                # Under valgrind every script is "slow": logging each would be counted.
                r.config_set("slowlog-log-slower-than", -1)
            started = time.monotonic()
            app = _register(server.url, args.n, namespace=NAMESPACE, task=TASK, every=args.every)
            settings = app.settings
            app.close()
            print(f"registered {args.n:,} in {time.monotonic() - started:.0f} s", flush=True)
            time.sleep(args.every + 0.5)  # every schedule's first run is due
            with server.client() as r:
                _one_interval(r, round(args.every * 1000))
                _age_lateness(r)
            rounds = asyncio.run(_measure(server.url, settings, args, cg))
    finally:
        if cg is not None:
            cg.close()
    per: dict[str, list[float]] = {"claim": [], "settle": []}
    for phase, ir, runs in rounds:
        per[phase].append(ir / max(runs, 1))
    claim, settle = (statistics.median(per[k]) for k in ("claim", "settle"))
    print(f"Redis instructions per run (median of {args.rounds}): claiming {claim / 1e3:.2f} k, "
          f"settling {settle / 1e3:.2f} k, total {(claim + settle) / 1e3:.2f} k")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
