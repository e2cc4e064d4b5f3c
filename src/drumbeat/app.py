"""App: settings, the Redis clients, the scripts and the task registry; the front of enqueue
(the path itself: enqueueing.py) and of schedules (schedules/methods.py, which App inherits)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, ParamSpec, Protocol, TypeVar, overload

import redis
import redis.asyncio as redis_async

from . import connections
from .admin import pausing
from .batches import Batch, amake_batch, make_batch
from .config import Settings
from .enqueueing import Enqueuer
from .errors import ConfigurationError, InvalidJob, UnknownTask
from .job import Job
from .job_ids import job_shard_of
from .keys import DEFAULT_QUEUE, Keys
from .limits import Limit, Limits, argument_value, make_limit, make_limits
from .middleware import Middleware, Producing, instances
from .resources import Hook, Register, Resources
from .schedules import ScheduleStore
from .schedules.methods import ScheduleMethods
from .scripts import Scripts
from .serialization import CODECS, Codec
from .task import Backoff, ErrorClasses, Prepared, Task, TaskConfig
from .task_ref import TaskRef

P = ParamSpec("P")
R = TypeVar("R")
H = TypeVar("H", bound=Callable[[], Any])
T = TypeVar("T")
M = TypeVar("M", bound=Middleware | type[Middleware])


class App(ScheduleMethods):
    """A drumbeat application: where jobs go, and which tasks exist.

    Args:
        url: Redis URL. Without one, ``DRUMBEAT_REDIS_URL`` is read, and without that the
            embedded Redis (a private ``redis-server`` on a unix socket) is started or reused.
        namespace: keeps several apps on one Redis apart.
        settings: a full `Settings`; keyword ``overrides`` replace single fields of it.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        namespace: str | None = None,
        settings: Settings | None = None,
        **overrides: Any,
    ) -> None:
        base = settings or Settings.from_env()
        self.settings = base.replace(
            **{
                k: v
                for k, v in {"url": url, "namespace": namespace, **overrides}.items()
                if v is not None
            }
        )
        self.keys = Keys(self.settings.namespace)
        self.scripts = Scripts(self.keys)
        self.job_keys = [
            Keys.job_keys(self.keys.namespace, k) for k in range(self.settings.job_shards)
        ]
        """The job shards' keys (`Settings.job_shards`); the first is `keys`, the main shard."""
        self.job_scripts = [self.scripts, *(Scripts(k) for k in self.job_keys[1:])]
        self.codec: Codec = CODECS[self.settings.codec]
        self.tasks: dict[str, Task[Any, Any]] = {}
        self.limiters: dict[str, Limit] = {}
        """Named budgets (`limiter`) that tasks share."""
        self.startup_hooks: list[Callable[[], Any]] = []
        self.shutdown_hooks: list[Callable[[], Any]] = []
        self.resources = Resources()
        self.middlewares: list[Middleware] = []
        """The job middleware (`middleware`), in the order registered."""
        self.producing = Producing()
        self.scheduler = ScheduleStore(self)
        """The schedule store (`schedules.ScheduleStore`)."""
        self.enqueuer = Enqueuer(self)
        """The enqueue path (`enqueueing.Enqueuer`): job shards, script calls, sending."""
        self.connections = connections.Connections(
            self.settings.url, embedded=self.settings.embedded
        )

    # -- connections (clients and their timeouts: connections.py) ------------------------------

    @property
    def url(self) -> str:
        """The Redis URL in use; resolving it starts the embedded Redis if none was given."""
        return self.connections.url

    @property
    def redis(self) -> redis.Redis:
        """The synchronous client (created on first use)."""
        return self.connections.redis

    async def aredis(self) -> redis_async.Redis:
        """The asyncio client of the running event loop (created on first use in each loop)."""
        return await self.connections.aredis()

    def close(self) -> None:
        self.connections.close()

    async def aclose(self) -> None:
        await self.connections.aclose()

    # -- tasks ---------------------------------------------------------------------------------

    @overload
    def task(self, fn: Callable[P, Awaitable[R]], /) -> Task[P, R]: ...
    @overload
    def task(self, fn: Callable[P, R], /) -> Task[P, R]: ...
    @overload
    def task(
        self,
        /,
        *,
        name: str | None = None,
        priority: int = 0,
        retries: int = 0,
        timeout: float | None = None,
        result_ttl: float | None = None,
        backoff: Backoff = 1.0,
        backoff_max: float = 600.0,
        queue: str = "default",
        rate_limit: str | None = None,
        rate_burst: int | None = None,
        concurrency_limit: int | None = None,
        limit_by: str | None = None,
        limiter: str | None = None,
        retry_on: ErrorClasses | None = None,
        dont_retry_on: ErrorClasses = (),
        unique_for: float = 0.0,
    ) -> _Decorator: ...

    def task(self, fn: Callable[..., Any] | None = None, /, **config: Any) -> Any:
        """Register a function as a task, bare (``@app.task``) or with options.

        Options: ``name`` (default ``module.qualname``), ``priority`` 0..9 (higher first),
        ``retries`` after the first failure, ``timeout`` seconds per attempt, ``result_ttl``
        seconds the outcome is kept (0: not at all), ``backoff``/``backoff_max`` seconds
        (``backoff`` may be a function of the failures so far returning the delay),
        ``retry_on``/``dont_retry_on``: the exception classes retried / failed at once,
        ``unique_for`` seconds a call's ``key=`` stays taken, even after its job ended,
        ``queue`` its jobs go to (default ``"default"``; workers serve named queues);
        ``rate_limit`` (``"N/s"``, ``"N/m"``, ``"N/h"``: starts across all workers, spaced
        evenly) with ``rate_burst`` (default 1), ``concurrency_limit`` (runs at once across all
        workers), both per value of argument ``limit_by`` if given, and ``limiter``: a named
        budget (`limiter`) shared with other tasks, which may be declared after the task (its
        name is checked when a job is enqueued, and when a worker starts).
        """

        def register(f: Callable[..., Any]) -> Task[Any, Any]:
            name = config.pop("name", None) or f"{f.__module__}.{f.__qualname__}"
            task: Task[Any, Any] = Task(self, f, TaskConfig(name=name, **config))
            if name in self.tasks and self.tasks[name].fn is not f:
                raise ConfigurationError(f"a different task is already registered as {name!r}")
            self.tasks[name] = task
            return task

        return register(fn) if fn is not None else register

    def limiter(
        self,
        name: str,
        *,
        rate: str | None = None,
        concurrency: int | None = None,
        burst: int | None = None,
    ) -> None:
        """Declare a named budget that tasks share with ``@app.task(limiter=name)``: at most
        ``rate`` starts (``"N/s"``, ``"N/m"``, ``"N/h"``, with ``burst``) and ``concurrency``
        runs at once, counted over all its tasks across all workers."""
        make_limits(what=f"limiter {name!r}", limiter=name)  # checks the name
        if rate is None and concurrency is None:
            raise InvalidJob(f"limiter {name!r} needs rate= or concurrency= (or both)")
        self.limiters[name] = make_limit(rate, burst, concurrency, f"limiter {name!r}")

    def limits_of(self, limits: Limits, task: Task[Any, Any], args: Any, kwargs: Any) -> None:
        """Refuses a call whose limits cannot be acquired: an unknown limiter, or a limit_by
        argument the call does not pass."""
        if limits.limiter is not None and limits.limiter not in self.limiters:
            known = ", ".join(sorted(self.limiters)) or "none"
            raise InvalidJob(
                f"task {task.name!r} names limiter {limits.limiter!r}, which is not declared; "
                f"call app.limiter({limits.limiter!r}, rate=..., concurrency=...) first "
                f"(declared: {known})"
            )
        if limits.limit_by is not None:
            argument_value(task.fn, limits.limit_by, args, kwargs)

    def on_startup(self, fn: H) -> H:
        """Decorator: ``fn`` (sync or async, no arguments) runs in each worker process before
        its first claim: open per-process resources (a database pool) here. If it raises, the
        worker does not start."""
        self.startup_hooks.append(fn)
        return fn

    def on_shutdown(self, fn: H) -> H:
        """Decorator: ``fn`` (sync or async, no arguments) runs in each worker process after
        its last job; a failure is logged."""
        self.shutdown_hooks.append(fn)
        return fn

    def resource(
        self, name: str, *, check: Hook | None = None, close: Hook | None = None
    ) -> Register:
        """Decorator: the factory (sync or async, no arguments) makes a per-process resource
        that tasks get with ``drumbeat.resource(name)`` (``await drumbeat.aresource(name)``
        for an async factory), or with ``.get()`` on the `Resource` this returns. Made on first
        use in each process; ``check(instance)`` runs before its first use in each job, and if
        it raises or returns False the instance is closed with ``close(instance)`` and made
        anew; closed when the worker stops, after the ``on_shutdown`` hooks."""
        return self.resources.register(name, check=check, close=close)

    def middleware(self, mw: M) -> M:
        """Register job middleware (a `drumbeat.Middleware` instance, or a subclass taking no
        arguments; usable as a class decorator): its ``before_enqueue`` / ``after_enqueue``
        run around each enqueue of this app, its ``before_run`` / ``after_run`` around each
        run in this app's workers (``drumbeat worker`` included). See docs/middleware.md."""
        for instance in instances([mw]):
            self.middlewares.append(instance)
            self.producing.add(instance)
        return mw

    def get_task(self, name: str) -> Task[Any, Any]:
        try:
            return self.tasks[name]
        except KeyError:
            known = ", ".join(sorted(self.tasks)) or "none"
            raise UnknownTask(f"no task named {name!r} is registered (known: {known})") from None

    # -- enqueue -------------------------------------------------------------------------------

    def enqueue_many(self, jobs: Iterable[Prepared]) -> list[Job[Any]]:
        """Enqueue many jobs in one round trip per `Settings.batch_limit` jobs, pipelined."""
        return self.enqueuer.enqueue_many(jobs)

    async def aenqueue_many(self, jobs: Iterable[Prepared]) -> list[Job[Any]]:
        """`enqueue_many` for async callers."""
        return await self.enqueuer.aenqueue_many(jobs)

    def enqueue(self, task: str, *args: Any, **kwargs: Any) -> Job[Any]:
        """Enqueue a task by name (for producers that do not import the task's code); a task
        registered here keeps its own defaults (its priority)."""
        return self.enqueue_many([self._by_name(task, args, kwargs)])[0]

    async def aenqueue(self, task: str, *args: Any, **kwargs: Any) -> Job[Any]:
        """`enqueue` for async callers."""
        return (await self.aenqueue_many([self._by_name(task, args, kwargs)]))[0]

    def task_ref(
        self, name: str, *, queue: str | None = None, priority: int | None = None
    ) -> TaskRef[..., Any]:
        """A task by name, with ``.options(...)``, ``.enqueue``, ``.aenqueue`` and
        ``.prepare`` as a `Task` has them; ``queue`` and ``priority``: its defaults when it is
        not registered here (`TaskRef`)."""
        return TaskRef(self, name, queue=queue, priority=priority)

    def chain(self, steps: Iterable[Prepared]) -> list[Job[Any]]:
        """Enqueues ``steps`` so that each runs once the one before it completed (a step
        dead-lettered or cancelled dead-letters the rest); returns their jobs, in order. A
        step does not receive the previous one's result: it reads it as
        ``current_job().dependencies[0].result()`` (docs/workflows.md)."""
        return self.enqueuer.chain(steps)

    async def achain(self, steps: Iterable[Prepared]) -> list[Job[Any]]:
        """`chain` for async callers."""
        return await self.enqueuer.achain(steps)

    def batch(
        self,
        members: Iterable[Prepared],
        *,
        on_complete: Prepared | None = None,
        on_success: Prepared | None = None,
        open: bool = False,
    ) -> Batch:
        """Enqueues ``members`` as one batch (one MULTI) and returns its `Batch`: ``on_complete``
        runs once every member ended, whatever their outcome; ``on_success`` once if they all
        succeeded (else it is cancelled). ``open=True`` keeps it from ending until
        `Batch.close` (add members meanwhile); members may be added until it ended either way
        (docs/workflows.md)."""
        return make_batch(self, members, on_complete=on_complete, on_success=on_success, open=open)

    async def abatch(
        self,
        members: Iterable[Prepared],
        *,
        on_complete: Prepared | None = None,
        on_success: Prepared | None = None,
        open: bool = False,
    ) -> Batch:
        """`batch` for async callers."""
        return await amake_batch(
            self, members, on_complete=on_complete, on_success=on_success, open=open
        )

    def get_batch(self, batch_id: str) -> Batch:
        """A handle on an existing batch (its ``jobs`` are empty: they were added elsewhere)."""
        return Batch(self, batch_id)

    def _by_name(self, task: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Prepared:
        known = self.tasks.get(task)
        return known.prepare(*args, **kwargs) if known is not None else Prepared(task, args, kwargs)

    def job(self, job_id: str) -> Job[Any]:
        """A handle on an existing job."""
        return Job(self, job_id, created=False)

    def queues(self) -> list[str]:
        """The queues this app's tasks name (the default queue when it has no tasks), the
        default queue first: what a worker serves unless told otherwise."""
        named = {task.config.queue for task in self.tasks.values()} or {DEFAULT_QUEUE}
        return sorted(named, key=lambda q: (q != DEFAULT_QUEUE, q))

    def known_queues(self) -> list[str]:
        """Every queue jobs were sent to on this namespace (the registry in Redis), and the
        queues this app's tasks name."""
        return self._with_local(self.redis.smembers(self.keys.queues))

    async def aknown_queues(self) -> list[str]:
        """`known_queues` for async callers."""
        return self._with_local(await (await self.aredis()).smembers(self.keys.queues))

    def _with_local(self, stored: Any) -> list[str]:
        names = {_decoded(q) for q in stored} | set(self.queues())
        return sorted(names, key=lambda q: (q != DEFAULT_QUEUE, q))

    # -- pausing queues (the logic: admin/pausing.py) --------------------------------------------

    def pause_queue(self, queue: str) -> bool:
        """Pause ``queue`` for every worker: its jobs (and, for the default queue, schedule
        runs) wait, keeping their order, until `resume_queue`; running ones finish, and new
        enqueues are accepted. Returns False if it was paused already."""
        return pausing.pause_queue(self, queue)

    async def apause_queue(self, queue: str) -> bool:
        """`pause_queue` for async callers."""
        return await pausing.apause_queue(self, queue)

    def resume_queue(self, queue: str) -> bool:
        """Resume a paused queue (its idle workers wake at once); False if it was not paused."""
        return pausing.resume_queue(self, queue)

    async def aresume_queue(self, queue: str) -> bool:
        """`resume_queue` for async callers."""
        return await pausing.aresume_queue(self, queue)

    def paused_queues(self) -> list[str]:
        """The paused queues, the default one first."""
        return pausing.paused_queues(self)

    async def apaused_queues(self) -> list[str]:
        """`paused_queues` for async callers."""
        return await pausing.apaused_queues(self)

    def job_shard(self, job_id: str) -> tuple[Keys, Scripts]:
        """The keys and scripts of the job shard ``job_id`` names (its id says which)."""
        k = job_shard_of(job_id)
        if k < len(self.job_keys):
            return self.job_keys[k], self.job_scripts[k]
        # Made by an app with more job shards: the id still says where it lives.
        keys = Keys.job_keys(self.keys.namespace, k)
        return keys, Scripts(keys)


class _Decorator(Protocol):
    @overload
    def __call__(self, fn: Callable[P, Awaitable[R]], /) -> Task[P, R]: ...
    @overload
    def __call__(self, fn: Callable[P, R], /) -> Task[P, R]: ...


def _decoded(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
