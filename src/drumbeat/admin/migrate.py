"""Moving a namespace's schedules from the wheel into the time slots (``drumbeat schedules
migrate --to slots``), with its workers stopped.

The schedules of each wheel bucket move in one script call (`move_bucket_to_slots.lua`): their
records, totals and generations as they are, each waiting one into the slot of its due time,
each paused one into `paused`. A bucket that changed since it was read is read and sent again.
Limited schedules and those routed to another queue stay in the wheel, which keeps them under
``schedule_store="slots"`` too (the time slots cannot keep them yet). A schedule with a run
queued or in flight stops the migration at its bucket (the buckets before it have moved: run it
again once the run is done, with the workers stopped).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from drumbeat.connections import pipeline
from drumbeat.errors import DrumbeatError
from drumbeat.keys import DEFAULT_QUEUE, WHEEL_BUCKETS, Keys
from drumbeat.protocol import WHEEL_PREFIX, wheel_marker
from drumbeat.replies import text
from drumbeat.schedule import decode_schedule_spec, parse_record
from drumbeat.scheduler import _task_names
from drumbeat.scripts import Call

if TYPE_CHECKING:
    from drumbeat.app import App

__all__ = ["Migrated", "MigrationRefused", "to_slots"]

#: Buckets read per round trip.
_BUCKETS_PER_READ = 512
#: Times a bucket that changed while read is read again before giving up.
_TRIES = 20
_WHY = {
    -2: "has a run queued or in flight: stop the workers once no run is queued, then migrate",
    -3: "is kept as time slots already (the two stores hold the same id)",
    -4: "has a record that cannot be read",
    -5: "is neither waiting, paused nor running (a damaged wheel entry)",
}


class MigrationRefused(DrumbeatError):
    """A schedule that cannot move: the buckets before its own have moved."""


@dataclass(frozen=True, slots=True)
class Migrated:
    waiting: int
    """Schedules moved into the slot of their due time."""
    paused: int
    """Paused schedules moved into `paused`."""
    kept: int = 0
    """Limited and routed schedules, left in the wheel."""


@dataclass(frozen=True, slots=True)
class _Bucket:
    shard: int
    bucket: int
    records: dict[str, bytes]
    scores: dict[str, int]


def to_slots(app: App, *, progress: Callable[[int], None] | None = None) -> Migrated:
    """Moves every schedule of ``app``'s namespace from the wheel into the time slots;
    ``progress`` is told the schedules moved so far after each bucket.

    Raises:
        MigrationRefused: before moving anything, for schedules the time slots cannot keep
            yet; at the first bucket that cannot move, for the reasons in `_WHY`.
    """
    names = [
        _task_names(cast(Mapping[bytes, bytes], app.redis.hgetall(k.tasks)))
        for k in app.scheduler.shards
    ]
    waiting = paused = kept = 0
    for bucket in _buckets(app):
        apart = _kept_by_wheel(app, bucket, names[bucket.shard])
        kept += len(apart)
        moved = _move(app, bucket, apart)
        waiting, paused = waiting + moved[0], paused + moved[1]
        if progress is not None:
            progress(waiting + paused)
    for keys in app.scheduler.shards:
        _drop_stale_markers(app, keys)
    return Migrated(waiting, paused, kept)


def _drop_stale_markers(app: App, keys: Keys) -> None:
    """Takes out of `due` the markers of wheel buckets left empty before the migration (the
    wheel's claim drops those lazily; no claim of the wheel's comes after this)."""
    markers = [text(m) for m, _ in app.redis.zscan_iter(keys.due, match=f"{WHEEL_PREFIX}*")]
    if not markers:
        return
    with pipeline(app.redis, transaction=False) as pipe:
        for marker in markers:
            pipe.exists(keys.schedules(int(marker[len(WHEEL_PREFIX) :])))
        held = pipe.execute()
    empty = [m for m, n in zip(markers, held, strict=True) if not n]
    if empty:
        app.redis.zrem(keys.due, *empty)


def _buckets(app: App) -> Iterator[_Bucket]:
    """Every wheel bucket that holds schedules, read `_BUCKETS_PER_READ` at a time."""
    for shard, keys in enumerate(app.scheduler.shards):
        for lo in range(0, WHEEL_BUCKETS, _BUCKETS_PER_READ):
            buckets = range(lo, min(lo + _BUCKETS_PER_READ, WHEEL_BUCKETS))
            with pipeline(app.redis, transaction=False) as pipe:
                for b in buckets:
                    pipe.hgetall(keys.schedules(b))
                    pipe.zrange(keys.wheel(b), 0, -1, withscores=True)
                replies = pipe.execute()
            for i, b in enumerate(buckets):
                records, scores = replies[2 * i], replies[2 * i + 1]
                if records:
                    yield _read(shard, b, records, scores)


def _read(shard: int, bucket: int, records: Any, scores: Any) -> _Bucket:
    return _Bucket(
        shard,
        bucket,
        {text(sid): record for sid, record in records.items()},
        {text(sid): int(score) for sid, score in scores},
    )


def _kept_by_wheel(app: App, bucket: _Bucket, names: Mapping[str, str]) -> set[str]:
    """The schedules of ``bucket`` that stay in the wheel: limited ones, those routed to
    another queue, and those whose record cannot be read (``names``: its shard's task names
    by code)."""
    kept = set()
    for sid, record in bucket.records.items():
        try:
            info = app.scheduler.decode(sid, record, names)
            limited = decode_schedule_spec(parse_record(record).spec)[3] is not None
        except Exception:  # the wheel's workers report it when they run it
            limited = True
        if limited or info.queue != DEFAULT_QUEUE:
            kept.add(sid)
    return kept


def _move(app: App, bucket: _Bucket, apart: set[str]) -> tuple[int, int]:
    """Moves the schedules of one bucket but those ``apart`` (read again while it changes
    under the call)."""
    keys = app.scheduler.shards[bucket.shard]
    for _ in range(_TRIES):
        ids = [sid for sid in bucket.records if sid not in apart]
        if not ids:
            return 0, 0
        reply = _call(keys, bucket, ids).run(app.redis)
        code = int(reply[0])
        if code >= 0:
            return code, int(reply[1])
        sid = text(reply[1])
        if code != -1:
            raise MigrationRefused(
                f"schedule {sid!r} {_WHY[code]}; the buckets before it have moved"
            )
        with pipeline(app.redis, transaction=False) as pipe:
            pipe.hgetall(keys.schedules(bucket.bucket))
            pipe.zrange(keys.wheel(bucket.bucket), 0, -1, withscores=True)
            records, scores = pipe.execute()
        bucket = _read(bucket.shard, bucket.bucket, records, scores)
    raise MigrationRefused(
        f"wheel bucket {bucket.bucket} of shard {bucket.shard} kept changing: are workers "
        "or producers still running?"
    )


def _call(k: Keys, bucket: _Bucket, ids: list[str]) -> Call[list[Any]]:
    keys = [k.wheel(bucket.bucket), k.schedules(bucket.bucket), k.due, k.state]
    keys += [k.slots, k.where, k.paused]
    args: list[str | int] = [wheel_marker(bucket.bucket), len(ids)]
    for sid in ids:
        due = bucket.scores.get(sid)
        keys.append(k.slot(due) if due is not None else k.slots)
        args += [sid, "" if due is None else due]
    return Call("move_bucket_to_slots", keys, args, list)
