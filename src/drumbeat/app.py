"""App: settings, the Redis clients, the scripts and the task registry; enqueue lives here."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
import warnings
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, ParamSpec, Protocol, TypeVar, overload

import redis
import redis.asyncio as redis_async

from . import embedded
from .config import Settings
from .errors import ConfigurationError, InvalidJob, UnknownTask
from .job import Job, encode_spec
from .keys import Keys, check_name
from .scripts import SHAS, Call, Scripts
from .serialization import CODECS, Codec, check_size, encode_call
from .task import Prepared, Task, TaskConfig

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")

log = logging.getLogger("drumbeat")


class EvictionPolicyWarning(UserWarning):
    """Redis may evict keys under memory pressure, which silently loses jobs."""


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
        self.codec: Codec = CODECS[self.settings.codec]
        self.tasks: dict[str, Task[Any, Any]] = {}
        self._url: str | None = self.settings.url
        self._redis: redis.Redis | None = None
        self._aredis: tuple[asyncio.AbstractEventLoop, redis_async.Redis] | None = None

    # -- connections ---------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The Redis URL in use; resolving it starts the embedded Redis if none was given."""
        if self._url is None:
            self._url = embedded.ensure_running()
        return self._url

    @property
    def redis(self) -> redis.Redis:
        """The synchronous client (created on first use)."""
        if self._redis is None:
            client = redis.Redis.from_url(self.url, socket_connect_timeout=5)
            # Managed Redis services often disable CONFIG; then there is nothing to check.
            with contextlib.suppress(redis.ResponseError):
                _warn_if_evicting(client.config_get("maxmemory-policy"))
            self._redis = client
        return self._redis

    async def aredis(self) -> redis_async.Redis:
        """The asyncio client of the running event loop (created on first use in each loop)."""
        loop = asyncio.get_running_loop()
        if self._aredis is None or self._aredis[0] is not loop:
            url = self.url if self._url else await asyncio.to_thread(lambda: self.url)
            client = redis_async.Redis.from_url(url, socket_connect_timeout=5)
            await check_server(client)
            self._aredis = (loop, client)
        return self._aredis[1]

    def new_async_client(self, **options: Any) -> redis_async.Redis:
        """A separate asyncio client, for a worker's blocking reads and its own pool."""
        return redis_async.Redis.from_url(self.url, socket_connect_timeout=5, **options)

    def close(self) -> None:
        if self._redis is not None:
            self._redis.close()
            self._redis = None

    async def aclose(self) -> None:
        if self._aredis is not None:
            await self._aredis[1].aclose()
            self._aredis = None
        self.close()

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
        backoff: float = 1.0,
        backoff_max: float = 600.0,
    ) -> _Decorator: ...

    def task(self, fn: Callable[..., Any] | None = None, /, **config: Any) -> Any:
        """Register a function as a task, bare (``@app.task``) or with options.

        Options: ``name`` (default ``module.qualname``), ``priority`` 0..9 (higher first),
        ``retries`` after the first failure, ``timeout`` seconds per attempt, ``result_ttl``
        seconds the outcome is kept (0: not at all), ``backoff``/``backoff_max`` seconds.
        """

        def register(f: Callable[..., Any]) -> Task[Any, Any]:
            name = config.pop("name", None) or f"{f.__module__}.{f.__qualname__}"
            task: Task[Any, Any] = Task(self, f, TaskConfig(name=name, **config))
            if name in self.tasks and self.tasks[name].fn is not f:
                raise ConfigurationError(f"a different task is already registered as {name!r}")
            self.tasks[name] = task
            return task

        return register(fn) if fn is not None else register

    def get_task(self, name: str) -> Task[Any, Any]:
        try:
            return self.tasks[name]
        except KeyError:
            known = ", ".join(sorted(self.tasks)) or "none"
            raise UnknownTask(f"no task named {name!r} is registered (known: {known})") from None

    # -- enqueue -------------------------------------------------------------------------------

    def enqueue_many(self, jobs: Iterable[Prepared]) -> list[Job[Any]]:
        """Enqueue many jobs in one round trip per `Settings.batch_limit` jobs, pipelined."""
        calls = self._enqueue_calls(jobs)
        if not calls:
            return []
        # The first call alone loads the script if Redis lacks it; a pipeline cannot recover
        # from NOSCRIPT without risking a second copy of jobs it already added.
        results = [calls[0].run(self.redis)]
        if len(calls) > 1:
            with self.redis.pipeline(transaction=False) as pipe:
                for call in calls[1:]:
                    pipe.evalsha(SHAS[call.name], len(call.keys), *call.keys, *call.args)
                raw = pipe.execute()
            results += [c.parse(r) for c, r in zip(calls[1:], raw, strict=True)]
        return self._jobs_of(results)

    async def aenqueue_many(self, jobs: Iterable[Prepared]) -> list[Job[Any]]:
        """`enqueue_many` for async callers."""
        calls = self._enqueue_calls(jobs)
        if not calls:
            return []
        client = await self.aredis()
        results = [await calls[0].arun(client)]
        if len(calls) > 1:
            async with client.pipeline(transaction=False) as pipe:
                for call in calls[1:]:
                    pipe.evalsha(SHAS[call.name], len(call.keys), *call.keys, *call.args)
                raw = await pipe.execute()
            results += [c.parse(r) for c, r in zip(calls[1:], raw, strict=True)]
        return self._jobs_of(results)

    def enqueue(self, task: str, *args: Any, **kwargs: Any) -> Job[Any]:
        """Enqueue a task by name (for producers that do not import the task's code)."""
        return self.enqueue_many([Prepared(task, args, kwargs)])[0]

    def job(self, job_id: str) -> Job[Any]:
        """A handle on an existing job."""
        return Job(self, job_id, created=False)

    def _enqueue_calls(self, jobs: Iterable[Prepared]) -> list[Call[Any]]:
        groups: list[list[str | bytes | int]] = [[]]
        limit = self.settings.max_payload_bytes
        for prepared in jobs:
            if not isinstance(prepared, Prepared):
                raise InvalidJob(
                    f"enqueue_many takes jobs made by task.prepare(...) or "
                    f"task.options(...).prepare(...), got {type(prepared).__name__}"
                )
            if prepared.task not in self.tasks:
                _check_task_name(prepared.task)
            spec = encode_spec(
                self.codec,
                prepared.task,
                encode_call(self.codec, prepared.args, prepared.kwargs, limit),
            )
            check_size(spec, limit, f"job of task {prepared.task!r}")
            o = prepared.options
            if len(groups[-1]) >= 6 * self.settings.batch_limit:
                groups.append([])
            groups[-1] += [uuid.uuid4().hex, spec, o.priority, o.delay_ms, o.at_ms, o.key or ""]
        return [self.scripts.enqueue(g) for g in groups if g]

    def _jobs_of(self, results: Sequence[Any]) -> list[Job[Any]]:
        return [Job(self, e.id, e.created) for batch in results for e in batch]


