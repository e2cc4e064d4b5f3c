"""Bad input gets a clear error naming the problem, and nothing else is lost."""

from __future__ import annotations

from datetime import datetime

import pytest
import redis

import drumbeat
from drumbeat.testing import arun_until_idle
from tests.conftest import RedisServer, running_worker
from tests.helpers import wait_for_async


def test_enqueue_rejects_bad_options_and_writes_nothing(app: drumbeat.App, r: redis.Redis) -> None:
    @app.task
    def work(x: object) -> None: ...

    cases: list[tuple[dict[str, object], str]] = [
        ({"priority": 10}, "priority 10 is out of range; expected 0..9"),
        ({"priority": -1}, "out of range"),
        ({"priority": True}, "priority must be an int"),
        ({"delay": -1}, "delay must be a number of seconds >= 0"),
        ({"at": datetime(2030, 1, 1)}, "timezone-aware"),
        ({"key": "a{b}"}, "would break the Redis key schema"),
        ({"key": "has space"}, "would break the Redis key schema"),
        ({"key": "x" * 201}, "at most 200"),
        ({"key": ""}, "non-empty"),
    ]
    for options, message in cases:
        with pytest.raises(drumbeat.InvalidJob, match=message):
            work.options(**options).enqueue(1)  # type: ignore[arg-type]
    assert r.keys(f"drumbeat:{{{app.keys.namespace}}}:*") == []


def test_unserializable_argument_is_named(app: drumbeat.App, r: redis.Redis) -> None:
    @app.task
    def work(a: object, b: object = None) -> None: ...

    with pytest.raises(drumbeat.SerializationError, match="positional argument 1 of type set"):
        work.enqueue(1, {1, 2})
    with pytest.raises(drumbeat.SerializationError, match="keyword argument 'b' of type datetime"):
        work.enqueue(1, b=datetime.now())
    with pytest.raises(drumbeat.SerializationError, match="positional argument 0 of type float"):
        work.enqueue(float("nan"))
    assert r.keys(f"drumbeat:{{{app.keys.namespace}}}:*") == []


def test_oversized_payload_is_refused(redis_url: str, namespace: str, r: redis.Redis) -> None:
    app = drumbeat.App(redis_url, namespace=namespace, max_payload_bytes=1024)

    @app.task
    def work(blob: str) -> None: ...

    with pytest.raises(drumbeat.PayloadTooLarge, match=r"over the limit of 1,024 bytes"):
        work.enqueue("x" * 2000)
    assert work.enqueue("x" * 100).status() is drumbeat.JobStatus.QUEUED
    assert drumbeat.Settings().max_payload_bytes == 512 * 1024
    app.close()


def test_bad_names_are_refused(redis_url: str) -> None:
    with pytest.raises(ValueError, match="namespace"):
        drumbeat.App(redis_url, namespace="a}b")
    app = drumbeat.App(redis_url, namespace="fine")
    with pytest.raises(drumbeat.InvalidJob, match="task name"):
        app.task(name="bad name")(lambda: None)
    with pytest.raises(drumbeat.InvalidJob, match="task name"):
        app.enqueue("bad|name")
    with pytest.raises(drumbeat.InvalidJob, match="enqueue_many takes jobs"):
        app.enqueue_many([("not", "prepared")])  # type: ignore[list-item]
    app.close()


async def test_unknown_task_and_malformed_messages_are_dead_lettered(
    app: drumbeat.App, r: redis.Redis
) -> None:
    done: list[int] = []

    @app.task
    async def good(n: int) -> None:
        done.append(n)

    unknown = await app.aenqueue_many([drumbeat.Prepared("no.such.task", (), {})])
    # No grace for an unknown task (test_queues.py covers the grace): dead at its first claim.
    app.settings = app.settings.replace(unknown_task_grace=0.0)
    # A malformed record, a foreign message with no record at all, and garbage state.
    r.hset(app.keys.jobs, "junk1", b"\x00not a record")
    r.zadd(app.keys.ready, {"junk1": 1})
    r.zadd(app.keys.ready, {"foreign": 2})
    r.hset(app.keys.jobs, "junk2", b'{"t": 5, "c": "nope"}')
    r.hset(app.keys.state, "junk2", b"garbage|state")
    r.zadd(app.keys.ready, {"junk2": 3})
    await app.aenqueue_many([good.prepare(i) for i in range(5)])

    await arun_until_idle(app)
    with pytest.raises(drumbeat.JobFailed, match=r"no task named 'no\.such\.task'"):
        await unknown[0].aresult(timeout=5)
    assert sorted(done) == list(range(5)), "bad messages must not cost good jobs"
    dead = {m.decode() for m in r.zrange(app.keys.dead, 0, -1)}
    assert dead == {unknown[0].id, "junk1", "foreign", "junk2"}
    errors = {k.decode(): v.decode() for k, v in r.hgetall(app.keys.errors).items()}
    assert "malformed job record" in errors["junk1"]
    assert "no job record" in errors["foreign"]
    assert "malformed job record" in errors["junk2"]


async def test_unencodable_result_fails_the_job_not_the_worker(app: drumbeat.App) -> None:
    @app.task
    async def returns_set() -> set[int]:
        return {1}

    @app.task
    async def fine() -> int:
        return 1

    async with running_worker(app):
        with pytest.raises(
            drumbeat.JobFailed, match="result of type set cannot be encoded as json"
        ):
            await (await returns_set.aenqueue()).aresult(timeout=5)
        assert await (await fine.aenqueue()).aresult(timeout=5) == 1


def test_evicting_maxmemory_policy_warns(own_redis: RedisServer, own_r: redis.Redis) -> None:
    # Its own server: a server-wide setting that makes every other client warn meanwhile.
    redis_url, r = own_redis.url, own_r
    r.config_set("maxmemory-policy", "allkeys-lru")
    try:
        app = drumbeat.App(redis_url, namespace="warn")
        with pytest.warns(drumbeat.EvictionPolicyWarning, match="allkeys-lru"):
            app.redis.ping()
        app.close()
    finally:
        r.config_set("maxmemory-policy", "noeviction")
    quiet = drumbeat.App(redis_url, namespace="warn")
    quiet.redis.ping()  # filterwarnings=error: any warning here fails the test
    quiet.close()


def test_settings_are_validated() -> None:
    with pytest.raises(drumbeat.ConfigurationError, match="lease must be > 0"):
        drumbeat.Settings(lease=0)
    with pytest.raises(drumbeat.ConfigurationError, match="codec"):
        drumbeat.Settings(codec="pickle")  # type: ignore[arg-type]


async def test_worker_warns_at_start_when_redis_may_evict(
    own_app: drumbeat.App, own_r: redis.Redis
) -> None:
    app, r = own_app, own_r  # its own server, as above
    r.config_set("maxmemory-policy", "volatile-lru")
    try:
        with pytest.warns(drumbeat.EvictionPolicyWarning, match="volatile-lru"):
            async with running_worker(app) as worker:
                # The check runs before the worker registers, so once registered it has warned.
                await wait_for_async(
                    lambda: r.zscore(app.keys.workers, worker.id),
                    lambda score: score is not None,
                    message="the worker should start and register",
                )
    finally:
        r.config_set("maxmemory-policy", "noeviction")
