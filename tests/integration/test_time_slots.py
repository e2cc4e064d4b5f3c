"""The time-slot store's scripts (docs/design/time-slots.md), on a real Redis: entries land in
the slot of their due ms, a claim takes only due slots and only its room into lots of its own
(read after it), a settle is fenced by `where` (still naming the slot the run was claimed from)
and drops the lots the worker found settled, the reaper and a handback put back only runs still
in flight, and changes made while a run is in flight wait for its settle."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
import redis

from drumbeat.keys import Keys
from drumbeat.schedule import parse_record
from drumbeat.schedules.changes import SlotChanges
from drumbeat.schedules.slots import Entry, Settled, SlotScripts, parse_entry, settled_record
from drumbeat.scripts import Call

TASK = "tasks.watch"
SPEC = b'[["kw",500],[5000,0,0]]'


def _now_ms(r: redis.Redis) -> int:
    sec, usec = r.time()
    return int(sec) * 1000 + int(usec) // 1000


@pytest.fixture
def keys(namespace: str) -> Keys:
    return Keys(namespace)


@pytest.fixture
def s(keys: Keys) -> SlotScripts:
    return SlotScripts(keys)


def _slot(r: redis.Redis, keys: Keys, ms: int) -> list[str]:
    return [e.decode() for e in r.lrange(keys.slot(ms), 0, -1)]


def _upsert(
    r: redis.Redis, s: SlotScripts, ids: list[str], due: int, spec: bytes = SPEC
) -> list[int]:
    return SlotChanges(s.k).upsert(r, [(sid, 0, due, due, TASK, "", spec) for sid in ids])


@dataclass
class Got:
    now_ms: int
    reaped: bool
    entries: list[Entry]
    malformed: list[str]


def _claim(
    r: redis.Redis, s: SlotScripts, incarnation: str, limit: int, slots: list[int], *args: int,
    first: bool = False,
) -> Got:  # fmt: skip
    """A claim (``args``: its number) and the reads of its lots, as a worker sends them."""
    (number,) = args
    result = s.claim(incarnation, limit, 30_000, slots, number, first=first).run(r)
    lots = [read.run(r) for read in s.reads(incarnation, number, slots)]
    assert result.reaped or [len(lot.entries) + len(lot.malformed) for lot in lots] == result.taken
    entries = [e for lot in lots for e in lot.entries]
    return Got(result.now_ms, result.reaped, entries, [m for lot in lots for m in lot.malformed])


def _in_flight(r: redis.Redis, keys: Keys, incarnation: str) -> list[str]:
    """The ids in the lots of ``incarnation``."""
    out = []
    for lot in sorted(x.decode() for x in r.hkeys(keys.inflight(incarnation))):
        items = [i.decode() for i in r.lrange(keys.claimed(incarnation, lot), 0, -1)]
        out += [i.split("|")[0].split(";")[0] for i in items]
    return out


def _reap(r: redis.Redis, keys: Keys, s: SlotScripts, back: int, incarnations: list[str]) -> int:
    """The reaper as a worker's housekeeping calls it: the lots read first."""
    held = {i: [lot.decode() for lot in r.hkeys(keys.inflight(i))] for i in incarnations}
    return s.reap(back, held).run(r)


def _settle_all(
    r: redis.Redis, s: SlotScripts, incarnation: str, claim_now: int, entries: list, *,
    next_ms: int, outcome: str = "ok", drops: tuple[str, ...] = (),
) -> list:  # fmt: skip
    runs = []
    for e in entries:
        record = settled_record(
            e.record, outcome=outcome, started_ms=claim_now, duration_ms=3,
            next_grid_ms=next_ms, due_ms=e.due_ms, first_start_ms=e.first_start_ms,
        )  # fmt: skip
        error = "boom" if outcome == "fail" else None
        entry = f"{e.schedule_id}|{record}"
        runs.append(Settled(e.schedule_id, entry, next_ms, e.slot_ms, error))
    return s.settle(incarnation, runs, drops).run(r)


