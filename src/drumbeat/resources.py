"""Per-process resources (a database connection, an HTTP client) that a task gets healthy:
made lazily once per process, checked once per job before use and made anew when the check
fails, closed when the worker stops. ``@app.resource(...)`` registers one; a task asks for it
with `resource` / `aresource`, or through the `Resource` handle the decorator returns.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import threading
import weakref
from collections.abc import Awaitable, Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar, cast, overload

from .context import Running, current_run
from .errors import ConfigurationError

log = logging.getLogger("drumbeat.resources")

_CLOSE_WAIT = 5.0
"""Seconds `Resource.close` waits for a thread that is making or checking the resource."""

T = TypeVar("T")

Hook = Callable[[Any], object]
"""A check or a close: called with the resource; an async resource's may be coroutines."""


@dataclass(frozen=True, slots=True)
class _Made:
    """One live resource and where it was made. One of another process (inherited through a
    fork) is dropped, never used or closed: its socket is the parent's. An async one belongs to
    the event loop that made it."""

    value: Any
    pid: int
    loop: asyncio.AbstractEventLoop | None


class Resource(Generic[T]):
    """A named per-process resource: `get` (or `aget` for an async factory) returns this
    process's instance, checked once per job.

    Args:
        name: what `drumbeat.resource` finds it by.
        factory: makes a new instance (a coroutine function makes an async resource).
        check: called with the instance before its first use in each job (on every use outside
            a job); raising or returning ``False`` marks it broken: it is closed and made anew.
        close: called with an instance that failed its check, and at worker shutdown; what it
            raises is logged.
    """

    def __init__(
        self,
        name: str,
        factory: Callable[[], T] | Callable[[], Awaitable[T]],
        check: Hook | None = None,
        close: Hook | None = None,
    ) -> None:
        self.name = name
        self.factory = factory
        self.check = check
        self.closer = close
        self.is_async = inspect.iscoroutinefunction(factory)
        self.created = 0
        """Instances this process made: 1, plus one per failed check."""
        self._made: _Made | None = None
        self._lock = threading.Lock()
        self._alock: tuple[asyncio.AbstractEventLoop, asyncio.Lock] | None = None
        _all.add(self)

    def __repr__(self) -> str:
        return f"<Resource {self.name!r}>"

    # -- sync --------------------------------------------------------------------------------

    def get(self) -> T:
        """This process's instance, made now if there is none or its check fails.

        Raises:
            ConfigurationError: the factory is a coroutine function (use `aget`).
            Exception: whatever the factory raises (nothing is kept; the next call tries again).
        """
        if self.is_async:
            raise ConfigurationError(
                f"resource {self.name!r} has an async factory: get it with "
                f"`await drumbeat.aresource({self.name!r})`, not drumbeat.resource()"
            )
        checked = _checked_in_job()
        made = self._made
        if checked is not None and self in checked and made is not None and _mine(made, None):
            return made.value  # type: ignore[no-any-return]
        with self._lock:  # one thread checks or makes it; the others then see its result
            made = self._healthy()
            if made is None:
                value: T = self.factory()  # type: ignore[assignment]
                made = self._made = _Made(value, os.getpid(), None)
                self.created += 1
            if checked is not None:
                checked.add(self)
            return made.value  # type: ignore[no-any-return]

    def _healthy(self) -> _Made | None:
        made = self._own(None)
        if made is None or self.check is None:
            return made
        try:
            broken = "its check returned False" if self.check(made.value) is False else None
        except Exception as exc:
            broken = f"its check raised {type(exc).__name__}: {exc}"
        if broken is None:
            return made
        self._discard(broken)
        if self.closer is not None:
            try:
                self.closer(made.value)
            except Exception as exc:
                _close_failed(self.name, exc)
        return None

    def close(self) -> None:
        """Closes this process's instance, if it made one; the next `get` makes a new one.
        What ``close`` raises is logged, not raised."""
        if self.is_async:
            raise ConfigurationError(
                f"resource {self.name!r} has an async factory: close it with "
                "`await resource.aclose()`"
            )
        # A task thread left running past its timeout may hold the lock in a factory or check
        # that hangs; the worker's shutdown must not hang with it.
        if not self._lock.acquire(timeout=_CLOSE_WAIT):
            log.warning("resource %r is still being made or checked after %.0f s; not closed",
                        self.name, _CLOSE_WAIT)  # fmt: skip
            return
        try:
            made, self._made = self._own(None), None
        finally:
            self._lock.release()
        if made is not None and self.closer is not None:
            try:
                self.closer(made.value)
            except Exception as exc:
                _close_failed(self.name, exc)

    # -- async -------------------------------------------------------------------------------

    async def aget(self) -> T:
        """`get` for a resource whose factory is a coroutine function (its check and close may
        be either); the instance belongs to the running event loop."""
        if not self.is_async:
            raise ConfigurationError(
                f"resource {self.name!r} has a sync factory: get it with "
                f"drumbeat.resource({self.name!r}), not aresource()"
            )
        loop = asyncio.get_running_loop()
        checked = _checked_in_job()
        made = self._made
        if checked is not None and self in checked and made is not None and _mine(made, loop):
            return made.value  # type: ignore[no-any-return]
        async with self._async_lock(loop):
            made = await self._ahealthy(loop)
            if made is None:
                value: T = await self.factory()  # type: ignore[misc]
                made = self._made = _Made(value, os.getpid(), loop)
                self.created += 1
            if checked is not None:
                checked.add(self)
            return made.value  # type: ignore[no-any-return]

    async def _ahealthy(self, loop: asyncio.AbstractEventLoop) -> _Made | None:
        made = self._own(loop)
        if made is None or self.check is None:
            return made
        try:
            ok = await _maybe_await(self.check(made.value))
            broken = "its check returned False" if ok is False else None
        except Exception as exc:
            broken = f"its check raised {type(exc).__name__}: {exc}"
        if broken is None:
            return made
        self._discard(broken)
        await self._aclose_value(made.value)
        return None

    async def aclose(self) -> None:
        """Closes this process's instance (sync or async resource); errors are logged."""
        if not self.is_async:
            self.close()
            return
        made, self._made = self._own(asyncio.get_running_loop()), None
        if made is not None:
            await self._aclose_value(made.value)

    async def _aclose_value(self, value: Any) -> None:
        if self.closer is not None:
            try:
                await _maybe_await(self.closer(value))
            except Exception as exc:
                _close_failed(self.name, exc)

    def _async_lock(self, loop: asyncio.AbstractEventLoop) -> asyncio.Lock:
        if self._alock is None or self._alock[0] is not loop:
            self._alock = (loop, asyncio.Lock())
        return self._alock[1]

    # -- both --------------------------------------------------------------------------------

    def _own(self, loop: asyncio.AbstractEventLoop | None) -> _Made | None:
        """The instance if this process (and, for an async one, this loop) made it; one made
        elsewhere is forgotten without being closed."""
        made = self._made
        if made is not None and not _mine(made, loop):
            where = f"process {made.pid}" if made.pid != os.getpid() else "another event loop"
            log.info("resource %r was made in %s; dropped it, this one makes its own",
                     self.name, where)  # fmt: skip
            self._made = made = None
        return made

    def _discard(self, why: str) -> None:
        log.warning("resource %r is broken (%s); closing it and making a new one", self.name, why)
        self._made = None

    def _forked(self) -> None:
        """In a forked child: the parent's lock may be held by a thread that does not exist
        here, and its instance is the parent's."""
        self._lock = threading.Lock()
        self._alock = None
        self._made = None
        self.created = 0


