"""PNG charts of a results file, with matplotlib (in ``bench/.venv-peers``).

    python -m bench.charts bench/results/core-<stamp>.json       # -<scenario>.png, -ratios.png
    python -m bench.charts bench/results/periodic-<stamp>.json   # <stamp>.png
    python -m bench.charts bench/results/elastic-<stamp>.json    # <stamp>.png

Writes the PNGs beside the JSON and prints their paths. Every system is drawn in its own style
from `bench.styles`, the same in every chart.
"""

from __future__ import annotations

import json
import math
import sys
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.lines import Line2D

from .styles import BLACK, BLUE, GREEN, HALF, US, VERMILLION, legend_order, style, undelivered

FLOOR = 1e-4
"""Seconds: a lateness of 0 (APScheduler's runs on its own grid) drawn on a log axis."""


def _bars(ax: Any, names: list[str], stats: list[dict[str, Any]], metric: dict[str, Any]) -> None:
    medians = [s["median"] for s in stats]
    low = [s["median"] - s["min"] for s in stats]
    high = [s["max"] - s["median"] for s in stats]
    bars = ax.bar(names, medians, yerr=[low, high], capsize=3)
    for bar, name in zip(bars, names, strict=True):
        s = style(name)
        bar.set(color=s.color, alpha=s.alpha, edgecolor="black",
                linewidth=1.5 if name == US else 0)  # fmt: skip
    ax.bar_label(bars, labels=[f"{m:,.{metric['digits']}f}" for m in medians], fontsize=7)
    positive = [m for m in medians if m > 0]
    if positive and max(positive) / min(positive) > 50:
        ax.set_yscale("log")
    ax.set_ylabel(f"{metric['label']} ({metric['unit']})")
    ax.tick_params(axis="x", rotation=30, labelsize=8)
    better = "higher" if metric["higher_better"] else "lower"
    ax.set_title(f"{metric['label']}, median and min-max ({better} is better)", fontsize=9)


