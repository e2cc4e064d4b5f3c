"""`@app.task` turns a function into a typed Task handle; per-call options stay apart from its
arguments, so ``fetch.options(priority=9).enqueue(url)`` cannot mix the two up."""

from __future__ import annotations

import inspect
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, Protocol, TypedDict, TypeVar, Unpack

from .errors import InvalidJob
from .job import Job
from .keys import DEFAULT_QUEUE
from .limits import Limits, make_limits
from .middleware import check_headers
from .names import check_name
from .protocol import MAX_PRIORITY as MAX_PRIORITY  # noqa: PLC0414 (the CLI imports it here)
from .protocol import MIN_PRIORITY as MIN_PRIORITY  # noqa: PLC0414 (the CLI imports it here)
from .workflows import DependsOn, dependencies

if TYPE_CHECKING:
    from .app import App

P = ParamSpec("P")
R = TypeVar("R")

Backoff = float | Callable[[int], float]
"""Seconds before the first retry (doubled each failure, with jitter), or a function of the
failures so far (1 at the first retry) returning the seconds to wait, used as it returns them."""

ErrorClasses = type[BaseException] | tuple[type[BaseException], ...]


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
    limits: Limits | None = None
    """Limits of this call in place of its task's (carried in the job's record); ``None``: the
    task's, as the worker that runs it knows them."""
    unique_for: float | None = None
    """Seconds from this enqueue during which ``key`` stays taken, even after the job ended;
    ``None``: its task's (0: only while the job lives)."""
    headers: Mapping[str, str] | None = field(default=None, hash=False)
    """Metadata the job carries (str to str, `Settings.max_header_bytes` at most), read as
    ``current_job().headers``; producer middleware may add to them."""
    depends_on: tuple[tuple[str, bool], ...] = ()
    """Jobs it waits for, as (job id, may fail) pairs (`workflows.dependencies`)."""
    job_id: str | None = field(default=None, repr=False)
    """The id it gets (a chain names its steps before it sends them); None: a new one."""
    batch: str | None = field(default=None, repr=False)
    """The batch it is a member or a callback of (`App.batch` sets it; in its record)."""

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
        if self.headers is not None:
            object.__setattr__(self, "headers", check_headers(self.headers, "options"))
        self._check_dedup()

    def _check_dedup(self) -> None:
        if self.key is not None:
            try:
                check_name(self.key, "dedup key")
            except ValueError as exc:
                raise InvalidJob(str(exc)) from None
        if self.unique_for is not None:
            check_seconds(self.unique_for, "unique_for")
            if self.unique_for and self.key is None:
                raise InvalidJob(
                    f"unique_for={self.unique_for!r} needs key=: the dedup key it keeps taken"
                )

    @property
    def delay_ms(self) -> int:
        return round(self.delay * 1000)

    @property
    def at_ms(self) -> int:
        return 0 if self.at is None else max(1, round(self.at.timestamp() * 1000))


class CallOptions(TypedDict, total=False):
    """The per-call options `Task.options` and `TaskRef.options` take, by keyword; each left
    out (or None) is its task's. A limit given replaces the task's for this call: the rate
    options together, ``concurrency_limit``, ``limit_by`` and ``limiter`` each on its own (the
    others stay the task's); each as `TaskConfig` has it."""

    priority: int | None
    """0..9, higher runs first."""
    delay: float
    """Seconds to wait before it may run."""
    at: datetime | None
    """When it may run (timezone-aware), in place of ``delay``."""
    key: str | None
    """Dedup key: no second job while one with it is queued or running."""
    queue: str | None
    unique_for: float | None
    """Seconds (with ``key``) the key stays taken from this enqueue, even after the job ended."""
    headers: Mapping[str, str] | None
    """Metadata the job carries (str to str), read in the task as
    ``drumbeat.current_job().headers``."""
    rate_limit: str | None
    rate_burst: int | None
    concurrency_limit: int | None
    limit_by: str | None
    limiter: str | None
    depends_on: DependsOn | None
    """Jobs (handles or ids, or `drumbeat.Dependency`) it waits for, holding no slot: it runs
    once every one of them completed (docs/workflows.md)."""


LIMIT_OPTIONS = ("rate_limit", "rate_burst", "concurrency_limit", "limit_by", "limiter")
"""The options of `CallOptions` that are limits."""


