"""The time slots: the store every schedule waits in.

Each schedule waits as one entry, ``<id>|<record>``, in the list of the millisecond it is due
(`Keys.slot`); a claim renames each due slot it takes whole into a lot of its own
(`Keys.claimed`), which the worker reads in the same write, and the settle pushes each
schedule's next entry, which the worker builds (`settled_record`), into its next slot. A run is
its claimer's while `where` still names the slot it was claimed from; the lots only let the
reaper find the runs of a worker whose lease lapsed. Redis does no per-run parsing, and the
entries pass through Lua only when settled (`python -m bench.slots_cpu` counts Redis's
instructions a run). A run of a schedule with limits or routed to another queue goes to
its queue as a job for its one attempt instead (`SlotScripts.queue_runs`), and is settled from
there (`SlotScripts.finish_runs`). The design: ``docs/design/time-slots.md``.

Changes by id (upsert, remove, pause, resume, run now) are `changes.SlotChanges`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

import redis
import redis.asyncio as aredis

from drumbeat.keys import DEFAULT_QUEUE, Keys
from drumbeat.protocol import FIELD_SEP, RUN_PREFIX
from drumbeat.replies import QueuedRuns, parse_queued_runs
from drumbeat.scripts import Call

#: Most upcoming slots a claim reply names (UPCOMING in _lib.lua).
UPCOMING = 128

_T = TypeVar("_T")


def text_of(value: bytes | str) -> str:
    """An entry, or a record, as text. A spec the msgpack codec wrote is binary: its bytes that
    are not UTF-8 stay as they were (as surrogates), and `wire` gives them back when it is
    written again."""
    return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else value


def wire(text: str) -> bytes:
    """An entry or record made of `_text`, as bytes to write (its binary spec as it was)."""
    return text.encode("utf-8", "surrogateescape")


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
        text = text_of(e)
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
    """A schedule's record after one of its runs (``outcome`` ok, fail or skip): its totals,
    last start, duration and lateness, and its next grid slot. ``due_ms`` None: the run's due
    time is unknown, so its lateness counts as 0."""
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


@dataclass(frozen=True, slots=True)
class Queueing:
    """A time-slot run going to its queue as a job (`SlotScripts.queue_runs`)."""

    schedule_id: str
    slot_ms: int
    """The slot it was claimed from (refused unless `where` names it)."""
    record: bytes
    """Its job record: ``<task name>|<schedule record>``, the record as claimed."""
    priority: int
    run_key: str
    """``<due>:<grid>:<generation>:<manual>[:<first start ms>]`` (`protocol.RUN_STATE_FIELDS`)."""
    stalls: int
    claimed_ms: int


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
    input), put back in the input's order; a number alone: every run settled."""
    if isinstance(raw, int):
        return [1] * len(order)
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
            due, _, entry = text_of(r).partition(FIELD_SEP)
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
        args: list[str | bytes | int] = [incarnation, len(runs), len(drops), *drops]
        order: list[int] = []
        for (slot_ms, ms), group in groups.items():
            keys.append(k.slot(ms))
            args += [slot_ms, ms, len(group)]
            order += group
        # The ids together, then the entries (settle_slots.lua hands the ids to HMGET as
        # they are).
        args += [runs[i].schedule_id for i in order]
        args += [wire(runs[i].entry) for i in order]
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

    def queue_runs(
        self,
        incarnation: str,
        queue: str,
        runs: Sequence[Queueing],
        *,
        taker: str = "",
        lease_ms: int = 0,
    ) -> Call[QueuedRuns]:
        """Makes ``runs`` of ``incarnation`` jobs of ``queue`` for their one attempt (their
        schedules are limited or routed: queue_runs.lua): taken by worker ``taker`` (one that
        serves the queue) with a lease of ``lease_ms`` unless the queue is paused, else queued
        in its `ready`."""
        k = self.k
        keys = [k.where, k.jobs, k.state, k.seq, k.busy, k.lateness, k.queues]
        keys += [k.ready_of(queue), k.wake_of(queue), k.owners, k.leases, k.fence, k.progress]
        keys.append(k.pauses)
        args: list[str | bytes | int] = [incarnation, "" if queue == DEFAULT_QUEUE else queue]
        args += [taker, lease_ms]
        for r in runs:
            args += [r.schedule_id, r.slot_ms, r.record, r.priority, r.run_key, r.stalls,
                     r.claimed_ms]  # fmt: skip
        return Call("queue_runs", keys, args, parse_queued_runs)

    def finish_runs(self, runs: Sequence[tuple[int, Settled]]) -> Call[list[int | tuple[int, str]]]:
        """Settles runs that ran as jobs, each (its claim's token, its settle); see
        `parse_settled` for the reply."""
        k = self.k
        keys = [k.owners, k.leases, k.jobs, k.state, k.where, k.slots, k.pending, k.paused]
        keys.append(k.faults)
        args: list[str | bytes | int] = []
        for token, run in runs:
            keys.append(k.slot(run.next_ms))
            args += [RUN_PREFIX + run.schedule_id, token, run.next_ms, wire(run.entry),
                     run.error or ""]  # fmt: skip
        return Call("finish_runs", keys, args, parse_settled)