def chart(key: str, res: dict[str, Any], out: Path, subtitle: str) -> Path | None:
    metrics = {m["key"]: m for m in res["metrics"]}
    shown = res["ratio_metrics"]
    systems = {n: e for n, e in res["systems"].items() if e["metrics"]}
    if not systems:
        return None
    fig, axes = plt.subplots(1, len(shown), figsize=(5.5 * len(shown), 4.2), squeeze=False)
    for ax, mkey in zip(axes[0], shown, strict=True):
        names = legend_order(systems)
        _bars(ax, names, [systems[n]["metrics"][mkey] for n in names], metrics[mkey])
    missing = [
        f"{n}: {e['unsupported'] or 'failed'}"
        for n, e in res["systems"].items()
        if not e["metrics"]
    ]
    fig.suptitle(res["title"], fontsize=10)
    fig.text(0.5, 0.005, subtitle + ("; not shown: " + ", ".join(missing) if missing else ""),
             ha="center", fontsize=7)  # fmt: skip
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    path = out.with_name(f"{out.stem}-{key}.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def ratios_chart(data: dict[str, Any], out: Path, subtitle: str) -> Path | None:
    """One panel per scenario: drumbeat/peer for its main metric, per peer (1 = equal)."""
    panels = []
    for res in data["results"].values():
        mkey = res["ratio_metrics"][0]
        metric = next(m for m in res["metrics"] if m["key"] == mkey)
        peers = {n: e["ratios"][mkey] for n, e in res["systems"].items() if mkey in e["ratios"]}
        if peers:
            panels.append((res["title"], metric, peers))
    if not panels:
        return None
    cols = min(3, len(panels))
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.6 * rows), squeeze=False)
    for ax in axes.flat[len(panels) :]:
        ax.axis("off")
    for ax, (title, metric, peers) in zip(axes.flat, panels, strict=False):
        names = list(peers)
        medians = [peers[n]["median"] for n in names]
        bars = ax.bar(names, [m - 1 for m in medians], bottom=1,
                      color=[style(n).color for n in names], alpha=0.75)  # fmt: skip
        ax.bar_label(bars, labels=[f"{m:.2g}" for m in medians], fontsize=7)
        ax.axhline(1, color=VERMILLION, linewidth=2)
        ax.set_yscale("log")
        ax.set_ylim(min([*medians, 1.0]) / 1.6, max([*medians, 1.0]) * 1.6)
        better = ">" if metric["higher_better"] else "<"
        head = textwrap.shorten(title, 48, placeholder="...")
        ax.set_title(f"{head}\n{metric['label']} ({better}1: drumbeat better)", fontsize=8)
        ax.tick_params(axis="x", rotation=45, labelsize=7)
    fig.suptitle("drumbeat/peer, median of per-repetition ratios", fontsize=10)
    fig.text(0.5, 0.005, subtitle, ha="center", fontsize=7)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    path = out.with_name(f"{out.stem}-ratios.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def core_charts(path: Path, data: dict[str, Any]) -> list[Path]:
    info = data["info"]
    subtitle = (
        f"{info['cores']} cores, Redis {info['redis']}, {data['config']['repeat']} repetition(s), "
        f"{data['config']['jobs']:,} jobs"
    )
    written = [chart(key, res, path, subtitle) for key, res in data["results"].items()]
    written.append(ratios_chart(data, path, subtitle))
    return [p for p in written if p is not None]


# -- periodic ----------------------------------------------------------------------------------


def _line(ax: Any, system: str, xs: Sequence[float], ys: Sequence[float]) -> Any:
    s = style(system)
    (line,) = ax.plot(
        xs, ys, color=s.color, marker=s.marker, linestyle=s.line, linewidth=s.width,
        markersize=s.size, zorder=s.zorder, label=system,
    )  # fmt: skip
    return line


def _not_delivered(ax: Any, rows: Sequence[Mapping[str, Any]], shown: Sequence[float]) -> None:
    """Hollow markers in a band above the lateness plot, one per system and N under `HALF` %
    delivered, spread sideways so that systems at one N do not hide each other."""
    lo = min(shown, default=1e-3) / 3
    top = max(shown, default=100.0) * 3
    band = top * 4
    ax.set_ylim(lo, band * 4)
    ax.axhline(top * 1.6, color="black", linewidth=0.6)
    ax.text(0.01, band * 2.2, f"< {HALF:g} % delivered: p99 not plotted", fontsize=7,
            transform=ax.get_yaxis_transform(), va="bottom")  # fmt: skip
    by_n: dict[int, list[Mapping[str, Any]]] = {}
    for r in rows:
        by_n.setdefault(r["n"], []).append(r)
    for n, group in by_n.items():
        for k, r in enumerate(group):
            s = style(r["system"])
            x = n * 10 ** (0.06 * (k - (len(group) - 1) / 2))
            ax.plot([x], [band], marker=s.marker, markersize=s.size + 1,
                    markerfacecolor="white", markeredgecolor=s.color,
                    markeredgewidth=2 if r["system"] == US else 1.2,
                    linestyle="none", zorder=s.zorder, clip_on=False)  # fmt: skip


def periodic_chart(json_path: Path, png_path: Path) -> Path:
    """Runs delivered and lateness p99 against N, one line per system; under `HALF` % delivered
    the lateness point is a hollow marker in a band at the top, not a figure."""
    data = json.loads(json_path.read_text())
    rows = [r for r in data["table"] if r.get("pct_ideal") is not None]
    if not rows:
        sys.exit(f"{json_path}: no system has a result to chart (every row skipped or failed)")
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(14, 5.2))
    handles = {}
    shown: list[float] = []
    for system in legend_order(r["system"] for r in rows):
        mine = sorted((r for r in rows if r["system"] == system), key=lambda r: r["n"])
        ns = [r["n"] for r in mine]
        handles[system] = _line(ax1, system, ns, [r["pct_ideal"] for r in mine])
        # NaN breaks the line: a system's lateness is joined only between delivered points
        late = [math.nan if undelivered(r) else max(r["late_p99"], FLOOR) for r in mine]
        _line(ax2, system, ns, late)
        shown += [y for y in late if not math.isnan(y)]
    missed = [r for r in rows if undelivered(r)]
    if missed:
        _not_delivered(ax2, missed, shown)
    ax1.axhline(HALF, color="black", linewidth=0.6, linestyle=":")
    intervals = sorted({(r["n"], r["interval"]) for r in rows})
    common = max({i for _, i in intervals}, key=lambda i: sum(1 for _, j in intervals if j == i))
    odd = [f"{n:,}: {i:g} s" for n, i in intervals if i != common]
    xlabel = f"schedules (every {common:g} s" + "".join(f"; {x}" for x in odd) + ")"
    ax1.set(xscale="log", xlabel=xlabel, ylabel="runs delivered, % of N / interval",
            title="Runs delivered", ylim=(0, 105))  # fmt: skip
    ax2.set(xscale="log", yscale="log", xlabel=xlabel, ylabel="seconds",
            title="Lateness p99 (start - due)")  # fmt: skip
    for ax in (ax1, ax2):
        ax.grid(True, which="both", alpha=0.3)
    hollow = Line2D(
        [], [], marker="o", markerfacecolor="white", markeredgecolor="black", linestyle="none",
        label=f"hollow, at the top:\n< {HALF:g} % delivered",
    )  # fmt: skip
    fig.legend(handles=[*handles.values(), *([hollow] if missed else [])], fontsize=8,
               loc="center right", bbox_to_anchor=(0.995, 0.5))  # fmt: skip
    fig.suptitle(data["title"], fontsize=10)
    fig.tight_layout(rect=(0, 0, 0.875, 1))
    fig.savefig(png_path, dpi=110)
    plt.close(fig)
    return png_path


