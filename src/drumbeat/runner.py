"""Runs one claimed job: decode, look up the task, acquire its limits, call it (`calling`), and
decide what happens next (ack, retry after a backoff, or dead letter); a schedule's run
(`schedule_run`) ends in its schedule's next slot. Talks to Redis only through its caller."""

from __future__ import annotations

import logging
import random
import time
import traceback
from collections.abc import Callable, Coroutine
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Any, Protocol

from .batches import Batch
from .calling import TaskCaller
from .context import Checkpoints, Running, current_run
from .errors import Interrupted, InvalidJob, Retry, SerializationError, UnknownTask
from .job import (
    Job,
    Spec,
    decode_progress,
    decode_spec,
    encode_cancelled,
    encode_failure,
    encode_success,
)
from .keys import DEFAULT_QUEUE
from .limits import Limit
from .outcomes import (
    Again,
    Bury,
    Cancelled,
    Done,
    HandBack,
    Outcome,
    Parked,
    Queued,
    RunDone,
    Unknown,
    printable,
)
from .protocol import RUN_PREFIX
from .replies import Claimed
from .schedule_run import ScheduleRun, decode_run, not_run

if TYPE_CHECKING:
    from .app import App
    from .task import Task


log = logging.getLogger("drumbeat.worker")


class Named(Protocol):
    """Where `Runner.run` notes the task name it decoded (for the metrics counters), so the
    record is decoded once, and the limiter keys whose permits the run holds (released when it
    ends)."""

    task_name: str
    shard: int
    held_limits: list[str]
    acquiring: bool


class Gate(Protocol):
    """What the runner asks before starting a job of a limited task (`worker.limiting.Gate`)."""

    def keys_of(self, task: Task[Any, Any], spec: Spec) -> list[tuple[str, Limit]]: ...

    async def acquire(
        self,
        shard: int,
        job: Claimed,
        keyed: list[tuple[str, Limit]],
        now_ms: Callable[[], int],
    ) -> int | None: ...


def backoff_delay(task: Task[Any, Any], failures: int, rand: Callable[[], float]) -> float:
    """The delay before retry ``failures`` (`TaskConfig.retry_delay`)."""
    return task.config.retry_delay(failures, rand)