def call_options(
    given: CallOptions, what: str, priority: int, queue: str, limits: Limits | None
) -> Options:
    """The `Options` of a call (``what`` names it in errors): ``given`` over a task's
    ``priority`` and ``queue``, with its checked ``limits``."""
    unknown = given.keys() - CallOptions.__optional_keys__
    if unknown:
        raise TypeError(
            f"{what} got unexpected options {', '.join(sorted(unknown))}; expected some of "
            f"{', '.join(sorted(CallOptions.__optional_keys__))}"
        )
    p, q = given.get("priority"), given.get("queue")
    return Options(
        priority=priority if p is None else p,
        delay=given.get("delay", 0.0),
        at=given.get("at"),
        key=given.get("key"),
        queue=queue if q is None else q,
        limits=limits,
        unique_for=given.get("unique_for"),
        headers=given.get("headers"),
        depends_on=dependencies(given.get("depends_on")),
    )


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
    backoff: Backoff = 1.0
    """First retry delay in seconds, doubled each failure, with jitter (capped by
    ``backoff_max``); or a function of the failures so far returning the delay (`Backoff`)."""
    backoff_max: float = 600.0
    queue: str = DEFAULT_QUEUE
    """The queue its jobs go to, unless a call names another; workers serve named queues."""
    rate_limit: str | None = None
    """At most this many starts (``"N/s"``, ``"N/m"``, ``"N/h"``) across all workers, spaced
    evenly (per value of ``limit_by`` if set)."""
    rate_burst: int | None = None
    """Starts that may come at once after a pause (default 1: none early)."""
    concurrency_limit: int | None = None
    """At most this many runs at once across all workers (per value of ``limit_by`` if set)."""
    limit_by: str | None = None
    """An argument of the task whose value keys its own limits (one budget per value)."""
    limiter: str | None = None
    """A named budget (`App.limiter`) shared with other tasks."""
    retry_on: ErrorClasses | None = None
    """Only exceptions of these classes (or subclasses) are retried; others are dead-lettered
    at once. ``None``: every exception is (up to ``retries``)."""
    dont_retry_on: ErrorClasses = ()
    """Exceptions of these classes are dead-lettered at once, even if ``retry_on`` names a
    base class of theirs. An explicit `Retry` is honoured either way."""
    unique_for: float = 0.0
    """Seconds a call's dedup key stays taken from its enqueue, even after its job ended
    (calls of this task must give ``key=``); 0: only while the job lives."""

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
        if not callable(self.backoff):
            check_seconds(self.backoff, "backoff")
        check_seconds(self.backoff_max, "backoff_max")
        check_seconds(self.unique_for, "unique_for")
        # Frozen: the normal form (a tuple) is set once, here.
        if self.retry_on is not None:
            object.__setattr__(self, "retry_on", error_classes(self.retry_on, "retry_on"))
        object.__setattr__(
            self, "dont_retry_on", error_classes(self.dont_retry_on, "dont_retry_on")
        )
        self.make_limits()

    def retry_delay(self, failures: int, rand: Callable[[], float]) -> float:
        """Seconds before retry ``failures`` (1: the first): exponential backoff with equal
        jitter (half the step fixed, half random, capped), or what the backoff function returns,
        checked (`InvalidJob` saying why when it raises or returns no usable delay)."""
        backoff = self.backoff
        if not callable(backoff):
            step = min(self.backoff_max, backoff * 2 ** (failures - 1))
            return float(step / 2 + step / 2 * rand())
        try:
            delay = backoff(failures)
        except Exception as exc:
            raise InvalidJob(f"its backoff function raised {type(exc).__name__}: {exc}") from exc
        try:
            return check_seconds(delay, f"its backoff function's delay for failure {failures}")
        except InvalidJob as exc:
            raise InvalidJob(f"{exc} (returned by {backoff!r})") from None

    def retries_error(self, exc: BaseException) -> bool:
        """Whether ``exc`` may be retried (while ``retries`` allow): matched by class,
        subclasses included; ``dont_retry_on`` wins over ``retry_on``."""
        if isinstance(exc, self.dont_retry_on):
            return False
        return self.retry_on is None or isinstance(exc, self.retry_on)

    def make_limits(self, fn: Callable[..., Any] | None = None) -> Limits:
        """The task's checked limits (``fn``: its function, whose arguments limit_by names)."""
        return make_limits(
            what=f"task {self.name!r}",
            rate_limit=self.rate_limit,
            rate_burst=self.rate_burst,
            concurrency_limit=self.concurrency_limit,
            limit_by=self.limit_by,
            limiter=self.limiter,
            fn=fn,
        )