def test_an_upsert_puts_each_entry_in_the_slot_of_its_due_ms_once(
    r: redis.Redis, keys: Keys, s: SlotScripts
) -> None:
    due = _now_ms(r) + 60_000
    assert _upsert(r, s, ["a", "b"], due) == [1, 1]
    assert sorted(e.split("|")[0] for e in _slot(r, keys, due)) == ["a", "b"]
    assert r.zscore(keys.slots, str(due)) == due
    assert r.hget(keys.where, "a") == str(due).encode()
    # Unchanged: left alone, totals and place kept.
    assert _upsert(r, s, ["a"], due + 5) == [0]
    assert len(_slot(r, keys, due)) == 2
    assert not r.exists(keys.slot(due + 5))
    # Changed: a new generation at its new first due time; the old slot keeps the other one.
    assert _upsert(r, s, ["a"], due + 7, spec=b'[["kw",600],[5000,0,0]]') == [2]
    [moved] = _slot(r, keys, due + 7)
    assert moved.startswith("a|2|")  # generation 2
    assert [e.split("|")[0] for e in _slot(r, keys, due)] == ["b"]
    assert r.hget(keys.where, "a") == str(due + 7).encode()


def test_an_upsert_that_read_where_before_the_entry_moved_is_told_to_send_again(
    r: redis.Redis, keys: Keys, s: SlotScripts
) -> None:
    due = _now_ms(r) + 60_000
    _upsert(r, s, ["a"], due)
    stale = Call(
        "slot_schedules",
        [keys.slots, keys.where, keys.pending, keys.tasks, keys.wake, keys.stalled,
         keys.paused, keys.queues, keys.slot(due - 1), keys.slot(due + 9)],
        [1, "a", str(due - 1), 0, due + 9, due + 9, TASK, "", b"[]"],
        lambda raw: [int(x) for x in raw],
    )  # fmt: skip
    assert stale.run(r) == [-1]
    assert _slot(r, keys, due)[0].startswith("a|1|")  # untouched


def test_a_claim_takes_only_due_slots_and_only_as_many_runs_as_it_has_room_for(
    r: redis.Redis, keys: Keys, s: SlotScripts
) -> None:
    now = _now_ms(r)
    past, future = now - 50, now + 60_000
    _upsert(r, s, [f"p{i}" for i in range(5)], past)
    _upsert(r, s, ["f0"], future)
    got = _claim(r, s, "w1.1", 3, [past, future], 1, first=True)
    assert not got.reaped
    assert [e.schedule_id for e in got.entries] == ["p0", "p1", "p2"]
    assert {e.due_ms for e in got.entries} == {past}
    # The rest stay due in their slot; the future slot is untouched.
    assert [e.split("|")[0] for e in _slot(r, keys, past)] == ["p3", "p4"]
    assert len(_slot(r, keys, future)) == 1
    # The claim's lot: the entries as they were, with the claim's time in `inflight`; nothing
    # per run anywhere else (`where` still names the slot they came from).
    assert r.hgetall(keys.inflight("w1.1")) == {f"1:{past}".encode(): str(got.now_ms).encode()}
    assert r.hgetall(keys.busy) == {b"w1.1": b"3"}  # the runs it holds: the autoscaler's count
    held = [i.decode() for i in r.lrange(keys.claimed("w1.1", f"1:{past}"), 0, -1)]
    assert [i.split("|")[0] for i in held] == ["p0", "p1", "p2"]
    assert held[0].startswith("p0|1|")
    assert r.hget(keys.where, "p0") == str(past).encode()
    assert got.now_ms < r.zscore(keys.runners, "w1.1") <= got.now_ms + 30_000
    # Their lateness is counted once, for the three runs it stands for.
    counts = {f: int(v) for f, v in r.hgetall(keys.lateness).items() if f.startswith(b"c")}
    assert sum(v for f, v in counts.items() if f != b"cs") == 3
    assert counts[b"cs"] == 3 * (got.now_ms - past)
    # The next claim empties the slot (it leaves `slots`) and, with room left, still takes
    # nothing from the slot that is not due.
    again = _claim(r, s, "w1.1", 10, [past, future], 2)
    assert [e.schedule_id for e in again.entries] == ["p3", "p4"]
    assert set(r.hkeys(keys.inflight("w1.1"))) == {f"1:{past}".encode(), f"2:{past}".encode()}
    assert len(_slot(r, keys, future)) == 1
    assert r.zscore(keys.slots, str(past)) is None
    assert r.zscore(keys.slots, str(future)) == future


