"""Batches: members enqueued as one group, callbacks once every member ended (``App.batch``), on
a real Redis and a real worker (docs/workflows.md, batches)."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import drumbeat
from drumbeat import BatchEnded, JobStatus, current_job
from drumbeat.batch_send import _eval, _plan, new_batch_id
from drumbeat.job import encode_success
from drumbeat.testing import arun_until_idle, run_until_idle
from tests.conftest import reap_call


def _claim(app: drumbeat.App, r: redis.Redis, worker: str = "w", n: int = 1) -> Any:
    return app.scripts.claim(worker, n, 10_000, 100).run(r).jobs


def _ack(app: drumbeat.App, r: redis.Redis, claimed: Any) -> list[int]:
    outcome = encode_success(app.codec, None, 1 << 20)
    return app.scripts.complete([(claimed.id, claimed.token, outcome, 60_000, "")]).run(r)


async def test_on_complete_runs_once_after_every_member_and_reads_the_batch(
    app: drumbeat.App,
) -> None:
    order: list[str] = []
    seen: list[Any] = []

    @app.task
    async def build(name: str) -> None:
        order.append(name)
        if name == "bad":
            raise RuntimeError("broken")

    @app.task
    async def publish(root: str) -> None:
        order.append("publish:" + root)
        batch = current_job().batch
        assert batch is not None
        seen.append((batch.id, dict(await batch.astatus()), await batch.afailed_ids()))

    @app.task
    async def notify(root: str) -> None:
        order.append("notify")

    names = ["a", "bad", "c"]
    batch = await app.abatch(
        [build.prepare(n) for n in names],
        on_complete=publish.prepare("root"),
        on_success=notify.prepare("root"),
    )
    assert batch.on_complete is not None and batch.on_success is not None
    assert await batch.on_complete.astatus() is JobStatus.WAITING
    assert dict(await batch.astatus()) == {
        "total": 3, "pending": 3, "succeeded": 0, "failed": 0, "cancelled": 0
    }  # fmt: skip
    await arun_until_idle(app)
    # Once, after all three; on_success does not run (a member failed): it is cancelled.
    assert order.count("publish:root") == 1 and order[-1] == "publish:root"
    assert sorted(order[:3]) == sorted(names) and "notify" not in order
    bad = batch.jobs[1].id
    counts = {"total": 3, "pending": 0, "succeeded": 2, "failed": 1, "cancelled": 0}
    assert seen == [(batch.id, counts, [bad])]
    assert await batch.on_success.astatus() is JobStatus.CANCELLED
    status = await batch.astatus()
    assert status.ended and status.state == "closed"


async def test_on_success_runs_when_every_member_succeeded(app: drumbeat.App) -> None:
    ran: list[str] = []

    @app.task
    async def build(name: str) -> None:
        ran.append(name)

    @app.task
    async def notify() -> None:
        ran.append("notify")
        batch = current_job().batch
        assert batch is not None and (await batch.astatus())["succeeded"] == 2

    batch = await app.abatch([build.prepare("a"), build.prepare("b")], on_success=notify.prepare())
    await arun_until_idle(app)
    assert ran[-1] == "notify" and ran.count("notify") == 1
    assert batch.on_success is not None and await batch.on_success.astatus() is JobStatus.COMPLETE


def test_wait_blocks_until_the_end_without_polling(redis_url: str, namespace: str) -> None:
    app = drumbeat.App(redis_url, namespace=namespace)
    try:

        @app.task
        def work() -> None: ...

        batch = app.batch([work.prepare() for _ in range(3)])
        with pytest.raises(drumbeat.ResultTimeout):
            batch.wait(timeout=0.2)
        r = app.redis
        before = int(r.info("stats")["total_commands_processed"])
        done: list[Any] = []
        waiter = __import__("threading").Thread(target=lambda: done.append(batch.wait(30)))
        waiter.start()
        time.sleep(1.0)  # a poller would have sent commands all along
        during = int(r.info("stats")["total_commands_processed"]) - before
        assert not done and during < 10
        run_until_idle(app)
        waiter.join(10)
        assert done and done[0].ended and done[0]["succeeded"] == 3
        assert batch.wait(0.1).ended  # an ended batch returns at once
    finally:
        app.close()


async def test_await_done_wakes_when_the_last_member_ends(app: drumbeat.App) -> None:
    @app.task
    async def work() -> None:
        await asyncio.sleep(0.05)

    batch = await app.abatch([work.prepare() for _ in range(4)])
    waiting = asyncio.create_task(batch.await_done(timeout=20))
    await asyncio.sleep(0.1)
    assert not waiting.done()
    await arun_until_idle(app)
    status = await asyncio.wait_for(waiting, 5)
    assert status.ended and status.succeeded == 4


async def test_an_open_batch_takes_members_until_closed_and_a_member_may_add(
    app: drumbeat.App,
) -> None:
    ran: list[str] = []

    @app.task
    async def child(name: str) -> None:
        ran.append(name)

    @app.task
    async def parent() -> None:
        ran.append("parent")
        batch = current_job().batch
        assert batch is not None
        await batch.aadd([child.prepare("grandchild")])  # while it runs, the batch cannot end

    @app.task
    async def done() -> None:
        ran.append("done")

    batch = await app.abatch([parent.prepare()], on_complete=done.prepare(), open=True)
    await arun_until_idle(app)
    assert "done" not in ran  # open: it cannot end yet
    await batch.aadd([child.prepare("late")])
    assert (await batch.astatus())["pending"] == 1
    assert await batch.aclose() is True and await batch.aclose() is False
    await arun_until_idle(app)
    assert ran[-1] == "done" and ran.count("done") == 1
    assert sorted(ran[:-1]) == ["grandchild", "late", "parent"]
    assert (await batch.astatus())["total"] == 3
    with pytest.raises(BatchEnded, match=batch.id):
        await batch.aadd([child.prepare("too late")])
    assert "too late" not in ran and await arun_until_idle(app) == 0


async def test_an_empty_batch_ends_when_closed(app: drumbeat.App) -> None:
    ran: list[str] = []

    @app.task
    async def done() -> None:
        ran.append("done")

    batch = await app.abatch([], on_complete=done.prepare())
    assert (await batch.astatus()).ended
    await arun_until_idle(app)
    assert ran == ["done"]


async def test_a_stale_ack_counts_nothing(app: drumbeat.App, r: redis.Redis) -> None:
    @app.task
    async def work() -> None: ...

    batch = await app.abatch([work.prepare()], on_complete=work.prepare())
    first = _claim(app, r, "a")[0]
    r.zadd(app.keys.leases, {first.id: 1})  # its lease lapses: another worker takes it over
    assert reap_call(app).run(r).requeued == 1
    second = _claim(app, r, "b")[0]
    assert _ack(app, r, first) == [0]
    failure = b'{"ok":false,"error":"stale"}'
    assert app.scripts.bury([(first.id, first.token, failure, 60_000)]).run(r) == [0]
    status = await batch.astatus()
    assert status.pending == 1 and status.succeeded == status.failed == 0
    assert _ack(app, r, second) == [1]
    assert _ack(app, r, second) == [0]  # sent again: counted once
    status = await batch.astatus()
    assert status.ended and status.succeeded == 1 and status.total == 1
    assert batch.on_complete is not None and await batch.on_complete.astatus() is JobStatus.QUEUED


async def test_a_retried_member_is_counted_once_at_its_final_outcome(app: drumbeat.App) -> None:
    attempts: list[int] = []
    seen: list[Any] = []

    @app.task(retries=2, backoff=0.01)
    async def flaky() -> None:
        attempts.append(current_job().attempt)
        status = await current_job().batch.astatus()  # type: ignore[union-attr]
        seen.append(status.pending)
        if len(attempts) < 3:
            raise RuntimeError("not yet")

    @app.task
    async def after() -> None:
        seen.append("after")

    batch = await app.abatch([flaky.prepare()], on_complete=after.prepare())
    await arun_until_idle(app)
    assert attempts == [1, 2, 3] and seen == [1, 1, 1, "after"]
    status = await batch.astatus()
    assert (status.total, status.succeeded, status.failed) == (1, 1, 0)


async def test_a_member_dead_lettered_by_its_stalls_is_counted(
    app: drumbeat.App, r: redis.Redis
) -> None:
    @app.task
    async def work() -> None: ...

    batch = await app.abatch([work.prepare()], on_complete=work.prepare())
    claimed = _claim(app, r)[0]
    r.zadd(app.keys.leases, {claimed.id: 1})
    assert claimed.id in reap_call(app, max_stalls=0).run(r).buried
    status = await batch.astatus()
    assert status.ended and status.failed == 1
    assert await batch.afailed_ids() == [claimed.id]
    assert batch.on_complete is not None and await batch.on_complete.astatus() is JobStatus.QUEUED


async def test_cancelling_a_batch_cancels_its_pending_members_and_callbacks(
    app: drumbeat.App,
) -> None:
    ran: list[str] = []

    @app.task
    async def work(name: str) -> None:
        ran.append(name)

    other = await work.aenqueue("not in the batch")
    batch = await app.abatch(
        [work.prepare(n) for n in "abc"],
        on_complete=work.prepare("complete"),
        on_success=work.prepare("success"),
    )
    assert await batch.acancel() is True and await batch.acancel() is False
    assert [await j.astatus() for j in batch.jobs] == [JobStatus.CANCELLED] * 3
    assert batch.on_complete is not None and batch.on_success is not None
    assert await batch.on_complete.astatus() is JobStatus.CANCELLED
    assert await batch.on_success.astatus() is JobStatus.CANCELLED
    status = await batch.astatus()
    assert status.ended and status.cancelled == 3 and status.state == "cancelled"
    await arun_until_idle(app)
    assert ran == ["not in the batch"] and await other.astatus() is JobStatus.COMPLETE


async def test_cancelling_one_member_counts_it_as_not_succeeded(app: drumbeat.App) -> None:
    ran: list[str] = []

    @app.task
    async def work(name: str) -> None:
        ran.append(name)

    batch = await app.abatch(
        [work.prepare("a"), work.prepare("b")],
        on_complete=work.prepare("complete"),
        on_success=work.prepare("success"),
    )
    assert await batch.jobs[0].acancel()
    await arun_until_idle(app)
    assert ran == ["b", "complete"]
    assert await batch.afailed_ids() == [batch.jobs[0].id]


async def test_what_a_batch_cannot_hold_is_refused(app: drumbeat.App) -> None:
    @app.task
    async def work() -> None: ...

    job = await work.aenqueue()
    with pytest.raises(drumbeat.InvalidJob, match="depends_on"):
        await app.abatch([work.prepare()], on_complete=work.options(depends_on=job).prepare())
    with pytest.raises(drumbeat.InvalidJob, match="dedup key"):
        await app.abatch([work.prepare()], on_complete=work.options(key="k").prepare())
    with pytest.raises(drumbeat.InvalidJob, match="delay"):
        await app.abatch([work.prepare()], on_complete=work.options(delay=1).prepare())
    with pytest.raises(BatchEnded, match="unknown"):
        await app.get_batch("f" * 32).aadd([work.prepare()])
    assert await arun_until_idle(app) == 1  # nothing of the refused ones was enqueued


async def test_a_batch_keys_are_forgotten_after_its_end(app: drumbeat.App, r: redis.Redis) -> None:
    @app.task
    async def boom() -> None:
        raise RuntimeError("no")

    batch = await app.abatch([boom.prepare() for _ in range(3)])
    await arun_until_idle(app)
    assert (await batch.astatus()).failed == 3
    assert r.hlen(app.keys.batches) > 0 and r.hlen(app.keys.members) == 0
    r.zadd(app.keys.batchttl, {batch.id: 1})  # its time is up
    reap_call(app).run(r)
    assert r.hlen(app.keys.batches) == 0 and r.zcard(app.keys.batchttl) == 0
    with pytest.raises(drumbeat.JobNotFound, match=batch.id):
        await batch.astatus()


async def test_members_of_several_queues_and_delayed_ones(app: drumbeat.App) -> None:
    ran: list[str] = []

    @app.task(queue="slow")
    async def slow(name: str) -> None:
        ran.append(name)

    @app.task
    async def done() -> None:
        ran.append("done")

    batch = await app.abatch(
        [slow.prepare("s"), slow.options(delay=0.2).prepare("later"), done.prepare()],
        on_complete=done.prepare(),
    )
    await arun_until_idle(app, queues=["default", "slow"])
    assert ran[-1] == "done" and sorted(ran[:-1]) == ["done", "later", "s"]
    assert (await batch.astatus()).succeeded == 3


async def test_a_callback_can_be_depended_on(app: drumbeat.App) -> None:
    ran: list[str] = []

    @app.task
    async def work(name: str) -> None:
        ran.append(name)
        if name == "bad":
            raise RuntimeError("no")

    batch = await app.abatch(
        [work.prepare("bad")], on_complete=work.prepare("complete"), on_success=work.prepare("ok")
    )
    assert batch.on_complete is not None and batch.on_success is not None
    after_complete = await work.options(depends_on=batch.on_complete).aenqueue("after complete")
    after_success = await work.options(depends_on=batch.on_success).aenqueue("after success")
    await arun_until_idle(app)
    assert ran == ["bad", "complete", "after complete"]
    assert await after_complete.astatus() is JobStatus.COMPLETE
    assert await after_success.astatus() is JobStatus.DEAD  # its dependency was cancelled


async def test_a_large_batch_counts_every_member(app: drumbeat.App, r: redis.Redis) -> None:
    @app.task
    async def work() -> None: ...

    @app.task
    async def done() -> None: ...

    batch = await app.abatch([work.prepare() for _ in range(3000)], on_complete=done.prepare())
    assert r.hlen(app.keys.members) == 3000
    await arun_until_idle(app, concurrency=50)
    status = await batch.astatus()
    assert status.ended and status.succeeded == 3000 and r.hlen(app.keys.members) == 0
    # The batch is a handful of fields, whatever its size: its counts, not a set of members.
    assert r.hlen(app.keys.batches) == 4  # head, n, left, end


async def test_a_nested_batch_counts_in_its_parent_after_its_callbacks(app: drumbeat.App) -> None:
    ran: list[str] = []

    @app.task
    async def work(name: str) -> None:
        ran.append(name)
        if name == "bad":
            raise RuntimeError("no")

    @app.task
    async def fan_out() -> None:
        ran.append("fan out")
        batch = current_job().batch
        assert batch is not None
        await batch.aadd_batch(
            [work.prepare("child 1"), work.prepare("bad")], on_complete=work.prepare("child done")
        )

    parent = await app.abatch(
        [fan_out.prepare()],
        on_complete=work.prepare("parent done"),
        on_success=work.prepare("parent ok"),
    )
    await arun_until_idle(app)
    assert ran[0] == "fan out" and ran[-2:] == ["child done", "parent done"]
    assert "parent ok" not in ran  # a member of the nested batch failed
    status = await parent.astatus()
    # fan_out, the nested batch (failed: a member of it failed), its on_complete
    assert (status.total, status.succeeded, status.failed) == (3, 2, 1)
    [nested] = await parent.afailed_ids()
    child = app.get_batch(nested)
    assert (await child.astatus()).failed == 1
    with pytest.raises(BatchEnded, match=parent.id):
        await parent.aadd_batch([work.prepare("too late")])
    assert "too late" not in ran and await arun_until_idle(app) == 0


async def test_cancelling_a_batch_cancels_the_batches_nested_in_it(app: drumbeat.App) -> None:
    ran: list[str] = []

    @app.task
    async def work(name: str) -> None:
        ran.append(name)

    parent = await app.abatch([], on_complete=work.prepare("parent done"), open=True)
    child = await parent.aadd_batch([work.prepare("child")], on_complete=work.prepare("done"))
    assert await parent.acancel()
    await arun_until_idle(app)
    assert ran == []
    assert (await child.astatus()).state == "cancelled"
    status = await parent.astatus()
    assert status.ended and status.pending == 0 and status.cancelled == 2  # the batch, its callback


async def test_limited_members_are_counted_as_they_end(app: drumbeat.App) -> None:
    running: list[int] = []
    most: list[int] = []

    @app.task(concurrency_limit=1)
    async def one_at_a_time(i: int) -> None:
        running.append(i)
        most.append(len(running))
        await asyncio.sleep(0.01)
        running.remove(i)

    @app.task
    async def done() -> None:
        most.append(-1)

    batch = await app.abatch(
        [one_at_a_time.prepare(i) for i in range(6)], on_complete=done.prepare()
    )
    await arun_until_idle(app, concurrency=4)
    assert max(most) == 1 and most[-1] == -1 and most.count(-1) == 1
    assert (await batch.astatus()).succeeded == 6


async def test_producer_middleware_sees_members_and_callbacks(app: drumbeat.App) -> None:
    seen: list[tuple[str, str, str]] = []

    @app.middleware
    class Note(drumbeat.Middleware):
        def before_enqueue(self, job: drumbeat.Enqueueing) -> None:
            job.headers["via"] = "batch"

        def after_enqueue(self, job: drumbeat.Enqueueing, error: BaseException | None) -> None:
            seen.append((job.task, job.id, job.headers["via"]))

    @app.task
    async def work() -> str:
        return current_job().headers["via"]

    batch = await app.abatch([work.prepare(), work.prepare()], on_complete=work.prepare())
    assert batch.on_complete is not None
    assert [s[1] for s in seen] == [*(j.id for j in batch.jobs), batch.on_complete.id]
    await arun_until_idle(app)
    assert await batch.on_complete.aresult(timeout=1) == "batch"


def _multi(r: redis.Redis, calls: list[Any]) -> list[Any]:
    with r.pipeline(transaction=True) as pipe:
        for call in calls:
            pipe.execute_command(*_eval(call))
        return pipe.execute()  # type: ignore[no-any-return]


async def test_a_batch_written_again_after_a_lost_reply_counts_nothing_twice(
    app: drumbeat.App, r: redis.Redis
) -> None:
    ran: list[str] = []

    @app.task
    async def work(name: str) -> None:
        ran.append(name)

    # The client runs a MULTI again when its reply is lost: the same calls, the same ids.
    batch_id = new_batch_id(app, [])
    members = [work.prepare(n) for n in "abc"]
    calls, _, opening, _ = _plan(
        app, batch_id, members, [("c", work.prepare("cb"))], None, add=False
    )
    assert _multi(r, [*calls, opening])[-1] == 3
    first = _claim(app, r)[0]
    assert _ack(app, r, first) == [1]  # one member ended meanwhile
    assert _multi(r, [*calls, opening])[-1] == 3
    batch = app.get_batch(batch_id)
    status = await batch.astatus()
    assert (status.total, status.pending, status.succeeded) == (3, 2, 1)
    assert r.zcard(app.keys.ready) == 2  # the ended member's copy was taken back
    # An add sent again is a repeat too.
    calls, _, adding, _ = _plan(app, batch_id, [work.prepare("d")], [], None, add=True)
    assert _multi(r, [*calls, adding])[-1] == 1
    assert _multi(r, [*calls, adding])[-1] == 1
    assert (await batch.astatus()).total == 4
    await arun_until_idle(app)
    assert sorted(ran) == ["b", "c", "cb", "d"] and ran[-1] == "cb"
    assert (await batch.astatus()).succeeded == 4


async def test_a_member_whose_dedup_key_is_taken_is_no_member(app: drumbeat.App) -> None:
    ran: list[str] = []

    @app.task
    async def work(name: str) -> None:
        ran.append(name)

    holder = await work.options(key="docs").aenqueue("holder")
    batch = await app.abatch(
        [work.options(key="docs").prepare("dup"), work.options(key="cli").prepare("cli")],
        on_complete=work.prepare("done"),
    )
    dup, cli = batch.jobs
    assert dup.duplicate and dup.id == holder.id and not cli.duplicate
    assert (await batch.astatus()).total == 1  # the job holding the key runs on its own
    await arun_until_idle(app)
    assert sorted(ran) == ["cli", "done", "holder"] and ran[-1] == "done"
    # Its key is free again once the member ended: a later batch's member takes it.
    again = await app.abatch([work.options(key="cli").prepare("cli again")])
    assert not again.jobs[0].duplicate


async def test_a_schedule_starts_a_batch(app: drumbeat.App) -> None:
    found: list[Any] = []

    @app.task
    async def build(i: int) -> int:
        return i

    @app.task
    async def publish() -> None:
        batch = current_job().batch
        assert batch is not None
        found.append(await batch.astatus())

    @app.task
    async def nightly() -> None:
        assert current_job().schedule_id == "nightly" and current_job().batch is None
        await app.abatch([build.prepare(i) for i in range(3)], on_complete=publish.prepare())

    await app.aschedule("nightly", nightly, every=3600)
    assert await app.arun_now("nightly") == 1
    assert await arun_until_idle(app) == 5  # nightly, its 3 members, the callback
    assert len(found) == 1 and found[0].succeeded == 3


# A batch drawn at random: its members' behaviours, and the batches nested in it (depth 2).
_BEHAVIOURS = st.sampled_from(["ok", "fail", "retry", "cancel"])
_LEAVES = st.lists(_BEHAVIOURS, max_size=4)
_TREES = st.tuples(_LEAVES, st.lists(st.tuples(_LEAVES, st.just([])), max_size=2))


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(tree=_TREES)
def test_random_batches_count_every_member_once_and_call_back_once(
    redis_url: str, tree: tuple[list[str], list[Any]]
) -> None:
    app = drumbeat.App(redis_url, namespace="b" + uuid.uuid4().hex[:12])
    events: list[tuple[str, str]] = []
    tries: dict[str, int] = {}
    try:

        @app.task(retries=1, backoff=0.0)
        def member(name: str, how: str) -> None:
            tries[name] = tries.get(name, 0) + 1
            events.append(("end", name))
            if how == "fail" or (how == "retry" and tries[name] == 1):
                raise RuntimeError(how)

        @app.task
        def callback(kind: str, tag: str) -> None:
            events.append((kind, tag))

        def make(leaves: list[str], tag: str, parent: Any) -> tuple[Any, list[str]]:
            members = [member.prepare(f"{tag}.{i}", how) for i, how in enumerate(leaves)]
            calls = {"on_complete": callback.prepare("complete", tag)}
            calls["on_success"] = callback.prepare("success", tag)
            made = (parent.add_batch if parent else app.batch)(members, open=True, **calls)
            for job, how in zip(made.jobs, leaves, strict=True):
                if how == "cancel":
                    assert job.cancel()
            return made, [f"{tag}.{i}" for i in range(len(leaves))]

        def ok(leaves: list[str], nested: list[Any]) -> bool:
            return all(h in ("ok", "retry") for h in leaves) and all(ok(*n) for n in nested)

        top, names = make(tree[0], "t", None)
        batches = [(top, tree[0], tree[1], "t", names)]
        for k, child in enumerate(tree[1]):
            made, child_names = make(child[0], f"t{k}", top)
            batches.append((made, child[0], [], f"t{k}", child_names))
        for made, *_ in batches:
            made.close()
        drumbeat.testing.run_until_idle(app, concurrency=4)

        for made, leaves, nested, tag, names in batches:
            status = made.status()
            assert status.ended and status.pending == 0
            assert status.total == len(leaves) + 3 * len(nested)  # a nested batch and its callbacks
            assert status.cancelled >= leaves.count("cancel")
            assert events.count(("complete", tag)) == 1
            assert events.count(("success", tag)) == (1 if ok(leaves, nested) else 0)
            started = events.index(("complete", tag))
            assert all(events.index(("end", n)) < started for n in names if ("end", n) in events)
        assert sorted(n for n, c in tries.items() if c > 1) == sorted(
            f"{tag}.{i}" for _, leaves, _, tag, _ in batches for i, h in enumerate(leaves)
            if h in ("retry", "fail")
        )  # fmt: skip
        assert app.redis.hlen(app.keys.members) == 0
    finally:
        app.close()


async def test_members_with_dependencies_are_counted_however_their_enqueue_went(
    app: drumbeat.App, r: redis.Redis
) -> None:
    ran: list[str] = []

    @app.task
    async def work(name: str) -> None:
        ran.append(name)
        if name == "boom":
            raise RuntimeError("no")

    done, failed = await work.aenqueue("done"), await work.aenqueue("boom")
    await arun_until_idle(app)
    live = await work.aenqueue("live")
    batch = await app.abatch(
        [
            work.options(depends_on=done).prepare("after done"),  # queued at once
            work.options(depends_on=live).prepare("after live"),  # waits for it
            work.options(depends_on=failed).prepare("after boom"),  # dead-lettered at once
        ],
        on_complete=work.prepare("complete"),
    )
    after_done, after_live, after_boom = batch.jobs
    assert await after_done.astatus() is JobStatus.QUEUED
    assert await after_live.astatus() is JobStatus.WAITING
    assert await after_boom.astatus() is JobStatus.DEAD
    status = await batch.astatus()
    assert (status.total, status.pending, status.failed) == (3, 2, 1)
    await arun_until_idle(app)
    assert ran[-1] == "complete" and "after boom" not in ran
    assert ran.index("after live") > ran.index("live")
    assert await batch.afailed_ids() == [after_boom.id]
    # A dependency unknown: the enqueue is refused, and nothing of the batch is written.
    before = r.hlen(app.keys.jobs)
    with pytest.raises(drumbeat.UnknownDependency):
        await app.abatch(
            [work.prepare("plain"), work.options(depends_on="f" * 32).prepare("unknown")],
            on_complete=work.prepare("never"),
        )
    assert r.hlen(app.keys.jobs) == before and r.hlen(app.keys.members) == 0
    assert await arun_until_idle(app) == 0 and "never" not in ran
