"""A probe for issue 15: Redis instructions per schedule run when the schedule is kept as time
slots (one list per millisecond of entries "<id>|<record>") and runs in flight are leased per
worker, against the timing wheel.

    python -m bench.slots_probe [--n 100000] [--due 1000] [--per-slot 20] [--rounds 4]
        [--scripts probe|drumbeat]

``--scripts drumbeat`` drives drumbeat's own time-slot scripts (`drumbeat.slots.SlotScripts`:
claim_slots.lua and settle_slots.lua, lateness recording included, the worker's settled entries
built by `drumbeat.slots.settled_record`) in place of the probe's, measured the same way; the
rest of this text is about the probe's own scripts (the default), which came first.

Registers ``--n`` schedules (as ``bench.redis_cpu harness`` does), moves their records into
slot lists (``--per-slot`` entries a slot: 20 is 100,000 schedules every 5 s in 1-ms slots),
makes ``--due`` of them due, then in each round claims them (``slots_probe/claim_slots.lua``,
100 a call, passing the due slots as a worker would from the last reply's upcoming list) and
settles them (``slots_probe/settle_slots.lua``, 100 a call, each schedule's next entry built in
Python), counting Redis's instructions with callgrind as the harness does. The wheel's figure
for the same load is ``python -m bench.redis_cpu harness --n 100000 --due 90 --rounds 4
--callgrind --whole-buckets``. Also prints Redis memory per schedule of both layouts, and the
Python time to build a settled entry against today's packed ``finish_runs`` argument.

What the probe leaves out, each a cost of the design it measures: lateness figures (the
workers would keep the histogram and add it to Redis once a second, not per run), failures
(written to `faults` as today, only for failed runs), runs a claim has no slot for (they stay
in their slot), and finding a schedule's entry to change or remove it (`where` names its slot).
"""

from __future__ import annotations

import argparse
import statistics
import timeit
from pathlib import Path
from typing import Any

import redis

from bench._redis import RedisServer
from bench.flat_probe import _drop_wheel, _wheel_copy
from bench.redis_cpu import NAMESPACE, Callgrind, _register

HERE = Path(__file__).parent / "slots_probe"
BATCH = 100
WORKER = "w1"
PREFIX = f"drumbeat:{{{NAMESPACE}}}:"
SLOTS, WHERE, WORKERS = PREFIX + "slots", PREFIX + "where", PREFIX + "workers"
INFLIGHT = PREFIX + "inflight:" + WORKER


def slot_key(start: int) -> str:
    return f"{PREFIX}t:{start}"


def settled_entry(entry: str, started: int, ms: int, next_grid: int) -> str:
    """A schedule's entry after a run that went well: what finish_runs.lua's after_run writes
    (runs + 1, last start relative to the next grid slot, duration, lateness), built by the
    worker."""
    sid, gen, grid, flags, runs, fails, misf, _rel, _ms, _late, rest = entry.split("|", 10)
    late = max(0, started - int(grid))
    return (
        f"{sid}|{gen}|{next_grid}|{flags}|{int(runs) + 1}|{fails}|{misf}|{started - next_grid}|"
        f"{ms}|{late}|{rest}"
    )


def _place(
    r: redis.Redis, entries: dict[str, str], slot_of: dict[str, int], *, own: bool = False
) -> None:  # fmt: skip
    """Writes each entry into its slot's list, the slots into `slots` and `where` (``own``:
    drumbeat's keys, else the probe's)."""
    from drumbeat.keys import Keys

    k = Keys(NAMESPACE)
    key_of, slots, where = (k.slot, k.slots, k.where) if own else (slot_key, SLOTS, WHERE)
    by_slot: dict[int, list[str]] = {}
    for sid, slot in slot_of.items():
        by_slot.setdefault(slot, []).append(entries[sid])
    pipe = r.pipeline(transaction=False)
    for slot, items in by_slot.items():
        pipe.rpush(key_of(slot), *items)
        pipe.zadd(slots, {str(slot): slot})
        if len(pipe) > 10_000:
            pipe.execute()
    pipe.execute()
    pairs = list(slot_of.items())
    for lo in range(0, len(pairs), 10_000):
        r.hset(where, mapping=dict(pairs[lo : lo + 10_000]))


