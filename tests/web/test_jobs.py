"""The Jobs page in a real Chromium and its JSON: a job looked up by id (queued, running,
complete, dead), the running jobs with their progress, queued jobs a page at a time."""

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
from tests.web.conftest import ThreadWorker, serve

XSS = "<script>alert(1)</script>"


def _define(app: drumbeat.App, release: threading.Event | None = None) -> None:
    @app.task(name="hold")
    def hold(steps: int) -> None:
        assert release is not None, "only the worker's app runs hold"
        for step in range(steps):
            drumbeat.checkpoint({"step": step, "of": steps})
        release.wait(60)

    @app.task(name="boom")
    def boom(text: str) -> None:
        raise RuntimeError(text)

    @app.task(name="echo")
    async def echo(text: str) -> str:
        return text


@pytest.fixture
def app(redis_url: str, namespace: str) -> Iterator[drumbeat.App]:
    a = drumbeat.App(redis_url, namespace=namespace)
    _define(a)
    yield a
    a.close()


def _worker(redis_url: str, namespace: str, release: threading.Event) -> ThreadWorker:
    mine = drumbeat.App(redis_url, namespace=namespace, progress_interval=0)
    _define(mine, release)
    return ThreadWorker(mine, concurrency=1)


def test_lookup_of_a_queued_job_with_a_script_argument_shows_it_as_text(
    app: drumbeat.App, page: Any
) -> None:
    (ahead,) = app.enqueue_many([drumbeat.Prepared("echo", ["first"], {})])
    (job,) = app.enqueue_many([drumbeat.Prepared("echo", [XSS], {})])
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    with serve(app) as served:
        page.goto(served.url + "/jobs")
        # Listed among the queued jobs (priority 0, the only one with jobs), as text.
        row = page.locator(f'#queued-jobs tr[data-id="{job.id}"]')
        assert row.locator("code.args").inner_text() == f'["{XSS}"]'
        assert page.locator('#priority-tabs a[aria-current="page"]').get_attribute(
            "data-priority"
        ) == "0"  # fmt: skip
        # Looked up through the form.
        page.locator('#lookup input[name="id"]').fill(job.id)
        page.locator("#lookup button").click()
        page.wait_for_url(re.compile(r"/jobs\?id="))
        assert page.locator("#job").get_attribute("data-status") == "queued"
        assert page.locator("#job-task").inner_text() == "echo"
        assert page.locator("#job-args").inner_text() == f'["{XSS}"]'
        assert "1 job(s) in its queue" in page.locator("#job").inner_text()
        html = page.content()
        assert XSS not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
        assert page.locator("main script").count() == 0
    assert dialogs == [], f"a script ran in the page: {dialogs}"
    assert job.status() is drumbeat.JobStatus.QUEUED and ahead.status() is drumbeat.JobStatus.QUEUED


def test_lookup_of_running_complete_and_dead_jobs(
    app: drumbeat.App, redis_url: str, namespace: str, page: Any
) -> None:
    release = threading.Event()
    (done,) = app.enqueue_many([drumbeat.Prepared("echo", [XSS], {})])
    (dead,) = app.enqueue_many([drumbeat.Prepared("boom", ["it broke"], {})])
    (held,) = app.enqueue_many([drumbeat.Prepared("hold", [3], {})])
    try:
        with _worker(redis_url, namespace, release), serve(app) as served:
            wait_for(
                lambda: (done.status(), dead.status(), held.status()),
                lambda s: s == ("complete", "dead", "running"),
                message="echo completes, boom dies, hold runs",
            )
            wait_for(held.progress, lambda p: p == {"step": 2, "of": 3}, message="progress")

            page.goto(served.url + "/jobs")
            row = page.locator(f'#running-jobs tr[data-id="{held.id}"]')
            cells = row.locator("td").all_inner_texts()
            assert cells[1] == "hold", cells
            assert re.fullmatch(r"\d+\.\d s", cells[2]), f"running for: {cells}"
            assert '"step": 2' in cells[5], cells

            row.locator("a").click()  # the id links to the lookup
            page.wait_for_url(re.compile(r"/jobs\?id="))
            job = page.locator("#job")
            assert job.get_attribute("data-status") == "running"
            assert "claimed" in job.inner_text() and "lease until" in job.inner_text()

            page.goto(f"{served.url}/jobs?id={done.id}")
            assert page.locator("#job").get_attribute("data-status") == "complete"
            assert page.locator("#job-result").inner_text() == f'"{XSS}"'
            assert "(deleted when the job completed)" in page.locator("#job-task").inner_text()

            page.goto(f"{served.url}/jobs?id={dead.id}")
            assert page.locator("#job").get_attribute("data-status") == "dead"
            assert page.locator("#job-error").inner_text() == "RuntimeError: it broke"
            page.locator("#job details summary").click()
            assert "raise RuntimeError(text)" in page.locator("#job details pre").inner_text()
            assert page.locator("#job-task").inner_text() == "boom"

            api = httpx.get(f"{served.url}/api/job/{dead.id}").json()
            assert (api["status"], api["task"], api["args"]) == ("dead", "boom", ["it broke"])
            assert api["died_ms"] is not None and "Traceback" in api["traceback"]
            running = httpx.get(f"{served.url}/api/jobs/running").json()
            assert [r["id"] for r in running["running"]] == [held.id]
            assert running["running"][0]["progress"] == {"step": 2, "of": 3}
            missing = httpx.get(f"{served.url}/api/job/nope")
            assert missing.status_code == 404 and missing.json()["status"] == "missing"
            page.goto(f"{served.url}/jobs?id=nope")
            assert page.locator("#job-missing").count() == 1
    finally:
        release.set()


def test_queued_jobs_are_paged_by_cursor_in_the_order_they_run(app: drumbeat.App) -> None:
    p3 = app.enqueue_many(
        [drumbeat.Prepared("echo", [str(i)], {}, drumbeat.Options(priority=3)) for i in range(120)]
    )
    app.enqueue_many([drumbeat.Prepared("echo", ["x"], {}, drumbeat.Options(priority=7))] * 5)
    seen: list[str] = []
    with serve(app) as served:
        url = f"{served.url}/api/jobs/queued?priority=3&limit=50"
        sizes = []
        while True:
            got = httpx.get(url).json()
            assert got["count"] == 120 and got["counts_by_priority"][7] == 5
            sizes.append(len(got["jobs"]))
            seen += [j["id"] for j in got["jobs"]]
            if got["next"] is None:
                break
            url = f"{served.url}/api/jobs/queued?priority=3&limit=50&after={got['next']}"
        html = httpx.get(served.url + "/jobs").text
        assert httpx.get(served.url + "/api/jobs/queued?priority=12").status_code == 400
        assert httpx.get(served.url + "/api/jobs/queued?queue=nope").status_code == 400
    assert sizes == [50, 50, 20]
    assert seen == [j.id for j in p3], "FIFO inside the level, each job once"
    # Without a priority asked for, the page shows the best one with jobs waiting.
    assert re.search(r'data-priority="7" aria-current="page"', html), "p7 is shown first"
    assert len(re.findall(r'<tr data-id="', html)) == 5
    assert admin.queue_stats(app).ready == 125
