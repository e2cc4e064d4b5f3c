"""How the benchmark charts draw each system: one fixed style per system, drumbeat emphasised,
and lateness of a system that delivered under half its runs shown as not delivered."""

from __future__ import annotations

from collections import Counter
from typing import Any

from bench.core import SYSTEMS
from bench.periodic_peers import MODULES
from bench.styles import HALF, STYLES, UNKNOWN, US, legend_order, style, undelivered

KNOWN = sorted(set(SYSTEMS) | set(MODULES))


def test_every_system_of_either_benchmark_has_a_style_of_its_own() -> None:
    missing = [name for name in KNOWN if name not in STYLES]
    assert not missing, f"systems drawn with the fallback style {UNKNOWN}: {missing}"
    looks = Counter((s.color, s.marker, s.line) for s in STYLES.values())
    twins = {
        name: (s.color, s.marker, s.line)
        for name, s in STYLES.items()
        if looks[(s.color, s.marker, s.line)] > 1
    }
    assert not twins, f"systems drawn alike (colour, marker, line style): {twins}"
    markers = Counter(s.marker for s in STYLES.values())
    assert max(markers.values()) == 1, f"a marker shared by two systems: {markers.most_common(2)}"


def test_drumbeat_is_the_emphasised_one() -> None:
    ours = style(US)
    others = [s for name, s in STYLES.items() if name != US]
    shared = [name for name, s in STYLES.items() if name != US and s.color == ours.color]
    assert not shared, f"drumbeat's colour {ours.color} is also used by {shared}"
    assert all(ours.width > s.width for s in others), "drumbeat's line must be the thickest"
    assert all(ours.zorder > s.zorder for s in others), "drumbeat must be drawn on top"
    assert ours.alpha == 1.0 and all(s.alpha < 1.0 for s in others), "drumbeat's bar opaque"
    assert legend_order(["naive", "apscheduler", US, "saq", "naive"]) == [
        US, "naive", "apscheduler", "saq",
    ]  # fmt: skip


def _row(system: str, n: int, pct: float | None, p99: float | None) -> dict[str, Any]:
    return {"system": system, "n": n, "interval": 5.0, "pct_ideal": pct, "late_p99": p99}


def test_lateness_under_half_delivered_is_not_plotted_as_a_figure() -> None:
    # a fabricated `bench.periodic` results table: the figures are made up, the shapes are not
    result = {
        "table": [
            _row(US, 100_000, 90.6, 8.67),
            _row("apscheduler", 10_000, 100.0, 0.0003),
            _row("apscheduler", 100_000, 0.65, 0.46),  # a p99 of the few runs it made
            _row("saq", 10_000, HALF - 0.01, 7.85),
            _row("streaq", 10_000, HALF, 4.9),
            _row("taskiq", 100_000, 0.0, None),  # nothing ran in the window
        ]
    }
    marked = [(r["system"], r["n"]) for r in result["table"] if undelivered(r)]
    assert marked == [("apscheduler", 100_000), ("saq", 10_000), ("taskiq", 100_000)]
