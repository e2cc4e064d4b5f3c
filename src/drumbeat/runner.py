"""Runs one claimed job: decode, look up the task, call it under its timeout, and decide what
happens next (ack, retry after a backoff, or dead letter). Talks to Redis only through its
caller."""

from __future__ import annotations

import asyncio
import contextvars
import random
import traceback
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .context import Context, _current
from .errors import Retry, SerializationError, UnknownTask
from .job import decode_spec, encode_failure, encode_success
from .scripts import Claimed

if TYPE_CHECKING:
    from .app import App
    from .task import Task


@dataclass(frozen=True, slots=True)
class Done:
    outcome: bytes
    ttl_ms: int


@dataclass(frozen=True, slots=True)
class Again:
    delay_ms: int


@dataclass(frozen=True, slots=True)
class Bury:
    record: bytes
    ttl_ms: int
    reason: str


Outcome = Done | Again | Bury


def backoff_delay(task: Task[Any, Any], failures: int, rand: Callable[[], float]) -> float:
    """Exponential backoff with equal jitter: half the step fixed, half random, capped."""
    step = min(task.config.backoff_max, task.config.backoff * 2 ** (failures - 1))
    return float(step / 2 + step / 2 * rand())


class Runner:
    """Turns a claimed job into an `Outcome`; one per worker."""

    def __init__(self, app: App, worker_id: str, executor: Executor) -> None:
        self.app = app
        self.worker_id = worker_id
        self.executor = executor
        self.limit = app.settings.max_payload_bytes
        self.default_ttl_ms = round(app.settings.result_ttl * 1000)
        self.rand = random.random

    async def run(self, job: Claimed, now_ms: Callable[[], int]) -> Outcome:
        try:
            if job.spec is None:
                raise SerializationError("no job record: a foreign or corrupt entry in the queue")
            spec = decode_spec(job.spec)
            task = self.app.get_task(spec.task)
        except (SerializationError, UnknownTask) as exc:
            return self._bury(job, str(exc), None, now_ms())
        ttl_ms = self._ttl_ms(task)
        ctx = Context(job.id, task.name, job.attempt, job.token, job.priority, self.worker_id)
        token = _current.set(ctx)
        try:
            value = await asyncio.wait_for(
                self._call(task, spec.args, spec.kwargs), task.config.timeout
            )
            return Done(encode_success(self.app.codec, value, self.limit), ttl_ms)
        except Retry as exc:
            return self._failed(job, task, f"retry requested: {exc}", exc.delay, now_ms())
        except TimeoutError:
            return self._failed(
                job, task, f"timed out after {task.config.timeout} s", None, now_ms()
            )
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            return self._failed(job, task, error, None, now_ms(), tb=traceback.format_exc())
        finally:
            _current.reset(token)

    async def _call(self, task: Task[Any, Any], args: list[Any], kwargs: dict[str, Any]) -> Any:
        if task.is_async:
            return await task.fn(*args, **kwargs)
        # copy_context carries `current_job()` into the thread.
        run = contextvars.copy_context().run
        return await asyncio.get_running_loop().run_in_executor(
            self.executor, lambda: run(task.fn, *args, **kwargs)
        )

    def _ttl_ms(self, task: Task[Any, Any]) -> int:
        ttl = task.config.result_ttl
        return self.default_ttl_ms if ttl is None else round(ttl * 1000)

    def _failed(
        self,
        job: Claimed,
        task: Task[Any, Any],
        error: str,
        delay: float | None,
        now_ms: int,
        *,
        tb: str | None = None,
    ) -> Outcome:
        # Runs lost to crashed workers (stalls) are not the task's failures.
        failures = job.attempt - job.stalls
        if failures <= task.config.retries:
            if delay is None:
                delay = backoff_delay(task, failures, self.rand)
            return Again(max(0, round(delay * 1000)))
        return self._bury(job, error, tb, now_ms, self._ttl_ms(task))

    def _bury(
        self, job: Claimed, error: str, tb: str | None, now_ms: int, ttl_ms: int | None = None
    ) -> Bury:
        record = encode_failure(self.app.codec, error, tb, job.attempt, now_ms)
        return Bury(record, self.default_ttl_ms if ttl_ms is None else ttl_ms, error)
