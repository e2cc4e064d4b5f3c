"""The overview's pause / resume button per queue, in a real headless Chromium; its CSRF and
read-only refusals over plain HTTP."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

import drumbeat
from tests.web.conftest import ThreadWorker, serve


def _define(app: drumbeat.App) -> None:
    @app.task(name="work")
    def work() -> str:
        return "worked"

    @app.task(name="build", queue="builds")
    def build() -> str:
        return "built"


@pytest.fixture
def app(redis_url: str, namespace: str) -> Iterator[drumbeat.App]:
    a = drumbeat.App(redis_url, namespace=namespace, idle_block=0.5)
    _define(a)
    yield a
    a.close()


def test_the_pause_button_holds_a_queue_and_resume_releases_it(
    app: drumbeat.App, redis_url: str, namespace: str, page: Any
) -> None:
    mine = drumbeat.App(redis_url, namespace=namespace, idle_block=0.5)
    _define(mine)
    with ThreadWorker(mine, concurrency=2), serve(app) as served:
        errors: list[str] = []
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.goto(served.url + "/")
        builds = page.locator('#queues tr[data-queue="builds"]')
        assert builds.locator("[data-state]").inner_text().startswith("active")
        builds.locator("button.pause").click()
        page.wait_for_url(served.url + "/")
        builds.locator("button.resume").wait_for()
        assert builds.locator("[data-state]").inner_text().startswith("paused")
        assert app.paused_queues() == ["builds"]
        default = page.locator('#queues tr[data-queue="default"]')
        assert default.locator("[data-state]").inner_text().startswith("active")

        held = app.enqueue("build")
        ran = app.enqueue("work")
        assert ran.result(timeout=10) == "worked"  # the worker claims, and takes no build
        time.sleep(0.3)
        assert held.status() == "queued"

        builds.locator("button.resume").click()
        page.wait_for_url(served.url + "/")
        builds.locator("button.pause").wait_for()
        assert builds.locator("[data-state]").inner_text().startswith("active")
        assert app.paused_queues() == []
        assert held.result(timeout=10) == "built"
        assert errors == [], "no script error, no Content-Security-Policy violation"


def test_queue_actions_need_the_csrf_token_and_are_refused_read_only(app: drumbeat.App) -> None:
    with serve(app) as served:
        for data in ({"queue": "builds"}, {"queue": "builds", "csrf": "forged"}):
            refused = httpx.post(served.url + "/queues/pause", data=data)
            assert refused.status_code == 403, data
            assert "CSRF" in refused.json()["error"]
        assert app.paused_queues() == []
        done = httpx.post(
            served.url + "/queues/pause", data={"queue": "builds", "csrf": served.guard.csrf},
            headers={"accept": "application/json"},
        )  # fmt: skip
        assert done.json() == {"queue": "builds", "pause": True}
        bad = httpx.post(
            served.url + "/queues/pause", data={"queue": "a b", "csrf": served.guard.csrf}
        )
        assert bad.status_code == 400 and "queue name" in bad.json()["error"]
    with serve(app, read_only=True) as served:
        page = httpx.get(served.url + "/")
        assert 'action="/queues/' not in page.text
        assert "data-state>paused" in page.text
        refused = httpx.post(
            served.url + "/queues/resume", data={"queue": "builds", "csrf": served.guard.csrf}
        )
        assert refused.status_code == 403
    assert app.paused_queues() == ["builds"]
