"""Reading schedules: one by id (`App.get_schedule`) and all of them, or those whose id starts
with a prefix (`App.schedules`).

A schedule's entry waits in the slot `where` names, or in `paused` (`where` says "p"); while
its run is in flight it is in one of its worker's lots instead (`slots.py`), where `where`
still names the slot it was claimed from; while its run is queued as a job (`where` says "q"),
its record is the job's, in `jobs`.
These are plans (`plans.Reads`): pipelined reads, the same for the sync and async clients.
An entry that moves between two reads (a claim, a settle) is looked for again.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from drumbeat.keys import Keys
from drumbeat.protocol import FIELD_SEP, PAUSED_AT, PAUSED_FLAG, QUEUED_AT, RUN_PREFIX
from drumbeat.replies import text
from drumbeat.schedule import check_schedule_id

from .models import ScheduleInfo, decode_info, task_names
from .plans import Plan, Reads, send

if TYPE_CHECKING:
    from .store import ScheduleStore

_R = TypeVar("_R")
#: A part of a plan that returns what it read (`yield from` it).
_Step = Generator[Reads, list[Any], _R]

#: Lookups of one id whose entry kept moving between its reads, before giving up.
_TRIES = 5
#: `where` fields read per HSCAN (its COUNT), and slots read per round trip, when listing.
SCAN_COUNT = 1000


def _record(entries: Sequence[bytes], schedule_id: str) -> bytes | None:
    """The record of ``schedule_id``'s entry among ``entries``, if there."""
    plain, stalled = f"{schedule_id}|".encode(), f"{schedule_id};".encode()
    for entry in entries:
        if entry.startswith(plain):
            return entry[len(plain) :]
        if entry.startswith(stalled):
            return entry.partition(b"|")[2]
    return None


def _flying(k: Keys, at_ms: int | None = None) -> _Step[dict[str, tuple[int, bytes]]]:
    """Every run in flight in a shard (claimed from slot ``at_ms`` only, if given): schedule id
    -> (the slot it was claimed from, its record), read from the lots of the incarnations in
    `runners`. A record whose schedule was paused meanwhile (a "P" in `pending`: its settle
    pauses it) reads as paused at once."""
    incarnations, pending = yield Reads([("ZRANGE", k.runners, 0, -1), ("HGETALL", k.pending)])
    pausing = {text(sid) for sid, change in pending.items() if change[:1] == b"P"}
    names = [text(i) for i in incarnations]
    held = yield Reads([("HKEYS", k.inflight(name)) for name in names])
    lots = [(name, text(lot)) for name, got in zip(names, held, strict=True) for lot in got]
    if at_ms is not None:
        lots = [(name, lot) for name, lot in lots if int(lot.rpartition(":")[2]) == at_ms]
    read = yield Reads([("LRANGE", k.claimed(name, lot), 0, -1) for name, lot in lots])
    out: dict[str, tuple[int, bytes]] = {}
    for (_, lot), entries in zip(lots, read, strict=True):
        ms = int(lot.rpartition(":")[2])
        for entry in entries:
            head, sep, record = entry.partition(b"|")
            sid = head.partition(b";")[0].decode()
            if sep:
                out[sid] = (ms, _flagged_paused(record) if sid in pausing else record)
    return out


def _flagged_paused(record: bytes) -> bytes:
    """``record`` with its flags saying paused (as it is, if it cannot be read)."""
    try:
        gen, grid, flags, rest = record.split(b"|", 3)
        if int(flags) < PAUSED_FLAG:
            flags = b"%d" % (int(flags) + PAUSED_FLAG)
    except ValueError:
        return record
    return b"|".join((gen, grid, flags, rest))


