"""The dashboard in a real headless Chromium, and over plain HTTP: what the pages show, the
dead-letter actions, tokens, CSRF, read-only, escaping, ``/api`` and ``/metrics``."""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

import drumbeat
from drumbeat import admin, metrics
from drumbeat.cli import cli
from drumbeat.dashboard import Guard, InsecureBind
from tests.helpers import wait_for
from tests.web.conftest import ThreadWorker, serve

XSS = "<script>alert(1)</script>"
TOKEN = "s3cret-token-for-tests"


@pytest.fixture
def app(redis_url: str, namespace: str) -> Iterator[drumbeat.App]:
    a = drumbeat.App(redis_url, namespace=namespace)
    _define(a)
    yield a
    a.close()


def _define(app: drumbeat.App, release: threading.Event | None = None) -> None:
    @app.task(name="hold")
    def hold() -> None:
        assert release is not None, "only the worker's app runs hold"
        release.wait(60)

    @app.task(name="boom")
    def boom(text: str) -> None:
        raise RuntimeError(text)


def _worker(redis_url: str, namespace: str, release: threading.Event) -> ThreadWorker:
    """A worker with one slot, on an App of its own (its own connections)."""
    mine = drumbeat.App(redis_url, namespace=namespace)
    _define(mine, release)
    return ThreadWorker(mine, concurrency=1)


def _bury(app: drumbeat.App, redis_url: str, namespace: str, texts: list[str]) -> list[str]:
    """Dead letters of ``boom(text)``, made by a real worker (stopped afterwards)."""
    jobs = app.enqueue_many([drumbeat.Prepared("boom", [t], {}) for t in texts])
    with _worker(redis_url, namespace, threading.Event()):
        wait_for(
            lambda: admin.dead_count(app),
            lambda n: n == len(texts),
            message=f"{len(texts)} dead letters",
        )
    return [j.id for j in jobs]


# -- overview ----------------------------------------------------------------------------------


def test_overview_shows_queues_and_a_live_worker(
    app: drumbeat.App, redis_url: str, namespace: str, page: Any
) -> None:
    release = threading.Event()
    app.enqueue_many([drumbeat.Prepared("hold", [], {}, drumbeat.Options(priority=9))])
    try:
        with _worker(redis_url, namespace, release), serve(app) as served:
            wait_for(
                lambda: admin.queue_stats(app).running_total, lambda n: n == 1,
                message="the worker runs hold in its one slot",
            )  # fmt: skip
            seeded = [drumbeat.Prepared("boom", ["x"], {}) for _ in range(3)]
            seeded += [drumbeat.Prepared("boom", ["x"], {}, drumbeat.Options(priority=5))] * 2
            seeded += [drumbeat.Prepared("boom", ["x"], {}, drumbeat.Options(delay=600))]
            app.enqueue_many(seeded)

            errors: list[str] = []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.goto(served.url + "/")
            row = page.locator('#queues tr[data-queue="default"]')
            assert row.locator('[data-priority="0"]').inner_text() == "3"
            assert row.locator('[data-priority="5"]').inner_text() == "2"
            assert row.locator('[data-priority="9"]').inner_text() == "0"
            assert page.locator("#ready").inner_text() == "5"
            assert page.locator("#delayed").inner_text() == "1"
            assert page.locator("#running").inner_text() == "1"
            assert page.locator("#dead").inner_text() == "0"
            # The worker reports its busy slots with its heartbeat: the auto-refresh shows it.
            page.locator('#workers td:text-is("1 / 1")').wait_for()
            workers = page.locator("#workers tbody tr")
            assert workers.count() == 1
            cells = workers.first.locator("td").all_inner_texts()
            assert cells[1] == str(os.getpid()), cells
            assert cells[2] == "1 / 1", f"slots busy / total: {cells}"
            assert re.fullmatch(r"\d+\.\d s ago", cells[4]), cells

            # Auto-refresh: a job enqueued now shows up without reloading the page.
            app.enqueue_many([drumbeat.Prepared("boom", ["x"], {})])
            row.locator('[data-priority="0"]:text-is("4")').wait_for()
            assert errors == [], "no script error, no Content-Security-Policy violation"
    finally:
        release.set()