class Runner:
    """Turns a claimed job into an `Outcome`; one per worker."""

    def __init__(self, app: App, worker_id: str, executor: Executor) -> None:
        self.app = app
        self.worker_id = worker_id
        self.executor = executor
        self.limit = app.settings.max_payload_bytes
        self.default_ttl_ms = round(app.settings.result_ttl * 1000)
        self.rand = random.random
        self.gate: Gate | None = None
        """Acquires the limits of jobs of limited tasks (None: limits are not checked)."""
        self.caller = TaskCaller(executor)

    @property
    def abandoned(self) -> int:
        """Threads still running a sync call this runner gave up on (`TaskCaller.abandoned`)."""
        return self.caller.abandoned

    def run(
        self,
        job: Claimed,
        now_ms: Callable[[], int],
        checkpoints: Checkpoints | None = None,
        named: Named | None = None,
    ) -> Coroutine[Any, Any, Outcome]:
        """The run of a claimed job, to await: its `Outcome`. (The coroutine of a schedule's run
        or of a job's, handed over as it is: a coroutine more per run costs its frame.)"""
        if job.id.startswith(RUN_PREFIX):
            return self._run_schedule(job, now_ms, checkpoints, named)
        return self._run_job(job, now_ms, checkpoints, named)

    async def _run_job(
        self,
        job: Claimed,
        now_ms: Callable[[], int],
        checkpoints: Checkpoints | None,
        named: Named | None,
    ) -> Outcome:
        found = await self._task_of(job, now_ms, named)
        if not isinstance(found, tuple):
            return found
        task, spec, granted_ms = found
        ttl_ms = self._ttl_ms(task)
        if checkpoints is not None:
            checkpoints.is_async = task.is_async
        progress = decode_progress(job.progress)
        deps: tuple[Job[Any], ...] = tuple(Job(self.app, d) for d in spec.deps)
        batch = None if spec.batch is None else Batch(self.app, spec.batch)
        run = Running((job.id, task.name, job.attempt, job.token, job.priority, self.worker_id,
                       None, None, progress, checkpoints, granted_ms, spec.headers,
                       deps, batch))  # fmt: skip
        token = current_run.set(run)
        try:
            if task.is_async and task.config.timeout is None:  # the common case, inlined
                value = await task.fn(*spec.args, **spec.kwargs)
            else:
                value = await self.caller.call(task, spec.args, spec.kwargs, checkpoints)
            return Done(encode_success(self.app.codec, value, self.limit), ttl_ms)
        except Interrupted as stop:
            return self.cancelled(job, now_ms()) if stop.reason == "cancelled" else HandBack()
        except Exception as exc:
            return self._failure(job, task, exc, now_ms())
        finally:
            current_run.reset(token)

    async def _task_of(
        self, job: Claimed, now_ms: Callable[[], int], named: Named | None
    ) -> tuple[Task[Any, Any], Spec, int | None] | Outcome:
        """The job's task, call and granted start (`Context.granted_ms`), once it may run;
        else what becomes of it (its task is unknown here, its record unreadable, or its limits
        do not let it start now)."""
        try:
            if job.spec is None:
                raise SerializationError("no job record: a foreign or corrupt entry in the queue")
            spec = job.decoded if job.decoded is not None else decode_spec(job.spec)
            if named is not None:
                named.task_name = spec.task
            task = self.app.get_task(spec.task)
        except UnknownTask as exc:
            return self._unknown(job, str(exc), now_ms())
        except SerializationError as exc:
            return self._bury(job, str(exc), None, now_ms())
        if self.gate is not None and (task.limits or spec.limits is not None):
            acquired = await self._acquire(job, task, spec, named, now_ms)
            if isinstance(acquired, Parked | Bury):
                return acquired
            return task, spec, acquired
        return task, spec, None

    async def _acquire(
        self,
        job: Claimed,
        task: Task[Any, Any],
        spec: Spec,
        named: Named | None,
        now_ms: Callable[[], int],
    ) -> Parked | Bury | int | None:
        """Acquires the limits of a job of a limited task: the start they granted (Redis
        clock ms) or None (it has no limiter key) when it may run now."""
        assert self.gate is not None
        try:
            keyed = self.gate.keys_of(task, spec)
        except InvalidJob as exc:
            return self._bury(job, f"cannot acquire its limits: {exc}", None, now_ms())
        if not keyed:
            return None
        if named is not None:
            named.acquiring = True
        try:
            granted = await self.gate.acquire(named.shard if named else 0, job, keyed, now_ms)
        finally:
            if named is not None:
                named.acquiring = False
        if granted is None:
            return Parked()
        if named is not None:
            named.held_limits = [name for name, limit in keyed if limit.concurrency]
        return granted

    def _unknown(self, job: Claimed, error: str, now_ms: int) -> Unknown | Bury:
        """A job whose task this worker lacks goes back for one that knows it, until no worker
        that claimed it knew the task for `Settings.unknown_task_grace`."""
        grace_ms = round(self.app.settings.unknown_task_grace * 1000)
        first = job.unknown_ms or now_ms
        if now_ms - first < grace_ms:
            return Unknown()
        return self._bury(
            job,
            f"{error}; no worker that claimed it knew the task for "
            f"{(now_ms - first) / 1000:.0f} s (unknown_task_grace is "
            f"{self.app.settings.unknown_task_grace:g} s): deploy a worker that registers it, "
            "then retry the dead letter",
            None,
            now_ms,
        )

    def _failure(self, job: Claimed, task: Task[Any, Any], exc: Exception, now_ms: int) -> Outcome:
        """What follows an exception out of the task: a retry while its retries allow (an
        explicit `Retry` up to its own bound), else the dead-letter set."""
        if isinstance(exc, Retry):  # honoured even with retries=0, up to its own bound
            limit = exc.limit(task.config.retries)
            error = (
                f"retry requested but the task's retries ({limit}) are used up after "
                f"{job.attempt} attempts; to retry more, raise Retry(max_retries=...) or set "
                "the task's retries="
            )
            return self._failed(job, task, error, exc.delay, now_ms, retries=limit)
        tb = None
        if isinstance(exc, TimeoutError) and task.config.timeout is not None:
            error = f"timed out after {task.config.timeout} s"
        else:
            error = f"{type(exc).__name__}: {exc}"
            tb = "".join(traceback.format_exception(exc))
        if not task.config.retries_error(exc):  # retry_on / dont_retry_on: fails at once
            refused = isinstance(exc, task.config.dont_retry_on)
            why = "in the task's dont_retry_on" if refused else "not in the task's retry_on"
            error += f" (not retried: {type(exc).__name__} is {why})"
            return self._bury(job, error, tb, now_ms, self._ttl_ms(task))
        return self._failed(job, task, error, None, now_ms, tb=tb)

    def cancelled(self, job: Claimed, now_ms: int) -> Cancelled:
        """The outcome of a job stopped by `Job.cancel`."""
        return Cancelled(encode_cancelled(self.app.codec, job.attempt, now_ms), self.default_ttl_ms)

    async def _run_schedule(
        self,
        job: Claimed,
        now_ms: Callable[[], int],
        checkpoints: Checkpoints | None,
        named: Named | None = None,
    ) -> RunDone | Parked | Queued:
        """Runs one due run of a schedule (once its task's limits let it start); never raises,
        so a failure never stops the schedule. A run claimed from the time slots whose
        schedule is routed to another queue, or has limits, goes to its queue as a job
        instead: it holds no lease there to wait for its limits with, and the workers of
        that queue run it."""
        start_ms, started = now_ms(), time.monotonic()
        decoded = decode_run(job, named, (start_ms, started), now_ms)
        if isinstance(decoded, RunDone):
            return decoded
        slot, task_name, args, kwargs, limits, headers = decoded
        task = self._run_task(job, slot, start_ms, task_name)
        if isinstance(task, RunDone | Queued):
            return task
        granted_ms = None
        if self.gate is not None and (task.limits or limits is not None):
            spec = Spec(task.name, args, kwargs, limits)  # the schedule's own limits, if any
            granted = await self._run_limits(job, slot, task, spec, named=named, now_ms=now_ms)
            if isinstance(granted, RunDone | Parked | Queued):
                return granted
            granted_ms = granted
        if checkpoints is not None:
            checkpoints.is_async = task.is_async
        run = Running((job.id, task.name, job.attempt, job.token, job.priority, self.worker_id,
                       slot.schedule_id, slot.due, None, checkpoints, granted_ms,
                       headers))  # fmt: skip
        token = current_run.set(run)
        try:
            if task.is_async and task.config.timeout is None:  # the common case, inlined
                await task.fn(*args, **kwargs)
            else:
                await self.caller.call(task, args, kwargs, checkpoints)
            return slot.next("ok")
        except Interrupted as stop:  # a run is not resumed: it ends, the schedule goes on
            return slot.next("skip" if stop.reason == "handback" else "fail", stop.reason)
        except Exception as exc:
            if isinstance(exc, TimeoutError):
                error = f"timed out after {task.config.timeout} s"
            else:
                error = f"{type(exc).__name__}: {exc}"[:2000]
            return slot.next("fail", error)
        finally:
            current_run.reset(token)

    async def _run_limits(
        self,
        job: Claimed,
        slot: ScheduleRun,
        task: Task[Any, Any],
        spec: Spec,
        *,
        named: Named | None,
        now_ms: Callable[[], int],
    ) -> RunDone | Parked | Queued | int | None:
        """Acquires the limits of a schedule's run (`_acquire`), or settles it without running
        it. A run claimed from the time slots holds no lease to wait for them with: it goes to
        its queue as a job, where it waits for them as jobs do."""
        if job.slot_run is not None:
            return Queued(DEFAULT_QUEUE)
        acquired = await self._acquire(job, task, spec, named, now_ms)
        return slot.next("fail", acquired.reason) if isinstance(acquired, Bury) else acquired

    def _run_task(
        self, job: Claimed, slot: ScheduleRun, start_ms: int, task_name: bytes
    ) -> Task[Any, Any] | RunDone | Queued:
        """The task of a run that may start here; else what becomes of the run: settled without
        it (a misfire, a run that stalled too often, or its task unknown here: it keeps its
        cadence, the task may be deployed later), or sent to its queue as a job (a run claimed
        from the time slots whose schedule is routed there: that queue's workers run it)."""
        skipped = not_run(
            job, slot.due, start_ms, slot.cadence.grace_ms, self.app.settings.max_stalls
        )
        if skipped is not None:
            return slot.next(*skipped)
        if job.slot_run is not None and job.slot_run.queue is not None:
            return Queued(job.slot_run.queue)
        try:
            return self.app.get_task(task_name.decode())
        except UnknownTask as exc:
            return slot.next("fail", str(exc))

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
        retries: int | None = None,
    ) -> Outcome:
        """Again after a backoff while ``retries`` (default: the task's) allow, else Bury."""
        # Runs lost to crashed workers (stalls) are not the task's failures.
        failures = job.attempt - job.stalls
        if failures <= (task.config.retries if retries is None else retries):
            if delay is None:
                try:
                    delay = backoff_delay(task, failures, self.rand)
                except InvalidJob as exc:  # its own backoff function failed: say so
                    error = f"{error}; not retried: {exc}"
                    return self._bury(job, error, tb, now_ms, self._ttl_ms(task))
            return Again(max(0, round(delay * 1000)), error)
        return self._bury(job, error, tb, now_ms, self._ttl_ms(task))

    def _bury(
        self, job: Claimed, error: str, tb: str | None, now_ms: int, ttl_ms: int | None = None
    ) -> Bury:
        error, tb = printable(error), tb and printable(tb)
        record = encode_failure(self.app.codec, error, tb, job.attempt, now_ms)
        return Bury(record, self.default_ttl_ms if ttl_ms is None else ttl_ms, error)
