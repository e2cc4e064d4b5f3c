"""Retries that fit the error, on a real Redis: ``retry_on`` / ``dont_retry_on`` (matched by
class, subclasses included; an error not retried is dead-lettered at once) and a backoff
function (the retry is due when it says)."""

from __future__ import annotations

import pytest
import redis

import drumbeat
from drumbeat.testing import arun_until_idle
from tests.conftest import running_worker
from tests.helpers import redis_now_ms


async def test_retry_on_retries_only_the_errors_it_names(app: drumbeat.App) -> None:
    seen: dict[str, list[int]] = {"slow": [], "reset": [], "bad": []}

    @app.task(retries=3, backoff=0, retry_on=(TimeoutError, OSError))
    async def call(kind: str) -> str:
        attempt = drumbeat.current_job().attempt
        seen[kind].append(attempt)
        if attempt == 1:
            raise {"slow": TimeoutError, "reset": ConnectionResetError, "bad": ValueError}[kind]
        return kind

    async with running_worker(app):
        assert await (await call.aenqueue("slow")).aresult(timeout=10) == "slow"
        # ConnectionResetError is an OSError: subclasses are matched
        assert await (await call.aenqueue("reset")).aresult(timeout=10) == "reset"
        bad = await call.aenqueue("bad")
        with pytest.raises(
            drumbeat.JobFailed, match="ValueError is not in the task's retry_on"
        ) as info:
            await bad.aresult(timeout=10)
    assert seen == {"slow": [1, 2], "reset": [1, 2], "bad": [1]}, "ValueError: no retry"
    assert info.value.traceback and "ValueError" in info.value.traceback
    assert await bad.astatus() is drumbeat.JobStatus.DEAD


async def test_dont_retry_on_fails_at_once_and_wins_over_retry_on(app: drumbeat.App) -> None:
    seen: list[tuple[str, int]] = []

    @app.task(retries=2, backoff=0, retry_on=OSError, dont_retry_on=(FileNotFoundError,))
    async def read(kind: str) -> str:
        attempt = drumbeat.current_job().attempt
        seen.append((kind, attempt))
        if attempt == 1:
            raise FileNotFoundError(kind) if kind == "missing" else PermissionError(kind)
        return kind

    @app.task(retries=2, backoff=0, dont_retry_on=ValueError)
    async def parse(text: str) -> int:
        attempt = drumbeat.current_job().attempt
        seen.append((text, attempt))
        if text.isdigit() and attempt == 1:
            raise KeyError(text)  # not in dont_retry_on: retried
        return int(text)  # "x": ValueError, never retried

    async with running_worker(app):
        assert await (await read.aenqueue("denied")).aresult(timeout=10) == "denied"
        with pytest.raises(drumbeat.JobFailed, match="FileNotFoundError is in the task's dont"):
            await (await read.aenqueue("missing")).aresult(timeout=10)
        assert await (await parse.aenqueue("7")).aresult(timeout=10) == 7
        with pytest.raises(drumbeat.JobFailed, match="invalid literal"):
            await (await parse.aenqueue("x")).aresult(timeout=10)
    assert sorted(seen) == sorted(
        [("denied", 1), ("denied", 2), ("missing", 1), ("7", 1), ("7", 2), ("x", 1)]
    )


async def test_a_backoff_function_sets_when_the_retry_is_due(
    app: drumbeat.App, r: redis.Redis
) -> None:
    failures: list[int] = []

    def backoff(n: int) -> float:
        failures.append(n)
        return 40.0 * n

    @app.task(retries=2, backoff=backoff)
    async def flaky() -> None:
        raise RuntimeError("down")

    before = redis_now_ms(r)
    job = await flaky.aenqueue()
    # One run: its retry, due in 40 s, is past the wait's timeout (left waiting, not run).
    assert await arun_until_idle(app) == 1
    after = redis_now_ms(r)
    due = r.zscore(app.keys.due, job.id)
    assert failures == [1], "called with the failures so far"
    assert due is not None, "the failed job should wait in `due` for its retry"
    assert before + 40_000 <= due <= after + 40_000, "due when the function said, no jitter"
    assert await job.astatus() is drumbeat.JobStatus.SCHEDULED


async def test_a_backoff_function_that_fails_dead_letters_with_why(app: drumbeat.App) -> None:
    @app.task(retries=2, backoff=lambda n: -1.0)
    async def flaky() -> None:
        raise RuntimeError("down")

    async with running_worker(app):
        job = await flaky.aenqueue()
        with pytest.raises(drumbeat.JobFailed) as info:
            await job.aresult(timeout=10)
    assert info.value.error.startswith(
        "RuntimeError: down; not retried: its backoff function's delay for failure 1 must be "
        "a number of seconds >= 0, got -1.0"
    )


def test_retry_options_are_checked_at_definition(app: drumbeat.App) -> None:
    with pytest.raises(drumbeat.InvalidJob, match="retry_on takes exception classes"):
        app.task(retry_on=("TimeoutError",))(lambda: None)  # type: ignore[arg-type]
    with pytest.raises(drumbeat.InvalidJob, match="dont_retry_on takes exception classes"):
        app.task(dont_retry_on=int)(lambda: None)  # type: ignore[arg-type]
    with pytest.raises(drumbeat.InvalidJob, match="backoff must be a number of seconds"):
        app.task(backoff=-1)(lambda: None)
