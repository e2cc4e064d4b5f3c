"""The public API is small and pinned; changes to it are deliberate."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

import drumbeat
from drumbeat.runner import backoff_delay
from drumbeat.task import TaskConfig


def test_public_names_are_pinned() -> None:
    assert sorted(drumbeat.__all__) == [
        "App", "Batch", "BatchEnded", "BatchStatus", "Bound", "Cadence", "CallOptions",
        "ConfigurationError", "Context", "Dependency",
        "DrumbeatError", "Enqueueing", "EvictionPolicyWarning", "InvalidJob", "Job",
        "JobCancelled", "JobEnd",
        "JobFailed", "JobInfo", "JobNotFound", "JobStatus",
        "LeaseLost", "Middleware", "Options", "PayloadTooLarge", "Prepared", "Resource",
        "ResultTimeout", "Retry",
        "Schedule", "ScheduleInfo", "SerializationError", "Settings", "Task", "TaskRef",
        "UnknownDependency", "UnknownTask", "Worker", "WorkerCrashed", "acheckpoint",
        "aresource", "checkpoint",
        "current_job", "resource", "run_worker",
    ]  # fmt: skip
    for name in drumbeat.__all__:
        assert hasattr(drumbeat, name)


def test_error_tree_has_one_root_and_retry_stays_apart() -> None:
    errors = ["ConfigurationError", "InvalidJob", "SerializationError", "PayloadTooLarge"]
    errors += ["UnknownTask", "LeaseLost", "JobFailed", "JobNotFound", "ResultTimeout"]
    for name in errors:
        assert issubclass(getattr(drumbeat, name), drumbeat.DrumbeatError)
    assert not issubclass(drumbeat.Retry, drumbeat.DrumbeatError)


class _Fake:
    def __init__(self, backoff: float, cap: float) -> None:
        self.config = TaskConfig(name="t", backoff=backoff, backoff_max=cap)


@given(
    backoff=st.floats(0.01, 100),
    cap=st.floats(0.01, 10_000),
    failures=st.integers(1, 60),
    r=st.floats(0, 1),
)
def test_backoff_is_exponential_jittered_and_capped(
    backoff: float, cap: float, failures: int, r: float
) -> None:
    delay = backoff_delay(_Fake(backoff, cap), failures, lambda: r)  # type: ignore[arg-type]
    step = min(cap, backoff * 2 ** (failures - 1))
    assert step / 2 - 1e-9 <= delay <= step + 1e-9


def test_backoff_grows_until_the_cap() -> None:
    fake = _Fake(1.0, 60.0)
    delays = [backoff_delay(fake, n, random.random) for n in range(1, 10)]  # type: ignore[arg-type]
    assert delays[0] <= 1.0 and 4 <= delays[3] <= 8 and all(d <= 60 for d in delays)


def test_settings_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    mp = monkeypatch
    mp.setenv("DRUMBEAT_REDIS_URL", "redis://example:6379/2")
    mp.setenv("DRUMBEAT_LEASE", "2.5")
    mp.setenv("DRUMBEAT_CONCURRENCY", "7")
    s = drumbeat.Settings.from_env()
    assert (s.url, s.lease, s.concurrency) == ("redis://example:6379/2", 2.5, 7)
    mp.setenv("DRUMBEAT_CONCURRENCY", "many")
    with pytest.raises(drumbeat.ConfigurationError, match="DRUMBEAT_CONCURRENCY"):
        drumbeat.Settings.from_env()