# -- dead letters ------------------------------------------------------------------------------


def test_dead_letter_retry_button_requeues_it_and_payloads_stay_text(
    app: drumbeat.App, redis_url: str, namespace: str, page: Any
) -> None:
    first, second = _bury(app, redis_url, namespace, [XSS, "plain failure"])
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    with serve(app) as served:
        response = page.goto(served.url + "/dead")
        assert response is not None and response.status == 200
        html = page.content()
        assert XSS not in html, "the error text must be escaped"
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
        row = page.locator(f'tr[data-id="{first}"]')
        assert row.locator(".error").inner_text() == f"RuntimeError: {XSS}"
        assert page.locator("#dead-letters script").count() == 0

        row.locator("button.retry").click()
        page.wait_for_url(re.compile(r"/dead\?done="))
        assert page.locator("#notice").inner_text() == "1 requeued"
        assert page.locator(f'tr[data-id="{first}"]').count() == 0
        assert page.locator(f'tr[data-id="{second}"]').count() == 1
    assert dialogs == [], f"a script ran in the page: {dialogs}"
    # In Redis: the job left the dead set and waits in the queue again.
    assert [d.id for d in admin.dead_letters(app)] == [second]
    assert admin.queue_stats(app).ready == 1


def test_retry_all_and_purge_all(
    app: drumbeat.App, redis_url: str, namespace: str, page: Any
) -> None:
    _bury(app, redis_url, namespace, ["a", "b", "c"])
    with serve(app) as served:
        page.goto(served.url + "/dead")
        page.locator("tr[data-id] button.purge").first.click()
        page.wait_for_url(re.compile(r"/dead\?done="))
        assert page.locator("#notice").inner_text() == "1 purged"
        page.locator("#retry-all").click()
        page.wait_for_url(re.compile(r"/dead\?done=2"))
        assert page.locator("#notice").inner_text() == "2 requeued"
    assert admin.dead_count(app) == 0
    assert admin.queue_stats(app).ready == 2


# -- security ----------------------------------------------------------------------------------


def test_read_only_has_no_buttons_and_refuses_posts(
    app: drumbeat.App, redis_url: str, namespace: str, page: Any
) -> None:
    _bury(app, redis_url, namespace, ["x"])
    with serve(app, read_only=True) as served:
        page.goto(served.url + "/dead")
        assert page.locator("#dead-letters tbody tr").count() == 1
        assert page.locator("button").count() == 0
        assert page.locator("form").count() == 0
        refused = httpx.post(
            served.url + "/dead/retry", data={"all": "1", "csrf": served.guard.csrf}
        )
        assert refused.status_code == 403
        assert "read-only" in refused.json()["error"]
    assert admin.dead_count(app) == 1


def test_post_without_csrf_token_is_refused(
    app: drumbeat.App, redis_url: str, namespace: str
) -> None:
    _bury(app, redis_url, namespace, ["x"])
    with serve(app) as served:
        for data in ({"all": "1"}, {"all": "1", "csrf": "forged"}):
            refused = httpx.post(served.url + "/dead/purge", data=data)
            assert refused.status_code == 403, data
            assert "CSRF" in refused.json()["error"]
        assert admin.dead_count(app) == 1
        done = httpx.post(
            served.url + "/dead/purge", data={"all": "1", "csrf": served.guard.csrf},
            headers={"accept": "application/json"},
        )  # fmt: skip
        assert done.json() == {"purge": 1}
    assert admin.dead_count(app) == 0


def test_loopback_bind_answers_only_loopback_host_names(app: drumbeat.App) -> None:
    with serve(app) as served:
        assert httpx.get(served.url + "/api/dead").status_code == 200
        rebound = httpx.get(served.url + "/api/dead", headers={"host": "evil.example:8787"})
        assert rebound.status_code == 400