def test_a_settle_pushes_each_next_entry_into_its_slot_and_keeps_failed_runs_errors(
    r: redis.Redis, keys: Keys, s: SlotScripts
) -> None:
    now = _now_ms(r)
    _upsert(r, s, ["a", "b"], now - 10)
    got = _claim(r, s, "w1.1", 10, [now - 10], 1, first=True)
    nxt = now + 5000
    assert _settle_all(r, s, "w1.1", got.now_ms, got.entries, next_ms=nxt, outcome="fail") == [1, 1]
    entries = [parse_entry(e, nxt) for e in _slot(r, keys, nxt)]
    assert [e.schedule_id for e in entries] == ["a", "b"]
    assert [e.record.split("|")[3:5] for e in entries] == [["1", "1"]] * 2  # runs, failures
    assert r.zscore(keys.slots, str(nxt)) == nxt
    assert r.hget(keys.where, "a") == str(nxt).encode()
    assert r.hget(keys.faults, "a") == b"boom"
    assert not r.exists(keys.busy)  # both runs held (the autoscaler's count), then settled
    # The claim's lot waits for the worker to say all its runs settled: the next settle drops
    # it.
    lot = f"1:{now - 10}"
    assert r.exists(keys.claimed("w1.1", lot))
    _upsert(r, s, ["c"], now - 5)
    third = _claim(r, s, "w1.1", 10, [now - 5], 2)
    assert _settle_all(r, s, "w1.1", third.now_ms, third.entries, next_ms=nxt, drops=(lot,)) == [1]
    assert not r.exists(keys.claimed("w1.1", lot))
    assert r.hkeys(keys.inflight("w1.1")) == [f"2:{now - 5}".encode()]


def test_a_settle_sent_again_after_a_lost_reply_is_refused_and_adds_no_second_entry(
    r: redis.Redis, keys: Keys, s: SlotScripts
) -> None:
    now = _now_ms(r)
    _upsert(r, s, ["a"], now - 10)
    got = _claim(r, s, "w1.1", 10, [now - 10], 1, first=True)
    nxt = now + 5000
    assert _settle_all(r, s, "w1.1", got.now_ms, got.entries, next_ms=nxt) == [1]
    assert _settle_all(r, s, "w1.1", got.now_ms, got.entries, next_ms=nxt) == [0]
    assert len(_slot(r, keys, nxt)) == 1


def test_a_settles_reply_follows_the_order_of_its_runs_whatever_slots_they_go_to(
    r: redis.Redis, keys: Keys, s: SlotScripts
) -> None:
    # The runs go to Redis grouped by slot; each reply must still be its own run's (a refusal
    # taken for another run's would settle one run twice and leave another in flight).
    now = _now_ms(r)
    _upsert(r, s, ["a", "b", "c"], now - 10)
    got = _claim(r, s, "w1.1", 10, [now - 10], 1, first=True)
    a, b, c = got.entries
    r.hset(keys.where, "b", now - 1)  # b went back meanwhile: its settle is refused
    runs = []
    for e, nxt in ((a, now + 5000), (b, now + 6000), (c, now + 5000)):
        record = settled_record(
            e.record, outcome="ok", started_ms=got.now_ms, duration_ms=1, next_grid_ms=nxt,
            due_ms=e.due_ms,
        )  # fmt: skip
        runs.append(Settled(e.schedule_id, f"{e.schedule_id}|{record}", nxt, e.slot_ms))
    assert s.settle("w1.1", runs).run(r) == [1, 0, 1]
    assert sorted(x.split("|")[0] for x in _slot(r, keys, now + 5000)) == ["a", "c"]
    assert not r.exists(keys.slot(now + 6000))


