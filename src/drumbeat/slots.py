"""Schedules kept as time slots: the store that replaces the wheel (in progress).

Each schedule waits as one entry, ``<id>|<record>`` (the record as the wheel writes it), in the
list of the millisecond it is due (`Keys.slot`); a claim renames each due slot it takes whole
into a lot of its own (`Keys.claimed`), which the worker reads in the same write, and the
settle pushes each schedule's next entry, which the worker builds (`settled_record`), into its
next slot. A run is its claimer's while `where` still names the slot it was claimed from; the
lots only let the reaper find the runs of a worker whose lease lapsed. Redis does no per-run
parsing, and the entries pass through Lua only when settled (`bench.slots_probe --scripts
drumbeat` counts Redis's instructions a run). The plan, and what is not built yet:
``docs/design/time-slots.md``. Opt-in: ``Settings.schedule_store = "slots"``.

Scripts may only touch the keys they are passed, and an entry's slot is known only from
`where`, so the calls by id (`upsert`, `remove`) read `where` first and send again what moved
meanwhile.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

import redis
import redis.asyncio as aredis

from .keys import Keys
from .protocol import FIELD_SEP, PAUSED_AT
from .replies import parse_ints
from .scripts import Call

#: Most upcoming slots a claim reply names (UPCOMING in _lib.lua).
UPCOMING = 128
#: A call by id is sent again at most this many times when what it read moved meanwhile.
_MOVED_RETRIES = 20

_T = TypeVar("_T")
#: Builds a call by id for some items from what `SlotScripts._reads` read.
_Make = Callable[[Sequence[_T], Sequence[Any]], Call[list[int]]]


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _bytes(value: bytes | str) -> bytes:
    return value.encode() if isinstance(value, str) else value


@dataclass(slots=True)  # not frozen: a frozen init costs a setattr call per field, per run
class Entry:
    """A claimed run: its schedule's entry, where it was due, and any stalls."""

    schedule_id: str
    due_ms: int
    """The slot it was claimed from; for a run back from a lapsed lease, its first due time."""
    record: str
    slot_ms: int
    """The slot it was claimed from (`where` names it while the run is in flight)."""
    stalls: int = 0
    first_start_ms: int | None = None
    """When it first started, for a run back from a lapsed lease."""


def parse_entry(entry: str, slot_ms: int) -> Entry:
    """An entry popped from slot ``slot_ms``; ``ValueError`` for one with no schedule id (the
    claim did not hold it: claim_slots.lua's rule, a ``|`` or ``;`` after a non-empty id)."""
    head, sep, record = entry.partition(FIELD_SEP)
    sid, semi, marks = head.partition(";")
    if not sid or not (sep or semi):
        raise ValueError(f"malformed time-slot entry: {entry[:80]!r}; expected '<id>|<record>'")
    if semi:
        try:
            stalls, due, first = marks.split(";")
            return Entry(sid, int(due), record, slot_ms, int(stalls), int(first))
        except ValueError:
            pass  # unreadable stall marks: held all the same, so run as a fresh claim
    return Entry(sid, slot_ms, record, slot_ms)


@dataclass(frozen=True, slots=True)
class SlotClaim:
    """What `claim_slots.lua` replied."""

    now_ms: int
    reaped: bool
    """The incarnation's lease lapsed and its runs were taken back: claim as a new one."""
    upcoming: list[int] | None
    """The ms of the slots due soon (None: not asked for)."""
    next_ms: int | None
    """The ms of the earliest slot left (None: no slot holds an entry)."""
    taken: list[int]
    """Per slot passed, how many entries went into its lot."""


def parse_slot_claim(raw: Any) -> SlotClaim:
    now = int(raw[0])
    if isinstance(raw[1], bytes | str):  # 'reaped'
        return SlotClaim(now, True, None, None, [])
    upcoming = None if raw[1] is None else [int(ms) for ms in raw[1]]
    next_ms = int(raw[2])
    return SlotClaim(now, False, upcoming, None if next_ms < 0 else next_ms, raw[3:])


@dataclass(frozen=True, slots=True)
class Lot:
    """The entries a claim took from one slot, as the worker read them."""

    name: str
    """``<claim number>:<slot ms>``."""
    slot_ms: int
    entries: list[Entry]
    malformed: list[str]
    """Entries without a schedule id (written by something other than drumbeat)."""


def read_lot(name: str, slot_ms: int, raw: Any) -> Lot:
    entries: list[Entry] = []
    malformed: list[str] = []
    for e in raw:
        text = _text(e)
        try:
            entries.append(parse_entry(text, slot_ms))
        except ValueError:
            malformed.append(text)
    return Lot(name, slot_ms, entries, malformed)


