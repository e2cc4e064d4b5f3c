"""Delayed jobs on the Jobs page (in a real Chromium) and in ``/api/jobs/delayed``: jobs waiting
in a queue's `due`, delayed or backing off before a retry, soonest first, paged by a cursor; the
markers that share `due` (schedule buckets', limiter keys') are not listed."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

import drumbeat
from drumbeat.protocol import LIMIT_PREFIX
from tests.helpers import wait_for
from tests.web.conftest import ThreadWorker, serve

XSS = "<script>alert(1)</script>"


def _define(app: drumbeat.App) -> None:
    @app.task(name="later")
    def later(text: str) -> str:
        return text

    @app.task(name="flaky", retries=3, backoff=600)
    def flaky(text: str) -> None:
        raise RuntimeError(text)

    @app.task(name="tick")
    def tick() -> None:
        pass


@pytest.fixture
def app(redis_url: str, namespace: str) -> Iterator[drumbeat.App]:
    a = drumbeat.App(redis_url, namespace=namespace)
    _define(a)
    yield a
    a.close()


def _later(text: str, delay: float, queue: str | None = None) -> drumbeat.Prepared:
    options = (
        drumbeat.Options(delay=delay)
        if queue is None
        else drumbeat.Options(delay=delay, queue=queue)
    )
    return drumbeat.Prepared("later", [text], {}, options)


def _backing_off(app: drumbeat.App, redis_url: str, namespace: str) -> drumbeat.Job[Any]:
    """A job whose first attempt failed and that waits in `due` for its second (run by a
    worker of its own, stopped once the retry is booked)."""
    (job,) = app.enqueue_many([drumbeat.Prepared("flaky", ["once"], {})])
    mine = drumbeat.App(redis_url, namespace=namespace)
    _define(mine)
    with ThreadWorker(mine, concurrency=1):
        wait_for(
            lambda: app.redis.zscore(app.keys.due, job.id),
            lambda score: score is not None,
            message="the failed job should wait in due for its retry",
        )
    return job


def test_delayed_jobs_are_listed_soonest_first_without_markers(
    app: drumbeat.App, redis_url: str, namespace: str, page: Any
) -> None:
    retrying = _backing_off(app, redis_url, namespace)
    soon, xss, late = app.enqueue_many([_later("soon", 60), _later(XSS, 120), _later("late", 3600)])
    # A schedule (in the time slots, not in `due`) and a limiter key's marker.
    app.schedule("every-minute", "tick", every=60)
    app.redis.zadd(app.keys.due, {f"{LIMIT_PREFIX}t:later": 1})
    assert app.redis.zcard(app.keys.due) == 5
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    with serve(app) as served:
        page.goto(served.url + "/jobs")
        rows = page.locator("#delayed-jobs tbody tr")
        ids = [rows.nth(i).get_attribute("data-id") for i in range(rows.count())]
        # The retry is due 300..600 s after the failure (backoff 600 s, equal jitter).
        assert ids == [soon.id, xss.id, retrying.id, late.id], "soonest due first, no marker"
        row = page.locator(f'#delayed-jobs tr[data-id="{xss.id}"]')
        assert row.locator("code.args").inner_text() == f'["{XSS}"]'
        assert "in 1" in row.inner_text(), "due in about 120 s"
        backoff = page.locator(f'#delayed-jobs tr[data-id="{retrying.id}"]')
        assert backoff.locator("td.attempt").inner_text() == "1", "its first attempt failed"
        assert "flaky" in backoff.inner_text()
        assert "5 member(s) wait" in page.locator("#delayed-note").inner_text()
        html = page.content()
        assert XSS not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
        api = httpx.get(served.url + "/api/jobs/delayed").json()
    assert dialogs == [], f"a script ran in the page: {dialogs}"
    assert [j["id"] for j in api["jobs"]] == ids and api["next"] is None
    by_id = {j["id"]: j for j in api["jobs"]}
    assert by_id[retrying.id]["task"] == "flaky" and by_id[retrying.id]["attempt"] == 1
    assert by_id[xss.id]["args"] == [XSS] and by_id[soon.id]["attempt"] == 0
    assert by_id[late.id]["due_ms"] - api["now_ms"] > 3500_000
    assert by_id[late.id]["due_at"].endswith("Z") or "+00:00" in by_id[late.id]["due_at"]


def test_delayed_jobs_are_paged_by_cursor_through_ties_and_markers(app: drumbeat.App) -> None:
    # Jobs enqueued together with one delay share a due time: the cursor must page through
    # the tie, each job once. Markers between them are skipped.
    tied = app.enqueue_many([_later(str(i), 600) for i in range(7)])
    after = app.enqueue_many([_later(f"b{i}", 1200) for i in range(3)])
    tie_ms = app.redis.zscore(app.keys.due, tied[0].id)
    assert tie_ms is not None and all(
        app.redis.zscore(app.keys.due, j.id) == tie_ms for j in tied
    ), "one enqueue_many call gives its jobs one due time"
    app.redis.zadd(app.keys.due, {f"{LIMIT_PREFIX}n:{i}": tie_ms + 1 for i in range(5)})
    app.enqueue_many([_later("other", 5, queue="mail")])
    seen: list[str] = []
    sizes: list[int] = []
    with serve(app) as served:
        url = f"{served.url}/api/jobs/delayed?limit=3"
        while True:
            got = httpx.get(url).json()
            assert got["in_due"] == 15 and got["queue"] == "default", got
            sizes.append(len(got["jobs"]))
            seen += [j["id"] for j in got["jobs"]]
            if got["next"] is None:
                break
            url = f"{served.url}/api/jobs/delayed?limit=3&after={got['next']}"
        mail = httpx.get(served.url + "/api/jobs/delayed?queue=mail").json()
        bad = httpx.get(served.url + "/api/jobs/delayed?after=soon")
        unknown = httpx.get(served.url + "/api/jobs/delayed?queue=nope")
    assert seen == sorted((j.id for j in tied), key=str) + sorted((j.id for j in after), key=str)
    assert sizes[:3] == [3, 3, 3] and sum(sizes) == 10, sizes
    assert [j["task"] for j in mail["jobs"]] == ["later"] and mail["in_due"] == 1
    assert bad.status_code == 400 and "<due ms>.<skip>" in bad.json()["error"]
    assert unknown.status_code == 400 and "no queue 'nope'" in unknown.json()["error"]


def test_the_delayed_pager_in_the_browser(app: drumbeat.App, page: Any) -> None:
    jobs = app.enqueue_many([_later(f"j{i}", 600 + i) for i in range(55)])
    with serve(app) as served:
        page.goto(served.url + "/jobs")
        rows = page.locator("#delayed-jobs tbody tr")
        assert rows.count() == 50
        page.locator("#next-due-page").click()
        page.wait_for_url("**due_after=*")
        ids = [rows.nth(i).get_attribute("data-id") for i in range(rows.count())]
        assert ids == [j.id for j in jobs[50:]]
        assert page.locator("#next-due-page").count() == 0
        page.locator("#first-due-page").click()
        page.wait_for_url(served.url + "/jobs?queue=default")
        assert rows.count() == 50