def test_a_reaped_incarnation_is_refused_and_its_runs_come_back_with_their_stalls(
    r: redis.Redis, keys: Keys, s: SlotScripts
) -> None:
    now = _now_ms(r)
    due = now - 20
    _upsert(r, s, ["a", "b"], due)
    got = _claim(r, s, "w1.1", 10, [due], 1, first=True)
    r.zadd(keys.runners, {"w1.1": now - 1})  # its lease lapsed
    back = now - 5
    assert _reap(r, keys, s, back, ["w1.1"]) == 2
    assert not r.exists(keys.claimed("w1.1", f"1:{due}"), keys.inflight("w1.1"), keys.busy)
    assert r.hget(keys.stalled, str(back)) == b"2"  # at the end of their slot
    # Its late settle is refused: nothing is pushed, nothing dropped.
    assert _settle_all(r, s, "w1.1", got.now_ms, got.entries, next_ms=now + 5000) == [0, 0]
    assert not r.exists(keys.slot(now + 5000))
    # Its next claim is told; the runs wait in the due slot with a stall each.
    assert _claim(r, s, "w1.1", 10, [back], 2).reaped
    again = _claim(r, s, "w1.2", 10, [back], 1, first=True)
    assert sorted((e.schedule_id, e.stalls, e.due_ms, e.first_start_ms) for e in again.entries) == [
        ("a", 1, due, got.now_ms), ("b", 1, due, got.now_ms)
    ]  # fmt: skip
    assert not r.hexists(keys.stalled, str(back))
    # A stalled run is not counted late again: the lateness counts stay at the first claim's.
    total = sum(int(v) for f, v in r.hgetall(keys.lateness).items() if f[:1] == b"c" and f != b"cs")
    assert total == 2
    # A second lapse counts a second stall and keeps the first due time and start.
    r.zadd(keys.runners, {"w1.2": now - 1})
    assert _reap(r, keys, s, back, ["w1.2"]) == 2
    third = _claim(r, s, "w1.3", 10, [back], 1, first=True)
    assert {(e.stalls, e.due_ms, e.first_start_ms) for e in third.entries} == {(2, due, got.now_ms)}
    # Settled: the lateness is to the first start, and the stall marks are gone.
    assert _settle_all(r, s, "w1.3", third.now_ms, third.entries, next_ms=now + 5000) == [1, 1]
    [a] = [parse_entry(e, now + 5000) for e in _slot(r, keys, now + 5000) if e.startswith("a|")]
    assert a.stalls == 0
    assert a.record.split("|")[8] == str(got.now_ms - due)  # late


def test_a_claim_counts_late_only_the_fresh_runs_of_a_slot_that_also_holds_stalled_ones(
    r: redis.Redis, keys: Keys, s: SlotScripts
) -> None:
    now = _now_ms(r)
    due, back = now - 40, now - 20
    _upsert(r, s, ["x", "y", "z"], due)
    _claim(r, s, "w1.1", 10, [due], 1, first=True)  # counted: 3
    r.zadd(keys.runners, {"w1.1": now - 1})
    assert _reap(r, keys, s, back, ["w1.1"]) == 3  # at the end of slot `back`
    _upsert(r, s, ["f0", "f1"], back)  # fresh ones there, pushed after them
    r.lmove(keys.slot(back), keys.slot(back), "RIGHT", "LEFT")  # (fresh before stalled, as
    r.lmove(keys.slot(back), keys.slot(back), "RIGHT", "LEFT")  # a settle pushes them first)
    # Removing a waiting stalled run takes it out of the count too.
    assert SlotChanges(keys).remove(r, ["z"]) == 1
    assert r.hget(keys.stalled, str(back)) == b"2"
    first = _claim(r, s, "w1.2", 3, [back], 1, first=True)  # f0, f1 and x
    assert [e.schedule_id for e in first.entries] == ["f0", "f1", "x"]
    assert r.hget(keys.stalled, str(back)) == b"1"
    counts = {f: int(v) for f, v in r.hgetall(keys.lateness).items() if f.startswith(b"c")}
    assert sum(v for f, v in counts.items() if f != b"cs") == 3 + 2
    rest = _claim(r, s, "w1.2", 3, [back], 2)
    assert [(e.schedule_id, e.stalls) for e in rest.entries] == [("y", 1)]
    assert not r.exists(keys.stalled)
    counts = {f: int(v) for f, v in r.hgetall(keys.lateness).items() if f.startswith(b"c")}
    assert sum(v for f, v in counts.items() if f != b"cs") == 3 + 2