def test_non_loopback_bind_without_token_refuses_to_start(
    app: drumbeat.App, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(InsecureBind, match="DRUMBEAT_DASHBOARD_TOKEN"):
        Guard(host="0.0.0.0", token=None)
    Guard(host="0.0.0.0", token=TOKEN)  # with one it may
    for host in ("127.0.0.1", "::1", "localhost"):
        Guard(host=host, token=None)

    monkeypatch.delenv("DRUMBEAT_DASHBOARD_TOKEN", raising=False)
    monkeypatch.setenv("DRUMBEAT_REDIS_URL", app.settings.url or "")
    monkeypatch.setenv("DRUMBEAT_TEST_NAMESPACE", app.settings.namespace)
    result = CliRunner().invoke(
        cli, ["dashboard", "tests.apps.cli_app:app", "--host", "0.0.0.0", "--port", "1"]
    )
    assert result.exit_code == 2, result.output
    assert "DRUMBEAT_DASHBOARD_TOKEN" in result.output
    assert "dashboard on http" not in result.output, "nothing announced that is not served"


def test_token_is_required_by_header_or_login_cookie(app: drumbeat.App, page: Any) -> None:
    with serve(app, token=TOKEN) as served:
        for path in ("/api/overview", "/api/dead", "/metrics"):
            assert httpx.get(served.url + path).status_code == 401, path
            wrong = httpx.get(served.url + path, headers={"authorization": "Bearer nope"})
            assert wrong.status_code == 401, path
            ok = httpx.get(served.url + path, headers={"authorization": f"Bearer {TOKEN}"})
            assert ok.status_code == 200, path
        refused = httpx.post(served.url + "/dead/retry", data={"all": "1"})
        assert refused.status_code == 401

        response = page.goto(served.url + "/dead")
        assert response is not None and response.status == 401
        page.locator('input[name="token"]').fill("wrong")
        page.locator('button[type="submit"]').click()
        page.locator("#wrong").wait_for()
        page.locator('input[name="token"]').fill(TOKEN)
        page.locator('button[type="submit"]').click()
        page.wait_for_url(served.url + "/dead")
        assert page.locator("h1").inner_text().startswith("Dead letters")
        (cookie,) = page.context.cookies()
        assert cookie["name"] == "drumbeat_session"
        assert (cookie["httpOnly"], cookie["secure"], cookie["sameSite"]) == (True, True, "Strict")
        assert TOKEN not in cookie["value"], "the cookie proves the token, it does not hold it"
        api = page.request.get(served.url + "/api/dead")
        assert api.status == 200, "the login cookie authenticates API calls too"


def test_every_asset_is_served_by_the_dashboard(app: drumbeat.App) -> None:
    with serve(app) as served:
        for path in ("/", "/dead", "/login"):
            html = httpx.get(served.url + path).text
            refs = re.findall(r'(?:src|href)="([^"]+)"', html)
            assert refs and all(r.startswith("/") for r in refs), f"{path}: {refs}"
        for asset in ("/static/htmx.min.js", "/static/style.css"):
            assert httpx.get(served.url + asset).status_code == 200, asset


# -- JSON and metrics --------------------------------------------------------------------------


def test_api_json_and_metrics(app: drumbeat.App, redis_url: str, namespace: str) -> None:
    (dead_id,) = _bury(app, redis_url, namespace, ["x"])
    app.enqueue_many([drumbeat.Prepared("boom", ["y"], {}, drumbeat.Options(priority=3))])
    with serve(app) as served:
        overview = httpx.get(served.url + "/api/overview").json()
        assert overview["namespace"] == namespace
        assert overview["queue"]["ready_by_priority"][3] == 1
        assert overview["queue"]["dead"] == 1
        assert overview["queues"] == {"default": [0, 0, 0, 1, 0, 0, 0, 0, 0, 0]}
        assert {"workers", "supervisors", "schedules", "autoscale"} <= overview.keys()
        dead = httpx.get(served.url + "/api/dead").json()
        assert dead["total"] == 1
        assert dead["dead_letters"][0]["id"] == dead_id
        assert dead["dead_letters"][0]["error"] == "RuntimeError: x"
        assert httpx.get(served.url + "/api/dead?limit=x").status_code == 400

        scraped = httpx.get(served.url + "/metrics")
        assert scraped.headers["content-type"].startswith("text/plain")
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(scraped.text)
        for s in family.samples
    }
    assert samples["drumbeat_dead_letters", ()] == 1
    assert samples["drumbeat_queue_ready", (("priority", "3"), ("queue", "default"))] == 1
    assert samples["drumbeat_jobs_total", (("outcome", "dead"), ("task", "boom"))] == 1


