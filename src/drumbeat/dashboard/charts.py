"""The overview's charts: attempts completed and failed per second, and schedule runs' lateness
p50 / p99, over the last 15 minutes in 10 s windows, drawn as inline SVG on the server.

The numbers come from two fixed-size rings in Redis that every worker and every claim add to
(`throughput`, written by tally.lua with each settle batch, and `lateness`, by the claim
scripts), so the charts are right however many worker processes run, on however many
machines, and whichever dashboard draws them.
"""

from __future__ import annotations

import html
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from markupsafe import Markup

from drumbeat.connections import pipeline
from drumbeat.protocol import (
    LATENESS_WINDOW_MS,
    LATENESS_WINDOWS,
    THROUGHPUT_WINDOW_MS,
    THROUGHPUT_WINDOWS,
    bin_percentile_ms,
)

if TYPE_CHECKING:
    from drumbeat.app import App

__all__ = ["WINDOWS", "WINDOW_MS", "Line", "chart_svg", "overview_charts", "series_json"]

# The two rings line up window for window; the charts rely on it.
assert THROUGHPUT_WINDOW_MS == LATENESS_WINDOW_MS
assert THROUGHPUT_WINDOWS == LATENESS_WINDOWS
WINDOW_MS = THROUGHPUT_WINDOW_MS
#: Windows drawn: the 90 full ones of the last 15 minutes and the one being filled.
WINDOWS = THROUGHPUT_WINDOWS