class Read(Call[_T]):
    """A plain read sent in the same write as script calls, and read in its turn."""

    __slots__ = ()

    def command(self) -> tuple[str | bytes | int | float, ...]:
        return (self.name, *self.args)

    def run(self, client: redis.Redis) -> _T:
        return self.parse(client.execute_command(*self.command()))  # type: ignore[no-untyped-call]

    async def arun(self, client: aredis.Redis) -> _T:
        return self.parse(await client.execute_command(*self.command()))  # type: ignore[no-untyped-call]


def settled_record(
    record: str,
    *,
    outcome: str,
    started_ms: int,
    duration_ms: int,
    next_grid_ms: int,
    due_ms: int | None,
    first_start_ms: int | None = None,
) -> str:
    """A schedule's record after one of its runs: what ``after_run`` in finish_runs.lua
    writes for a run of the record's own generation (``outcome`` ok, fail or skip), byte for
    byte. ``due_ms`` None: the run's due time is unknown, so its lateness counts as 0."""
    return settled_fields(
        record.split(FIELD_SEP, 10), outcome=outcome, started_ms=started_ms,
        duration_ms=duration_ms, next_grid_ms=next_grid_ms, due_ms=due_ms,
        first_start_ms=first_start_ms,
    )  # fmt: skip


def settled_fields(
    fields: Sequence[str],
    *,
    outcome: str,
    started_ms: int,
    duration_ms: int,
    next_grid_ms: int,
    due_ms: int | None,
    first_start_ms: int | None = None,
) -> str:
    """`settled_record` of a record split into its fields (the worker split it when it
    claimed the run); ``ValueError`` for one that has not all of them."""
    gen, grid, flags, runs, fails, misf, rel, ms, late, task, spec = fields
    if outcome == "skip":
        misf = str(int(misf) + 1)
        if rel:
            last_start = int(grid) + int(rel)
            rel = str(last_start - next_grid_ms) if last_start > 0 else ""
        ran = f"{ms}|{late}"
    else:
        runs = str(int(runs) + 1)
        if outcome == "fail":
            fails = str(int(fails) + 1)
        lateness = 0
        if due_ms is not None:
            start = first_start_ms if first_start_ms is not None else started_ms
            lateness = max(0, start - due_ms)
        ran = f"{duration_ms}|{lateness}"
        rel = str(started_ms - next_grid_ms) if started_ms > 0 else ""
    return f"{gen}|{next_grid_ms}|{flags}|{runs}|{fails}|{misf}|{rel}|{ran}|{task}|{spec}"


@dataclass(slots=True)  # not frozen, as `Entry`
class Settled:
    """One run's settle, for `SlotScripts.settle`: its schedule's next entry and slot."""

    schedule_id: str
    entry: str
    """``<id>|<record>``: the record after the run (`settled_record`)."""
    next_ms: int
    """The due time of its next run: the slot its entry goes to."""
    slot_ms: int
    """The slot the run was claimed from (the settle is refused unless `where` names it)."""
    error: str | None = None
    """The error of a failed run, kept as the schedule's last one."""


def _in_order(order: Sequence[int], raw: Any) -> list[int | tuple[int, str]]:
    """`parse_settled` of a reply to runs sent in ``order`` (their places in the call's
    input), put back in the input's order."""
    got = parse_settled(raw)
    out: list[int | tuple[int, str]] = [0] * len(got)
    for place, item in zip(order, got, strict=True):
        out[place] = item
    return out


def parse_settled(raw: Any) -> list[int | tuple[int, str]]:
    """Per run: 1 settled, 0 refused, or (due ms, entry) to send again into that slot."""
    out: list[int | tuple[int, str]] = []
    for r in raw:
        if isinstance(r, int):
            out.append(r)
        else:
            due, _, entry = _text(r).partition(FIELD_SEP)
            out.append((int(due), entry))
    return out


class Claims:
    """The lots of one worker process incarnation in one shard, as its worker counts them: how
    many runs of each are not settled yet, and those all settled, which the next settle drops
    (`SlotScripts.settle`). A lot lives until then: while `where` moves on as runs settle, the
    lot only lets the reaper find the runs still in flight."""

    __slots__ = ("finished", "incarnation", "open")

    def __init__(self, incarnation: str) -> None:
        self.incarnation = incarnation
        self.open: dict[str, int] = {}
        """Lot -> its runs not settled yet."""
        self.finished: list[str] = []
        """Lots all settled that are still in Redis."""

    def took(self, lot: str, runs: int) -> None:
        if runs:
            self.open[lot] = runs
        else:
            self.finished.append(lot)

    def done(self, lot: str) -> None:
        """One run of ``lot`` is settled (or refused, or handed back)."""
        left = self.open.get(lot, 0) - 1
        if left > 0:
            self.open[lot] = left
        elif lot in self.open:
            del self.open[lot]
            self.finished.append(lot)

    def drops(self) -> list[str]:
        """The finished lots, for a settle to drop (taken: a settle that fails leaves them to
        the incarnation's end, `SlotLane.deregister`, or the reaper)."""
        out, self.finished = self.finished, []
        return out


