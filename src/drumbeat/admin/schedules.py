"""How many schedules there are, and how late their runs started."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from drumbeat import connections
from drumbeat.protocol import LATENESS_WINDOW_MS, bin_percentile_ms

from ._replies import text, time_ms

if TYPE_CHECKING:
    from drumbeat.app import App

# The lateness histogram's ring (protocol.py) holds a few more windows than the minute read.
LATENESS_WINDOWS_PER_MINUTE = 60_000 // LATENESS_WINDOW_MS


@dataclass(frozen=True, slots=True)
class Lateness:
    """Run lateness (start - due) over the last minute; percentiles are bin upper bounds."""

    runs: int
    p50_ms: float | None
    p99_ms: float | None
    max_ms: int | None


@dataclass(frozen=True, slots=True)
class ScheduleStats:
    total: int
    """Schedules registered, over every shard."""
    shards: int
    lateness: Lateness


def lateness_summary(
    fields: Mapping[Any, Any], now_ms: int, windows: int = LATENESS_WINDOWS_PER_MINUTE
) -> Lateness:
    """Merge the last ``windows`` windows (by default the last minute's) from one or more
    shards' `lateness` hashes."""
    current = now_ms // LATENESS_WINDOW_MS
    counts: dict[int, int] = defaultdict(int)
    top: int | None = None
    held = {k: v for k, v in ((text(k), text(v)) for k, v in fields.items())}
    recent = {name[1:] for name, value in held.items()
              if name.startswith("w") and current - int(value) < windows}  # fmt: skip
    for name, value in held.items():  # one pass: the ring holds thousands of fields
        if name.startswith("b"):
            slot, _, bin_ = name[1:].partition(":")
            if slot in recent:
                counts[int(bin_)] += int(value)
        elif name.startswith("m") and name[1:] in recent:
            top = max(top or 0, int(value))
    total = sum(counts.values())
    if not total:
        return Lateness(0, None, None, None)
    return Lateness(total, bin_percentile_ms(counts, 0.50), bin_percentile_ms(counts, 0.99), top)


def schedule_stats(app: App) -> ScheduleStats:
    """How many schedules there are and how late their runs started over the last minute."""
    client = app.redis
    shards = app.scheduler.shards
    with connections.pipeline(client, transaction=False) as pipe:
        pipe.time()
        for keys in shards:
            pipe.hgetall(keys.lateness)
        raw = pipe.execute()
    now_ms = time_ms(raw[0])
    merged: dict[str, str] = {}
    for i, _keys in enumerate(shards):
        # Shards' windows and bins line up; prefix slots by shard so they merge as windows.
        for k, v in raw[1 + i].items():
            name = text(k)
            merged[f"{name[0]}{i}.{name[1:]}"] = text(v)
    total = app.scheduler.count(client)
    return ScheduleStats(total, len(app.scheduler.apart) or 1, lateness_summary(merged, now_ms))