def lookup(store: ScheduleStore, schedule_id: str) -> Plan[ScheduleInfo]:
    """One schedule with its state (its next due time; None while its run is queued or in
    flight), if it exists."""
    for shard in store.homes(check_schedule_id(schedule_id)):
        k = store.shards[shard]
        for _ in range(_TRIES):
            at, fault, raw_names = yield Reads(
                [("HGET", k.where, schedule_id), ("HGET", k.faults, schedule_id),
                 ("HGETALL", k.tasks)]
            )  # fmt: skip
            if at is None:
                break  # not in this shard
            names = task_names(raw_names)
            record = yield from _record_at(k, schedule_id, text(at))
            if record is not None:
                due = int(at) if text(at).isdigit() and record[1] else None
                yield decode_info(schedule_id, record[0], names, due, fault)
                return
        else:
            raise RuntimeError(f"schedule {schedule_id!r} kept moving while being read")


def _record_at(k: Keys, schedule_id: str, at: str) -> _Step[tuple[bytes, bool] | None]:
    """The record of ``schedule_id`` where `where` says it is (``at``), and whether it waits
    there (False: its run is in flight, queued as a job, or it is paused); None when it moved
    meanwhile."""
    if at == PAUSED_AT:
        (entry,) = yield Reads([("HGET", k.paused, schedule_id)])
        return None if entry is None else (entry.partition(b"|")[2], False)
    if at == QUEUED_AT:
        (job,) = yield Reads([("HGET", k.jobs, RUN_PREFIX + schedule_id)])
        return None if job is None else (_job_record(job), False)
    (entries,) = yield Reads([("LRANGE", k.slot(int(at)), 0, -1)])
    record = _record(entries, schedule_id)
    if record is not None:
        return record, True
    flying = yield from _flying(k, int(at))
    found = flying.get(schedule_id)
    return None if found is None else (found[1], False)


def _job_record(job: bytes) -> bytes:
    """The schedule record of a run queued as a job (its job record: "<task>|<record>")."""
    return job.partition(FIELD_SEP.encode())[2]


def in_flight(store: ScheduleStore, schedule_id: str) -> Plan[bool]:
    """Whether a run of ``schedule_id`` is claimed by a worker's lane (not settled yet); a run
    queued as a job is a job."""
    for shard in store.homes(check_schedule_id(schedule_id)):
        k = store.shards[shard]
        for _ in range(_TRIES):
            (at,) = yield Reads([("HGET", k.where, schedule_id)])
            if at is None:
                break
            if not text(at).isdigit():
                yield False
                return
            (entries,) = yield Reads([("LRANGE", k.slot(int(at)), 0, -1)])
            if _record(entries, schedule_id) is not None:
                yield False
                return
            flying = yield from _flying(k, int(at))
            if schedule_id in flying:
                yield True
                return
        else:
            raise RuntimeError(f"schedule {schedule_id!r} kept moving while being read")
    yield False


def held(k: Keys, ids: Sequence[str]) -> Plan[list[bool]]:
    """Whether shard ``k`` holds each of ``ids``: one item, a flag each."""
    (got,) = yield Reads([("HMGET", k.where, *ids)])
    yield [g is not None for g in got]


def home(store: ScheduleStore, schedule_id: str) -> Plan[int]:
    """The shard a schedule lives in (an index of `ScheduleStore.shards`), if it exists."""
    homes = store.homes(check_schedule_id(schedule_id))
    found = yield Reads([("HEXISTS", store.shards[i].where, schedule_id) for i in homes])
    for shard, there in zip(homes, found, strict=True):
        if there:
            yield shard
            return


@dataclass(frozen=True, slots=True)
class Batch:
    """The schedules one `HSCAN` of a shard's `where` found, in a stable order (the same
    reply gives the same list: a page may resume in it)."""

    cursor: int
    """The scan cursor this batch was read from."""
    following: int
    """The cursor of the next batch (0: the shard's scan is over)."""
    infos: list[ScheduleInfo]


def listing(store: ScheduleStore, prefix: str = "") -> Plan[ScheduleInfo]:
    """Every schedule whose id starts with ``prefix``, with its state (`batches` of every
    shard). A schedule that moves while the listing runs may be missed or listed twice, as a
    scan of a changing keyspace does."""
    for shard in range(len(store.shards)):
        plan = batches(store, shard, prefix)
        step = next(plan, None)
        while step is not None:
            if isinstance(step, Reads):
                step = send(plan, (yield step))
            else:
                # Not `yield from` the list: the driver sends its replies into this plan.
                for info in step.infos:  # noqa: UP028
                    yield info
                step = next(plan, None)


