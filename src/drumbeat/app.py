"""App: settings, the Redis clients, the scripts and the task registry; enqueue lives here."""

from __future__ import annotations

import itertools
import os
import zlib
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, ParamSpec, Protocol, TypeVar, overload

import redis
import redis.asyncio as redis_async
from redis.exceptions import NoScriptError

from . import connections
from .admin import pausing
from .batches import Batch, amake_batch, make_batch
from .config import Settings
from .errors import ConfigurationError, InvalidJob, UnknownTask
from .job import Job, encode_spec
from .keys import DEFAULT_QUEUE, Keys, check_name, job_shard_of, new_job_id
from .limits import Limit, Limits, argument_value, make_limit, make_limits
from .middleware import (
    Enqueueing,
    Middleware,
    Producing,
    check_header_size,
    check_headers,
    instances,
)
from .resources import Hook, Register, Resources
from .schedule import Mode
from .schedules import Schedule, ScheduleInfo, ScheduleStore
from .schedules.store import anow_ms, now_ms
from .scripts import Call, Scripts
from .serialization import CODECS, Codec, check_size, encode_call
from .task import Backoff, ErrorClasses, Prepared, Task, TaskConfig, unique_ms_of
from .task_ref import TaskRef
from .workflows import (
    after_previous,
    chain_steps,
    check_dependent,
    raise_if_refused,
    sent_one_by_one,
    shard_of_dependent,
)

P = ParamSpec("P")
R = TypeVar("R")
H = TypeVar("H", bound=Callable[[], Any])
T = TypeVar("T")
M = TypeVar("M", bound=Middleware | type[Middleware])