# -- elastic pool ------------------------------------------------------------------------------

POLICY_STYLES = {
    "autoscale": (VERMILLION, "-", 3.0),
    "fixed-min": (BLUE, "--", 1.4),
    "fixed-max": (GREEN, "-.", 1.4),
    "original": (BLACK, ":", 1.8),
}
"""Colour, line style and width per policy: drumbeat's autoscaling in drumbeat's vermillion."""


def _median_run(runs: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The repetition whose drain time is the median one (the run the chart shows)."""

    def drained(run: Mapping[str, Any]) -> float:
        after = [s for s in run["samples"] if s["t"] >= 0]
        return next((s["t"] for s in after if s["backlog"] == 0 and s["running"] == 0), 1e9)

    good = sorted((r for r in runs if not r["errors"] and r["samples"]), key=drained)
    return good[(len(good) - 1) // 2] if good else None


def elastic_chart(json_path: Path, png_path: Path) -> Path:
    """Processes (the supervisor's children) and backlog against time since the step, one line
    per policy, from each policy's median repetition."""
    data = json.loads(json_path.read_text())
    cfg = data["config"]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(10, 7), sharex=True,
                                   gridspec_kw={"height_ratios": [3, 2]})  # fmt: skip
    for policy in cfg["policies"]:
        run = _median_run([r for r in data["runs"] if r["policy"] == policy])
        if run is None:
            continue
        color, line, width = POLICY_STYLES.get(policy, (BLUE, "-", 1.0))
        ts = [s["t"] for s in run["samples"]]
        ax1.step(ts, [s["processes"] for s in run["samples"]], where="post", color=color,
                 linestyle=line, linewidth=width, label=policy)  # fmt: skip
        ax2.plot(ts, [s["backlog"] + s["running"] for s in run["samples"]], color=color,
                 linestyle=line, linewidth=width, label=policy)  # fmt: skip
    ax1.set(ylabel="worker processes (supervisor's children)",
            ylim=(0, cfg["maximum"] + 0.8), title=data["title"])  # fmt: skip
    ax1.axvline(0, color="black", linewidth=0.6)
    ax2.axvline(0, color="black", linewidth=0.6)
    ax2.set(xlabel="seconds since the step (the median repetition of each policy)",
            ylabel="jobs queued or running")  # fmt: skip
    for ax in (ax1, ax2):
        ax.grid(True, alpha=0.3)
    ax1.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)
    plt.close(fig)
    return png_path


def main(json_path: str) -> None:
    path = Path(json_path)
    data = json.loads(path.read_text())
    if data.get("kind") == "elastic":  # bench.elastic's results
        print(elastic_chart(path, path.with_suffix(".png")))
        return
    if "table" in data:  # bench.periodic's results
        print(periodic_chart(path, path.with_suffix(".png")))
        return
    for written in core_charts(path, data):
        print(written)


if __name__ == "__main__":
    main(sys.argv[1])