def _mine(made: _Made, loop: asyncio.AbstractEventLoop | None) -> bool:
    return made.pid == os.getpid() and made.loop is loop


async def _maybe_await(value: object) -> object:
    return await value if inspect.isawaitable(value) else value


def _close_failed(name: str, exc: Exception) -> None:
    log.warning("closing resource %r failed (%s: %s); dropped it", name, type(exc).__name__, exc)


# Every Resource, so that a forked child starts with fresh locks and none of the parent's
# instances (the pid check on each use covers a fork that bypasses these hooks).
_all: weakref.WeakSet[Resource[Any]] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for res in list(_all):
        res._forked()


os.register_at_fork(after_in_child=_after_fork_in_child)

# Which resources the running job has checked: the job's run (one per run) and a set.
# A sync task runs in a copy of its job's contextvars, an async one in its job's asyncio task,
# so the mark lives exactly as long as the run (a coroutine the job spawns may check again).
_checks: ContextVar[tuple[Running, set[Resource[Any]]]] = ContextVar("drumbeat_resource_checks")


def _checked_in_job() -> set[Resource[Any]] | None:
    """The resources checked in the running job; None outside a job (check every use)."""
    run = current_run.get(None)
    if run is None:
        return None
    entry = _checks.get(None)
    if entry is None or entry[0] is not run:
        entry = (run, set())
        _checks.set(entry)
    return entry[1]


