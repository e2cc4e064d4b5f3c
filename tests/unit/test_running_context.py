"""A run's Context is made when a task first asks for it (`context.Running`), once per run."""

from __future__ import annotations

import contextvars
import dataclasses

import pytest

from drumbeat import Context, current_job
from drumbeat.context import Running, current_run

FIELDS = ("s:a", "tasks.ping", 1, 41, 5, "w1", "a", 1000, ("done", 3), None, 1234, {"h": "1"})


def test_a_run_makes_its_context_when_first_asked_then_gives_the_same_one() -> None:
    run = Running(FIELDS)
    assert run._context is None, "nothing asked: no Context made"

    def task() -> tuple[Context, Context]:
        current_run.set(run)
        return current_job(), current_job()

    first, again = contextvars.copy_context().run(task)
    assert first is again
    assert type(first) is Context and first == Context(*FIELDS), "every field in its place"
    assert hash(first) == hash(Context(*FIELDS)) and repr(first) == repr(Context(*FIELDS))
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.attempt = 2  # type: ignore[misc]
    assert (first.job_id, first.token, first.schedule_id, first.due_ms) == ("s:a", 41, "a", 1000)
    assert first.headers == {"h": "1"}


def test_outside_a_run_there_is_no_current_job() -> None:
    with pytest.raises(LookupError, match="only available while a drumbeat job runs"):
        contextvars.copy_context().run(current_job)
