"""`Settings.ready_wait` and `Settings.handover_wait`: a supervisor's wait for a new worker to
say it serves, and a recycling worker's own deadline, which must outlast it."""

from __future__ import annotations

import inspect

import pytest

from drumbeat import ConfigurationError, Settings
from drumbeat.config import HANDOVER_MARGIN
from drumbeat.supervisor import Supervisor


def test_defaults() -> None:
    s = Settings()
    assert s.ready_wait == 60.0
    assert s.handover_wait is None
    assert s.handover_deadline == 60.0 + HANDOVER_MARGIN
    assert inspect.signature(Supervisor).parameters["ready_wait"].default == s.ready_wait, (
        "a Supervisor built without settings should wait as long as the settings' default"
    )


def test_the_handover_deadline_follows_ready_wait_unless_set() -> None:
    """Raising ready_wait alone is enough for a slow start-up; a replace moves the derived
    deadline along (it is not stored)."""
    s = Settings(ready_wait=120)
    assert s.handover_deadline == 120 + HANDOVER_MARGIN
    assert s.replace(ready_wait=5).handover_deadline == 5 + HANDOVER_MARGIN
    assert Settings(ready_wait=5, handover_wait=6).handover_deadline == 6


def test_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DRUMBEAT_READY_WAIT", "2.5")
    monkeypatch.setenv("DRUMBEAT_HANDOVER_WAIT", "10")
    s = Settings.from_env()
    assert s.ready_wait == 2.5
    assert s.handover_wait == 10.0
    assert s.handover_deadline == 10.0
    monkeypatch.setenv("DRUMBEAT_HANDOVER_WAIT", "")
    assert Settings.from_env().handover_wait is None, "an empty variable keeps the default"


@pytest.mark.parametrize("var", ["DRUMBEAT_READY_WAIT", "DRUMBEAT_HANDOVER_WAIT"])
def test_from_env_refuses_what_is_not_a_number(monkeypatch: pytest.MonkeyPatch, var: str) -> None:
    monkeypatch.setenv(var, "a minute")
    with pytest.raises(ConfigurationError, match=f"{var}='a minute' is not a valid"):
        Settings.from_env()


@pytest.mark.parametrize("value", [0, -1.0])
def test_non_positive_waits_are_refused(value: float) -> None:
    with pytest.raises(ConfigurationError, match=rf"ready_wait must be > 0, got {value!r}"):
        Settings(ready_wait=value)
    with pytest.raises(ConfigurationError, match=rf"handover_wait must be > 0, got {value!r}"):
        Settings(handover_wait=value)


def test_from_env_refuses_a_non_positive_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DRUMBEAT_READY_WAIT", "0")
    with pytest.raises(ConfigurationError, match="ready_wait must be > 0"):
        Settings.from_env()


@pytest.mark.parametrize("handover", [30.0, 60.0])
def test_a_handover_wait_not_past_ready_wait_is_refused(handover: float) -> None:
    with pytest.raises(
        ConfigurationError,
        match=r"handover_wait must be longer than ready_wait \(60 s.*leave it unset",
    ):
        Settings(handover_wait=handover)
    with pytest.raises(ConfigurationError, match="handover_wait must be longer than ready_wait"):
        Settings(handover_wait=75.0).replace(ready_wait=75.0)
