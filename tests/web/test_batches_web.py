"""The Batches pages in a real Chromium (the newest batches, one batch with its counts, failed
members and callbacks) and their JSON, which is `drumbeat batches ls | show --json`'s; and the
dead-letter retry's reply counting the dependents that came back."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import unquote

import httpx

import drumbeat
from drumbeat import admin
from tests.helpers import wait_for
from tests.integration.test_batches_listing import sync_app
from tests.web.conftest import ThreadWorker, serve

__all__ = ["sync_app"]  # a fixture, used by name: an app with the tasks add and boom


def _run(app: drumbeat.App, redis_url: str, namespace: str, until: Any, message: str) -> None:
    """Runs a worker until ``until()`` holds: on a thread, with an app of its own (the
    browser's loop holds this thread's), which has ``app``'s tasks."""
    mine = drumbeat.App(redis_url, namespace=namespace)
    for name in ("add", "boom"):
        task = app.tasks[name]
        mine.task(name=name, retries=task.config.retries)(task.fn)
    with ThreadWorker(mine, concurrency=2):
        wait_for(until, message=message)


def test_batches_are_listed_and_one_is_shown_with_failed_members_and_callbacks(
    sync_app: drumbeat.App, redis_url: str, namespace: str, page: Any
) -> None:
    app = sync_app
    add, boom = app.tasks["add"], app.tasks["boom"]
    ended = app.batch(
        [add.prepare(1), boom.prepare("<b>no</b>")],
        on_complete=add.prepare(0), on_success=add.prepare(2),
    )  # fmt: skip
    assert ended.on_complete is not None
    on_complete = ended.on_complete
    # Until its callback ran too: the batch ends first, and a worker stopped then left it
    # queued (it failed so once in CI).
    _run(app, redis_url, namespace,
         lambda: ended.status().ended and on_complete.status() is drumbeat.JobStatus.COMPLETE,
         "the batch ended and its on_complete ran")  # fmt: skip
    still_open = app.batch([add.prepare(3)], open=True)  # no worker: its member is pending
    failed_member = ended.jobs[1].id
    assert ended.on_complete is not None and ended.on_success is not None

    problems: list[str] = []
    page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(str(e)))
    with serve(app) as served:
        page.goto(served.url + "/")
        page.locator('header nav a[href="/batches"]').click()
        page.wait_for_url(re.compile(r"/batches$"))
        nav = page.locator('header nav a[href="/batches"]')
        assert nav.get_attribute("aria-current") == "page"
        rows = page.locator("#batches tbody tr")
        assert rows.evaluate_all("rows => rows.map(r => r.dataset.id)") == [
            still_open.id, ended.id,
        ], "newest first"  # fmt: skip
        cells = page.locator(f'tr[data-id="{ended.id}"] td').all_inner_texts()
        assert cells[1:7] == ["ended", "2", "0", "1", "1", "0"], cells
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", cells[7]), cells
        cells = page.locator(f'tr[data-id="{still_open.id}"] td').all_inner_texts()
        assert cells[1:7] == ["open", "1", "1", "0", "0", "0"], cells

        page.locator(f'tr[data-id="{ended.id}"] a').click()
        page.wait_for_url(re.compile(f"/batches/{ended.id}$"))
        assert page.locator("#phase").inner_text() == "ended"
        assert page.locator("#batch td.failed").inner_text() == "1"
        assert page.locator("#batch td.succeeded").inner_text() == "1"
        assert page.locator("#failed-ids li").all_inner_texts() == [failed_member]
        callbacks = {
            row.get_attribute("data-role"): row.locator("td").all_inner_texts()[1:]
            for row in page.locator("#callbacks tbody tr").all()
        }
        assert callbacks == {
            "on_complete": [ended.on_complete.id, "complete"],
            "on_success": [ended.on_success.id, "cancelled"],
        }
        page.locator("#failed-ids a").click()  # on to the failed member's job
        page.wait_for_url(re.compile(r"/jobs\?id="))
        assert page.locator("#job").get_attribute("data-status") == "dead"

        assert problems == [], "no script error, no Content-Security-Policy violation"
        missing = page.goto(served.url + "/batches/" + "f" * 32)
        assert missing is not None and missing.status == 404
        assert "No batch" in page.locator("#missing").inner_text()

        # The JSON is the CLI's (`drumbeat batches ls | show --json`), with the phase shown.
        listed = httpx.get(served.url + "/api/batches").json()["batches"]
        assert [(b["id"], b["phase"], b["failed"]) for b in listed] == [
            (still_open.id, "open", 0), (ended.id, "ended", 1),
        ]  # fmt: skip
        one = httpx.get(served.url + f"/api/batch/{ended.id}").json()
        assert one["failed_ids"] == [failed_member] and one["made_at"] == listed[1]["made_at"]
        assert one["callbacks"]["on_success"] == {"id": ended.on_success.id, "status": "cancelled"}
        assert httpx.get(served.url + "/api/batch/" + "f" * 32).status_code == 404
        assert httpx.get(served.url + "/batches?limit=0").status_code == 400


def test_dead_retry_counts_the_dependents_that_came_back(
    sync_app: drumbeat.App, redis_url: str, namespace: str
) -> None:
    app = sync_app
    add, boom = app.tasks["add"], app.tasks["boom"]
    one, two = (app.chain([boom.prepare("x"), add.prepare(1), add.prepare(2)]) for _ in "12")
    _run(app, redis_url, namespace, lambda: admin.dead_count(app) == 6, "the chains are dead")
    with serve(app) as served:
        shown = httpx.post(
            served.url + "/dead/retry", data={"id": one[0].id, "csrf": served.guard.csrf}
        )
        assert shown.status_code == 303
        notice = unquote(shown.headers["location"])
        assert notice == "/dead?done=1 requeued and 2 dependents dead-lettered with them"
        done = httpx.post(
            served.url + "/dead/retry", data={"all": "1", "csrf": served.guard.csrf},
            headers={"accept": "application/json"},
        )  # fmt: skip
        assert done.json() == {"retry": 1, "dependents": 2, "outside_batch": 0}
    assert [app.job(c[0].id).status() for c in (one, two)] == [drumbeat.JobStatus.QUEUED] * 2
    assert admin.dead_count(app) == 0
