"""examples/recipes/fastapi_app.py: a request enqueues (``aenqueue``), the App opens and closes in
the lifespan, and a worker runs the job. The requests go through httpx's ASGI transport inside
the app's own lifespan (Starlette's TestClient now warns about httpx)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from types import ModuleType

import httpx
import pytest
import redis

from drumbeat.testing import arun_until_idle
from tests.recipes.conftest import fresh_import


@pytest.fixture
async def recipe(recipe_env: dict[str, str]) -> AsyncIterator[ModuleType]:
    module = fresh_import("examples.recipes.fastapi_app")
    yield module
    await module.jobs.aclose()
    module.jobs.close()


@asynccontextmanager
async def serving(recipe: ModuleType) -> AsyncIterator[httpx.AsyncClient]:
    """The web app between its lifespan's start-up and shutdown, as a server runs it."""
    api = recipe.api
    async with api.router.lifespan_context(api):
        transport = httpx.ASGITransport(app=api)
        async with httpx.AsyncClient(transport=transport, base_url="http://recipe") as client:
            yield client


async def test_a_request_enqueues_the_job_that_a_worker_then_runs(recipe: ModuleType) -> None:
    async with serving(recipe) as client:
        answer = await client.post("/signups", json={"email": "ada@example.com"})
        assert answer.status_code == 202
        job_id = answer.json()["job"]
        assert answer.json()["duplicate"] is False
        assert (await client.get(f"/jobs/{job_id}")).json() == {"status": "queued"}

    assert await arun_until_idle(recipe.jobs) == 1
    job = recipe.jobs.job(job_id)
    assert await job.aresult(timeout=1) == "welcome sent to ada@example.com"
    async with serving(recipe) as client:
        assert (await client.get(f"/jobs/{job_id}")).json() == {"status": "complete"}


async def test_a_form_posted_twice_enqueues_one_job(recipe: ModuleType) -> None:
    async with serving(recipe) as client:
        first = (await client.post("/signups", json={"email": "grace@example.com"})).json()
        second = (await client.post("/signups", json={"email": "grace@example.com"})).json()
    assert second == {"job": first["job"], "duplicate": True}
    assert await arun_until_idle(recipe.jobs) == 1


async def test_the_lifespan_fails_the_start_up_when_redis_is_unreachable(
    recipe_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DRUMBEAT_REDIS_URL", "redis://127.0.0.1:1/0")  # nothing listens there
    recipe = fresh_import("examples.recipes.fastapi_app")
    try:
        with pytest.raises(redis.ConnectionError):
            async with serving(recipe):
                pass
    finally:
        await recipe.jobs.aclose()


async def test_the_lifespan_closes_the_connections_it_opened(
    recipe_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    name = "recipe-lifespan"  # redis-py names each connection of the URL's clients so
    monkeypatch.setenv(
        "DRUMBEAT_REDIS_URL", f"{recipe_env['DRUMBEAT_REDIS_URL']}?client_name={name}"
    )
    recipe = fresh_import("examples.recipes.fastapi_app")
    observer = redis.Redis.from_url(recipe_env["DRUMBEAT_REDIS_URL"])

    def named() -> int:
        return sum(c["name"] == name for c in observer.client_list())

    try:
        async with serving(recipe) as client:
            await client.post("/signups", json={"email": "edsger@example.com"})
            assert named() >= 1, "the requests' client is not the one the lifespan closes"
        assert named() == 0, "the lifespan's shutdown left the App's connections open"
    finally:
        await recipe.jobs.aclose()
        observer.close()
