"""Every page of the dashboard loads in a real Chromium with something to show, without a
script error or a Content-Security-Policy violation, and only with assets it serves itself;
a screenshot of each is kept as a test artefact."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

import drumbeat
from drumbeat import admin
from tests.helpers import wait_for
from tests.web.conftest import ARTIFACTS, ThreadWorker, serve

PAGES = {
    "overview": "/", "jobs": "/jobs", "schedules": "/schedules", "batches": "/batches",
    "dead": "/dead",
}  # fmt: skip


def _define(app: drumbeat.App, release: threading.Event | None = None) -> None:
    @app.task(name="hold")
    def hold() -> None:
        assert release is not None, "only the worker's app runs hold"
        release.wait(60)

    @app.task(name="boom")
    async def boom(text: str) -> None:
        raise RuntimeError(text)

    @app.task(name="tick")
    async def tick() -> None: ...


@pytest.fixture
def app(redis_url: str, namespace: str) -> Iterator[drumbeat.App]:
    a = drumbeat.App(redis_url, namespace=namespace)
    _define(a)
    yield a
    a.close()


def test_every_page_loads_clean_and_is_screenshotted(
    app: drumbeat.App, redis_url: str, namespace: str, page: Any
) -> None:
    release = threading.Event()
    mine = drumbeat.App(redis_url, namespace=namespace)
    _define(mine, release)
    app.schedule("tick:1", "tick", every=1)
    app.enqueue_many([drumbeat.Prepared("hold", [], {}, drumbeat.Options(priority=9))])
    app.enqueue_many([drumbeat.Prepared("boom", ["<b>not bold</b>"], {})])
    try:
        with ThreadWorker(mine, concurrency=2), serve(app) as served:
            wait_for(
                lambda: (admin.queue_stats(app).running_total, admin.dead_count(app)),
                lambda seen: seen == (1, 1),
                message="hold runs and boom is dead",
            )
            app.enqueue_many(
                [drumbeat.Prepared("boom", ["queued"], {}, drumbeat.Options(delay=600))]
            )
            problems: list[str] = []
            page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: problems.append(str(e)))
            for name, path in PAGES.items():
                response = page.goto(served.url + path)
                assert response is not None and response.status == 200, path
                assert page.locator("main h1, main section").count() >= 1, path
                assert page.locator(f'header nav a[href="{path}"]').get_attribute(
                    "aria-current"
                ) == "page", path  # fmt: skip
                html = page.content()
                assert "<b>not bold</b>" not in html, f"{path}: user data must be escaped"
                refs = re.findall(r'(?:src|href)="([^"]+)"', httpx.get(served.url + path).text)
                assert refs and all(r.startswith("/") for r in refs), f"{path}: {refs}"
                ARTIFACTS.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(ARTIFACTS / f"page-{name}.png"), full_page=True)
            assert problems == [], "no script error, no Content-Security-Policy violation"
            metrics = page.goto(served.url + "/metrics")
            assert metrics is not None and metrics.status == 200
            assert "drumbeat_jobs_total" in page.content()
    finally:
        release.set()
