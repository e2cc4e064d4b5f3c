"""The stale-connection problem on a real PostgreSQL (tests/pg.py): every backend is terminated
between batches of jobs. Tasks on a plain long-lived connection fail; tasks that get theirs from
the resource registry never do (it is checked once per job and made anew). After a fork the
child connects on its own and never closes the parent's connection."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import psycopg
import pytest

import drumbeat
from drumbeat.resources import Resources
from tests.conftest import running_worker
from tests.helpers import wait_for_async
from tests.pg import backends, terminate_backends

ROOT = Path(__file__).resolve().parents[2]


async def test_a_terminated_connection_fails_plain_jobs_but_never_registry_jobs(
    app: drumbeat.App, pg_dsn: str
) -> None:
    @app.resource("db", check=lambda c: c.execute("select 1"), close=lambda c: c.close())
    def db() -> psycopg.Connection[Any]:
        return psycopg.connect(pg_dsn, autocommit=True)

    @app.resource("adb", check=lambda c: c.execute("select 1"), close=lambda c: c.close())
    async def adb() -> psycopg.AsyncConnection[Any]:
        return await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True)

    plain = psycopg.connect(pg_dsn, autocommit=True)  # the control: one connection, no check

    def pid_of(cursor: Any) -> int:
        return int(cursor.fetchone()[0])

    @app.task
    def via_registry() -> int:
        return pid_of(drumbeat.resource("db").execute("select pg_backend_pid()"))

    @app.task
    async def via_async_registry() -> int:
        conn = await drumbeat.aresource("adb")
        row = await (await conn.execute("select pg_backend_pid()")).fetchone()
        return int(row[0])

    @app.task
    def via_plain() -> int:
        return pid_of(plain.execute("select pg_backend_pid()"))

    admin = psycopg.connect(pg_dsn, autocommit=True)
    batches, failed, plain_errors, terminated = [], [], [], []
    try:
        async with running_worker(app, concurrency=4):
            for batch in range(5):
                if batch:  # every job of the last batch has ended: kill their connections
                    terminated.append(await asyncio.to_thread(terminate_backends, admin))
                jobs = [await via_registry.aenqueue() for _ in range(10)]
                jobs += [await via_async_registry.aenqueue() for _ in range(10)]
                pids: list[int] = []
                for job in jobs:
                    try:
                        pids.append(await job.aresult(timeout=20))
                    except drumbeat.JobFailed as exc:
                        failed.append(str(exc))
                batches.append((set(pids[:10]), set(pids[10:])))
                try:
                    await (await via_plain.aenqueue()).aresult(timeout=20)
                except drumbeat.JobFailed as exc:
                    plain_errors.append(str(exc))
        await wait_for_async(lambda: backends(admin), until=lambda b: b == set(),
                             message="the stopped worker should close its connections")  # fmt: skip
    finally:
        admin.close()
        plain.close()
    assert failed == [], "no job should fail with a connection from the registry"
    assert terminated == [3, 2, 2, 2], "db, adb and plain (which stays closed after the first)"
    assert db.created == 5 and adb.created == 5, "one new connection after each termination"
    sync_pids = [b[0] for b in batches]
    async_pids = [b[1] for b in batches]
    assert all(len(p) == 1 for p in sync_pids + async_pids), f"one connection per batch: {batches}"
    assert len(set.union(*sync_pids)) == 5 and len(set.union(*async_pids)) == 5
    # The control proves the problem is real: the first batch ran, every later one failed
    # (psycopg's AdminShutdown, then the connection stays closed).
    assert len(plain_errors) == 4, plain_errors
    assert "terminating connection due to administrator command" in plain_errors[0]
    assert all("OperationalError: the connection is closed" in e for e in plain_errors[1:])


def test_after_a_fork_the_child_connects_anew_and_leaves_the_parents_connection_alone(
    pg_dsn: str,
) -> None:
    registry = Resources()
    db = registry.register("db", check=lambda c: c.execute("select 1"), close=lambda c: c.close())(
        lambda: psycopg.connect(pg_dsn, autocommit=True)
    )

    def backend() -> int:
        row = db.get().execute("select pg_backend_pid()").fetchone()
        assert row is not None
        return int(row[0])

    admin = psycopg.connect(pg_dsn, autocommit=True)
    try:
        parent = backend()
        read, write = os.pipe()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads (3.12+)
            pid = os.fork()
        if pid == 0:  # the child: report, close its own, leave without any cleanup
            try:
                report = f"{backend()} {db.created}"
                db.close()
            except BaseException as exc:
                report = repr(exc)
            os.write(write, report.encode())
            os._exit(0)
        os.close(write)
        with os.fdopen(read) as f:
            report = f.read()
        os.waitpid(pid, 0)
        child, made = (int(n) for n in report.split())
        assert child != parent and made == 1, f"the child should make its own: {report}"
        assert backend() == parent, "the parent's connection survived the child's close"
        assert db.created == 1
        assert terminate_backends(admin) == 1
        assert backend() != parent and db.created == 2, "made anew after the termination"
    finally:
        db.close()
        admin.close()


_FORK_TEST = (
    test_after_a_fork_the_child_connects_anew_and_leaves_the_parents_connection_alone.__name__
)


@pytest.mark.parametrize("ci", [None, "true"])
def test_without_postgresql_the_tests_skip_but_fail_in_ci(ci: str | None) -> None:
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["DRUMBEAT_TEST_PG_BINDIR"] = "/nonexistent"
    if ci is not None:
        env["CI"] = ci
    test = f"{__file__}::{_FORK_TEST}"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", test],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=100, check=False,
    )  # fmt: skip
    out = run.stdout + run.stderr
    assert "apt-get install postgresql" in out, out
    if ci is None:
        assert run.returncode == 0 and "1 skipped" in out, out
    else:
        assert run.returncode == 1 and "1 error" in out and "CI must run" in out, out
