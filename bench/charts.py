"""PNG charts of a `bench.core` results file, with matplotlib (in ``bench/.venv-peers``).

    python -m bench.charts bench/results/core-<stamp>.json

Writes ``core-<stamp>-<scenario>.png`` beside it, one per scenario, and prints their paths.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

DRUMBEAT, PEER, RATIO = "#d62728", "#1f77b4", "#555555"


def _bars(ax: Any, names: list[str], stats: list[dict[str, Any]], metric: dict[str, Any]) -> None:
    medians = [s["median"] for s in stats]
    low = [s["median"] - s["min"] for s in stats]
    high = [s["max"] - s["median"] for s in stats]
    colors = [DRUMBEAT if n == "drumbeat" else PEER for n in names]
    bars = ax.bar(names, medians, color=colors, yerr=[low, high], capsize=3)
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
        names = list(systems)
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
        bars = ax.bar(names, [m - 1 for m in medians], bottom=1, color=RATIO)
        ax.bar_label(bars, labels=[f"{m:.2g}" for m in medians], fontsize=7)
        ax.axhline(1, color=DRUMBEAT, linewidth=1)
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


def main(json_path: str) -> None:
    path = Path(json_path)
    data = json.loads(path.read_text())
    info = data["info"]
    subtitle = (
        f"{info['cores']} cores, Redis {info['redis']}, {data['config']['repeat']} repetition(s), "
        f"{data['config']['jobs']:,} jobs"
    )
    for key, res in data["results"].items():
        written = chart(key, res, path, subtitle)
        if written is not None:
            print(written)
    summary = ratios_chart(data, path, subtitle)
    if summary is not None:
        print(summary)


if __name__ == "__main__":
    main(sys.argv[1])
