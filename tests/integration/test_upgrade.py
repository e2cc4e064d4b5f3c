"""An app upgraded from drumbeat with the timing wheel (the store before the time slots) keeps
its schedules: a worker's start moves them into the time slots (schedules/upgrade.py), from the
keys the old code wrote (`tests/fixtures/wheel_keys.json`, made by `tests/fixtures/
wheel_keys.py` with drumbeat at commit a3577d4): totals, pauses, limits, routes, and a run
queued as a job, which runs and settles into the time slots."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import redis

import drumbeat
from drumbeat.protocol import PAUSED_AT, QUEUED_AT
from drumbeat.schedules.upgrade import MOVED, move_wheel
from drumbeat.serialization import CODECS
from drumbeat.testing import arun_until_idle

FIXTURE = Path(__file__).parents[1] / "fixtures" / "wheel_keys.json"


def _load_old_keys(r: redis.Redis, namespace: str) -> None:
    """The keys the old code wrote, under ``namespace``."""
    dump: dict[str, dict[str, Any]] = json.loads(FIXTURE.read_text())
    for old_key, item in dump.items():
        key = old_key.replace("{old}", "{" + namespace + "}")
        kind, value = item["type"], item["value"]
        if kind == "hash":
            r.hset(key, mapping=value)
        elif kind == "zset":
            r.zadd(key, {member: score for member, score in value})
        elif kind == "list":
            r.rpush(key, *value)
        elif kind == "set":
            r.sadd(key, *value)
        else:
            r.set(key, value)


def _as_msgpack(r: redis.Redis, namespace: str) -> None:
    """The old keys as an app with the msgpack codec wrote them: each spec (a schedule's, and
    the queued run's in `jobs`) binary, the same array msgpack-encoded."""
    msgpack = CODECS["msgpack"]
    for key in r.scan_iter(f"drumbeat:{{{namespace}}}:schedules:*"):
        for sid, record in r.hgetall(key).items():
            *fields, spec = record.split(b"|", 10)
            r.hset(key, sid, b"|".join([*fields, msgpack.dumps(json.loads(spec))]))
    jobs = f"drumbeat:{{{namespace}}}:jobs"
    for job_id, record in r.hgetall(jobs).items():
        name, _, spec = record.partition(b"|")
        r.hset(jobs, job_id, name + b"|" + msgpack.dumps(json.loads(spec)))


def _app(redis_url: str, namespace: str, codec: str = "json") -> drumbeat.App:
    app = drumbeat.App(redis_url, namespace=namespace, codec=codec)  # type: ignore[arg-type]
    app.task(name="tick")(_tick)
    app.task(name="build", queue="builds")(_build)
    return app


RAN: list[tuple[str, int]] = []


async def _tick(n: int) -> None:
    RAN.append(("tick", n))


async def _build(n: int) -> None:
    RAN.append(("build", n))


def _wheel_keys(r: redis.Redis, namespace: str) -> list[bytes]:
    found = [*r.scan_iter(match=f"drumbeat:{{{namespace}}}:wheel:*")]
    found += r.scan_iter(match=f"drumbeat:{{{namespace}}}:schedules:*")
    return found + [m for m in r.zrange(f"drumbeat:{{{namespace}}}:due", 0, -1) if m[:2] == b"w:"]


def test_the_wheels_schedules_move_into_the_time_slots_once(
    redis_url: str, namespace: str, r: redis.Redis
) -> None:
    _load_old_keys(r, namespace)
    app = _app(redis_url, namespace)
    assert app.get_schedule("plain") is None, "not read from the wheel: it moves first"
    moved = move_wheel(app.redis, app.scheduler.shards)
    assert (moved.waiting, moved.paused, moved.queued, moved.kept, moved.left) == (2, 1, 1, 0, 0)
    assert _wheel_keys(r, namespace) == [], "the wheel's keys and markers are gone"
    assert r.get(app.keys.upgraded) == MOVED.encode()
    plain, paused, limited, routed = (app.get_schedule(i) for i in
                                      ("plain", "paused", "limited", "routed"))  # fmt: skip
    assert plain is not None and plain.runs == 2 and plain.args == [1]
    assert plain.next_due_ms is not None and plain.last_run_ms is not None
    assert paused is not None and paused.paused and r.hget(app.keys.where, "paused") == b"p"
    assert limited is not None and limited.cadence.every == 3600 and limited.next_due_ms
    assert routed is not None and routed.queue == "builds" and routed.next_due_ms is None
    assert r.hget(app.keys.where, "routed") == QUEUED_AT.encode()
    assert r.hget(app.keys.jobs, "s:routed") == b"build|" + r.hget(app.keys.jobs, "s:routed")[6:]
    assert sorted(i.id for i in app.schedules()) == ["limited", "paused", "plain", "routed"]
    again = move_wheel(app.redis, app.scheduler.shards)
    assert again.total == 0, "moved once"
    assert PAUSED_AT == "p"
    app.close()


def test_a_schedule_registered_again_before_the_move_keeps_its_new_definition(
    redis_url: str, namespace: str, r: redis.Redis
) -> None:
    _load_old_keys(r, namespace)
    app = _app(redis_url, namespace)
    assert app.schedule_many([drumbeat.Schedule("plain", "tick", every=30, args=[9])]) == [1]
    moved = move_wheel(app.redis, app.scheduler.shards)
    assert moved.kept == 1 and moved.waiting == 1
    info = app.get_schedule("plain")
    assert info is not None and info.args == [9] and info.cadence.every == 30
    app.close()


# msgpack: the time slots read entries as text, and a binary spec once stopped every run.
@pytest.mark.parametrize("codec", ["json", "msgpack"])
async def test_a_worker_moves_the_wheel_at_its_start_and_runs_every_schedule(
    redis_url: str, namespace: str, r: redis.Redis, codec: str
) -> None:
    _load_old_keys(r, namespace)
    if codec == "msgpack":
        _as_msgpack(r, namespace)
    app = _app(redis_url, namespace, codec)
    RAN.clear()
    try:
        # The routed run the old worker queued runs in its queue; the others were due at the
        # old code's times, since passed (or not yet, just after the fixture was made).
        ran = await arun_until_idle(app, queues=["default", "builds"])
        assert r.get(app.keys.upgraded), "moved at its start"
        assert 1 <= ran <= 3 and ("build", 4) in RAN, RAN
        # Run now those not run already (a run now of a schedule due already adds none).
        made = await app.arun_now("plain", "limited")
        assert await arun_until_idle(app, queues=["default", "builds"]) == made
        assert set(RAN) == {("build", 4), ("tick", 1), ("tick", 3)}, "all but the paused one"
        infos = {i.id: i for i in await app.aschedules()}
        assert all(i.next_due_ms for i in infos.values() if not i.paused), "all settled"
        assert infos["plain"].runs >= 3, "its two runs under the wheel, and one at least"
        assert infos["routed"].runs == 1 and infos["limited"].runs >= 1
        assert infos["paused"].paused and infos["paused"].runs == 0
        assert _wheel_keys(r, namespace) == []
        assert not r.hexists(app.keys.jobs, "s:routed")
        assert not r.hexists(app.keys.state, "s:routed")
    finally:
        await app.aclose()


@pytest.mark.parametrize("code", [-4])
def test_a_bucket_that_cannot_move_is_logged_and_left_for_the_next_start(
    redis_url: str, namespace: str, r: redis.Redis, code: int, caplog: pytest.LogCaptureFixture
) -> None:
    _load_old_keys(r, namespace)
    broken = f"drumbeat:{{{namespace}}}:schedules:9125"
    r.hset(broken, "plain", "not a record")
    app = _app(redis_url, namespace)
    with caplog.at_level("ERROR", logger="drumbeat.upgrade"):
        moved = move_wheel(app.redis, app.scheduler.shards)
    assert moved.left == 1 and moved.total == 3
    assert any("cannot be read" in m for m in caplog.messages), caplog.messages
    assert r.get(app.keys.upgraded) is None, "tried again at the next start"
    assert r.hexists(broken, "plain")
    app.close()
