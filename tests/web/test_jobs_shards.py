"""The Jobs page with `job_shards` > 1, in a real Chromium: each shard's waiting and delayed
jobs are listed by a tab of their own (a shard keeps its own order), and every link keeps the
shard; a job of any shard is found by its id."""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

import drumbeat
from drumbeat.job_ids import job_shard_of
from tests.web.conftest import serve

SHARDS = 3


@pytest.fixture
def app(redis_url: str, namespace: str) -> Iterator[drumbeat.App]:
    a = drumbeat.App(redis_url, namespace=namespace, job_shards=SHARDS)

    @a.task(name="echo")
    async def echo(text: str) -> str:
        return text

    yield a
    a.close()


def _in_shard(app: drumbeat.App, shard: int, text: str, **options: Any) -> drumbeat.Job[Any]:
    """A job of ``shard`` (its dedup key hashes there)."""
    key = next(
        f"{text}{i}" for i in range(1000) if zlib.crc32(f"{text}{i}".encode()) % SHARDS == shard
    )
    (job,) = app.enqueue_many(
        [drumbeat.Prepared("echo", [text], {}, drumbeat.Options(key=key, **options))]
    )
    assert job_shard_of(job.id) == shard
    return job


def test_each_shard_lists_its_own_jobs_and_links_keep_the_shard(
    app: drumbeat.App, page: Any
) -> None:
    main = _in_shard(app, 0, "main")
    second = _in_shard(app, 2, "second", priority=4)
    later = _in_shard(app, 2, "later", delay=600)
    with serve(app) as served:
        page.goto(served.url + "/jobs")
        assert page.locator("#shard-tabs a").count() == SHARDS
        assert page.locator(f'#queued-jobs tr[data-id="{main.id}"]').count() == 1
        assert page.locator(f'#queued-jobs tr[data-id="{second.id}"]').count() == 0
        page.locator('#shard-tabs a[data-shard="2"]').click()
        page.wait_for_url("**shard=2**")
        # The best priority with jobs in that shard: 4.
        assert page.locator('#priority-tabs a[aria-current="page"]').get_attribute(
            "data-priority"
        ) == "4"  # fmt: skip
        assert page.locator(f'#queued-jobs tr[data-id="{second.id}"]').count() == 1
        assert page.locator(f'#delayed-jobs tr[data-id="{later.id}"]').count() == 1
        for link in ("#priority-tabs a", "#queue-tabs a"):
            assert "shard=2" in (page.locator(link).first.get_attribute("href") or ""), link
        page.goto(served.url + f"/jobs?id={second.id}")
        assert page.locator("#job").get_attribute("data-status") == "queued"
        api = httpx.get(served.url + "/api/jobs/queued?priority=4&shard=2", timeout=10).json()
        assert [j["id"] for j in api["jobs"]] == [second.id] and api["shard"] == 2
        bad = httpx.get(served.url + f"/api/jobs/delayed?shard={SHARDS}", timeout=10)
        assert bad.status_code == 400 and "shard must be in 0..2" in bad.json()["error"]
