"""A recycling worker's wait for the supervisor's word (SIGUSR1) to retire: with a deadline
under an older supervisor, without one under a supervisor that holds it while its successors
fail to start."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterator

import pytest

from drumbeat.worker.liveness import (
    PROTOCOL,
    SUPERVISOR_FD,
    SUPERVISOR_HOLDS,
    SUPERVISOR_PROTOCOL,
    SUPERVISOR_READY,
)
from drumbeat.worker.recycling import Budget, Recycler
from tests.helpers import wait_for_async


@pytest.fixture
def pipe(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """The read end of the pipe of a supervisor that reads beats and `ready` lines."""
    r, w = os.pipe()
    os.set_blocking(r, False)
    monkeypatch.setenv(SUPERVISOR_FD, str(w))
    monkeypatch.setenv(SUPERVISOR_PROTOCOL, str(PROTOCOL))
    monkeypatch.setenv(SUPERVISOR_READY, "1")
    yield r
    os.close(r)
    os.close(w)


def _read(fd: int) -> bytes:
    try:
        return os.read(fd, 4096)
    except BlockingIOError:
        return b""


def _spent(retired: list[str], stopping: asyncio.Event) -> Recycler:
    """A recycler whose budget is spent, with a hand-over wait of 0.05 s."""
    return Recycler(Budget(max_jobs=1), lambda: 1, lambda: retired.append("retired"), stopping,
                    interval=0.01, handover_wait=0.05)  # fmt: skip


async def test_under_an_older_supervisor_it_retires_on_its_own_after_the_handover_wait(
    pipe: int,
) -> None:
    retired: list[str] = []
    await asyncio.wait_for(_spent(retired, asyncio.Event()).run(), 10)
    assert _read(pipe) == f"retire {os.getpid()}\n".encode()
    assert retired == ["retired"]


async def test_under_a_holding_supervisor_it_claims_on_until_told(
    pipe: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The supervisor holds a worker whose successors fail to start: the worker must not retire
    on its own after the hand-over wait (that would cost the pool a process)."""
    monkeypatch.setenv(SUPERVISOR_HOLDS, "1")
    retired: list[str] = []
    stopping = asyncio.Event()
    run = asyncio.create_task(_spent(retired, stopping).run())
    try:
        asked = await wait_for_async(lambda: _read(pipe), until=bool,
                                     message="the worker should ask for a successor")  # fmt: skip
        assert asked == f"retire {os.getpid()}\n".encode()
        with contextlib.suppress(TimeoutError):  # 20 hand-over waits pass
            await asyncio.wait_for(asyncio.shield(run), 1.0)
        assert not run.done() and not retired, "it retired on its own while held"
        stopping.set()  # SIGUSR1: Worker.retire sets it
        await asyncio.wait_for(run, 10)
        assert not retired, "told to retire, it has nothing more to do"
    finally:
        run.cancel()
        await asyncio.gather(run, return_exceptions=True)