def prepare(
    r: redis.Redis, n: int, due: int, per_slot: int, *, own: bool = False
) -> tuple[list[int], dict[str, str]]:
    """The slot layout of the ``n`` schedules registered in ``NAMESPACE`` (their wheel dropped):
    s0..s<due - 1> in slots a second in the past, ``per_slot`` each, the rest ``per_slot`` a slot
    a day later. Returns the due slots, in order, and every entry."""
    fields, _scores = _wheel_copy(r, n)
    _drop_wheel(r)
    entries = {k.decode(): f"{k.decode()}|{v.decode()}" for k, v in fields.items()}
    now = int(r.time()[0]) * 1000
    slot_of: dict[str, int] = {}
    for i in range(n):
        base = now - 1000 if i < due else now + 86_400_000
        slot_of[f"s{i}"] = base + (i if i < due else i - due) // per_slot
    _place(r, entries, slot_of, own=own)
    return sorted({slot_of[f"s{i}"] for i in range(due)}), entries


def claim_all(
    r: redis.Redis, claim: Any, slots: list[int], per_slot: int, expected: int
) -> list[str]:  # fmt: skip
    """Claims every entry of ``slots`` (``per_slot`` each), BATCH a call, passing the slots
    that hold what the call has room for, as a worker does with its upcoming list."""
    out: list[str] = []
    left = {s: per_slot for s in slots}
    pending = list(slots)
    while len(out) < expected:
        passed = pending[: BATCH // per_slot + 1]
        got = claim(
            keys=[SLOTS, INFLIGHT, WORKERS, *(slot_key(s) for s in passed)],
            args=[WORKER, BATCH, 60_000, *passed],
        )
        entries = [e.decode() for e in got[2:]]
        assert entries, f"claimed {len(out)} of {expected} runs, then nothing"
        out += entries
        _took(pending, left, len(entries))
    return out


def _took(pending: list[int], left: dict[int, int], took: int) -> None:
    """Counts ``took`` entries off the slots ``pending`` (in order, ``left`` in each); a slot
    emptied leaves ``pending``."""
    while took and pending:
        s = pending[0]
        used = min(took, left[s])
        left[s] -= used
        took -= used
        if left[s] == 0:
            pending.pop(0)


def settle_all(r: redis.Redis, settle: Any, entries: list[str], to_slot: dict[str, int]) -> None:
    """Settles the claimed ``entries``, BATCH a call, each schedule's next entry into the slot
    ``to_slot`` names."""
    now = int(r.time()[0]) * 1000
    for lo in range(0, len(entries), BATCH):
        ids, pairs, groups = [], [], {}
        for entry in entries[lo : lo + BATCH]:
            sid = entry[: entry.index("|")]
            slot = to_slot[sid]
            ids.append(sid)
            pairs += [sid, slot]
            groups.setdefault(slot, []).append(settled_entry(entry, now, 1, slot))
        args: list[Any] = [len(ids), *ids, *pairs]
        for slot, items in groups.items():
            args += [slot, slot, len(items), *items]
        out = settle(keys=[INFLIGHT, WHERE, SLOTS, *(slot_key(s) for s in groups)], args=args)
        assert out == [1] * len(ids), f"settle refused runs: {out}"


def scripts(r: redis.Redis) -> tuple[Any, Any]:
    return (
        r.register_script((HERE / "claim_slots.lua").read_text()),
        r.register_script((HERE / "settle_slots.lua").read_text()),
    )


class Drumbeat:
    """drumbeat's own time-slot scripts behind the probe's claim and settle, for one worker
    incarnation that claims BATCH runs a call and settles them BATCH a call."""

    def __init__(self) -> None:
        from drumbeat.keys import Keys
        from drumbeat.schedules.slots import Claims, SlotScripts

        self.keys = Keys(NAMESPACE)
        self.s = SlotScripts(self.keys)
        self.claims = Claims("w1.1")
        self.number = 0

    def claim_all(self, r: redis.Redis, slots: list[int], per_slot: int, expected: int) -> list:
        """Claims every entry of ``slots``, passing those with room for it, and reads the lots
        in the same round trip, as a worker does."""
        from drumbeat.scripts import SOURCES
        from drumbeat.schedules.slots import read_lot

        r.script_load(SOURCES["claim_slots"])  # sent as EVALSHA in a pipeline below
        out: list = []
        left = {s: per_slot for s in slots}
        pending = list(slots)
        while len(out) < expected:
            passed = pending[: BATCH // per_slot + 1]
            self.number += 1
            claim = self.s.claim(
                "w1.1", BATCH, 60_000, passed, self.number, first=self.number == 1, upcoming=0
            )
            pipe = r.pipeline(transaction=False)
            for call in [claim, *self.s.reads("w1.1", self.number, passed)]:
                pipe.execute_command(*call.command())
            raw, *lots = pipe.execute()
            got = claim.parse(raw)
            read = [read_lot("", ms, lot) for ms, lot in zip(passed, lots, strict=True)]
            entries = [e for lot in read for e in lot.entries]
            assert entries, f"claimed {len(out)} of {expected} runs, then nothing"
            for taken, ms in zip(got.taken, passed, strict=True):
                self.claims.took(f"{self.number}:{ms}", taken)
            out += [(e, f"{self.number}:{e.slot_ms}", got.now_ms) for e in entries]
            _took(pending, left, len(entries))
        return out

    def settle_all(self, r: redis.Redis, claimed: list, to_slot: dict[str, int]) -> None:
        """Settles ``claimed`` runs (each a success of 1 ms), BATCH a call, each schedule's next
        entry built by the worker's `settled_record` into the slot ``to_slot`` names; each
        call drops the claim lists found all settled before it."""
        from drumbeat.schedules.slots import Settled, settled_record

        for lo in range(0, len(claimed), BATCH):
            runs = []
            for e, _, now in claimed[lo : lo + BATCH]:
                nxt = to_slot[e.schedule_id]
                record = settled_record(
                    e.record, outcome="ok", started_ms=now, duration_ms=1, next_grid_ms=nxt,
                    due_ms=e.due_ms, first_start_ms=e.first_start_ms,
                )  # fmt: skip
                runs.append(Settled(e.schedule_id, f"{e.schedule_id}|{record}", nxt, e.slot_ms))
            out = self.s.settle("w1.1", runs, self.claims.drops()).run(r)
            assert out == [1] * len(runs), f"settle refused runs: {out}"
            for _, number, _ in claimed[lo : lo + BATCH]:
                self.claims.done(number)


def one_round(
    r: redis.Redis, probe: tuple[Any, Any] | Drumbeat, slots: list[int], per_slot: int,
    due: int, *, cg: Callgrind | None,
) -> tuple[list[int], int, int]:  # fmt: skip
    """Claims the ``due`` entries of ``slots`` and settles them into new slots a second in the
    past (due again); returns those slots and the instructions of each phase (0 without
    ``cg``)."""
    base = int(r.time()[0]) * 1000 - 1000 - due
    while base in slots or base + due // per_slot in slots:
        base -= due
    if cg:
        cg.on()
    if isinstance(probe, Drumbeat):
        claimed = probe.claim_all(r, slots, per_slot, due)
        ids = [e.schedule_id for e, _, _ in claimed]
    else:
        got = claim_all(r, probe[0], slots, per_slot, due)
        ids = [e[: e.index("|")] for e in got]
    claim_ir = cg.take() if cg else 0
    to_slot = {sid: base + i // per_slot for i, sid in enumerate(ids)}
    if cg:
        cg.on()
    if isinstance(probe, Drumbeat):
        probe.settle_all(r, claimed, to_slot)
    else:
        settle_all(r, probe[1], got, to_slot)
    settle_ir = cg.take() if cg else 0
    return sorted(set(to_slot.values())), claim_ir, settle_ir


def instructions(
    n: int, due: int, per_slot: int, rounds: int, *, own: bool = False
) -> tuple[float, float]:
    """Median instructions per run, claiming and settling, over the rounds after the first;
    ``own``: with drumbeat's scripts."""
    cg = Callgrind()
    rows: list[tuple[float, float]] = []
    try:
        with RedisServer(binary=str(cg.wrapper)) as server, server.client() as r:
            assert server.proc is not None
            cg.pid = server.proc.pid
            app = _register(server.url, n)
            try:
                probe = Drumbeat() if own else scripts(r)
                slots, _ = prepare(r, n, due, per_slot, own=own)
                for rnd in range(rounds):  # the first round warms Redis up
                    slots, claim_ir, settle_ir = one_round(
                        r, probe, slots, per_slot, due, cg=cg if rnd else None
                    )
                    if rnd:
                        rows.append((claim_ir / due, settle_ir / due))
            finally:
                app.close()
    finally:
        cg.close()
    return statistics.median(c for c, _ in rows), statistics.median(f for _, f in rows)


def memory(n: int) -> tuple[float, float]:
    """Redis bytes per schedule (INFO used_memory): the wheel's keys, then the slots'."""
    with RedisServer() as server, server.client() as r:
        app = _register(server.url, n)
        try:
            with_wheel = int(r.info("memory")["used_memory"])
            fields, _ = _wheel_copy(r, n)
            _drop_wheel(r)
            empty = int(r.info("memory")["used_memory"])
            entries = {k.decode(): f"{k.decode()}|{v.decode()}" for k, v in fields.items()}
            now = int(r.time()[0]) * 1000
            _place(r, entries, {f"s{i}": now + 5000 * i // n for i in range(n)})
            with_slots = int(r.info("memory")["used_memory"])
        finally:
            app.close()
    return (with_wheel - empty) / n, (with_slots - empty) / n


def worker_side() -> tuple[float, float]:
    """µs to build one run's settle argument in Python: today's packed finish_runs argument
    (scripts.finish_runs' f-string) against the probe's settled entry."""
    entry = "s123|1|1764841234567|0|4821|0|0|12|1|3|1|[123]"
    member, token, bucket, slot = "s:s123", 123456789, 4321, 1
    today = timeit.repeat(
        lambda: (
            f"{member}|{token}|ok|1|1|1764841239567|1764841239567|1764841234567|{bucket}/{slot}|"
        ),
        number=100_000,
        repeat=5,
    )
    probe = timeit.repeat(
        lambda: settled_entry(entry, 1764841234570, 1, 1764841239567), number=100_000, repeat=5
    )
    return min(today) * 10, min(probe) * 10


def main() -> None:
    p = argparse.ArgumentParser(
        prog="python -m bench.slots_probe", description=__doc__.split("\n")[0]
    )
    p.add_argument("--n", type=int, default=100_000)
    p.add_argument("--due", type=int, default=1000)
    p.add_argument("--per-slot", type=int, default=20)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument(
        "--scripts", choices=["probe", "drumbeat"], default="probe",
        help="the probe's own scripts, or drumbeat's (claim_slots.lua, settle_slots.lua)",
    )  # fmt: skip
    a = p.parse_args()
    own = a.scripts == "drumbeat"
    c, f = instructions(a.n, a.due, a.per_slot, a.rounds, own=own)
    if own:
        print(
            f"drumbeat's time-slot scripts, {a.n:,} schedules, {a.due} due per round,"
            f" {a.per_slot} a slot, {a.rounds - 1} measured rounds (medians):"
            f" {(c + f) / 1e3:.1f} k Redis instructions per run (claiming {c / 1e3:.1f} k,"
            f" settling {f / 1e3:.1f} k)"
        )
        return
    print(
        f"time slots, {a.n:,} schedules, {a.due} due per round, {a.per_slot} a slot,"
        f" {a.rounds - 1} measured rounds (medians): {(c + f) / 1e3:.1f} k Redis instructions"
        f" per run (claiming {c / 1e3:.1f} k, settling {f / 1e3:.1f} k)"
    )
    wheel, slots = memory(a.n)
    print(f"Redis memory per schedule: wheel {wheel:.0f} B, time slots {slots:.0f} B")
    today, probe = worker_side()
    built = f"today {today:.2f} µs, probe {probe:.2f} µs"
    print(f"Python per run to build the settle argument: {built}")


if __name__ == "__main__":
    main()