class Register(Protocol):
    """What ``@app.resource(...)`` returns: turns the factory into its `Resource`."""

    @overload
    def __call__(self, factory: Callable[[], Awaitable[T]], /) -> Resource[T]: ...
    @overload
    def __call__(self, factory: Callable[[], T], /) -> Resource[T]: ...


class Resources:
    """The resources an `App` registered, by name."""

    def __init__(self) -> None:
        self._by_name: dict[str, Resource[Any]] = {}

    def register(
        self, name: str, *, check: Hook | None = None, close: Hook | None = None
    ) -> Register:
        """A decorator registering a factory under ``name`` (see `App.resource`)."""

        def add(factory: Callable[[], Any]) -> Resource[Any]:
            old = self._by_name.get(name)
            if old is not None and old.factory is not factory:
                raise ConfigurationError(f"a different resource is already registered as {name!r}")
            self._by_name[name] = res = Resource(name, factory, check, close)
            return res

        return cast(Register, add)

    def __getitem__(self, name: str) -> Resource[Any]:
        try:
            return self._by_name[name]
        except KeyError:
            known = ", ".join(sorted(self._by_name)) or "none"
            raise ConfigurationError(
                f"no resource named {name!r} is registered (registered: {known}); register one "
                f"with @app.resource({name!r})"
            ) from None

    def __iter__(self) -> Iterator[Resource[Any]]:
        return iter(list(self._by_name.values()))

    async def aclose(self) -> None:
        """Closes every instance this process made (the worker's last stop hook); errors are
        logged, not raised."""
        for res in self:
            await res.aclose()


_active: ContextVar[Resources] = ContextVar("drumbeat_resources")


def bind(resources: Resources) -> None:
    """Makes `resource` / `aresource` find ``resources`` in this context and in every task and
    thread started from it (the worker binds its app's before its start hooks)."""
    _active.set(resources)


def _named(name: str, call: str) -> Resource[Any]:
    try:
        registry = _active.get()
    except LookupError:
        raise ConfigurationError(
            f"drumbeat.{call}({name!r}) works in a worker's tasks and hooks; elsewhere use the "
            f"handle @app.resource returned, or app.resources[{name!r}]"
        ) from None
    return registry[name]


def resource(name: str) -> Any:
    """The running worker's resource ``name``, healthy: made on first use in this process,
    checked before its first use in each job (every use outside a job), made anew when the
    check fails.

    Raises:
        ConfigurationError: no resource of that name is registered, it is async (use
            `aresource`), or no worker runs here.
    """
    return _named(name, "resource").get()


async def aresource(name: str) -> Any:
    """`resource` for a resource whose factory is a coroutine function."""
    return await _named(name, "aresource").aget()
