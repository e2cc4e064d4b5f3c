"""The line protocol on the supervisor's pipe: beats only for a supervisor that reads them."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator

import pytest

from drumbeat.worker.liveness import (
    SUPERVISOR_FD,
    SUPERVISOR_PROTOCOL,
    SUPERVISOR_READY,
    Liveness,
    parse,
    tell_supervisor,
)
from tests.helpers import wait_for_async


@pytest.fixture
def pipe(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """The read end of a pipe whose write end this process's `tell_supervisor` writes on."""
    r, w = os.pipe()
    os.set_blocking(r, False)
    monkeypatch.setenv(SUPERVISOR_FD, str(w))
    yield r
    os.close(r)
    os.close(w)


def _read(fd: int) -> bytes:
    try:
        return os.read(fd, 4096)
    except BlockingIOError:
        return b""


def test_protocol_2_sends_beats_and_retirements_as_lines(
    pipe: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SUPERVISOR_PROTOCOL, "2")
    assert tell_supervisor("beat") and tell_supervisor("retire")
    lines = _read(pipe).split(b"\n")
    assert lines == [f"beat {os.getpid()}".encode(), f"retire {os.getpid()}".encode(), b""]
    assert [parse(line) for line in lines[:2]] == [("beat", os.getpid()), ("retire", os.getpid())]


def test_ready_goes_only_to_a_supervisor_that_reads_it(
    pipe: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SUPERVISOR_PROTOCOL, "2")
    monkeypatch.delenv(SUPERVISOR_READY, raising=False)
    assert not tell_supervisor("ready"), "a supervisor of protocol 2 alone cannot read it"
    monkeypatch.setenv(SUPERVISOR_READY, "1")
    assert tell_supervisor("ready")
    assert parse(_read(pipe).rstrip(b"\n")) == ("ready", os.getpid())


def test_an_older_supervisor_gets_no_beats_and_retirements_as_it_knows_them(
    pipe: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A worker restarted on new code (SIGHUP) under a supervisor started on the old: that one
    # counted every line as a retirement, so a beat would start a spare process each second.
    monkeypatch.delenv(SUPERVISOR_PROTOCOL, raising=False)
    assert not tell_supervisor("beat")
    assert tell_supervisor("retire")
    assert _read(pipe) == f"{os.getpid()}\n".encode()
    assert parse(str(os.getpid()).encode()) == ("retire", os.getpid())


def test_without_a_supervisor_nothing_is_written(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SUPERVISOR_FD, raising=False)
    assert not tell_supervisor("beat")
    assert not tell_supervisor("retire")


@pytest.mark.parametrize("line", [b"", b"beat", b"beat x", b"hello 12", b"beat 1 2"])
def test_lines_that_are_not_messages_are_refused(line: bytes) -> None:
    assert parse(line) is None


def test_a_pipe_that_cannot_be_written_is_given_up_after_one_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    r, w = os.pipe()
    os.close(r)  # the supervisor is gone
    monkeypatch.setenv(SUPERVISOR_FD, str(w))
    monkeypatch.setenv(SUPERVISOR_PROTOCOL, "2")
    try:
        assert not tell_supervisor("beat")
        assert not tell_supervisor("beat")
    finally:
        os.close(w)
    warned = [rec for rec in caplog.records if "supervisor's pipe" in rec.message]
    assert len(warned) == 1, "expected one warning, then no more writes"


async def test_a_failing_tick_is_logged_and_the_ticks_go_on(
    pipe: int, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(SUPERVISOR_PROTOCOL, "2")
    calls: list[int] = []

    def wedged() -> str | None:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("a bug in the wedge check")
        return None

    pulse = asyncio.create_task(Liveness(0.01, wedged).run())
    try:
        beats = await wait_for_async(
            lambda: _read(pipe), until=bool, message="the ticks should go on after a failing one"
        )
    finally:
        pulse.cancel()
    assert beats.startswith(b"beat ")
    assert any("liveness tick failed" in rec.message for rec in caplog.records)
