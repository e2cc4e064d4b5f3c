"""How each system is drawn in every chart (core and periodic), and which points are drawn at all.

Plain data, no matplotlib: `bench.charts` draws with it, the unit tests read it. Colours are the
Okabe-Ito palette (safe for the common colour-vision deficiencies); no colour alone tells two
systems of one chart apart, so every system also has its own marker and line style. drumbeat has
the one vermillion, a line three times as thick, the top layer and the first legend entry.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

# Okabe-Ito; its yellow is left out (too faint on white) and its orange too (beside drumbeat's
# vermillion it would be the one pair a reader could still confuse).
VERMILLION, BLUE, SKY, GREEN, PURPLE, BLACK, GREY = (
    "#D55E00", "#0072B2", "#56B4E9", "#009E73", "#CC79A7", "#000000", "#999999",
)  # fmt: skip

US = "drumbeat"
HALF = 50.0
"""Below this % of the ideal runs a system's lateness p99 covers only the few runs it made, so
the chart marks the point as not delivered instead of plotting it."""


@dataclass(frozen=True, slots=True)
class Style:
    color: str
    marker: str
    line: str
    width: float = 1.3
    size: float = 5.5
    zorder: int = 2
    alpha: float = 0.75
    """Opacity of a peer's bar (drumbeat's is opaque), so drumbeat's bar stands out too."""


STYLES: Mapping[str, Style] = {
    US: Style(VERMILLION, "o", "-", width=3.6, size=9.0, zorder=10, alpha=1.0),
    # periodic peers: two at most per colour, told apart by marker and dashes
    "naive": Style(BLACK, "X", ":"),
    "celery-beat": Style(GREEN, "v", "--"),
    "redbeat": Style(GREEN, "^", "-."),
    "rq-scheduler": Style(PURPLE, "<", "--"),
    "rq-cron": Style(PURPLE, ">", "-."),
    "arq": Style(GREY, "p", "--"),
    "saq": Style(SKY, "D", "--"),
    "streaq": Style(SKY, "h", "-."),
    "taskiq": Style(BLUE, "P", "-."),
    "apscheduler": Style(BLUE, "s", "--"),
    # queue peers only (arq, saq, streaq and taskiq above are in both benchmarks)
    "celery": Style(GREEN, "d", ":"),
    "rq": Style(PURPLE, "8", ":"),
    "dramatiq": Style(BLACK, "*", "--"),
    "huey": Style(GREY, "H", "-."),
    # baselines, not queues
    "floor": Style(BLACK, "_", "-", width=1.0),
}
UNKNOWN = Style(GREY, ".", ":")
"""For a system added to a benchmark but not yet here: drawn, plainly, rather than failing."""


def style(system: str) -> Style:
    return STYLES.get(system, UNKNOWN)


def legend_order(systems: Iterable[str]) -> list[str]:
    """The systems once each, drumbeat first, the others in the order given."""
    names = list(dict.fromkeys(systems))
    return sorted(names, key=lambda n: n != US)


def undelivered(row: Mapping[str, Any]) -> bool:
    """True for a results row (`bench.periodic` JSON ``table``) whose lateness must not be
    plotted as a figure: under `HALF` % of the runs delivered, or no run in the window at all."""
    pct, p99 = row.get("pct_ideal"), row.get("late_p99")
    return pct is None or p99 is None or pct < HALF
