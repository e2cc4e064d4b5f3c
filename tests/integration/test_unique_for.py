"""Dedup that outlives the job, on a real Redis: with ``unique_for``, a key stays taken for
that long from its enqueue, even after its job completed; the duplicate says so."""

from __future__ import annotations

import asyncio

import pytest
import redis

import drumbeat
from tests.conftest import running_worker
from tests.helpers import entries, redis_now_ms, wait_for_async


async def test_a_key_stays_taken_after_its_job_completed(app: drumbeat.App, r: redis.Redis) -> None:
    @app.task
    async def send(to: str) -> str:
        return to

    first = await send.options(key="welcome:u1", unique_for=60).aenqueue("u1")
    async with running_worker(app):
        assert await first.aresult(timeout=10) == "u1"
    assert not r.hexists(app.keys.uniq, "welcome:u1"), "the live-job dedup is released"

    again = await send.options(key="welcome:u1", unique_for=60).aenqueue("u1 again")
    plain = send.options(key="welcome:u1").enqueue("no window given")  # sync, same key
    assert again.duplicate and not again.created and again.id == first.id
    assert plain.duplicate and plain.id == first.id, "the window is the key's"
    assert "duplicate" in repr(again)
    assert entries(r, app.keys.jobs) == 0, "no job was added"
    assert await again.aresult(timeout=1) == "u1", "the handle is the first job's"
    other = await send.options(key="welcome:u2", unique_for=60).aenqueue("u2")
    assert other.created and not other.duplicate


async def test_a_key_is_free_again_once_its_window_ended(app: drumbeat.App, r: redis.Redis) -> None:
    @app.task(unique_for=0.3)  # the task's window: a call gives only its key
    async def sync_account(account: int) -> int:
        return account

    first = await sync_account.options(key="acct-7").aenqueue(7)
    async with running_worker(app):
        await first.aresult(timeout=10)
        assert (await sync_account.options(key="acct-7").aenqueue(7)).duplicate
        ends = r.zscore(app.keys.uniqends, "acct-7")
        assert ends is not None
        await wait_for_async(
            lambda: redis_now_ms(r) > ends,
            message="Redis time should pass the end of the window",
        )
        after = await sync_account.options(key="acct-7").aenqueue(8)
        assert after.created and after.id != first.id
        assert await after.aresult(timeout=10) == 8
    # Ended windows are swept by the enqueues that open windows, with their job ids.
    await asyncio.sleep(0.35)
    await sync_account.options(key="acct-8").aenqueue(8)
    assert r.zrange(app.keys.uniqends, 0, -1) == [b"acct-8"]
    assert r.hkeys(app.keys.uniqfor) == [b"acct-8"]


async def test_unique_for_needs_a_key(app: drumbeat.App) -> None:
    @app.task(unique_for=60)
    async def once() -> None: ...

    @app.task
    async def plain() -> None: ...

    with pytest.raises(drumbeat.InvalidJob, match=r"has unique_for=60 s.*options\(key=\.\.\.\)"):
        await once.aenqueue()
    with pytest.raises(drumbeat.InvalidJob, match="unique_for=5 needs key="):
        plain.options(unique_for=5)
    with pytest.raises(drumbeat.InvalidJob, match="unique_for must be a number of seconds"):
        plain.options(key="k", unique_for=-1)
    # A call's own unique_for=0 takes the task's window off for that call.
    job = await once.options(key="k", unique_for=0).aenqueue()
    assert job.created