def test_supervisors_show_live_and_desired_processes_and_why(app: drumbeat.App) -> None:
    """A registration as `Autoscaler` writes it (`beat_supervisor.lua`), shown on the page and
    in ``drumbeat_desired_processes``."""
    info = {
        "host": "build-7", "pid": 4242, "live": 2, "desired": 3, "min": 1, "max": 5,
        "concurrency": 10, "slots": 20, "reason": f"backlog {XSS} needs 3", "reason_ms": None,
        "started_ms": None, "needed": 3, "ttl_ms": 60_000,
    }  # fmt: skip
    app.scripts.beat_supervisor("sup-1", json.dumps(info).encode(), 60_000).run(app.redis)
    with serve(app) as served:
        html = httpx.get(served.url + "/").text
        scraped = httpx.get(served.url + "/metrics").text
    row = re.search(r'<table id="supervisors">.*?</table>', html, re.S)
    assert row is not None, "a supervisors table"
    cells = [
        re.sub(r"\s+", " ", c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", row[0], re.S)
    ]
    assert cells[:5] == ["build-7", "4242", "2 / 3", "1..5", "20"], cells
    assert cells[5] == "backlog &lt;script&gt;alert(1)&lt;/script&gt; needs 3"
    desired = [
        s.value
        for family in text_string_to_metric_families(scraped)
        for s in family.samples
        if s.name == "drumbeat_desired_processes"
    ]
    assert desired == [3]


def test_delayed_and_lag_gauges(app: drumbeat.App) -> None:
    app.enqueue_many([drumbeat.Prepared("boom", ["x"], {}, drumbeat.Options(delay=0.05))])
    app.enqueue_many([drumbeat.Prepared("boom", ["x"], {}, drumbeat.Options(delay=600))])

    def gauges() -> tuple[float, float]:
        text = metrics.render(app).decode()
        found = {
            s.name: s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }
        return found["drumbeat_queue_delayed"], found["drumbeat_schedule_lag"]

    # No worker promotes the first: once its time passes it is due and not claimed (lag).
    assert wait_for(gauges, lambda g: g == (2, 1), message="(delayed, lag)") == (2, 1)


def test_csrf_is_required_with_a_token_too_and_replicas_agree(
    app: drumbeat.App, redis_url: str, namespace: str
) -> None:
    _bury(app, redis_url, namespace, ["x"])
    auth = {"authorization": f"Bearer {TOKEN}", "accept": "application/json"}
    with serve(app, token=TOKEN) as served:
        refused = httpx.post(served.url + "/dead/retry", data={"all": "1"}, headers=auth)
        assert refused.status_code == 403, "a token does not stand in for the CSRF token"
        # Another process with the same token (a replica) made the page the form came from.
        replica = Guard(host="127.0.0.1", token=TOKEN).csrf
        done = httpx.post(
            served.url + "/dead/retry", data={"all": "1", "csrf": replica}, headers=auth
        )
        assert done.json() == {"retry": 1, "dependents": 0, "outside_batch": 0}
    assert Guard(host="127.0.0.1").csrf != Guard(host="127.0.0.1").csrf, "no token: per process"


def test_overview_shows_schedule_lateness(
    app: drumbeat.App, redis_url: str, namespace: str
) -> None:
    mine = drumbeat.App(redis_url, namespace=namespace)

    @mine.task(name="tick")
    async def tick() -> None: ...

    mine.schedule("tick:1", tick, every=1)
    mine.close()  # its sync client: the worker uses its async ones
    with ThreadWorker(mine), serve(app) as served:
        html = wait_for(
            lambda: httpx.get(served.url + "/").text,
            lambda text: "lateness p50" in text,
            message="a run started, with its lateness shown",
            timeout=30,
            interval=0.3,
        )
    assert re.search(r"1 schedules over 1 shard\(s\); [1-9]\d* runs started", html), html
    assert re.search(r"lateness p50 \d+ ms,\s*p99 \d+ ms, max \d+ ms\.", html), html