def test_a_claim_renames_a_slot_it_takes_whole_and_moves_the_first_entries_of_a_bigger_one(
    r: redis.Redis, keys: Keys, s: SlotScripts
) -> None:
    now = _now_ms(r)
    small, big = now - 30, now - 20
    _upsert(r, s, ["a", "b"], small)
    _upsert(r, s, ["c", "d", "e"], big)
    r.hset(keys.stalled, str(small), 5)  # a count gone wrong: the emptied slot drops it anyway
    got = _claim(r, s, "w1.1", 4, [small, big], 1, first=True)
    assert not r.hexists(keys.stalled, str(small))
    assert [e.schedule_id for e in got.entries] == ["a", "b", "c", "d"]
    assert not r.exists(keys.slot(small))
    assert r.lrange(keys.claimed("w1.1", f"1:{small}"), 0, -1)[0].startswith(b"a|")
    assert [e.split(b"|")[0] for e in r.lrange(keys.slot(big), 0, -1)] == [b"e"]
    assert r.zscore(keys.slots, str(small)) is None
    assert r.zscore(keys.slots, str(big)) == big


def test_a_lease_renewed_before_the_reaper_runs_keeps_its_runs(
    r: redis.Redis, keys: Keys, s: SlotScripts
) -> None:
    now = _now_ms(r)
    _upsert(r, s, ["a"], now - 20)
    _claim(r, s, "w1.1", 10, [now - 20], 1, first=True)
    assert _reap(r, keys, s, now - 5, ["w1.1"]) == 0  # its lease is 30 s away
    assert _in_flight(r, keys, "w1.1") == ["a"]


def test_the_reaper_takes_back_only_the_runs_still_in_flight_and_only_claims_it_read(
    r: redis.Redis, keys: Keys, s: SlotScripts
) -> None:
    now = _now_ms(r)
    due = now - 20
    _upsert(r, s, ["a", "b", "c"], due)
    got = _claim(r, s, "w1.1", 10, [due], 1, first=True)
    a = got.entries[0]
    assert _settle_all(r, s, "w1.1", got.now_ms, [a], next_ms=now + 60_000) == [1]
    r.zadd(keys.runners, {"w1.1": now - 1})  # its lease lapsed
    # A claim the caller did not read (made after it read the claim numbers): left for the
    # next pass rather than lost.
    assert s.reap(now - 5, {"w1.1": []}).run(r) == 0
    assert r.exists(keys.claimed("w1.1", f"1:{due}"))
    assert _reap(r, keys, s, now - 5, ["w1.1"]) == 2
    assert sorted(e.split(";")[0] for e in _slot(r, keys, now - 5)) == ["b", "c"]
    assert [e.split("|")[0] for e in _slot(r, keys, now + 60_000)] == ["a"]  # a stays settled


