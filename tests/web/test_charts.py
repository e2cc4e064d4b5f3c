"""The overview's throughput and lateness charts: counted in Redis by the workers, read back
window by window, drawn as inline SVG."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

import drumbeat
from drumbeat import protocol
from drumbeat.dashboard import charts
from tests.helpers import wait_for
from tests.web.conftest import ThreadWorker, serve


def _define(app: drumbeat.App) -> None:
    @app.task(name="ok")
    async def ok(x: int) -> int:
        return x

    @app.task(name="bad", retries=1, backoff=0.01, backoff_max=0.01)
    async def bad(x: int) -> None:
        raise RuntimeError(f"no {x}")

    @app.task(name="tick")
    async def tick() -> None: ...


@pytest.fixture
def app(redis_url: str, namespace: str) -> Iterator[drumbeat.App]:
    a = drumbeat.App(redis_url, namespace=namespace)
    _define(a)
    yield a
    a.close()


def _worker(redis_url: str, namespace: str) -> ThreadWorker:
    mine = drumbeat.App(redis_url, namespace=namespace)
    _define(mine)
    return ThreadWorker(mine, concurrency=4)


def _totals(series: dict[str, Any]) -> tuple[int, int]:
    flow = series["throughput"]
    return sum(p["completed"] for p in flow), sum(p["failed"] for p in flow)


def test_throughput_series_counts_the_workload_and_is_drawn(
    app: drumbeat.App, redis_url: str, namespace: str, page: Any
) -> None:
    n_ok, n_bad = 40, 5
    app.enqueue_many(
        [drumbeat.Prepared("ok", [i], {}) for i in range(n_ok)]
        + [drumbeat.Prepared("bad", [i], {}) for i in range(n_bad)]
    )
    with _worker(redis_url, namespace):
        # Each `bad` job raises twice: retried once, then dead.
        wait_for(
            lambda: _totals(charts.series_json(app)), lambda t: t == (n_ok, 2 * n_bad),
            message="the throughput series counts every settled attempt", timeout=30,
        )  # fmt: skip
    series = charts.series_json(app)
    assert len(series["throughput"]) == charts.WINDOWS == 91
    assert series["window_ms"] == 10_000
    starts = [p["at_ms"] for p in series["throughput"]]
    assert starts == sorted(starts) and starts[-1] <= series["now_ms"] < starts[-1] + 10_000

    with serve(app) as served:
        api = httpx.get(served.url + "/api/overview").json()
        assert _totals(api["charts"]) == (n_ok, 2 * n_bad)
        page.goto(served.url + "/")
        svg = page.locator("svg#chart-throughput")
        assert svg.locator("title").text_content() == "Attempts per second"
        for name in ("completed", "failed"):
            drawn = svg.locator(f'g[data-series="{name}"] polyline, g[data-series="{name}"] circle')
            assert drawn.count() >= 1, f"the {name} line is drawn"
        assert page.locator("svg#chart-lateness").count() == 1


def test_lateness_series_has_the_runs_of_a_schedule(
    app: drumbeat.App, redis_url: str, namespace: str
) -> None:
    app.schedule("tick:1", "tick", every=1)
    with _worker(redis_url, namespace), serve(app) as served:
        series = wait_for(
            lambda: httpx.get(served.url + "/api/overview").json()["charts"],
            lambda s: sum(p["runs"] for p in s["lateness"]) >= 2,
            message="schedule runs show in the lateness series", timeout=30, interval=0.3,
        )  # fmt: skip
        html = httpx.get(served.url + "/").text
    with_runs = [p for p in series["lateness"] if p["runs"]]
    assert all(0 <= p["p50_ms"] <= p["p99_ms"] for p in with_runs), with_runs
    assert all(p["p50_ms"] is None for p in series["lateness"] if not p["runs"])
    chart = re.search(r'<svg id="chart-lateness".*?</svg>', html, re.S)
    assert chart is not None
    assert re.search(r'<g data-series="p50">(<polyline|<circle)', chart[0]), chart[0]


def test_chart_svg_escapes_and_leaves_gaps() -> None:
    svg = charts.chart_svg(
        "<b>t</b>", " ms", [charts.Line("a<", "#000", [1.0, None, 2.0, 3.0, None])], "c1"
    )
    assert "<b>" not in svg and "&lt;b&gt;t&lt;/b&gt;" in svg
    assert svg.count("<polyline") == 1, "two points in a row make a line"
    assert svg.count("<circle") == 1, "a lone point is a dot"
    assert "style=" not in svg, "the Content-Security-Policy refuses inline styles"


def test_a_refused_count_taken_back_never_draws_below_zero(app: drumbeat.App) -> None:
    app.scripts.tally(["j|complete|ok", 3]).run(app.redis)
    app.scripts.tally(["j|complete|ok", -5, "j|dead|ok", 1]).run(app.redis)
    flow = charts.series_json(app)["throughput"]
    assert all(p["completed"] >= 0 for p in flow), flow
    assert sum(p["failed"] for p in flow) == 1
    # Every slot was made at the first write: the ring never grows, whatever runs through it.
    assert app.redis.hlen(app.keys.throughput) == charts.WINDOWS


def test_both_rings_hold_fifteen_minutes_and_the_window_being_filled() -> None:
    for windows, window_ms in (
        (protocol.LATENESS_WINDOWS, protocol.LATENESS_WINDOW_MS),
        (protocol.THROUGHPUT_WINDOWS, protocol.THROUGHPUT_WINDOW_MS),
    ):
        assert (windows - 1) * window_ms == 15 * 60_000, (windows, window_ms)
