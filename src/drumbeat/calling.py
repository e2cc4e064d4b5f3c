"""Calls a task's function: awaited on the worker's loop when it is async, in the worker's
thread pool when it is sync, under the task's timeout (the time a run spent lending its slot at
checkpoints does not count). A thread cannot be stopped: a sync call given up on (timed out,
cancelled) runs on, and is counted until it returns, so the worker can tell a wedged pool."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .context import Checkpoints
    from .task import Task


@dataclass(slots=True)
class _SyncCall:
    """Where a sync task's call in the pool is (`TaskCaller.abandoned`); under the caller's lock."""

    started: bool = False
    done: bool = False
    given_up: bool = False


class TaskCaller:
    """Runs task functions for one worker's runner."""

    def __init__(self, executor: Executor) -> None:
        self.executor = executor
        self.abandoned = 0
        """Threads still running a sync call given up on (timed out or cancelled): each holds a
        thread of the pool until its call returns."""
        self._lock = threading.Lock()

    async def call(
        self,
        task: Task[Any, Any],
        args: list[Any],
        kwargs: dict[str, Any],
        checkpoints: Checkpoints | None,
    ) -> Any:
        timeout = task.config.timeout
        if timeout is None:  # wait_for costs a timer handle per job; skip it
            return await self._call(task, args, kwargs)
        if checkpoints is None:
            return await asyncio.wait_for(self._call(task, args, kwargs), timeout)
        # Time spent paused at checkpoints (lending the slot) does not count: the deadline moves
        # by it. A sync task's thread is not stopped on timeout; its result is dropped.
        run = asyncio.ensure_future(self._call(task, args, kwargs))
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            while True:
                left = started + timeout + checkpoints.paused - loop.time()
                if left <= 0:
                    raise TimeoutError
                done, _ = await asyncio.wait({run}, timeout=left)
                if done:
                    return run.result()
        finally:
            if not run.done():
                run.cancel()

    async def _call(self, task: Task[Any, Any], args: list[Any], kwargs: dict[str, Any]) -> Any:
        if task.is_async:
            return await task.fn(*args, **kwargs)
        # copy_context carries `current_job()` into the thread.
        run = contextvars.copy_context().run
        call = _SyncCall()

        def in_thread() -> Any:
            with self._lock:
                call.started = True
                if call.given_up:  # given up on after the pool took it, before it began
                    self.abandoned += 1
            try:
                return run(task.fn, *args, **kwargs)
            finally:
                with self._lock:
                    call.done = True
                    if call.given_up:
                        self.abandoned -= 1

        try:
            return await asyncio.get_running_loop().run_in_executor(self.executor, in_thread)
        except asyncio.CancelledError:  # a timeout, a cancel, a stop: the thread runs on
            with self._lock:
                call.given_up = True
                if call.started and not call.done:
                    self.abandoned += 1
            raise