def batches(store: ScheduleStore, shard: int, prefix: str, cursor: int = 0) -> Plan[Batch]:
    """The schedules of ``shard`` whose id starts with ``prefix``, a `Batch` per `HSCAN` of
    `where` from ``cursor`` on: the slots it names read in pipelined batches, paused entries
    from `paused`, and the runs in flight from their lots."""
    pattern = "".join(f"\\{c}" if c in "*?[]\\" else c for c in prefix) + "*"
    k = store.shards[shard]
    (raw_names,) = yield Reads([("HGETALL", k.tasks)])
    names = task_names(raw_names)
    flying: dict[str, tuple[int, bytes]] | None = None
    while True:
        ((cursor_raw, flat),) = yield Reads(
            [("HSCAN", k.where, cursor, "MATCH", pattern, "COUNT", SCAN_COUNT)]
        )
        # redis-py parses HSCAN's fields into a dict; a raw reply is a flat list.
        if not isinstance(flat, dict):
            flat = dict(zip(flat[::2], flat[1::2], strict=True))
        at = {text(f): int(v) for f, v in flat.items() if text(v).isdigit()}
        paused = [text(f) for f, v in flat.items() if text(v) == PAUSED_AT]
        queued = [text(f) for f, v in flat.items() if text(v) == QUEUED_AT]
        infos = (yield from _paused(k, names, paused)) if paused else []
        if queued:
            infos += yield from _queued(k, names, queued)
        if at:
            found = yield from _found(k, at)
            if flying is None and any(sid not in found for sid in at):
                flying = yield from _flying(k)
            (faults,) = yield Reads([("HMGET", k.faults, *at)])
            for (sid, ms), fault in zip(at.items(), faults, strict=True):
                if sid in found:
                    infos.append(decode_info(sid, found[sid], names, ms, fault))
                elif flying is not None and sid in flying and flying[sid][0] == ms:
                    infos.append(decode_info(sid, flying[sid][1], names, None, fault))
                # else it moved while listed
        yield Batch(cursor, int(cursor_raw), infos)
        cursor = int(cursor_raw)
        if cursor == 0:
            return


def _paused(k: Keys, names: Mapping[str, str], ids: Sequence[str]) -> _Step[list[ScheduleInfo]]:
    """The paused schedules ``ids`` (`where` says "p"), from `paused`."""
    entries, faults = yield Reads([("HMGET", k.paused, *ids), ("HMGET", k.faults, *ids)])
    return [
        decode_info(sid, entry.partition(b"|")[2], names, None, fault)
        for sid, entry, fault in zip(ids, entries, faults, strict=True)
        if entry is not None  # else resumed while listed
    ]


def _queued(k: Keys, names: Mapping[str, str], ids: Sequence[str]) -> _Step[list[ScheduleInfo]]:
    """The schedules ``ids`` whose run is queued as a job (`where` says "q"), from `jobs`."""
    members = [RUN_PREFIX + sid for sid in ids]
    jobs, faults = yield Reads([("HMGET", k.jobs, *members), ("HMGET", k.faults, *ids)])
    return [
        decode_info(sid, _job_record(job), names, None, fault)
        for sid, job, fault in zip(ids, jobs, faults, strict=True)
        if job is not None  # else settled while listed
    ]


def _found(k: Keys, at: Mapping[str, int]) -> _Step[dict[str, bytes]]:
    """The records of the ids ``at`` names that wait in the slot it names."""
    slots = sorted(set(at.values()))
    out: dict[str, bytes] = {}
    for lo in range(0, len(slots), SCAN_COUNT):
        batch = slots[lo : lo + SCAN_COUNT]
        read = yield Reads([("LRANGE", k.slot(ms), 0, -1) for ms in batch])
        for entries in read:
            for entry in entries:
                head, sep, record = entry.partition(b"|")
                sid = head.partition(b";")[0].decode()
                if sep and sid in at:
                    out[sid] = record
    return out
