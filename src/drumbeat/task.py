"""`@app.task` turns a function into a typed Task handle; per-call options stay apart from its
arguments, so ``fetch.options(priority=9).enqueue(url)`` cannot mix the two up."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar

from .errors import InvalidJob
from .job import Job
from .keys import DEFAULT_QUEUE, check_name
from .protocol import MAX_PRIORITY as MAX_PRIORITY  # noqa: PLC0414 (the CLI imports it here)
from .protocol import MIN_PRIORITY as MIN_PRIORITY  # noqa: PLC0414 (the CLI imports it here)

if TYPE_CHECKING:
    from .app import App

P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class Options:
    """Per-call placement of a job: none of these reach the task function."""

    priority: int = 0
    delay: float = 0.0
    at: datetime | None = None
    key: str | None = None
    queue: str | None = None
    """The queue the job goes to; ``None`` takes its task's (the default queue for a task
    this process does not know)."""

    def __post_init__(self) -> None:
        if self.queue is not None:
            check_queue(self.queue)
        if isinstance(self.priority, bool) or not isinstance(self.priority, int):
            raise InvalidJob(f"priority must be an int, got {self.priority!r}")
        if not MIN_PRIORITY <= self.priority <= MAX_PRIORITY:
            raise InvalidJob(
                f"priority {self.priority} is out of range; expected {MIN_PRIORITY}..{MAX_PRIORITY}"
                " (higher runs first)"
            )
        if not isinstance(self.delay, int | float) or self.delay < 0 or self.delay != self.delay:
            raise InvalidJob(f"delay must be a number of seconds >= 0, got {self.delay!r}")
        if self.at is not None:
            if not isinstance(self.at, datetime) or self.at.tzinfo is None:
                raise InvalidJob(
                    f"at must be a timezone-aware datetime, got {self.at!r}; "
                    "use datetime.now(timezone.utc) + timedelta(...)"
                )
            if self.delay:
                raise InvalidJob("pass either delay= or at=, not both")
        if self.key is not None:
            try:
                check_name(self.key, "dedup key")
            except ValueError as exc:
                raise InvalidJob(str(exc)) from None

    @property
    def delay_ms(self) -> int:
        return round(self.delay * 1000)

    @property
    def at_ms(self) -> int:
        return 0 if self.at is None else max(1, round(self.at.timestamp() * 1000))


@dataclass(frozen=True, slots=True)
class Prepared:
    """One job ready to enqueue: a task name, its arguments and its options."""

    task: str
    args: Sequence[Any]
    kwargs: Mapping[str, Any]
    options: Options = field(default_factory=Options)


@dataclass(frozen=True, slots=True)
class TaskConfig:
    """How the worker runs a task; fixed at definition."""

    name: str
    priority: int = 0
    retries: int = 0
    timeout: float | None = None
    result_ttl: float | None = None
    """Seconds the outcome is kept; ``None`` takes `Settings.result_ttl`, 0 keeps nothing."""
    backoff: float = 1.0
    """First retry delay in seconds; doubled each failure, with jitter."""
    backoff_max: float = 600.0
    queue: str = DEFAULT_QUEUE
    """The queue its jobs go to, unless a call names another; workers serve named queues."""

    def __post_init__(self) -> None:
        try:
            check_name(self.name, "task name")
        except ValueError as exc:
            raise InvalidJob(str(exc)) from None
        check_queue(self.queue)
        Options(priority=self.priority)
        if self.retries < 0:
            raise InvalidJob(f"retries must be >= 0, got {self.retries}")
        if self.timeout is not None and self.timeout <= 0:
            raise InvalidJob(f"timeout must be > 0 seconds or None, got {self.timeout}")
        if self.result_ttl is not None and self.result_ttl < 0:
            raise InvalidJob(f"result_ttl must be >= 0 seconds or None, got {self.result_ttl}")
        if self.backoff < 0 or self.backoff_max < 0:
            raise InvalidJob("backoff and backoff_max must be >= 0 seconds")


class Bound(Generic[P, R]):
    """A task with per-call options applied; what ``Task.options(...)`` returns."""

    def __init__(self, task: Task[P, R], options: Options) -> None:
        self._task = task
        self._options = options

    def prepare(self, *args: P.args, **kwargs: P.kwargs) -> Prepared:
        return Prepared(self._task.name, args, kwargs, self._options)

    def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> Job[R]:
        return self._task.app.enqueue_many([self.prepare(*args, **kwargs)])[0]

    async def aenqueue(self, *args: P.args, **kwargs: P.kwargs) -> Job[R]:
        return (await self._task.app.aenqueue_many([self.prepare(*args, **kwargs)]))[0]


class Task(Generic[P, R]):
    """A registered task. Calling it runs the function here; `enqueue` sends it to a worker."""

    def __init__(
        self, app: App, fn: Callable[P, R] | Callable[P, Awaitable[R]], config: TaskConfig
    ):
        self.app = app
        self.fn = fn
        self.config = config
        self.is_async = inspect.iscoroutinefunction(fn)
        self._defaults = Options(priority=config.priority, queue=config.queue)
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn

    @property
    def name(self) -> str:
        return self.config.name

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R | Awaitable[R]:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<Task {self.name}>"

    def options(
        self,
        *,
        priority: int | None = None,
        delay: float = 0.0,
        at: datetime | None = None,
        key: str | None = None,
        queue: str | None = None,
    ) -> Bound[P, R]:
        prio = self.config.priority if priority is None else priority
        q = self.config.queue if queue is None else queue
        return Bound(self, Options(priority=prio, delay=delay, at=at, key=key, queue=q))

    def prepare(self, *args: P.args, **kwargs: P.kwargs) -> Prepared:
        """A job for `App.enqueue_many`, with this task's default options."""
        return Prepared(self.name, args, kwargs, self._defaults)

    def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> Job[R]:
        return self.app.enqueue_many([self.prepare(*args, **kwargs)])[0]

    async def aenqueue(self, *args: P.args, **kwargs: P.kwargs) -> Job[R]:
        return (await self.app.aenqueue_many([self.prepare(*args, **kwargs)]))[0]


def check_queue(queue: str) -> str:
    """``queue`` if it is a valid queue name, else `InvalidJob` saying why."""
    try:
        return check_name(queue, "queue name")
    except ValueError as exc:
        raise InvalidJob(str(exc)) from None