class App:
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
        # Producers spread jobs over the shards in turn, each from its own place in the turn.
        self._turn = itertools.count(int.from_bytes(os.urandom(2), "big"))
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
        try:
            return self.producing.around(lambda sent: self._enqueue_many(jobs, sent))
        except redis.ResponseError as exc:
            raise_if_refused(exc)
            raise

    def _enqueue_many(
        self, jobs: Iterable[Prepared], sent: list[Enqueueing] | None
    ) -> list[Job[Any]]:
        calls, positions = self._enqueue_calls(jobs, sent)
        if not calls:
            return []
        # The first call alone loads the script if Redis lacks it; the rest go in a pipeline.
        results = [self._run_direct(calls[0])]
        if len(calls) > 1:
            with self.redis.pipeline(transaction=False) as pipe:
                for call in calls[1:]:
                    # Not .evalsha: a Redis Cluster pipeline refuses it (by name).
                    pipe.execute_command(*call.command())  # type: ignore[no-untyped-call]
                raw = pipe.execute(raise_on_error=False)
            for call, reply in zip(calls[1:], raw, strict=True):
                # Scripts flushed meanwhile (a restart, SCRIPT FLUSH): a call refused with
                # NOSCRIPT did nothing, so running it again cannot add a job twice.
                again = isinstance(reply, NoScriptError)
                results.append(call.run(self.redis) if again else _parsed(call, reply))
        return self._jobs_of(results, positions)

    async def aenqueue_many(self, jobs: Iterable[Prepared]) -> list[Job[Any]]:
        """`enqueue_many` for async callers."""
        try:
            return await self.producing.aaround(lambda sent: self._aenqueue_many(jobs, sent))
        except redis.ResponseError as exc:
            raise_if_refused(exc)
            raise

    async def _aenqueue_many(
        self, jobs: Iterable[Prepared], sent: list[Enqueueing] | None
    ) -> list[Job[Any]]:
        calls, positions = self._enqueue_calls(jobs, sent)
        if not calls:
            return []
        client = await self.aredis()
        results = [await calls[0].arun(client)]
        if len(calls) > 1:
            async with client.pipeline(transaction=False) as pipe:
                for call in calls[1:]:
                    pipe.execute_command(*call.command())  # as in enqueue_many
                raw = await pipe.execute(raise_on_error=False)
            for call, reply in zip(calls[1:], raw, strict=True):
                again = isinstance(reply, NoScriptError)  # as in enqueue_many
                results.append(await call.arun(client) if again else _parsed(call, reply))
        return self._jobs_of(results, positions)

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
        chained = chain_steps(self, list(steps))
        if not sent_one_by_one(chained):
            return self.enqueue_many(chained)
        jobs: list[Job[Any]] = []
        for step in chained:
            jobs += self.enqueue_many([after_previous(step, jobs[-1] if jobs else None)])
        return jobs

    async def achain(self, steps: Iterable[Prepared]) -> list[Job[Any]]:
        """`chain` for async callers."""
        chained = chain_steps(self, list(steps))
        if not sent_one_by_one(chained):
            return await self.aenqueue_many(chained)
        jobs: list[Job[Any]] = []
        for step in chained:
            jobs += await self.aenqueue_many([after_previous(step, jobs[-1] if jobs else None)])
        return jobs

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

    # -- schedules -----------------------------------------------------------------------------

    def schedule(
        self,
        id: str,
        task: Task[Any, Any] | str,
        *,
        every: float | None = None,
        cron: str | None = None,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        priority: int | None = None,
        tz: str = "UTC",
        mode: Mode = "rate",
        grace: float | None = None,
        jitter: float = 0.0,
        queue: str | None = None,
        rate_limit: str | None = None,
        rate_burst: int | None = None,
        concurrency_limit: int | None = None,
        limit_by: str | None = None,
        limiter: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        """Create or update (by ``id``) a schedule that runs ``task`` periodically.

        Args:
            every: seconds between runs (fixed rate: no drift, missed runs coalesced).
            cron: a five-field cron expression instead of ``every``, in time zone ``tz``.
            args: the task's positional arguments, as for `Task.enqueue`.
            kwargs: the task's keyword arguments.
            priority: 0..9 against other work; defaults to the task's.
            mode: ``"rate"`` (next = previous due + every) or ``"delay"`` (next = end + every).
            grace: skip (and count) a run that would start more than ``grace`` seconds late.
            jitter: spread each run by up to ``jitter`` seconds (stable per run).
            queue: the queue its runs go to; defaults to the task's. The workers that serve
                the default queue keep every schedule (they promote due runs, as Celery beat
                sends them); a run of another queue waits in that queue for its workers.
            rate_limit: starts per time over every worker (``"200/s"``). This and the four
                below limit this schedule's runs in place of the task's limits (as a whole),
                as `Task.options` takes them.
            rate_burst: starts allowed at once after a pause.
            concurrency_limit: runs at once.
            limit_by: the argument whose value ``concurrency_limit`` counts per.
            limiter: a budget declared with `App.limiter`.
            headers: headers every run carries (``current_job().headers``; str to str).
                Producer middleware does not run for a schedule's runs (no enqueue makes them).
        """
        item = Schedule(
            id, task, every, cron, args, kwargs or {}, priority, tz, mode, grace, jitter, queue,
            rate_limit, rate_burst, concurrency_limit, limit_by, limiter, headers,
        )  # fmt: skip
        self.schedule_many([item])

    async def aschedule(
        self,
        id: str,
        task: Task[Any, Any] | str,
        *,
        every: float | None = None,
        cron: str | None = None,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        priority: int | None = None,
        tz: str = "UTC",
        mode: Mode = "rate",
        grace: float | None = None,
        jitter: float = 0.0,
        queue: str | None = None,
        rate_limit: str | None = None,
        rate_burst: int | None = None,
        concurrency_limit: int | None = None,
        limit_by: str | None = None,
        limiter: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        """`schedule` for async callers."""
        item = Schedule(
            id, task, every, cron, args, kwargs or {}, priority, tz, mode, grace, jitter, queue,
            rate_limit, rate_burst, concurrency_limit, limit_by, limiter, headers,
        )  # fmt: skip
        await self.aschedule_many([item])

    def schedule_many(self, schedules: Iterable[Schedule]) -> list[int]:
        """Upsert many schedules, one script call per 500 per shard.

        Returns one code per schedule, in the order given: 1 created, 2 updated, 0 unchanged.
        """
        return self.scheduler.upsert(schedules)

    async def aschedule_many(self, schedules: Iterable[Schedule]) -> list[int]:
        """`schedule_many` for async callers."""
        return await self.scheduler.aupsert(schedules)

    def unschedule(self, *ids: str) -> int:
        """Remove schedules; a run queued or in flight finishes and is not followed by another."""
        return self.scheduler.each(ids, lambda s, chunk: s.remove(self.redis, chunk))

    async def aunschedule(self, *ids: str) -> int:
        client = await self.aredis()
        return await self.scheduler.aeach(ids, lambda s, chunk: s.aremove(client, chunk))

    def pause(self, *ids: str) -> int:
        """Stop scheduling runs (a run in flight finishes); returns how many were paused."""
        return self.scheduler.each(ids, lambda s, chunk: s.pause(self.redis, chunk))

    async def apause(self, *ids: str) -> int:
        client = await self.aredis()
        return await self.scheduler.aeach(ids, lambda s, chunk: s.apause(client, chunk))

    def resume(self, *ids: str) -> int:
        """Resume paused schedules at their next slot from now; returns how many resumed."""
        resumed = self.scheduler.resumed(now_ms(self.redis))
        return self.scheduler.each(ids, lambda s, chunk: s.resume(self.redis, chunk, resumed))

    async def aresume(self, *ids: str) -> int:
        client = await self.aredis()
        resumed = self.scheduler.resumed(await anow_ms(client))
        return await self.scheduler.aeach(ids, lambda s, chunk: s.aresume(client, chunk, resumed))

    def run_now(self, *ids: str) -> int:
        """Queue one extra run of each schedule now, unless one is already queued or running."""
        now = now_ms(self.redis)
        return self.scheduler.each(ids, lambda s, chunk: s.run_now(self.redis, chunk, now))

    async def arun_now(self, *ids: str) -> int:
        client = await self.aredis()
        now = await anow_ms(client)
        return await self.scheduler.aeach(ids, lambda s, chunk: s.arun_now(client, chunk, now))

    def schedules(self, prefix: str = "") -> Iterator[ScheduleInfo]:
        """Iterate over schedules whose id starts with ``prefix``, with their state."""
        return self.scheduler.iterate(prefix)

    async def aschedules(self, prefix: str = "") -> list[ScheduleInfo]:
        """`schedules` for async callers (returns a list)."""
        return await self.scheduler.alist(prefix)

    def get_schedule(self, schedule_id: str) -> ScheduleInfo | None:
        """One schedule with its state, or None if there is no schedule with this id."""
        return self.scheduler.get(schedule_id)

    async def aget_schedule(self, schedule_id: str) -> ScheduleInfo | None:
        """`get_schedule` for async callers."""
        return await self.scheduler.aget(schedule_id)

    def _run_direct(self, call: Call[T]) -> T:
        """Runs ``call`` on this thread's own connection (`direct.Direct`); through the
        client (which loads a missing script, and retries a failed connection by its policy)
        when that fails."""
        try:
            raw = self.connections.direct.execute(*call.command())
        except (NoScriptError, redis.ConnectionError, redis.TimeoutError):
            # Refused with NOSCRIPT, the call did nothing; a lost connection is retried as the
            # client retries any command (the job's id is chosen here: a repeat writes the same
            # job again, it does not add another).
            return call.run(self.redis)
        return call.parse(raw)

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

    def run_shard(self, schedule_id: str) -> tuple[Keys, Scripts]:
        """The keys and scripts of the shard a schedule's runs live in (its schedule's: a
        lookup when schedules are spread over shards)."""
        if not self.scheduler.apart:
            return self.keys, self.scripts
        found = self.scheduler.home_of(self.redis, schedule_id)
        return self._schedule_shard(schedule_id, found)

    async def arun_shard(self, schedule_id: str) -> tuple[Keys, Scripts]:
        if not self.scheduler.apart:
            return self.keys, self.scripts
        found = await self.scheduler.ahome_of(await self.aredis(), schedule_id)
        return self._schedule_shard(schedule_id, found)

    def _schedule_shard(self, schedule_id: str, found: int | None) -> tuple[Keys, Scripts]:
        i = self.scheduler.shard_of(schedule_id) if found is None else found
        return self.scheduler.shards[i], self.scheduler.scripts[i]

    def _job_shard_for(self, key: str | None, limited: bool, turn: int) -> int:
        """Where a new job goes: a limited one to the main shard (its limiter keys live there,
        so the limit is one for all), one with a dedup key to the shard the key hashes to (so
        one key is deduplicated in one place), any other to this producer's turn."""
        n = len(self.job_keys)
        if n == 1 or limited:
            return 0
        if key is not None:
            return zlib.crc32(key.encode()) % n
        return turn % n

    def _enqueue_calls(
        self, jobs: Iterable[Prepared], sent: list[Enqueueing] | None = None
    ) -> tuple[list[Call[Any]], list[list[int]]]:
        """The enqueue calls of ``jobs`` and, per call, the positions of its jobs among them
        (the replies are put back in the order given); each job through the producer
        middleware, noted in ``sent`` (None: the app has none).

        One call per run of jobs of one queue in one shard, at most `batch_limit` jobs each: a
        shard keeps the order of its jobs (the script writes to that queue's keys, and `seq`
        orders them). A call's unkeyed jobs share one shard, and once their batch is full the
        next batch goes to the next shard: batches spread; keyed ones go where their keys hash
        to, each shard's in as few calls as its queues allow."""
        # (queue, shard, items, positions, whether its jobs wait for others: enqueue_after)
        groups: list[tuple[str, int, list[str | bytes | int], list[int], bool]] = []
        current: dict[int, int] = {}  # shard -> its group being filled
        limit, batch = self.settings.max_payload_bytes, self.settings.batch_limit
        turn = next(self._turn)
        for i, prepared in enumerate(jobs):
            if not isinstance(prepared, Prepared):
                raise InvalidJob(
                    f"enqueue_many takes jobs made by task.prepare(...) or "
                    f"task.options(...).prepare(...), got {type(prepared).__name__}"
                )
            o = prepared.options
            known = self.tasks.get(prepared.task)
            limits = o.limits or (known.limits if known is not None else None)
            if known is None:
                _check_task_name(prepared.task)
            elif limits:
                self.limits_of(limits, known, prepared.args, prepared.kwargs)
            args_blob = encode_call(self.codec, prepared.args, prepared.kwargs, limit)
            queue = o.queue or self._queue_of(prepared.task)
            unique_ms = unique_ms_of(prepared, known)
            shard, after, pinned = self._dependent_shard(prepared, unique_ms, bool(limits), turn)
            g = current.get(shard)
            spread = len(self.job_keys) > 1 and o.key is None and not limits and not pinned
            if spread and g is not None and len(groups[g][3]) >= batch:
                turn = next(self._turn)  # a full batch of unkeyed jobs: the next shard's turn
                shard = self._job_shard_for(None, False, turn)
                g = current.get(shard)
            if (g is None or groups[g][0] != queue or len(groups[g][3]) >= batch
                    or groups[g][4] != after):  # fmt: skip
                groups.append((queue, shard, [], [], after))
                g = current[shard] = len(groups) - 1
            job_id, headers = o.job_id or new_job_id(shard), o.headers
            if sent is not None:
                sent.append(self.producing.start(job_id, prepared.task, queue, o.priority, headers))
                headers = sent[-1].headers
            what = f"job of task {prepared.task!r}"
            if headers:  # checked again: middleware may have added to them
                headers = check_headers(headers, what)
                check_header_size(headers, self.settings.max_header_bytes, what)
            record = None if o.limits is None else o.limits.to_record()
            deps = [job for job, _ in o.depends_on]
            spec = encode_spec(
                self.codec, prepared.task, args_blob, record, headers, deps=deps, batch=o.batch
            )
            check_size(spec, limit, what)
            if after:
                groups[g][2].extend((job_id, spec, o.priority, o.key or "", len(deps)))
                groups[g][2].extend(f"{int(fails)}{job}" for job, fails in o.depends_on)
            else:
                groups[g][2].extend(
                    (job_id, spec, o.priority, o.delay_ms, o.at_ms, o.key or "", unique_ms)
                )
            groups[g][3].append(i)
        ttl_ms = round(self.settings.result_ttl * 1000)
        calls = [
            self.job_scripts[shard].enqueue_after(items, queue, ttl_ms)
            if after
            else self.job_scripts[shard].enqueue(items, queue)
            for queue, shard, items, _, after in groups
        ]
        return calls, [positions for _, _, _, positions, _ in groups]

    def _dependent_shard(
        self, prepared: Prepared, unique_ms: int, limited: bool, turn: int
    ) -> tuple[int, bool, bool]:
        """(shard, whether it goes through enqueue_after.lua, whether its shard is fixed) of a
        new job: a job with dependencies, or a chain's step (its id given), goes where they
        are; any other where `_job_shard_for` says."""
        o = prepared.options
        if o.job_id is None and not o.depends_on:
            return self._job_shard_for(o.key, limited, turn), False, False
        if o.job_id is not None:
            shard = job_shard_of(o.job_id)
        elif o.key is None and not limited:
            shard = job_shard_of(o.depends_on[0][0])
        else:
            shard = self._job_shard_for(o.key, limited, turn)
        if shard >= len(self.job_keys):
            raise InvalidJob(f"job shard {shard} is beyond Settings.job_shards here")
        if not o.depends_on:  # a chain's first step: with enqueue_after only if it may
            return shard, not (o.delay or o.at is not None or unique_ms), True
        check_dependent(prepared, unique_ms)
        return shard_of_dependent(prepared, shard), True, True

    def _queue_of(self, task: str) -> str:
        known = self.tasks.get(task)
        return DEFAULT_QUEUE if known is None else known.config.queue

    def _jobs_of(self, results: Sequence[Any], positions: Sequence[list[int]]) -> list[Job[Any]]:
        """Each call's jobs, back in the order they were given."""
        jobs: list[Job[Any]] = [None] * sum(map(len, positions))  # type: ignore[list-item]
        for batch, where in zip(results, positions, strict=True):
            for e, i in zip(batch, where, strict=True):
                jobs[i] = Job(self, e.id, e.created)
        return jobs


class _Decorator(Protocol):
    @overload
    def __call__(self, fn: Callable[P, Awaitable[R]], /) -> Task[P, R]: ...
    @overload
    def __call__(self, fn: Callable[P, R], /) -> Task[P, R]: ...


def _parsed(call: Call[T], reply: Any) -> T:
    """A pipelined reply: the call's result, or the error Redis answered with, raised."""
    if isinstance(reply, Exception):
        raise reply
    return call.parse(reply)


def _check_task_name(name: str) -> None:
    try:
        check_name(name, "task name")
    except ValueError as exc:
        raise InvalidJob(str(exc)) from None


def _decoded(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
