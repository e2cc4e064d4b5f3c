"""The overview page and ``/api/overview`` count the jobs waiting for their dependencies."""

from __future__ import annotations

import re

import httpx

import drumbeat
from tests.web.conftest import serve


def test_overview_shows_jobs_waiting_for_dependencies(redis_url: str, namespace: str) -> None:
    app = drumbeat.App(redis_url, namespace=namespace)
    try:

        @app.task
        def work() -> None: ...

        app.chain([work.prepare(), work.prepare(), work.prepare()])
        with serve(app) as served:
            overview = httpx.get(served.url + "/api/overview").json()
            html = httpx.get(served.url + "/").text
        assert (overview["queue"]["ready"], overview["queue"]["waiting"]) == (1, 2)
        assert re.search(r'id="waiting">2<', html), "the waiting card"
    finally:
        app.close()
