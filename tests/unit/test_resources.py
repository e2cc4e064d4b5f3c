"""The per-process resource registry on its own: lazy, checked once per job, made anew when the
check fails, one instance under many threads, never the parent's after a fork, closed on
request. (With a worker: tests/integration/test_resources.py; with PostgreSQL:
test_resources_pg.py and tests/process/test_resources_process.py.)"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import os
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

import pytest

import drumbeat
from drumbeat.context import Running, current_run
from drumbeat.resources import Resource, Resources, bind


class Thing:
    """A stand-in for a connection: counts what was done to it."""

    made = 0

    def __init__(self) -> None:
        Thing.made += 1
        self.n = Thing.made
        self.checks = 0
        self.broken = False
        self.closed = False

    def check(self) -> None:
        self.checks += 1
        if self.broken or self.closed:
            raise ConnectionError(f"thing {self.n} is broken")

    def close(self) -> None:
        self.closed = True


def _thing_resource(**more: Any) -> tuple[Resources, Resource[Thing]]:
    registry = Resources()
    hooks: dict[str, Any] = {"check": Thing.check, "close": Thing.close} | more
    res: Resource[Thing] = registry.register("thing", **hooks)(Thing)
    return registry, res


def _in_job(fn: Callable[[], Any], n: int = 1) -> Any:
    """Runs ``fn`` as the runner runs a task: in a context whose current job is a new run."""
    job = Running((f"job{n}", "t", 1, n, 0, "w", None, None, None, None, None, {}))

    def run() -> Any:
        current_run.set(job)
        return fn()

    return contextvars.copy_context().run(run)


def test_made_on_first_use_only_and_the_same_one_after() -> None:
    _, res = _thing_resource()
    before = Thing.made
    assert res.created == 0 and Thing.made == before, "registering made an instance"
    first = res.get()
    assert res.get() is first and _in_job(res.get) is first
    assert res.created == 1 and Thing.made == before + 1


def test_checked_once_per_job_and_on_every_use_outside_a_job() -> None:
    _, res = _thing_resource()
    thing = res.get()  # made, not checked
    assert thing.checks == 0
    _in_job(lambda: [res.get() for _ in range(5)], n=1)
    assert thing.checks == 1, "several uses in one job should check once"
    _in_job(lambda: [res.get() for _ in range(5)], n=2)
    assert thing.checks == 2, "a new job should check again"
    res.get()
    res.get()
    assert thing.checks == 4, "outside a job every use checks"


def test_a_failing_check_closes_the_old_one_and_makes_a_new_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    _, res = _thing_resource()
    old = res.get()
    old.broken = True
    with caplog.at_level(logging.WARNING, "drumbeat.resources"):
        new = _in_job(res.get)
    assert new is not old and old.closed and not new.closed
    assert res.created == 2
    assert "resource 'thing' is broken (its check raised ConnectionError: thing" in caplog.text


def test_a_check_returning_false_fails_but_none_passes() -> None:
    verdict: list[object] = [None]
    _, res = _thing_resource(check=lambda thing: verdict[0])
    first = res.get()
    assert res.get() is first, "a check returning None (as most do) passed"
    verdict[0] = False
    assert res.get() is not first and first.closed


def test_a_failing_close_is_logged_and_a_failing_factory_raises_and_keeps_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def bad_close(thing: Thing) -> None:
        raise OSError("socket already gone")

    _, res = _thing_resource(close=bad_close)
    res.get().broken = True
    with caplog.at_level(logging.WARNING, "drumbeat.resources"):
        res.get()
    assert "closing resource 'thing' failed (OSError: socket already gone)" in caplog.text

    fail = [True]

    def flaky() -> Thing:
        if fail[0]:
            raise ConnectionRefusedError("database down")
        return Thing()

    flaky_res = Resources().register("flaky")(flaky)
    with pytest.raises(ConnectionRefusedError):
        flaky_res.get()
    fail[0] = False
    assert isinstance(flaky_res.get(), Thing) and flaky_res.created == 1


def test_many_threads_at_once_make_one() -> None:
    def slow() -> Thing:
        time.sleep(0.05)  # widens the window in which a second thread could make another
        return Thing()

    res = Resources().register("slow", check=Thing.check)(slow)
    start = threading.Barrier(16)
    got: list[Thing] = []

    def use(n: int) -> None:
        start.wait()
        got.append(_in_job(res.get, n))

    threads = [threading.Thread(target=use, args=(n,)) for n in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(got) == 16 and len({id(g) for g in got}) == 1
    assert res.created == 1


def test_many_threads_find_it_broken_and_one_makes_its_successor() -> None:
    _, res = _thing_resource()
    res.get().broken = True
    start = threading.Barrier(16)
    got: list[Thing] = []

    def use(n: int) -> None:
        start.wait()
        got.append(_in_job(res.get, n))

    threads = [threading.Thread(target=use, args=(n,)) for n in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len({id(g) for g in got}) == 1 and res.created == 2


def test_an_unknown_name_names_the_registered_ones() -> None:
    registry, _ = _thing_resource()
    registry.register("cache")(dict)
    with pytest.raises(drumbeat.ConfigurationError, match=r"no resource named 'db' is registered "
                       r"\(registered: cache, thing\)"):  # fmt: skip
        registry["db"]

    def use() -> object:
        bind(registry)
        return drumbeat.resource("db")

    with pytest.raises(drumbeat.ConfigurationError, match="registered: cache, thing"):
        contextvars.copy_context().run(use)


def test_resource_outside_a_worker_says_where_it_works() -> None:
    with pytest.raises(drumbeat.ConfigurationError, match="works in a worker's tasks and hooks"):
        contextvars.copy_context().run(drumbeat.resource, "thing")


def test_registering_another_factory_under_a_taken_name_is_refused() -> None:
    registry, _ = _thing_resource()
    with pytest.raises(drumbeat.ConfigurationError, match="already registered as 'thing'"):
        registry.register("thing")(dict)


def test_close_closes_this_process_instance_and_the_next_use_makes_a_new_one() -> None:
    registry, res = _thing_resource()
    thing = res.get()
    asyncio.run(registry.aclose())
    assert thing.closed
    assert res.get() is not thing and res.created == 2
    asyncio.run(registry.aclose())  # twice is fine
    Resources().register("never")(Thing).close()  # never made: nothing to close


def test_close_does_not_wait_forever_for_a_thread_stuck_in_a_check(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    release = threading.Event()
    checking = threading.Event()

    def hangs(thing: Thing) -> None:
        checking.set()
        release.wait(30)

    _, res = _thing_resource(check=hangs)
    thing = res.get()
    stuck = threading.Thread(target=res.get)  # outside a job: checks, and hangs there
    stuck.start()
    try:
        assert checking.wait(10), "the check did not start"
        monkeypatch.setattr("drumbeat.resources._CLOSE_WAIT", 0.1)
        with caplog.at_level(logging.WARNING, "drumbeat.resources"):
            res.close()
        assert (
            "resource 'thing' is still being made or checked after 0 s; not closed" in caplog.text
        )
        assert not thing.closed
    finally:
        release.set()
        stuck.join(10)
    res.close()
    assert thing.closed


def test_after_a_fork_the_child_makes_its_own_and_never_closes_the_parents() -> None:
    _, res = _thing_resource()
    parent = res.get()
    read, write = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads (3.12+)
        pid = os.fork()
    if pid == 0:  # the child: report and leave without running any cleanup
        try:
            child = res.get()
            report = f"{child is not parent} {parent.closed} {res.created} {child.checks}"
            res.close()
            report += f" {child.closed} {parent.closed}"
        except BaseException as exc:
            report = repr(exc)
        os.write(write, report.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        report = f.read()
    os.waitpid(pid, 0)
    # a new one; the parent's not closed; made once in the child; closing closes the child's only
    assert report == "True False 1 0 True False", report
    assert res.get() is parent and not parent.closed


def test_an_instance_of_another_process_is_dropped_unclosed_even_without_fork_hooks() -> None:
    _, res = _thing_resource()
    theirs = res.get()
    assert res._made is not None
    res._made = type(res._made)(theirs, res._made.pid + 1, None)  # as if made elsewhere
    mine = res.get()
    assert mine is not theirs and not theirs.closed and theirs.checks == 0


async def test_an_async_resource_is_made_checked_and_closed_on_its_loop() -> None:
    class AThing(Thing):
        async def acheck(self) -> bool:
            self.checks += 1
            return not self.broken

        async def aclose(self) -> None:
            self.closed = True

    async def make() -> AThing:
        await asyncio.sleep(0)
        return AThing()

    registry = Resources()
    res = registry.register("athing", check=AThing.acheck, close=AThing.aclose)(make)
    many = await asyncio.gather(*(res.aget() for _ in range(10)))
    assert len({id(t) for t in many}) == 1 and res.created == 1
    first = many[0]
    first.broken = True
    second = await res.aget()
    assert second is not first and first.closed
    with pytest.raises(
        drumbeat.ConfigurationError, match=r"get it with `await drumbeat.aresource\('athing'\)`"
    ):
        res.get()
    with pytest.raises(drumbeat.ConfigurationError, match=r"resource\('thing'\), not aresource"):
        await _thing_resource()[1].aget()
    await registry.aclose()
    assert second.closed