def _str(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def _held(fields: Mapping[str, str], current: int) -> dict[int, int]:
    """Slot -> window number, for the slots of the `lateness` ring that hold one of the last
    `WINDOWS` windows."""
    out = {}
    for name, value in fields.items():
        if name.startswith("w") and name[1:].isdigit() and current - int(value) < WINDOWS:
            out[int(name[1:])] = int(value)
    return out


def _throughput(fields: Mapping[str, str], now_ms: int) -> list[dict[str, Any]]:
    """The `throughput` ring: ``<slot>`` -> ``<window>|<completed>|<failed>``."""
    current = now_ms // WINDOW_MS
    by_window: dict[int, tuple[int, int]] = {}
    for value in fields.values():
        parts = value.split("|")
        if len(parts) == 3 and all(p.lstrip("-").isdigit() for p in parts):
            window, completed, failed = map(int, parts)
            if current - WINDOWS < window <= current:
                by_window[window] = (completed, failed)
    points = []
    for window in range(current - WINDOWS + 1, current + 1):
        completed, failed = by_window.get(window, (0, 0))
        start = window * WINDOW_MS
        # The window being filled counts only the time it has run (at least a second).
        seconds = WINDOW_MS / 1000 if window < current else max(1.0, (now_ms - start) / 1000)
        # A count taken back (a refused settle) may land in a later window than it was added.
        points.append(
            {"at_ms": start, "seconds": seconds,
             "completed": max(0, completed), "failed": max(0, failed)}
        )  # fmt: skip
    return points


def _lateness(shards: Sequence[Mapping[str, str]], now_ms: int) -> list[dict[str, Any]]:
    current = now_ms // WINDOW_MS
    bins: defaultdict[int, defaultdict[int, int]] = defaultdict(lambda: defaultdict(int))
    for fields in shards:
        held = _held(fields, current)
        for name, value in fields.items():
            if not name.startswith("b"):
                continue
            slot, _, b = name[1:].partition(":")
            if slot.isdigit() and int(slot) in held and b.lstrip("-").isdigit():
                bins[held[int(slot)]][int(b)] += int(value)
    points = []
    for window in range(current - WINDOWS + 1, current + 1):
        found = bins.get(window)
        runs = sum(found.values()) if found else 0
        points.append(
            {"at_ms": window * WINDOW_MS, "runs": runs,
             "p50_ms": bin_percentile_ms(found, 0.50) if found and runs else None,
             "p99_ms": bin_percentile_ms(found, 0.99) if found and runs else None}
        )  # fmt: skip
    return points


def series_json(app: App) -> dict[str, Any]:
    """The last 15 minutes, window by window (oldest first), in one round trip.

    ``throughput``: attempts ``completed`` and ``failed`` (failed, retried or dead-lettered) in
    each window, which lasted ``seconds`` (the last one is still being filled). ``lateness``:
    schedule runs started in each window and their lateness p50 / p99 (upper bounds of ~19 %
    wide bins; ``null`` without runs), over every schedule shard.
    """
    with pipeline(app.redis, transaction=False) as pipe:
        pipe.time()
        pipe.hgetall(app.keys.throughput)
        for keys in app.scheduler.shards:
            pipe.hgetall(keys.lateness)
        raw = pipe.execute()
    seconds, micros = raw[0]
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    decoded = [{_str(k): _str(v) for k, v in fields.items()} for fields in raw[1:]]
    return {
        "window_ms": WINDOW_MS,
        "now_ms": now_ms,
        "throughput": _throughput(decoded[0], now_ms),
        "lateness": _lateness(decoded[1:], now_ms),
    }


# -- SVG ---------------------------------------------------------------------------------------

WIDTH, HEIGHT = 560, 170
MINUS = "\N{MINUS SIGN}"
LEFT, RIGHT, TOP, BOTTOM = 52, 10, 26, 22


@dataclass(frozen=True, slots=True)
class Line:
    name: str
    color: str
    values: Sequence[float | None]
    """One value per window, oldest first; None leaves a gap."""


def _nice_ceiling(value: float) -> float:
    """The smallest 1, 2 or 5 times a power of ten at or above ``value`` (at least 1)."""
    if value <= 1:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    return float(next(m * power for m in (1, 2, 5, 10) if m * power >= value))


def _number(value: float) -> str:
    if value >= 1000:
        return f"{value / 1000:g}k"
    return f"{value:g}"


def _runs(line: Line, x: Any, y: Any) -> list[str]:
    """The line as polylines over its stretches without gaps (a lone point as a dot)."""
    out, stretch = [], []
    for i, v in enumerate([*line.values, None]):
        if v is not None:
            stretch.append(f"{x(i):.1f},{y(v):.1f}")
            continue
        if len(stretch) == 1:
            cx, cy = stretch[0].split(",")
            out.append(f'<circle cx="{cx}" cy="{cy}" r="2" fill="{line.color}"/>')
        elif stretch:
            out.append(
                f'<polyline fill="none" stroke="{line.color}" stroke-width="1.5" '
                f'stroke-linejoin="round" points="{" ".join(stretch)}"/>'
            )
        stretch = []
    return out


def chart_svg(title: str, unit: str, lines: Sequence[Line], chart_id: str) -> Markup:
    """A line chart of the last 15 minutes, as an ``<svg>`` element (no script, no style
    attribute: the Content-Security-Policy allows neither inline)."""
    n = max((len(line.values) for line in lines), default=0)
    top = _nice_ceiling(max((v for line in lines for v in line.values if v is not None), default=0))
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(i: int) -> float:
        return LEFT + (i * plot_w / (n - 1) if n > 1 else plot_w)

    def y(v: float) -> float:
        return TOP + plot_h - v / top * plot_h

    esc = html.escape
    parts = [
        f'<svg id="{esc(chart_id)}" class="chart" role="img" aria-labelledby="{esc(chart_id)}-t" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" '
        'xmlns="http://www.w3.org/2000/svg" font-size="11" font-family="system-ui, sans-serif">',
        f'<title id="{esc(chart_id)}-t">{esc(title)}</title>',
        f'<text x="{LEFT}" y="14" font-weight="600" fill="#1d2329">{esc(title)}</text>',
    ]
    legend_x = WIDTH - RIGHT
    for line in reversed(lines):
        legend_x -= 20 + 7 * len(line.name)
        parts.append(
            f'<rect x="{legend_x}" y="6" width="9" height="9" fill="{line.color}"/>'
            f'<text x="{legend_x + 12}" y="14" fill="#6a737d">{esc(line.name)}</text>'
        )
    for frac in (0.0, 0.5, 1.0):
        gy = y(top * frac)
        parts.append(
            f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{gy:.1f}" y2="{gy:.1f}" stroke="#e1e4e8"/>'
            f'<text x="{LEFT - 4}" y="{gy + 4:.1f}" text-anchor="end" fill="#6a737d">'
            f"{esc(_number(top * frac))}{esc(unit) if frac == 1.0 else ''}</text>"
        )
    if n > 1:
        for i in (0, (n - 1) // 3, (n - 1) * 2 // 3):
            ago = (n - 1 - i) * WINDOW_MS / 60_000
            parts.append(
                f'<text x="{x(i):.1f}" y="{HEIGHT - 6}" fill="#6a737d">{MINUS}{ago:g} min</text>'
            )
        parts.append(
            f'<text x="{x(n - 1):.1f}" y="{HEIGHT - 6}" text-anchor="end" fill="#6a737d">now</text>'
        )
    for line in lines:
        parts.append(f'<g data-series="{esc(line.name)}">{"".join(_runs(line, x, y))}</g>')
    parts.append("</svg>")
    # Safe: built here from numbers and escaped text.
    return Markup("".join(parts))


def overview_charts(series: Mapping[str, Any]) -> dict[str, Markup]:
    """The throughput and lateness charts of `series_json`'s data."""
    flow = series["throughput"]
    late = series["lateness"]
    return {
        "throughput": chart_svg(
            "Attempts per second", "/s",
            [Line("completed", "#0b6bcb", [p["completed"] / p["seconds"] for p in flow]),
             Line("failed", "#b42318", [p["failed"] / p["seconds"] for p in flow])],
            "chart-throughput",
        ),
        "lateness": chart_svg(
            "Schedule lateness", " ms",
            [Line("p50", "#0b6bcb", [p["p50_ms"] for p in late]),
             Line("p99", "#d97706", [p["p99_ms"] for p in late])],
            "chart-lateness",
        ),
    }  # fmt: skip
