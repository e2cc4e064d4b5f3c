"""The upgrade from the timing wheel, the schedule store before the time slots: every worker
moves what a namespace still holds in the wheel into the time slots at its start (`move_wheel`),
once per shard (its `upgraded` key says the move is done there).

The schedules of each wheel bucket move in one script call (`move_bucket_to_slots.lua`): their
records, totals and generations as they are, each waiting one into the slot of its due time,
each paused one into `paused`, each with a run queued or in flight into a job the time slots
settle (its worker, of the version before, must be stopped first: docs/deploy.md). A bucket that
changed since it was read is read and sent again; one that cannot move (a damaged record) is
logged and left, and the move is tried again at the next start.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from drumbeat.connections import pipeline
from drumbeat.keys import WHEEL_BUCKETS, Keys
from drumbeat.protocol import WHEEL_PREFIX, wheel_marker
from drumbeat.replies import text
from drumbeat.scripts import Call

if TYPE_CHECKING:
    import redis

log = logging.getLogger("drumbeat.upgrade")

#: Buckets read per round trip.
_BUCKETS_PER_READ = 512
#: Times a bucket that changed while read is read again before giving up.
_TRIES = 20
_WHY = {
    -4: "has a record that cannot be read",
    -5: "is neither waiting, paused nor running (a damaged wheel entry)",
}
#: What `upgraded` holds once a shard's wheel has moved.
MOVED = "wheel moved to time slots"


@dataclass(slots=True)
class Moved:
    """What `move_wheel` moved, over every shard."""

    waiting: int = 0
    """Schedules moved into the slot of their due time."""
    paused: int = 0
    """Paused schedules moved into `paused`."""
    queued: int = 0
    """Schedules whose run was queued or in flight: a job the time slots settle."""
    kept: int = 0
    """Schedules the time slots held already (registered again): their wheel copy went."""
    left: int = 0
    """Buckets that could not move (logged): tried again at the next start."""

    @property
    def total(self) -> int:
        return self.waiting + self.paused + self.queued + self.kept


def move_wheel(client: redis.Redis, shards: list[Keys]) -> Moved:
    """Moves every shard's wheel (of ``shards``) into its time slots, unless done before."""
    moved = Moved()
    for keys in shards:
        if client.get(keys.upgraded) is not None:
            continue
        left = moved.left
        if _holds_a_wheel(client, keys):
            for shard_bucket in _buckets(client, keys):
                _move(client, keys, shard_bucket, moved)
            _drop_stale_markers(client, keys)
        if moved.left == left:
            client.set(keys.upgraded, MOVED)
    if moved.total:
        log.warning("moved %d schedules from the timing wheel into the time slots (%d waiting, "
                    "%d paused, %d with a run queued or in flight, %d held there already)",
                    moved.total, moved.waiting, moved.paused, moved.queued,
                    moved.kept)  # fmt: skip
    return moved


def _holds_a_wheel(client: redis.Redis, keys: Keys) -> bool:
    """Whether any bucket of the shard's wheel holds a schedule: an `EXISTS` of
    `_BUCKETS_PER_READ` bucket keys a command, in one round trip (a few ms; reading every
    bucket, as `_buckets` does, took 0.44 s on an empty namespace)."""
    with pipeline(client, transaction=False) as pipe:
        for lo in range(0, WHEEL_BUCKETS, _BUCKETS_PER_READ):
            hi = min(lo + _BUCKETS_PER_READ, WHEEL_BUCKETS)
            pipe.exists(*(keys.schedules(b) for b in range(lo, hi)))
        return any(int(n) for n in pipe.execute())


@dataclass(frozen=True, slots=True)
class _Bucket:
    bucket: int
    records: dict[str, bytes]
    scores: dict[str, int]


def _buckets(client: redis.Redis, keys: Keys) -> Iterator[_Bucket]:
    """Every wheel bucket that holds schedules, read `_BUCKETS_PER_READ` at a time."""
    for lo in range(0, WHEEL_BUCKETS, _BUCKETS_PER_READ):
        buckets = range(lo, min(lo + _BUCKETS_PER_READ, WHEEL_BUCKETS))
        with pipeline(client, transaction=False) as pipe:
            for b in buckets:
                pipe.hgetall(keys.schedules(b))
                pipe.zrange(keys.wheel(b), 0, -1, withscores=True)
            replies = pipe.execute()
        for i, b in enumerate(buckets):
            records, scores = replies[2 * i], replies[2 * i + 1]
            if records:
                yield _read(b, records, scores)


def _read(bucket: int, records: Any, scores: Any) -> _Bucket:
    return _Bucket(
        bucket,
        {text(sid): record for sid, record in records.items()},
        {text(sid): int(score) for sid, score in scores},
    )


def _move(client: redis.Redis, keys: Keys, bucket: _Bucket, moved: Moved) -> None:
    """Moves the schedules of one bucket (read again while it changes under the call)."""
    for _ in range(_TRIES):
        reply = _call(keys, bucket, list(bucket.records)).run(client)
        code = int(reply[0])
        if code >= 0:
            waiting, paused, queued, kept = (int(x) for x in reply)
            moved.waiting += waiting
            moved.paused += paused
            moved.queued += queued
            moved.kept += kept
            return
        if code != -1:
            log.error("schedule %r %s: its wheel bucket %d (of %s) stays; the other buckets "
                      "move", text(reply[1]), _WHY[code], bucket.bucket, keys.tag)  # fmt: skip
            moved.left += 1
            return
        with pipeline(client, transaction=False) as pipe:
            pipe.hgetall(keys.schedules(bucket.bucket))
            pipe.zrange(keys.wheel(bucket.bucket), 0, -1, withscores=True)
            records, scores = pipe.execute()
        bucket = _read(bucket.bucket, records, scores)
        if not bucket.records:
            return
    log.error("wheel bucket %d of %s kept changing while it moved: are workers of the version "
              "before still running?", bucket.bucket, keys.tag)  # fmt: skip
    moved.left += 1


def _call(k: Keys, bucket: _Bucket, ids: list[str]) -> Call[list[Any]]:
    keys = [k.wheel(bucket.bucket), k.schedules(bucket.bucket), k.due, k.state]
    keys += [k.slots, k.where, k.paused, k.jobs, k.tasks, k.pending]
    args: list[str | int] = [wheel_marker(bucket.bucket), len(ids)]
    for sid in ids:
        due = bucket.scores.get(sid)
        keys.append(k.slot(due) if due is not None else k.slots)
        args += [sid, "" if due is None else due]
    return Call("move_bucket_to_slots", keys, args, list)


def _drop_stale_markers(client: redis.Redis, keys: Keys) -> None:
    """Takes out of `due` the markers of wheel buckets left empty (the wheel's claim dropped
    those lazily; none comes after this)."""
    markers = [text(m) for m, _ in client.zscan_iter(keys.due, match=f"{WHEEL_PREFIX}*")]
    if not markers:
        return
    with pipeline(client, transaction=False) as pipe:
        for marker in markers:
            pipe.exists(keys.schedules(int(marker[len(WHEEL_PREFIX) :])))
        held = pipe.execute()
    empty = [m for m, n in zip(markers, held, strict=True) if not n]
    if empty:
        client.zrem(keys.due, *empty)