def test_a_schedule_changed_in_flight_gets_its_new_definition_when_its_run_settles(
    r: redis.Redis, keys: Keys, s: SlotScripts
) -> None:
    now = _now_ms(r)
    _upsert(r, s, ["a", "b"], now - 10)
    got = _claim(r, s, "w1.1", 10, [now - 10], 1, first=True)
    new_due = now + 9000
    assert SlotChanges(keys).upsert(r, [("a", 3, new_due, new_due, TASK, "", b"[]")]) == [2]
    assert r.hget(keys.pending, "a") is not None
    # Upserted unchanged while in flight: its settle finds it unchanged, and it settles as built
    # (its generation and place kept).
    assert _upsert(r, s, ["b"], now + 1) == [2]
    reply = _settle_all(r, s, "w1.1", got.now_ms, got.entries, next_ms=now + 5000)
    assert reply[1] == 1  # b settled as built
    [b_entry] = _slot(r, keys, now + 5000)
    assert b_entry.startswith("b|1|")
    due, entry = reply[0]  # type: ignore[misc]
    assert due == new_due
    record = entry.split("|", 1)[1]
    gen, grid, flags, runs = record.split("|")[:4]
    assert (gen, grid, flags, runs) == ("2", str(new_due), "3", "1")  # the run counted
    assert record.endswith("|[]")
    assert r.hget(keys.where, "a") == str(now - 10).encode()  # still in flight
    assert s.settle("w1.1", [Settled("a", entry, new_due, now - 10)]).run(r) == [1]
    assert _slot(r, keys, new_due) == [entry]
    assert not r.exists(keys.pending)


def test_a_removed_schedule_goes_at_once_or_when_its_run_in_flight_settles(
    r: redis.Redis, keys: Keys, s: SlotScripts
) -> None:
    now = _now_ms(r)
    _upsert(r, s, ["waiting"], now + 60_000)
    _upsert(r, s, ["running"], now - 10)
    got = _claim(r, s, "w1.1", 10, [now - 10], 1, first=True)
    assert SlotChanges(keys).remove(r, ["waiting", "running", "unknown"]) == 2
    assert not r.exists(keys.slot(now + 60_000))
    assert r.zscore(keys.slots, str(now + 60_000)) is None
    assert _settle_all(
        r, s, "w1.1", got.now_ms, got.entries, next_ms=now + 5000, outcome="fail"
    ) == [1]
    assert not r.exists(keys.slot(now + 5000))
    assert not r.hexists(keys.where, "running")
    assert not r.exists(keys.pending)
    assert not r.hexists(keys.faults, "running")


def test_a_change_or_pause_left_by_a_reaped_run_is_superseded_by_what_finds_it_waiting(
    r: redis.Redis, keys: Keys, s: SlotScripts
) -> None:
    """A change asked while a run was in flight waits in `pending` for its settle; when the
    run is reaped instead, its entry waits in a slot again, and a later upsert, which finds it
    there, is the newer word (without this, the next settle would apply the older change)."""
    now = _now_ms(r)
    _upsert(r, s, ["a"], now - 10)
    _claim(r, s, "w1.1", 10, [now - 10], 1, first=True)
    assert _upsert(r, s, ["a"], now + 9000, spec=b"[]") == [2]  # in flight: waits
    assert SlotChanges(keys).pause(r, ["a"]) == 1  # in flight: waits too
    assert r.hget(keys.pending, "a") == f"P{now + 9000}|{now + 9000}|0|1|[]".encode()
    r.zadd(keys.runners, {"w1.1": now - 1})
    back = now - 5
    assert _reap(r, keys, s, back, ["w1.1"]) == 1
    # A run back from a lapsed lease is due already: not run now a second time.
    assert SlotChanges(keys).run_now(r, ["a"], now) == 0
    # Found waiting: a change applies at once; the pause still waits.
    assert _upsert(r, s, ["a"], now - 3, spec=b'["x"]') == [2]
    assert r.hget(keys.pending, "a") == b"P"
    got = _claim(r, s, "w1.2", 10, [now - 3], 1, first=True)
    assert [e.record.endswith('|["x"]') for e in got.entries] == [True]
    assert SlotChanges(keys).run_now(r, ["a"], now) == 0  # in flight
    assert _settle_all(r, s, "w1.2", got.now_ms, got.entries, next_ms=now + 5000) == [1]
    # The pause applied at the settle: the entry waits in `paused`, in no slot.
    assert r.hget(keys.where, "a") == b"p" and not r.exists(keys.pending)
    assert not r.exists(keys.slot(now + 5000))
    paused = r.hget(keys.paused, "a")
    assert paused is not None and paused.decode().split("|")[3] == "10"  # flags: paused


