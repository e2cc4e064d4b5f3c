"""The Schedules page in a real Chromium and its JSON: search by id prefix a page at a time,
pause, resume, run now and remove (checked in Redis), CSRF and read-only."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

import drumbeat
from drumbeat.dashboard import schedules as pages
from drumbeat.schedules import reads as slot_reads
from tests.helpers import set_due, wait_for
from tests.web.conftest import ThreadWorker, serve


async def _tick(n: int) -> None: ...


@pytest.fixture
def app(redis_url: str, namespace: str) -> Iterator[drumbeat.App]:
    a = drumbeat.App(redis_url, namespace=namespace)
    a.task(name="tick")(_tick)
    yield a
    a.close()


def _make(app: drumbeat.App, ids: list[str]) -> None:
    app.schedule_many([drumbeat.Schedule(i, "tick", every=3600, args=(1,)) for i in ids])


def _info(app: drumbeat.App, schedule_id: str) -> drumbeat.ScheduleInfo:
    info = app.get_schedule(schedule_id)
    assert info is not None, f"schedule {schedule_id} exists"
    return info


def test_pause_resume_run_now_and_remove_from_the_page(app: drumbeat.App, page: Any) -> None:
    _make(app, ["a:1", "a:2", "a:3", "b:1"])
    with serve(app) as served:
        page.goto(served.url + "/schedules")
        assert page.locator("#schedules tbody tr").count() == 4
        assert page.locator("h1").inner_text() == "Schedules (4)"
        page.locator('#search input[name="prefix"]').fill("a:")
        page.locator("#search button").click()
        page.wait_for_url(re.compile(r"prefix=a%3A"))
        assert sorted(page.locator("#schedules tbody tr").evaluate_all(
            "rows => rows.map(r => r.dataset.id)"
        )) == ["a:1", "a:2", "a:3"]  # fmt: skip
        row = page.locator('tr[data-id="a:2"]')
        assert row.get_attribute("data-state") == "scheduled"
        cells = row.locator("td").all_inner_texts()
        assert cells[1:4] == ["tick", "every 1h", "scheduled"], cells
        assert re.fullmatch(r"in \d+\.\d s", cells[4]), cells

        row.locator("button.pause").click()
        page.wait_for_url(re.compile(r"done="))
        assert page.locator("#notice").inner_text() == "paused 1 schedule"
        assert page.locator('tr[data-id="a:2"]').get_attribute("data-state") == "paused"
        assert _info(app, "a:2").paused, "paused in Redis"
        assert page.locator("#schedules tbody tr").count() == 3, "the search is kept"

        page.locator('tr[data-id="a:2"] button.resume').click()
        page.locator('#notice:text-is("resumed 1 schedule")').wait_for()
        resumed = _info(app, "a:2")
        assert not resumed.paused and resumed.next_due_ms is not None, "resumed in Redis"

        page.locator('tr[data-id="a:1"] button.run-now').click()
        page.locator('#notice:text-is("queued a run of 1 schedule")').wait_for()
        due = _info(app, "a:1").next_due_ms
        assert due is not None and due <= time.time() * 1000 + 1000, "due now, in its slot"
        assert page.locator('tr[data-id="a:1"]').get_attribute("data-state") == "scheduled"

        page.goto(served.url + "/schedules?prefix=b")
        page.locator('tr[data-id="b:1"] details.confirm summary').click()
        page.locator('tr[data-id="b:1"] button.remove').click()
        page.locator('#notice:text-is("removed 1 schedule")').wait_for()
        assert app.get_schedule("b:1") is None, "removed from Redis"
        assert page.locator("#schedules tbody tr").count() == 0
    assert app.scheduler.count(app.redis) == 3


def test_the_page_lists_and_acts_on_schedules_kept_as_time_slots(
    redis_url: str, namespace: str, page: Any
) -> None:
    app = drumbeat.App(redis_url, namespace=namespace)
    app.task(name="tick")(_tick)
    _make(app, ["a:1", "a:2", "b:1"])
    # Limited: its runs go through its queue as jobs, and it is listed with the others.
    app.schedule("c:1", "tick", every=3600, args=(1,), rate_limit="1/s")
    with serve(app) as served:
        page.goto(served.url + "/schedules")
        assert page.locator("h1").inner_text() == "Schedules (4)"
        assert page.locator('tr[data-id="c:1"]').count() == 1
        page.goto(served.url + "/schedules?prefix=a")
        rows = page.locator("#schedules tbody tr")
        assert sorted(rows.evaluate_all("rows => rows.map(r => r.dataset.id)")) == ["a:1", "a:2"]
        page.locator('tr[data-id="a:2"] button.pause').click()
        page.locator('#notice:text-is("paused 1 schedule")').wait_for()
        assert page.locator('tr[data-id="a:2"]').get_attribute("data-state") == "paused"
        assert _info(app, "a:2").paused and app.redis.hexists(app.keys.paused, "a:2")
        page.locator('tr[data-id="a:2"] button.resume').click()
        page.locator('#notice:text-is("resumed 1 schedule")').wait_for()
        assert not _info(app, "a:2").paused
        page.locator('tr[data-id="a:1"] button.run-now').click()
        page.locator('#notice:text-is("queued a run of 1 schedule")').wait_for()
        due = _info(app, "a:1").next_due_ms
        assert due is not None and due <= pages._now_ms(app), "its entry waits in a due slot"
    app.close()


def test_search_pages_cover_every_match_once(
    redis_url: str, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = drumbeat.App(redis_url, namespace=namespace)
    app.task(name="tick")(_tick)
    _make(app, [f"p:{i}" for i in range(600)] + [f"q:{i}" for i in range(20)])
    app.pause("p:3", "q:4")  # kept apart with the time slots: listed all the same
    # More than Redis keeps as a listpack (512 fields), which one HSCAN call reads whole.
    with serve(app) as served:

        def walk(prefix: str, limit: int) -> tuple[list[str], int]:
            ids, pages_read, cursor = [], 0, ""
            while True:
                query = {"prefix": prefix, "limit": str(limit)}
                if cursor:
                    query["cursor"] = cursor
                got = httpx.get(served.url + "/api/schedules", params=query).json()
                pages_read += 1
                assert len(got["schedules"]) <= limit
                ids += [s["id"] for s in got["schedules"]]
                if got["next"] is None:
                    return ids, pages_read
                cursor = got["next"]

        ids, read = walk("p:", 50)
        assert sorted(ids) == sorted(f"p:{i}" for i in range(600)) and len(ids) == 600
        assert read >= 6
        assert sorted(walk("q:", 7)[0]) == sorted(f"q:{i}" for i in range(20))
        assert len(walk("", 100)[0]) == 620
        # Glob characters in a prefix are matched literally (no id holds them).
        for prefix in ("p*", "[pq]", "?:", "\\"):
            assert walk(prefix, 50)[0] == [], prefix

        # A prefix matching few examines about EXAMINED_PER_PAGE schedules per request.
        monkeypatch.setattr(pages, "EXAMINED_PER_PAGE", 100)
        monkeypatch.setattr(slot_reads, "SCAN_COUNT", 100)
        ids, read = walk("q:1", 50)
        assert sorted(ids) == sorted(["q:1", *(f"q:{i}" for i in range(10, 20))])
        assert read >= 3, "620 schedules over at least 3 requests of ~100"
        partial = httpx.get(served.url + "/api/schedules", params={"prefix": "zz"}).json()
        assert partial["schedules"] == [] and partial["next"] is not None
        assert 0 < partial["searched"] < 1
        monkeypatch.undo()

        first = httpx.get(served.url + "/api/schedules", params={"limit": "5"}).json()
        assert first["total"] == 620 and len(first["schedules"]) == 5
        exact = httpx.get(served.url + "/api/schedules", params={"prefix": "q:7"}).json()
        assert exact["schedules"][0]["id"] == "q:7", "an exact id comes first"
        one = httpx.get(served.url + "/api/schedule/p:5").json()
        assert (one["id"], one["state"], one["cadence_text"]) == ("p:5", "scheduled", "every 1h")
        assert httpx.get(served.url + "/api/schedule/nope").status_code == 404
        bad = httpx.get(served.url + "/api/schedules", params={"cursor": "x"})
        assert bad.status_code == 400 and "cursor" in bad.json()["error"]
    app.close()


def test_actions_need_the_csrf_token(app: drumbeat.App) -> None:
    _make(app, ["c:1"])
    with serve(app) as served:
        for action in pages.ACTIONS:
            refused = httpx.post(f"{served.url}/schedules/{action}", data={"id": "c:1"})
            assert refused.status_code == 403 and "CSRF" in refused.json()["error"], action
        assert not _info(app, "c:1").paused
        done = httpx.post(
            f"{served.url}/schedules/pause", data={"id": "c:1", "csrf": served.guard.csrf},
            headers={"accept": "application/json"},
        )  # fmt: skip
        assert done.json() == {"pause": 1}
    assert _info(app, "c:1").paused


def test_read_only_hides_and_refuses_the_schedule_actions(app: drumbeat.App, page: Any) -> None:
    _make(app, ["r:1"])
    with serve(app, read_only=True) as served:
        page.goto(served.url + "/schedules")
        assert page.locator('#schedules tr[data-id="r:1"]').count() == 1
        assert page.locator("#schedules button").count() == 0
        assert page.locator("#schedules form").count() == 0
        for action in pages.ACTIONS:
            refused = httpx.post(
                f"{served.url}/schedules/{action}", data={"id": "r:1", "csrf": served.guard.csrf}
            )
            assert refused.status_code == 403 and "read-only" in refused.json()["error"], action
    info = _info(app, "r:1")
    assert not info.paused and info.next_due_ms is not None
    assert app.redis.zscore(app.keys.ready, "s:r:1") is None, "no run was queued"


def test_the_last_runs_lateness_is_shown_and_in_the_json(
    app: drumbeat.App, redis_url: str, namespace: str, page: Any
) -> None:
    _make(app, ["late", "never"])
    # The schedule's next run moved 5 s into the past, so the worker starts it at least 5 s
    # after it was due.
    sec, usec = app.redis.time()
    due = int(sec) * 1000 + int(usec) // 1000 - 5000
    set_due(app.redis, app, "late", due)
    mine = drumbeat.App(redis_url, namespace=namespace)

    @mine.task(name="tick")
    async def tick(n: int) -> None: ...

    with ThreadWorker(mine, concurrency=1):
        info = wait_for(
            lambda: _info(app, "late"),
            lambda i: i.runs == 1,
            message="the worker should run the overdue schedule",
        )
    assert info.last_run_ms is not None and info.last_lateness_ms is not None
    late = info.last_lateness_ms
    assert late == info.last_run_ms - due >= 5000
    with serve(app) as served:
        page.goto(served.url + "/schedules")
        cell = page.locator('#schedules tr[data-id="late"] td.lateness')
        assert cell.inner_text() == f"{late} ms"
        assert page.locator('#schedules tr[data-id="never"] td.lateness').inner_text() == "\u2013"
        found = httpx.get(served.url + "/api/schedule/late").json()
        listed = httpx.get(served.url + "/api/schedules").json()
    assert found["last_lateness_ms"] == late and found["runs"] == 1
    by_id = {s["id"]: s for s in listed["schedules"]}
    assert by_id["late"]["last_lateness_ms"] == late
    assert by_id["never"]["last_lateness_ms"] is None
