"""Job middleware: code that runs around each enqueue (in the producer) and each run (in the
worker), registered on the App with `App.middleware`, and the headers a job carries from the
one to the other.

The worker side is the worker's per-job hooks (`worker.hooks.Hooks`): a middleware's
``before_run`` and ``after_run`` are added to them when a `Worker` of the app is made, so
``drumbeat worker`` and a supervisor's workers (which import the app) run them too. A
middleware method that raises is logged and the enqueue or the run goes on as if it had not
been there.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from .errors import ConfigurationError, InvalidJob, PayloadTooLarge

if TYPE_CHECKING:
    from .job import Job
    from .worker.hooks import JobEnd, JobInfo

log = logging.getLogger("drumbeat.middleware")

M = TypeVar("M", bound="Middleware | type[Middleware]")
T = TypeVar("T")


@dataclass(slots=True, eq=False)
class Enqueueing:
    """A job on its way to Redis, as `Middleware.before_enqueue` and ``after_enqueue`` see it
    (the same object for both)."""

    id: str
    """The id the job is written under; after the enqueue, the id Redis answered with (an
    existing job's when its dedup key was taken: see `created`)."""
    task: str
    queue: str
    priority: int
    headers: dict[str, str]
    """The job's headers so far (`Task.options(headers=...)`); add to them here."""
    created: bool | None = None
    """After the enqueue: True if the job was created, False if deduplicated; None before,
    or when the enqueue failed."""
    notes: dict[str, Any] = field(default_factory=dict)
    """For a middleware's own use between ``before_enqueue`` and ``after_enqueue``."""


class Middleware:
    """Base class of job middleware: override the methods you need (the others cost
    nothing). Register an instance, or a class that takes no arguments, with
    `App.middleware`.

    Producer side, in the process that enqueues (sync or async, `enqueue_many` and by name):
    ``before_enqueue`` once per job before it is written (it may add headers), then
    ``after_enqueue`` once the write answered or failed. Both are plain functions: they run
    in the caller's thread or event loop, so keep them quick (no I/O).

    Worker side, on the worker's event loop: ``before_run`` as a run starts, ``after_run``
    once it ended, with its outcome and duration. Either may be a coroutine function. Each
    run of a middleware happens in the asyncio task that runs the job, so a context variable
    set in ``before_run`` is seen by the task (its thread too, for a sync task) and by
    ``after_run``.

    Middleware run in the order registered; the ``after_*`` methods in the reverse order, so
    middleware nest. One that raises is logged and the job goes on.
    """

    def before_enqueue(self, job: Enqueueing) -> None:
        """A job is about to be written; ``job.headers`` may be added to."""

    def after_enqueue(self, job: Enqueueing, error: BaseException | None) -> None:
        """The job was written (``job.id``, ``job.created``), or ``error`` stopped it."""

    def before_run(self, job: JobInfo) -> Awaitable[None] | None:
        """A run of ``job`` starts (each attempt, and each run of a schedule)."""
        return None

    def after_run(self, end: JobEnd) -> Awaitable[None] | None:
        """A run ended: ``end.job``, ``end.outcome``, ``end.duration``, ``end.error``."""
        return None


def overrides(mw: Middleware, name: str) -> bool:
    """Whether ``mw`` has its own ``name`` method (the base class's do nothing, and are not
    called: a worker with no job hooks skips them all)."""
    return getattr(type(mw), name) is not getattr(Middleware, name)


def check_headers(headers: object, what: str) -> dict[str, str]:
    """``headers`` as a new dict, if it maps str to str; else `InvalidJob` saying what is
    wrong."""
    if not isinstance(headers, Mapping):
        raise InvalidJob(f"{what}: headers must be a dict of str to str, got {headers!r}")
    for key, value in headers.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise InvalidJob(
                f"{what}: headers must be a dict of str to str, got {key!r}: {value!r} "
                "(format other values as text)"
            )
    return dict(headers)


def check_header_size(headers: Mapping[str, str], limit: int, what: str) -> None:
    """`PayloadTooLarge` when ``headers`` encode (as compact JSON) to more than ``limit``
    bytes."""
    size = len(json.dumps(headers, separators=(",", ":")).encode())
    if size > limit:
        raise PayloadTooLarge(
            f"{what}: headers encode to {size:,} bytes, over the limit of {limit:,} bytes "
            "(Settings.max_header_bytes); headers are for small metadata (ids, trace "
            "context): pass data as the task's arguments"
        )


class Producing:
    """The producer side of an app's middleware: their ``before_enqueue`` and
    ``after_enqueue`` methods."""

    def __init__(self) -> None:
        self.before: list[Callable[[Enqueueing], None]] = []
        self.after: list[Callable[[Enqueueing, BaseException | None], None]] = []

    def __bool__(self) -> bool:
        return bool(self.before or self.after)

    def add(self, mw: Middleware) -> None:
        if overrides(mw, "before_enqueue"):
            self.before.append(mw.before_enqueue)
        if overrides(mw, "after_enqueue"):
            self.after.insert(0, mw.after_enqueue)  # the reverse order: middleware nest

    def start(
        self, job_id: str, task: str, queue: str, priority: int, headers: Mapping[str, str] | None
    ) -> Enqueueing:
        """One job's `Enqueueing`, through every ``before_enqueue``."""
        job = Enqueueing(job_id, task, queue, priority, dict(headers or {}))
        for hook in self.before:
            try:
                hook(job)
            except Exception:
                log.exception("before_enqueue of %s failed on job %s", _owner(hook), job_id)
        return job

    def finish(
        self,
        sent: Sequence[Enqueueing],
        jobs: Sequence[Job[Any]] | None,
        error: BaseException | None,
    ) -> None:
        """Every ``after_enqueue`` on each of ``sent``, given the jobs it became (None: the
        enqueue failed with ``error``)."""
        for i, job in enumerate(sent):
            if jobs is not None:
                job.id, job.created = jobs[i].id, jobs[i].created
            for hook in self.after:
                try:
                    hook(job, error)
                except Exception:
                    log.exception("after_enqueue of %s failed on job %s", _owner(hook), job.id)

    def around(self, send: Callable[[list[Enqueueing] | None], list[Job[Any]]]) -> list[Job[Any]]:
        """``send(sent)``: an enqueue whose jobs are noted in ``sent`` (in order) as they are
        made; then each gets its ``after_enqueue``, also when the enqueue raised."""
        if not self:
            return send(None)
        sent: list[Enqueueing] = []
        try:
            jobs = send(sent)
        except BaseException as exc:
            self.finish(sent, None, exc)
            raise
        self.finish(sent, jobs, None)
        return jobs

    async def aaround(
        self, send: Callable[[list[Enqueueing] | None], Awaitable[list[Job[Any]]]]
    ) -> list[Job[Any]]:
        """`around` for an async enqueue."""
        if not self:
            return await send(None)
        sent: list[Enqueueing] = []
        try:
            jobs = await send(sent)
        except BaseException as exc:
            self.finish(sent, None, exc)
            raise
        self.finish(sent, jobs, None)
        return jobs


def instances(items: Iterable[Middleware | type[Middleware]]) -> list[Middleware]:
    """Middleware given as instances or as classes taking no arguments, as instances."""
    out = []
    for item in items:
        if isinstance(item, type) and issubclass(item, Middleware):
            out.append(item())
        elif isinstance(item, Middleware):
            out.append(item)
        else:
            raise ConfigurationError(
                f"app.middleware takes a drumbeat.Middleware instance or subclass, got {item!r}"
            )
    return out


def _owner(hook: Callable[..., Any]) -> str:
    owner = getattr(hook, "__self__", None)
    return type(owner).__qualname__ if owner is not None else repr(hook)