def test_a_handback_puts_runs_back_as_claimed_and_takes_back_their_lateness(
    r: redis.Redis, keys: Keys, s: SlotScripts
) -> None:
    now = _now_ms(r)
    _upsert(r, s, ["a", "b"], now - 30)
    before = _slot(r, keys, now - 30)
    _claim(r, s, "w1.1", 10, [now - 30], 1, first=True)
    lot = f"1:{now - 30}"
    assert s.handback("w1.1", now - 2, [lot], ["a", "b", "never"]).run(r) == 2
    assert _slot(r, keys, now - 2) == before
    assert _in_flight(r, keys, "w1.1") == []  # a reaper cannot put them back a second time
    assert not r.exists(keys.busy)
    counts = [int(v) for f, v in r.hgetall(keys.lateness).items() if f[:1] == b"c"]
    assert sum(counts) == 0  # both bins and the sum back to nothing
    # Given back already: a second hand-back finds nothing of it in flight.
    assert s.handback("w1.1", now - 1, [lot], ["a"]).run(r) == 0


def test_a_malformed_entry_is_reported_and_dropped_and_the_others_are_claimed(
    r: redis.Redis, keys: Keys, s: SlotScripts
) -> None:
    now = _now_ms(r)
    _upsert(r, s, ["a"], now - 10)
    r.lpush(keys.slot(now - 10), "no separator here")
    got = _claim(r, s, "w1.1", 10, [now - 10], 1, first=True)
    assert got.malformed == ["no separator here"]
    assert [e.schedule_id for e in got.entries] == ["a"]


def test_the_workers_record_after_a_run_counts_it_and_moves_to_the_next_slot() -> None:
    rng = random.Random(7)
    for _ in range(300):
        grid = rng.randrange(1_700_000_000_000, 1_800_000_000_000)
        nxt = grid + rng.choice([1, 5000, 60_000])
        rel = rng.choice(["", str(rng.randrange(-5, 900))])
        record = (
            f"{rng.randrange(1, 9)}|{grid}|{rng.choice([0, 3])}|{rng.randrange(0, 10**6)}|"
            f"{rng.randrange(0, 99)}|{rng.randrange(0, 99)}|{rel}|{rng.randrange(0, 9000)}|"
            f"{rng.randrange(0, 900)}|{rng.randrange(1, 40)}|[[\"kw\",{rng.randrange(9)}],[5000]]"
        )  # fmt: skip
        outcome = rng.choice(["ok", "fail", "skip"])
        started = grid + rng.randrange(-3, 2000)
        due = rng.choice([None, grid, grid + 7])
        first = rng.choice([None, started - rng.randrange(1, 900)]) if due else None
        ms = rng.randrange(0, 5000)
        got = settled_record(
            record, outcome=outcome, started_ms=started, duration_ms=ms, next_grid_ms=nxt,
            due_ms=due, first_start_ms=first,
        )  # fmt: skip
        before, after = parse_record(record.encode()), parse_record(got.encode())
        same = ("generation", "priority", "paused", "task_code", "spec")
        assert all(getattr(after, f) == getattr(before, f) for f in same), (record, got)
        assert after.grid_ms == nxt
        ran = outcome != "skip"
        assert after.runs == before.runs + ran
        assert after.failures == before.failures + (outcome == "fail")
        assert after.misfires == before.misfires + (not ran)
        if ran:
            late = 0 if due is None else max(0, (first if first is not None else started) - due)
            assert (after.last_start_ms, after.last_ms, after.last_late_ms) == (started, ms, late)
        else:  # a skipped run leaves the last run's start, duration and lateness as they were
            assert after.last_start_ms == before.last_start_ms
            assert (after.last_ms, after.last_late_ms) == (before.last_ms, before.last_late_ms)