class Target(Protocol):
    """What a `Bound` sends jobs of: a `Task`, or a `task_ref.TaskRef` (a task by name)."""

    @property
    def app(self) -> App: ...
    @property
    def name(self) -> str: ...


class Bound(Generic[P, R]):
    """A task with per-call options applied; what ``Task.options(...)`` returns."""

    def __init__(self, task: Target, options: Options) -> None:
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
        self.limits = config.make_limits(fn)
        """What its runs acquire (empty: unlimited, the worker adds no round trip)."""
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

    def options(self, **given: Unpack[CallOptions]) -> Bound[P, R]:
        """Per-call options (`CallOptions`); ``unique_for`` defaults to the task's."""
        what = f"{self.name}.options(...)"
        limits = self.call_limits(what, **given)
        return Bound(
            self, call_options(given, what, self.config.priority, self.config.queue, limits)
        )

    def call_limits(self, what: str, **given: Unpack[CallOptions]) -> Limits | None:
        """The limits of a call (or a schedule) that gives some of its own, checked (the other
        options are not read); None when it gives none (its task's apply)."""
        rate_limit, rate_burst = given.get("rate_limit"), given.get("rate_burst")
        if all(given.get(name) is None for name in LIMIT_OPTIONS):
            return None
        c = self.config
        rated = rate_limit is not None or rate_burst is not None
        concurrency_limit, limit_by = given.get("concurrency_limit"), given.get("limit_by")
        limiter = given.get("limiter")
        return make_limits(
            what=what,
            rate_limit=rate_limit if rated else c.rate_limit,
            rate_burst=rate_burst if rated else c.rate_burst,
            concurrency_limit=c.concurrency_limit
            if concurrency_limit is None
            else concurrency_limit,
            limit_by=c.limit_by if limit_by is None else limit_by,
            limiter=c.limiter if limiter is None else limiter,
            fn=self.fn,
        )

    def prepare(self, *args: P.args, **kwargs: P.kwargs) -> Prepared:
        """A job for `App.enqueue_many`, with this task's default options."""
        return Prepared(self.name, args, kwargs, self._defaults)

    def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> Job[R]:
        return self.app.enqueue_many([self.prepare(*args, **kwargs)])[0]

    async def aenqueue(self, *args: P.args, **kwargs: P.kwargs) -> Job[R]:
        return (await self.app.aenqueue_many([self.prepare(*args, **kwargs)]))[0]


def unique_ms_of(prepared: Prepared, known: Task[Any, Any] | None) -> int:
    """Milliseconds the call's dedup key stays taken from now (0: while its job lives)."""
    o = prepared.options
    if o.unique_for is not None:
        return round(o.unique_for * 1000)
    if known is None or not known.config.unique_for:
        return 0
    if o.key is None:
        raise InvalidJob(
            f"task {prepared.task!r} has unique_for={known.config.unique_for:g} s, which keeps "
            "a call's dedup key taken: give one with .options(key=...)"
        )
    return round(known.config.unique_for * 1000)


def check_seconds(value: object, what: str) -> float:
    """``value`` if it is a finite number of seconds >= 0, else `InvalidJob` saying so."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < 0
    ):
        raise InvalidJob(f"{what} must be a number of seconds >= 0, got {value!r}")
    return float(value)


def error_classes(value: object, what: str) -> tuple[type[BaseException], ...]:
    """``value`` (an exception class or a tuple of them) as a tuple, else `InvalidJob`."""
    classes = value if isinstance(value, tuple) else (value,)
    for c in classes:
        if not (isinstance(c, type) and issubclass(c, BaseException)):
            raise InvalidJob(
                f"{what} takes exception classes (or a tuple of them), got {c!r}; "
                f"e.g. {what}=(TimeoutError, ConnectionError)"
            )
    return classes


def check_queue(queue: str) -> str:
    """``queue`` if it is a valid queue name, else `InvalidJob` saying why."""
    try:
        return check_name(queue, "queue name")
    except ValueError as exc:
        raise InvalidJob(str(exc)) from None
