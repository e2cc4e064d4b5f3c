"""The overview page and ``/api/overview`` show jobs parked on limiter keys, in all and per
queue, and do not count the keys' markers in `due` as delayed jobs."""

from __future__ import annotations

import re
import threading

import httpx

import drumbeat
from drumbeat import admin
from tests.helpers import wait_for
from tests.web.conftest import ThreadWorker, serve


def _define(app: drumbeat.App, release: threading.Event) -> None:
    @app.task(name="hold", concurrency_limit=1)
    def hold(tag: str) -> None:
        release.wait(60)

    @app.task(name="pack", queue="builds", concurrency_limit=1)
    def pack(tag: str) -> None:
        release.wait(60)


def test_overview_shows_parked_jobs_per_queue(redis_url: str, namespace: str) -> None:
    release = threading.Event()
    app = drumbeat.App(redis_url, namespace=namespace)
    _define(app, release)
    worker_app = drumbeat.App(redis_url, namespace=namespace, idle_block=0.5)
    _define(worker_app, release)
    prepared = [drumbeat.Prepared("hold", [f"h{i}"], {}) for i in range(3)]
    prepared += [drumbeat.Prepared("pack", [f"p{i}"], {}) for i in range(2)]
    app.enqueue_many(prepared)
    try:
        with ThreadWorker(worker_app, concurrency=4), serve(app) as served:
            wait_for(
                lambda: admin.queue_stats(app).parked, lambda n: n == 3,
                message="two hold jobs and one pack job park behind the running ones",
            )  # fmt: skip
            overview = httpx.get(served.url + "/api/overview").json()
            assert overview["queue"]["parked"] == 3
            assert overview["queue"]["delayed"] == 0, "the keys' markers are no delayed jobs"
            assert overview["parked_by_queue"] == {"default": 2, "builds": 1}
            html = httpx.get(served.url + "/").text
            release.set()
    finally:
        release.set()
        app.close()
    assert re.search(r'id="parked">3<', html), "the parked card"
    assert re.search(r'id="delayed">0<', html), "the delayed card"
    builds = re.search(r'<tr data-queue="builds">.*?</tr>', html, re.S)
    assert builds is not None, "a row for the builds queue"
    assert re.search(r"<td[^>]*data-parked[^>]*>1</td>", builds[0]), builds[0]
