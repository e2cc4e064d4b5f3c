"""Leases and fencing at the script level: a stale worker can no longer touch a taken-over job."""

from __future__ import annotations

import redis

import drumbeat
from drumbeat.job import encode_success
from tests.conftest import reap_call
from tests.helpers import redis_now_ms, wait_for


def _expire_and_reap(app: drumbeat.App, r: redis.Redis, job_id: str) -> None:
    # Backdate the lease instead of sleeping: the reaper compares deadlines with Redis time.
    r.zadd(app.keys.leases, {job_id: 1})
    reaped = reap_call(app).run(r)
    assert reaped.requeued == 1


def test_stale_worker_is_fenced_off(app: drumbeat.App, r: redis.Redis) -> None:
    @app.task(retries=3)
    def work() -> None: ...

    job = work.enqueue()
    s = app.scripts
    first = s.claim("worker-a", 1, 10_000, 100).run(r).jobs[0]
    _expire_and_reap(app, r, job.id)
    second = s.claim("worker-b", 1, 10_000, 100).run(r).jobs[0]
    assert second.id == first.id and second.token > first.token
    assert (second.attempt, second.stalls) == (2, 1)

    stale = first.token
    outcome = encode_success(app.codec, "stale", 1 << 20)
    assert s.complete([(job.id, stale, outcome, 60_000, "")]).run(r) == [0]
    assert s.retry([(job.id, stale, 0, 0)]).run(r) == [0]
    assert s.bury([(job.id, stale, b'{"error":"x"}', 60_000)]).run(r) == [0]
    assert s.extend_leases("worker-a", 10_000, b"{}", [(job.id, stale)]).run(r).lost == [
        (job.id, stale)
    ]
    assert s.handback([(job.id, stale)]).run(r) == [0]
    # None of the refused calls wrote a result or moved the job.
    assert not r.hexists(app.keys.results, job.id)
    assert job.status() is drumbeat.JobStatus.RUNNING
    assert r.hget(app.keys.owners, job.id).startswith(f"{second.token}|worker-b|".encode())

    assert s.extend_leases("worker-b", 10_000, b"{}", [(job.id, second.token)]).run(r).lost == []
    good = encode_success(app.codec, "fresh", 1 << 20)
    assert s.complete([(job.id, second.token, good, 60_000, "")]).run(r) == [1]
    assert job.result(timeout=1) == "fresh"


def test_a_reap_holding_back_leaves_expired_leases_to_be_renewed(
    app: drumbeat.App, r: redis.Redis
) -> None:
    """Just after a slot migration (worker/housekeeping.py) a reap leaves the jobs of expired
    leases with their workers, whose heartbeats could not renew them meanwhile, and does the
    rest of its sweep."""

    @app.task
    def work() -> None: ...

    job = work.enqueue()
    claimed = app.scripts.claim("worker-a", 1, 10_000, 100).run(r).jobs[0]
    r.zadd(app.keys.leases, {job.id: 1})
    r.zadd(app.keys.expires, {"old-outcome": 1})
    r.hset(app.keys.results, "old-outcome", b"{}")
    held = reap_call(app, take_over=False).run(r)
    assert (held.requeued, held.buried) == (0, [])
    assert r.zscore(app.keys.leases, job.id) == 1, "the expired lease is left as it was"
    assert not r.hexists(app.keys.results, "old-outcome"), "the rest of the sweep went on"
    renewed = app.scripts.extend_leases("worker-a", 10_000, b"{}", [(job.id, claimed.token)])
    assert renewed.run(r).lost == [], "the worker still owns the job and renews its lease"
    assert reap_call(app).run(r).requeued == 0
    assert job.status() is drumbeat.JobStatus.RUNNING


def test_tokens_increase_across_claims(app: drumbeat.App, r: redis.Redis) -> None:
    @app.task
    def work(n: int) -> None: ...

    app.enqueue_many([work.prepare(i) for i in range(5)])
    claimed = app.scripts.claim("w", 5, 10_000, 100).run(r).jobs
    tokens = [c.token for c in claimed]
    assert tokens == sorted(tokens) and len(set(tokens)) == 5


def test_lease_expiries_are_bounded_by_max_stalls(app: drumbeat.App, r: redis.Redis) -> None:
    @app.task
    def crashy() -> None: ...

    job = crashy.enqueue()
    s = app.scripts
    for _ in range(3):
        s.claim("w", 1, 10_000, 100).run(r)
        r.zadd(app.keys.leases, {job.id: 1})
        reaped = reap_call(app, max_stalls=2).run(r)
    assert reaped.buried == [job.id]
    assert job.status() is drumbeat.JobStatus.DEAD
    err = app.redis.hget(app.keys.errors, job.id)
    assert err is not None and b"lease expired 3 times" in err


def test_handback_keeps_place_and_attempt(app: drumbeat.App, r: redis.Redis) -> None:
    @app.task
    def work(n: int) -> None: ...

    app.enqueue_many([work.prepare(i) for i in range(3)])
    first = app.scripts.claim("w", 1, 10_000, 100).run(r).jobs[0]
    assert app.scripts.handback([(first.id, first.token)]).run(r) == [1]
    again = app.scripts.claim("w", 1, 10_000, 100).run(r).jobs[0]
    assert again.id == first.id, "a handed-back job goes back to the front of its level"
    assert again.attempt == 1, "a hand-back does not spend an attempt"


def test_worker_heartbeat_is_recorded(app: drumbeat.App, r: redis.Redis) -> None:
    app.scripts.extend_leases("w1", 10_000, b'{"pid": 1}', []).run(r)
    sec, _ = r.time()
    score = r.zscore(app.keys.workers, "w1")
    assert score is not None and abs(score / 1000 - sec) < 5
    assert r.hget(app.keys.workerinfo, "w1") == b'{"pid": 1}'
    # Swept once it is older than the 1 ms TTL by Redis time (what the reaper compares).
    wait_for(lambda: redis_now_ms(r), lambda now: now > score + 1, message="Redis time moves")
    reap_call(app, worker_ttl_ms=1).run(r)
    assert r.zscore(app.keys.workers, "w1") is None, "silent workers are swept"


def test_reap_says_when_a_sweep_hit_its_limit(app: drumbeat.App, r: redis.Redis) -> None:
    r.zadd(app.keys.expires, {f"j{i}": 1 for i in range(25)})
    r.hset(app.keys.results, mapping={f"j{i}": b"{}" for i in range(25)})
    passes = []
    while True:
        reaped = reap_call(app, limit=10).run(r)
        passes.append(reaped.more)
        if not reaped.more:
            break
    assert passes == [True, True, False]
    assert r.hlen(app.keys.results) == 0
