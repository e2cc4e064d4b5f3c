"""What the demo shows: a snapshot of drumbeat's own figures (schedules, run lateness as the
claim script records it, the supervisors' processes) and the marketplace's counters, rendered
live with rich and summed up at the end."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rich.table import Table

from drumbeat import App, admin, autoscale
from drumbeat.protocol import bin_percentile_ms, bin_upper_ms

from . import ledger
from .server import SEARCH_BUDGET, Market, Stats


@dataclass(frozen=True, slots=True)
class RunLateness:
    """Start lateness of every schedule run since the demo began (drumbeat's cumulative
    histogram, ~19 %-wide bins: a percentile is its bin's upper bound, never below the truth)."""

    runs: int
    p50_ms: float | None
    p99_ms: float | None
    max_bin_ms: float | None


@dataclass(frozen=True, slots=True)
class Snapshot:
    at: float
    """time.monotonic() when it was taken."""
    schedules: int
    recent: admin.Lateness
    """Lateness over the last minute, as `drumbeat status` shows it."""
    bins: Mapping[int, int]
    """Runs per lateness bin since the demo began (`lateness_bins`)."""
    ready: int
    processes: int
    desired: int
    scale_reason: str
    matched: int
    market: Stats


def lateness_bins(shards: list[Mapping[Any, Any]]) -> dict[int, int]:
    """Runs per lateness bin since the namespace began: the ``c<bin>`` counters of each
    shard's `lateness` hash, merged."""
    counts: defaultdict[int, int] = defaultdict(int)
    for fields in shards:
        for raw, value in fields.items():
            name = raw.decode() if isinstance(raw, bytes) else str(raw)
            if name.startswith("c") and name[1:].isdigit():
                counts[int(name[1:])] += int(value)
    return dict(counts)


def run_lateness(bins: Mapping[int, int], since: Mapping[int, int] | None = None) -> RunLateness:
    """The runs of ``bins`` (those after ``since``, when given) and their percentiles."""
    counts = {b: n - (since or {}).get(b, 0) for b, n in bins.items()}
    counts = {b: n for b, n in counts.items() if n > 0}
    total = sum(counts.values())
    if not total:
        return RunLateness(0, None, None, None)
    p50, p99 = bin_percentile_ms(counts, 0.50), bin_percentile_ms(counts, 0.99)
    return RunLateness(total, p50, p99, bin_upper_ms(max(counts)))


def snapshot(app: App, market: Market, at: float) -> Snapshot:
    stats = admin.schedule_stats(app)
    signal = autoscale.read_signal(app)
    with app.redis.pipeline(transaction=False) as pipe:
        for keys in app.scheduler.shards:
            pipe.hgetall(keys.lateness)
        pipe.scard(ledger.MATCHED)
        raw = pipe.execute()
    sups = signal.supervisors
    return Snapshot(
        at=at,
        schedules=stats.total,
        recent=stats.lateness,
        bins=lateness_bins(raw[:-1]),
        ready=signal.ready,
        processes=sum(s.live for s in sups),
        desired=sum(s.desired for s in sups),
        scale_reason=sups[0].reason if sups else "",
        matched=int(raw[-1]),
        market=market.stats(),
    )


def ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.0f} ms"


def live(now: Snapshot, before: Snapshot, phase: str) -> Table:
    """The live view: one row per figure, rates over the time since ``before``."""
    dt = max(1e-3, now.at - before.at)
    runs_s = run_lateness(now.bins, since=before.bins).runs / dt
    m = now.market
    table = Table(title=f"drumbeat marketplace monitor  {phase}", show_header=False, min_width=64)
    table.add_column(style="bold")
    table.add_column(justify="right")
    table.add_row("monitors (schedules, every 5 s)", f"{now.schedules:,}")
    table.add_row("monitor runs/s", f"{runs_s:,.0f}")
    table.add_row(
        "run lateness p50 / p99 (last min)", f"{ms(now.recent.p50_ms)} / {ms(now.recent.p99_ms)}"
    )
    table.add_row("searches/s (limit)", f"{m.searches_last_s} ({SEARCH_BUDGET})")
    table.add_row("searches answered 429", _flag(m.throttled))
    table.add_row("listings", f"{m.listings:,}")
    table.add_row("matches (user, item)", f"{now.matched:,}")
    table.add_row("orders placed", f"{m.orders:,}")
    table.add_row("duplicate orders", _flag(m.duplicates))
    table.add_row("jobs waiting", f"{now.ready:,}")
    reason = f"  [dim]{now.scale_reason}[/]" if now.scale_reason else ""
    table.add_row("worker processes (desired)", f"{now.processes} ({now.desired}){reason}")
    return table


def _flag(n: int) -> str:
    return f"[green]{n}[/]" if n == 0 else f"[bold red]{n}[/]"