class SlotScripts:
    """Typed constructors for the time-slot scripts of one shard."""

    def __init__(self, keys: Keys) -> None:
        self.k = keys

    def claim(
        self,
        incarnation: str,
        limit: int,
        lease_ms: int,
        slots: Sequence[int],
        number: int,
        *,
        first: bool = False,
        upcoming: int = UPCOMING,
    ) -> Call[SlotClaim]:
        """Claims up to ``limit`` due runs of ``slots`` (the ms of due slots, from the last
        reply's `upcoming`) as the incarnation's claim ``number`` (new for each claim) into
        its lots; ``first``: the incarnation's first claim (it registers). `reads` reads the
        lots: send them in the same write, after this call."""
        k = self.k
        keys = [k.slots, k.runners, k.inflight(incarnation), k.lateness, k.stalled, k.busy]
        for ms in slots:
            keys += [k.slot(ms), k.claimed(incarnation, f"{number}:{ms}")]
        args = [incarnation, limit, lease_ms, 1 if first else 0, upcoming, number, *slots]
        return Call("claim_slots", keys, args, parse_slot_claim)

    def reads(self, incarnation: str, number: int, slots: Sequence[int]) -> list[Read[Lot]]:
        """Reads of the lots claim ``number`` takes from ``slots`` (empty where it took
        nothing)."""
        out: list[Read[Lot]] = []
        for ms in slots:
            lot = f"{number}:{ms}"
            key = self.k.claimed(incarnation, lot)
            out.append(Read("LRANGE", [key], [key, 0, -1], partial(read_lot, lot, ms)))
        return out

    def settle(
        self, incarnation: str, runs: Sequence[Settled], drops: Sequence[str] = ()
    ) -> Call[list[int | tuple[int, str]]]:
        """Settles ``runs`` of ``incarnation``, and drops its lots ``drops`` (all their runs
        settled: `Claims.drops`); see `parse_settled` for the reply (one item per run, in the
        order of ``runs``)."""
        k = self.k
        groups: dict[tuple[int, int], list[int]] = {}
        for i, run in enumerate(runs):
            group = groups.get((run.slot_ms, run.next_ms))
            if group is None:
                groups[run.slot_ms, run.next_ms] = [i]
            else:
                group.append(i)
        keys = [k.where, k.slots, k.pending, k.faults, k.inflight(incarnation), k.busy, k.paused]
        keys += [k.claimed(incarnation, lot) for lot in drops]
        args: list[str | int] = [incarnation, len(runs), len(drops), *drops]
        order: list[int] = []
        for (slot_ms, ms), group in groups.items():
            keys.append(k.slot(ms))
            args += [slot_ms, ms, len(group)]
            args += [runs[i].schedule_id for i in group]
            args += [runs[i].entry for i in group]
            order += group
        for run in runs:
            if run.error is not None:
                args += [run.schedule_id, run.error]
        return Call("settle_slots", keys, args, partial(_in_order, order))

    def reap(self, back_ms: int, held: Mapping[str, Sequence[str]]) -> Call[int]:
        """Takes back into slot ``back_ms`` the runs of the incarnations of ``held`` (each
        with the lots its `inflight` hash held) whose lease lapsed."""
        k = self.k
        keys = [k.runners, k.where, k.slots, k.stalled, k.slot(back_ms), k.busy]
        args: list[str | int] = [back_ms]
        for incarnation, lots in held.items():
            keys.append(k.inflight(incarnation))
            keys += [k.claimed(incarnation, lot) for lot in lots]
            args += [incarnation, len(lots), *lots]
        return Call("reap_runners", keys, args, int)

    def renew(self, incarnation: str, lease_ms: int) -> Call[int]:
        """Renews the incarnation's lease; 0 when it was reaped (or never claimed)."""
        return Call("renew_runner", [self.k.runners], [incarnation, lease_ms], int)

    def handback(
        self, incarnation: str, back_ms: int, lots: Sequence[str], ids: Sequence[str]
    ) -> Call[int]:
        """Gives runs ``ids`` of ``incarnation`` (in its ``lots``) back, as claimed, into
        slot ``back_ms``."""
        k = self.k
        keys = [k.where, k.slots, k.lateness, k.stalled, k.slot(back_ms)]
        keys += [k.inflight(incarnation), k.busy, *(k.claimed(incarnation, lot) for lot in lots)]
        args: list[str | int] = [back_ms, len(lots), *lots, incarnation, *ids]
        return Call("handback_slots", keys, args, int)

    def _reads(self, pipe: Any, ids: Sequence[str]) -> None:
        """Queues the reads a call by id needs first: `where` and `paused` of each id."""
        pipe.hmget(self.k.where, list(ids))
        pipe.hmget(self.k.paused, list(ids))

    def _at(self, read: Sequence[Any]) -> tuple[list[str], list[str]]:
        """What `_reads` read of `where`, as the scripts take it: per id its text
        (empty: none), and the key of the slot it names (`slots`, never read, when it names
        none: a paused schedule, or none at all)."""
        k, texts, keys = self.k, [], []
        for old in read[0]:
            was = _text(old) if old is not None else ""
            texts.append(was)
            keys.append(k.slot(int(was)) if was.isdigit() else k.slots)
        return texts, keys

    def _upsert_call(
        self, items: Sequence[tuple[str, int, int, int, str, bytes]], read: Sequence[Any]
    ) -> Call[list[int]]:
        """`slot_schedules` of ``items`` given what `_reads` read."""
        k = self.k
        texts, at_keys = self._at(read)
        keys = [k.slots, k.where, k.pending, k.tasks, k.wake, k.stalled, k.paused]
        args: list[str | bytes | int] = [len(items)]
        for (sid, priority, grid, due, task, spec), was, at in zip(
            items, texts, at_keys, strict=True
        ):
            keys += [at, k.slot(due)]
            args += [sid, was, priority, grid, due, task, spec]
        return Call("slot_schedules", keys, args, parse_ints)

    def _by_where(
        self, script: str, keys: list[str], args: list[str | int], ids: Sequence[str],
        read: Sequence[Any],
    ) -> Call[list[int]]:  # fmt: skip
        """``script`` of ``ids`` whose ARGV ends with pairs (id, what `where` gave) and whose
        KEYS with the slot `where` named of each."""
        texts, at_keys = self._at(read)
        args += [len(ids)]
        for sid, was in zip(ids, texts, strict=True):
            args += [sid, was]
        return Call(script, keys + at_keys, args, parse_ints)

    def _remove_call(self, ids: Sequence[str], read: Sequence[Any]) -> Call[list[int]]:
        """`unslot_schedules` of ``ids`` given what `_reads` read."""
        k = self.k
        keys = [k.slots, k.where, k.pending, k.faults, k.stalled, k.paused]
        return self._by_where("unslot_schedules", keys, [], ids, read)

    def _pause_call(self, ids: Sequence[str], read: Sequence[Any]) -> Call[list[int]]:
        """`pause_slots` of ``ids`` given what `_reads` read."""
        k = self.k
        keys = [k.slots, k.where, k.pending, k.paused, k.stalled]
        return self._by_where("pause_slots", keys, [], ids, read)

    def _run_now_call(self, now_ms: int) -> _Make[str]:
        """`run_slots_now` of ids, into the slot of ``now_ms``, given what `_reads` read."""
        k = self.k

        def make(ids: Sequence[str], read: Sequence[Any]) -> Call[list[int]]:
            keys = [k.slots, k.where, k.pending, k.paused, k.stalled, k.wake, k.slot(now_ms)]
            return self._by_where("run_slots_now", keys, [now_ms], ids, read)

        return make

    def _resume_call(self, resumed: Callable[[str, bytes], tuple[int, int, int]]) -> _Make[str]:
        """`resume_slots` of ids given what `_reads` read; ``resumed`` gives the (generation,
        next grid ms, next due ms) of a paused schedule from its record."""
        k = self.k

        def make(ids: Sequence[str], read: Sequence[Any]) -> Call[list[int]]:
            texts, _ = self._at(read)
            keys = [k.slots, k.where, k.pending, k.paused, k.wake]
            args: list[str | int] = [len(ids)]
            for sid, was, entry in zip(ids, texts, read[1], strict=True):
                if was == PAUSED_AT and entry is not None:
                    record = _bytes(entry).partition(FIELD_SEP.encode())[2]
                    gen, grid, due = resumed(sid, record)
                    keys.append(k.slot(due))
                    args += [sid, was, gen, grid, due]
                else:  # not paused, or a pause waiting for its run: nothing to compute
                    keys.append(k.slots)
                    args += [sid, was, "", "", ""]
            return Call("resume_slots", keys, args, parse_ints)

        return make

    def upsert(
        self, client: redis.Redis, items: Sequence[tuple[str, int, int, int, str, bytes]]
    ) -> list[int]:
        """Items are (id, priority, grid_ms, due_ms, task name, spec); one 1 created, 2
        updated, 0 unchanged each (see slot_schedules.lua: a schedule whose run is in flight
        is answered 2, as its run's settle compares and applies its definition)."""
        return self._by_id(client, [i[0] for i in items], self._upsert_call, items)

    async def aupsert(
        self, client: aredis.Redis, items: Sequence[tuple[str, int, int, int, str, bytes]]
    ) -> list[int]:
        """`upsert` for async callers."""
        return await self._aby_id(client, [i[0] for i in items], self._upsert_call, items)

    def remove(self, client: redis.Redis, ids: Sequence[str]) -> int:
        """Removes schedules by id; returns how many there were."""
        return self._by_id(client, ids, self._remove_call, ids).count(1)

    async def aremove(self, client: aredis.Redis, ids: Sequence[str]) -> int:
        """`remove` for async callers."""
        return (await self._aby_id(client, ids, self._remove_call, ids)).count(1)

    def pause(self, client: redis.Redis, ids: Sequence[str]) -> int:
        """Pauses schedules by id (see pause_slots.lua); returns how many it paused."""
        return self._by_id(client, ids, self._pause_call, ids).count(1)

    async def apause(self, client: aredis.Redis, ids: Sequence[str]) -> int:
        """`pause` for async callers."""
        return (await self._aby_id(client, ids, self._pause_call, ids)).count(1)

    def resume(
        self,
        client: redis.Redis,
        ids: Sequence[str],
        resumed: Callable[[str, bytes], tuple[int, int, int]],
    ) -> int:
        """Resumes paused schedules by id (see resume_slots.lua and `_resume_call`); returns
        how many it resumed."""
        return self._by_id(client, ids, self._resume_call(resumed), ids).count(1)

    async def aresume(
        self,
        client: aredis.Redis,
        ids: Sequence[str],
        resumed: Callable[[str, bytes], tuple[int, int, int]],
    ) -> int:
        """`resume` for async callers."""
        return (await self._aby_id(client, ids, self._resume_call(resumed), ids)).count(1)

    def run_now(self, client: redis.Redis, ids: Sequence[str], now_ms: int) -> int:
        """Runs schedules once now, into the slot of ``now_ms`` (see run_slots_now.lua);
        returns how many it queued."""
        return self._by_id(client, ids, self._run_now_call(now_ms), ids).count(1)

    async def arun_now(self, client: aredis.Redis, ids: Sequence[str], now_ms: int) -> int:
        """`run_now` for async callers."""
        return (await self._aby_id(client, ids, self._run_now_call(now_ms), ids)).count(1)

    def _by_id(
        self, client: redis.Redis, ids: Sequence[str], make: _Make[_T], items: Sequence[_T]
    ) -> list[int]:
        """Runs ``make``'s call for ``items`` (of ``ids``) after reading where they are, and
        again for those that moved meanwhile (-1); one code per item."""
        out, todo = [-1] * len(items), list(range(len(items)))
        for _ in range(_MOVED_RETRIES):
            pipe = client.pipeline(transaction=False)
            self._reads(pipe, [ids[i] for i in todo])
            call = make([items[i] for i in todo], pipe.execute())
            todo = _settle_codes(out, todo, call.run(client))
            if not todo:
                return out
        raise RuntimeError(f"schedules kept moving while being changed: {len(todo)} left")

    async def _aby_id(
        self, client: aredis.Redis, ids: Sequence[str], make: _Make[_T], items: Sequence[_T]
    ) -> list[int]:
        """`_by_id` for async callers."""
        out, todo = [-1] * len(items), list(range(len(items)))
        for _ in range(_MOVED_RETRIES):
            async with client.pipeline(transaction=False) as pipe:
                self._reads(pipe, [ids[i] for i in todo])
                read = await pipe.execute()
            call = make([items[i] for i in todo], read)
            todo = _settle_codes(out, todo, await call.arun(client))
            if not todo:
                return out
        raise RuntimeError(f"schedules kept moving while being changed: {len(todo)} left")


def _settle_codes(out: list[int], todo: list[int], got: list[int]) -> list[int]:
    """Writes the codes of the items ``todo`` into ``out``; returns those that moved (-1)."""
    for i, code in zip(todo, got, strict=True):
        out[i] = code
    return [i for i in todo if out[i] == -1]
