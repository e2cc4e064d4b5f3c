"""`raise drumbeat.Retry()` on a real Redis: honoured even with the default ``retries=0``,
bounded, and a dead letter that says why when the bound is hit."""

from __future__ import annotations

import pytest

import drumbeat
from tests.conftest import running_worker


async def test_retry_runs_again_with_the_default_retries(app: drumbeat.App) -> None:
    seen: list[int] = []

    @app.task
    async def poll() -> str:
        attempt = drumbeat.current_job().attempt
        seen.append(attempt)
        if attempt < 3:
            raise drumbeat.Retry(delay=0)
        return "ready"

    async with running_worker(app):
        assert await (await poll.aenqueue()).aresult(timeout=10) == "ready"
    assert seen == [1, 2, 3]


async def test_retry_past_its_bound_dead_letters_with_a_clear_error(app: drumbeat.App) -> None:
    seen: list[int] = []

    @app.task
    def forever() -> None:
        seen.append(drumbeat.current_job().attempt)
        raise drumbeat.Retry(delay=0)

    async with running_worker(app):
        job = await forever.aenqueue()
        with pytest.raises(drumbeat.JobFailed) as info:
            await job.aresult(timeout=10)
    limit = drumbeat.Retry.DEFAULT_MAX_RETRIES
    assert seen == list(range(1, limit + 2)), "the first run and then `limit` retries"
    assert f"retry requested but the task's retries ({limit}) are used up" in info.value.error
    assert await job.astatus() is drumbeat.JobStatus.DEAD


async def test_retry_carries_its_own_cap_and_the_task_retries_can_raise_it(
    app: drumbeat.App,
) -> None:
    capped: list[int] = []
    generous: list[int] = []

    @app.task
    async def once_more() -> None:
        capped.append(drumbeat.current_job().attempt)
        raise drumbeat.Retry(delay=0, max_retries=1)

    @app.task(retries=5)
    async def patient() -> int:
        attempt = drumbeat.current_job().attempt
        generous.append(attempt)
        if attempt <= 5:
            raise drumbeat.Retry(delay=0)
        return attempt

    async with running_worker(app):
        with pytest.raises(drumbeat.JobFailed, match=r"retries \(1\) are used up"):
            await (await once_more.aenqueue()).aresult(timeout=10)
        assert await (await patient.aenqueue()).aresult(timeout=10) == 6
    assert capped == [1, 2]
    assert generous == [1, 2, 3, 4, 5, 6]


async def test_a_failure_after_a_retry_request_uses_the_task_retries(app: drumbeat.App) -> None:
    seen: list[int] = []

    @app.task
    async def then_fail() -> None:
        attempt = drumbeat.current_job().attempt
        seen.append(attempt)
        if attempt == 1:
            raise drumbeat.Retry(delay=0)
        raise RuntimeError("broken for good")

    async with running_worker(app):
        with pytest.raises(drumbeat.JobFailed, match="RuntimeError: broken for good"):
            await (await then_fail.aenqueue()).aresult(timeout=10)
    assert seen == [1, 2], "an ordinary failure is not retried with retries=0"


def test_retry_checks_its_arguments() -> None:
    with pytest.raises(ValueError, match="max_retries must be an int >= 0"):
        drumbeat.Retry(max_retries=-1)
    assert drumbeat.Retry(max_retries=0).limit(task_retries=7) == 0
    assert drumbeat.Retry().limit(task_retries=0) == drumbeat.Retry.DEFAULT_MAX_RETRIES
    assert drumbeat.Retry().limit(task_retries=10) == 10