class _Decorator(Protocol):
    @overload
    def __call__(self, fn: Callable[P, Awaitable[R]], /) -> Task[P, R]: ...
    @overload
    def __call__(self, fn: Callable[P, R], /) -> Task[P, R]: ...


def _check_task_name(name: str) -> None:
    try:
        check_name(name, "task name")
    except ValueError as exc:
        raise InvalidJob(str(exc)) from None


async def check_server(client: redis_async.Redis) -> None:
    """Warns when the server's configuration could silently lose jobs."""
    # Managed Redis services often disable CONFIG; then there is nothing to check.
    with contextlib.suppress(redis.ResponseError):
        _warn_if_evicting(await client.config_get("maxmemory-policy"))


def _warn_if_evicting(config: dict[Any, Any]) -> None:
    policy = config.get("maxmemory-policy") or config.get(b"maxmemory-policy")
    if isinstance(policy, bytes):
        policy = policy.decode()
    if policy and policy != "noeviction":
        log.warning("Redis maxmemory-policy is %r: jobs can be evicted; use noeviction", policy)
        warnings.warn(
            f"Redis maxmemory-policy is {policy!r}: under memory pressure Redis will evict keys "
            "and silently lose jobs. Set `maxmemory-policy noeviction` for drumbeat's Redis.",
            EvictionPolicyWarning,
            stacklevel=3,
        )
