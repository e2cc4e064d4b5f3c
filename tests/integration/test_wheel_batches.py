"""The schedule scripts' batched writes (issue 15, Redis CPU per run) keep what the per-item
writes did: a bucket with more due runs than one read takes them all, bucket markers end at each
bucket's earliest due time, a settled run's record is what the full parse and format gave, and
the lateness histogram adds up across calls and windows."""

from __future__ import annotations

import re
from pathlib import Path

import redis

import drumbeat
from drumbeat import admin, protocol
from drumbeat.keys import bucket_of
from drumbeat.replies import Claimed
from drumbeat.schedule import Record, parse_record
from drumbeat.scripts import Scripts
from tests.helpers import leased

LIB = (Path(protocol.__file__).parent / "lua" / "_lib.lua").read_text()
WHEEL_READ = int(re.search(r"^local WHEEL_READ = (\d+)", LIB, re.M).group(1))  # type: ignore[union-attr]
TASK = "tasks.ping"


def _now_ms(r: redis.Redis) -> int:
    sec, usec = r.time()
    return int(sec) * 1000 + int(usec) // 1000


def _ids_in_bucket(count: int, bucket: int | None = None) -> list[str]:
    """``count`` schedule ids that share one wheel bucket (``bucket``, or the first id's)."""
    found: list[str] = []
    i = 0
    while len(found) < count:
        candidate = f"b{i}"
        i += 1
        b = bucket_of(candidate)
        if bucket is None:
            bucket = b
        if b == bucket:
            found.append(candidate)
    return found


def _put(
    app: drumbeat.App, r: redis.Redis, due: dict[str, int], gen: int = 1, priority: int = 0
) -> None:
    """Schedules ``due`` (id -> due ms) of the ping task, markers at their buckets' earliest."""
    keys = app.scheduler.shards[0]
    r.hset(keys.tasks, mapping={TASK: 7, "#7": TASK, "#": 7})
    for schedule_id, at in due.items():
        b = bucket_of(schedule_id)
        # gen|grid|flags|runs|failures|misfires|last_start|last_ms|task|spec: the layout
        # before `late`, which the scripts still read (and upgrade when they write the record)
        r.hset(keys.schedules(b), schedule_id, f"{gen}|{at}|{priority}|3|1|2||5|7|[[],{{}}]")
        r.zadd(keys.wheel(b), {schedule_id: at})
        r.zadd(keys.due, {protocol.wheel_marker(b): at}, lt=True)


def test_a_bucket_with_more_due_runs_than_one_read_gives_them_all(
    app: drumbeat.App, r: redis.Redis
) -> None:
    keys, scripts = app.scheduler.shards[0], Scripts(app.scheduler.shards[0])
    now = _now_ms(r)
    ids = _ids_in_bucket(WHEEL_READ + 5)
    bucket = bucket_of(ids[0])
    later = now + 3_600_000
    _put(app, r, {i: now - 1000 - n for n, i in enumerate(ids[:-1])} | {ids[-1]: later})
    result = scripts.promote_runs([bucket], "w1", 100, 60_000).run(r)
    taken = sorted(job.id for job in result.jobs)
    assert taken == sorted(protocol.RUN_PREFIX + i for i in ids[:-1]), (
        f"every due run of the bucket ({len(ids) - 1}), got {len(taken)}"
    )
    assert r.zrange(keys.wheel(bucket), 0, -1) == [ids[-1].encode()], "only the later one waits"
    assert r.zscore(keys.due, protocol.wheel_marker(bucket)) == later, (
        "the bucket's marker should be at its next due time"
    )
    # Each run's lateness is counted from its due time (at least 1,000 ms here).
    held = {k.decode(): int(v) for k, v in r.hgetall(keys.lateness).items()}
    counted = sum(v for k, v in held.items() if k.startswith("c") and k != "cs")
    assert counted == len(ids) - 1, f"one lateness sample per run, got {held}"
    late = held["cs"] / (len(ids) - 1)
    assert 1000 <= late < 60_000, f"lateness from each run's due time (>= 1 s ago): {late} ms"
    run = next(j for j in result.jobs if j.id == protocol.RUN_PREFIX + ids[0])
    assert run.extra == f"{now - 1000}:{now - 1000}:1:0", "the run's due:grid:gen:manual"


def test_runs_of_mixed_priorities_are_taken_best_first_and_the_rest_queued(
    app: drumbeat.App, r: redis.Redis
) -> None:
    keys, scripts = app.scheduler.shards[0], Scripts(app.scheduler.shards[0])
    now = _now_ms(r)
    ids = _ids_in_bucket(4)
    # The due order is ids[0] first; the priority 5 ones come later and must still go first.
    _put(app, r, {ids[0]: now - 4000, ids[1]: now - 3000})
    _put(app, r, {ids[2]: now - 2000, ids[3]: now - 1000}, priority=5)
    taken = scripts.promote_runs([bucket_of(ids[0])], "w1", 2, 60_000).run(r).jobs
    assert [j.id for j in taken] == ["s:" + ids[2], "s:" + ids[3]], "priority 5 first, in order"
    assert r.zrange(keys.ready, 0, -1) == [b"s:" + ids[0].encode(), b"s:" + ids[1].encode()]


def test_markers_of_every_bucket_a_claim_passes_are_rescored_or_dropped(
    app: drumbeat.App, r: redis.Redis
) -> None:
    keys, scripts = app.scheduler.shards[0], Scripts(app.scheduler.shards[0])
    now = _now_ms(r)
    a, a_later = _ids_in_bucket(2)
    b = next(i for i in (f"c{n}" for n in range(10_000)) if bucket_of(i) != bucket_of(a))
    later = now + 3_600_000
    _put(app, r, {a: now - 2000, a_later: later, b: now - 1000})
    result = scripts.promote_runs([bucket_of(a), bucket_of(b)], "w1", 100, 60_000).run(r)
    assert sorted(job.id for job in result.jobs) == ["s:" + a, "s:" + b]
    assert r.zscore(keys.due, protocol.wheel_marker(bucket_of(a))) == later
    assert r.zscore(keys.due, protocol.wheel_marker(bucket_of(b))) is None, (
        "an emptied bucket's marker should go"
    )


def _finish(
    app: drumbeat.App, r: redis.Redis, job: Claimed, outcome: str, next_grid: int
) -> list[int]:
    """Settles ``job`` (a run of generation 1) after 42 ms, its next run at ``next_grid`` + 7."""
    scripts = Scripts(app.scheduler.shards[0])
    due = int(job.extra.split(":")[0])
    item = (job.id, job.token, outcome, 42, 1, next_grid, next_grid + 7, "boom", due)
    return scripts.finish_runs([item]).run(r)


def test_a_settled_run_rewrites_its_record_field_by_field(
    app: drumbeat.App, r: redis.Redis
) -> None:
    keys, scripts = app.scheduler.shards[0], Scripts(app.scheduler.shards[0])
    now = _now_ms(r)
    ok, fail, skip, regen, other = _ids_in_bucket(5)
    bucket = bucket_of(ok)
    grid = now - 1000
    _put(app, r, {ok: grid, fail: grid, skip: grid, regen: grid})
    # A schedule of another bucket due earlier than these runs' next ones keeps its marker.
    elsewhere = next(i for i in (f"e{n}" for n in range(10_000)) if bucket_of(i) != bucket)
    _put(app, r, {elsewhere: now + 1000, other: now + 3_600_000})
    jobs = {j.id[2:]: j for j in scripts.promote_runs([bucket], "w1", 100, 60_000).run(r).jobs}
    assert set(jobs) == {ok, fail, skip, regen}
    owners = {i: r.hget(keys.owners, "s:" + i) for i in jobs}
    started = {i: int(o.decode().rsplit("|", 1)[1]) for i, o in owners.items() if o}
    r.zadd(keys.due, {protocol.wheel_marker(bucket_of(elsewhere)): now + 1000})
    next_grid = now + 10_000
    # Bump the generation of `regen` while its run is in flight (a changed definition).
    raw = r.hget(keys.schedules(bucket), regen)
    assert raw is not None
    r.hset(keys.schedules(bucket), regen, b"2" + raw[1:])
    # The earliest next run first: later ones must not push the bucket's marker back (LT).
    assert _finish(app, r, jobs[regen], "ok", next_grid) == [1]
    assert _finish(app, r, jobs[ok], "ok", next_grid) == [1]
    assert _finish(app, r, jobs[fail], "fail", next_grid) == [1]
    assert _finish(app, r, jobs[skip], "skip", next_grid) == [1]

    def record(i: str) -> Record:
        raw = r.hget(keys.schedules(bucket), i)
        assert raw is not None
        return parse_record(raw)

    spec = b"[[],{}]"
    late = {i: at - grid for i, at in started.items()}  # each run was due at `grid`
    assert record(ok) == Record(
        1, next_grid, 0, False, 4, 1, 2, started[ok], 42, late[ok], "7", spec
    )
    assert record(fail) == Record(
        1, next_grid, 0, False, 4, 2, 2, started[fail], 42, late[fail], "7", spec
    )
    assert record(skip) == Record(1, next_grid, 0, False, 3, 1, 3, None, 5, 0, "7", spec)
    # Another generation: the grid stays, its next run is due at its own grid slot.
    assert record(regen) == Record(
        2, grid, 0, False, 4, 1, 2, started[regen], 42, late[regen], "7", spec
    )
    assert r.hget(keys.faults, fail) == b"boom"
    wheel = dict(r.zrange(keys.wheel(bucket), 0, -1, withscores=True))
    assert wheel == {
        ok.encode(): next_grid + 7,
        fail.encode(): next_grid + 7,
        skip.encode(): next_grid + 7,
        regen.encode(): grid,
        other.encode(): now + 3_600_000,
    }
    assert r.zscore(keys.due, protocol.wheel_marker(bucket)) == grid, (
        "pulled forward to the earliest"
    )
    assert r.zscore(keys.due, protocol.wheel_marker(bucket_of(elsewhere))) == now + 1000


def test_lateness_adds_up_within_a_window_and_a_reused_slot_starts_over(
    app: drumbeat.App, r: redis.Redis
) -> None:
    body = """
      local samples = {}
      for i = 2, #ARGV do samples[#samples + 1] = tonumber(ARGV[i]) end
      record_lateness(KEYS[1], tonumber(ARGV[1]), samples)
    """
    key = app.keys.lateness

    def record(now: int, *samples: int) -> None:
        r.eval(LIB + "\n" + body, 1, key, now, *samples)

    span = protocol.LATENESS_WINDOW_MS
    now = 1_700_000_120_000  # the start of a window
    window, slot = now // span, (now // span) % protocol.LATENESS_WINDOWS
    record(now, 5, 100)
    record(now + 1, 5, 3000)
    record(now + 2, 50)  # below the window's max, which stays
    record(now + span, 9)  # the next slot
    bin_ = protocol.lateness_bin
    held = {k.decode(): int(v) for k, v in r.hgetall(key).items()}
    assert held[f"w{slot}"] == window and held[f"m{slot}"] == 3000
    assert held[f"b{slot}:{bin_(5)}"] == 2 and held[f"b{slot}:{bin_(3000)}"] == 1
    assert held[f"c{bin_(5)}"] == 2 and held["cs"] == 5 + 100 + 5 + 3000 + 50 + 9
    # The same slot, LATENESS_WINDOWS windows later: its counts and max start over.
    later = now + protocol.LATENESS_WINDOWS * span
    record(later, 7)
    held = {k.decode(): int(v) for k, v in r.hgetall(key).items()}
    mine = {k: v for k, v in held.items() if k.startswith((f"b{slot}:", f"m{slot}", f"w{slot}"))}
    assert mine == {f"w{slot}": window + protocol.LATENESS_WINDOWS, f"m{slot}": 7,
                    f"b{slot}:{bin_(7)}": 1}  # fmt: skip
    nxt = (slot + 1) % protocol.LATENESS_WINDOWS
    assert held[f"m{nxt}"] == 9, "another slot's window is kept"
    assert held[f"c{bin_(5)}"] == 2 and held[f"c{bin_(7)}"] == 1, "cumulative counts keep all"
    assert held["cs"] == 5 + 100 + 5 + 3000 + 50 + 9 + 7


def test_one_settle_of_runs_from_two_buckets_names_each_buckets_keys_once(
    app: drumbeat.App, r: redis.Redis
) -> None:
    """The runs of a bucket fall due and end together: their keys go once per call, and each
    run is put back in its own bucket, in whatever order the runs come."""
    keys, scripts = app.scheduler.shards[0], Scripts(app.scheduler.shards[0])
    now = _now_ms(r)
    a = _ids_in_bucket(3)
    b = _ids_in_bucket(
        2, next(bucket_of(f"o{n}") for n in range(100) if bucket_of(f"o{n}") != bucket_of(a[0]))
    )
    _put(app, r, dict.fromkeys(a + b, now - 1000))
    claimed = scripts.promote_runs([bucket_of(a[0]), bucket_of(b[0])], "w1", 100, 60_000).run(r)
    jobs = {j.id[2:]: j for j in claimed.jobs}
    order = [a[0], b[0], a[1], b[1], a[2]]  # interleaved
    items = [
        (jobs[i].id, jobs[i].token, "ok", 1, 1, now + 60_000 + n, now + 60_000 + n, "", now - 1000)
        for n, i in enumerate(order)
    ]
    call = scripts.finish_runs(items)
    assert len(call.keys) == 7 + 2 * 2, f"two buckets' keys once each: {call.keys}"
    assert call.run(r) == [1] * 5
    for n, i in enumerate(order):
        assert r.zscore(keys.wheel(bucket_of(i)), i) == now + 60_000 + n, f"{i} in its bucket"
        assert not r.hexists(keys.owners, "s:" + i)
    assert r.zscore(keys.due, protocol.wheel_marker(bucket_of(a[0]))) == now + 60_000
    assert r.zscore(keys.due, protocol.wheel_marker(bucket_of(b[0]))) == now + 60_001


def _claim_three_due_runs(
    scripts: Scripts, app: drumbeat.App, r: redis.Redis
) -> tuple[int, list[Claimed]]:
    """Three runs of one bucket, due a second ago, claimed by "w1": the claim's time and jobs."""
    now = _now_ms(r)
    ids = _ids_in_bucket(3)
    _put(app, r, dict.fromkeys(ids, now - 1000))
    jobs = scripts.promote_runs([bucket_of(ids[0])], "w1", 100, 60_000).run(r).jobs
    assert len(jobs) == 3
    return now, jobs


def _settle_as_ok(scripts: Scripts, r: redis.Redis, jobs: list[Claimed], now: int) -> None:
    """Settles ``jobs`` (claimed at ``now`` by _claim_three_due_runs) as runs that went well."""
    items = [(j.id, j.token, "ok", 1, 1, now + 60_000, now + 60_000, "", now - 1000) for j in jobs]
    assert scripts.finish_runs(items).run(r) == [1] * 3


def test_state_and_owners_stay_hash_tables_when_few_claims_are_held(
    app: drumbeat.App, r: redis.Redis
) -> None:
    """Under 512 fields Redis keeps a hash as a listpack, where each field read, write and
    delete scans the whole hash, and drops the key with its last field: each claim then wrote
    into a listpack field by field (27,000 instructions an entry for 600, `bench.redis_cpu`)."""
    keys, scripts = app.scheduler.shards[0], Scripts(app.scheduler.shards[0])
    now, jobs = _claim_three_due_runs(scripts, app, r)
    for key in (keys.state, keys.owners):
        assert r.object("encoding", key) == b"hashtable", f"{key} with 3 fields"
    _settle_as_ok(scripts, r, jobs, now)
    for key in (keys.state, keys.owners):
        assert r.hkeys(key) == [protocol.KEEP_FIELD.encode()], f"{key}: only the kept field"
        assert r.object("encoding", key) == b"hashtable", f"{key} stays a hash table"


def test_leases_stay_a_skiplist_when_few_claims_are_held(app: drumbeat.App, r: redis.Redis) -> None:
    """Under 128 members Redis keeps a sorted set as a listpack, where each ZADD scans it (for
    the member, then for its place among the equal deadlines of a claim), and drops the key with
    its last member: each claim then built `leases` lease by lease (an eighth of claiming a run,
    `bench.redis_cpu harness --whole-buckets --callgrind`). The kept member is no lease: the
    reaper, status and the autoscaler's busy slots leave it out."""
    keys, scripts = app.scheduler.shards[0], Scripts(app.scheduler.shards[0])
    now, jobs = _claim_three_due_runs(scripts, app, r)
    assert r.object("encoding", keys.leases) == b"skiplist", "3 leases"
    assert leased(r, keys.leases) == 3
    assert admin.running_jobs(app)[1] == 3, "status counts leases, not the kept member"
    assert [job.id for job in admin.running_jobs(app)[2]] == sorted(j.id for j in jobs)
    _settle_as_ok(scripts, r, jobs, now)
    assert r.zrange(keys.leases, 0, -1, withscores=True) == [
        (protocol.LEASES_KEEP.encode(), float("inf"))
    ]
    assert r.object("encoding", keys.leases) == b"skiplist", "stays a skiplist"
    assert admin.running_jobs(app)[1] == 0 and admin.running_jobs(app)[2] == []
    reaped = scripts.reap(
        max_stalls=3, limit=100, dead_ttl_ms=60_000, worker_ttl_ms=60_000, result_ttl_ms=60_000
    ).run(r)
    assert (reaped.requeued, reaped.buried) == (0, []), "the kept member is no lapsed lease"
    assert r.zscore(keys.leases, protocol.LEASES_KEEP) == float("inf")


def test_jobs_and_state_are_hash_tables_from_the_first_run_queued_or_job_enqueued(
    app: drumbeat.App, r: redis.Redis
) -> None:
    """The same for `jobs`: runs a claim cannot start wait in `ready` with their spec in `jobs`,
    which was a listpack for every burst of fewer than 512 (a sixth of a run's Redis
    instructions went to scanning it, `bench.redis_cpu --whole-buckets`); and for a namespace
    whose first write is an enqueue."""
    keys, scripts = app.scheduler.shards[0], Scripts(app.scheduler.shards[0])
    now = _now_ms(r)
    ids = _ids_in_bucket(3)
    _put(app, r, dict.fromkeys(ids, now - 1000))
    taken = scripts.promote_runs([bucket_of(ids[0])], "w1", 1, 60_000).run(r).jobs
    assert len(taken) == 1 and r.zcard(keys.ready) == 2, "two runs wait in ready"
    for key in (keys.jobs, keys.state):
        assert r.object("encoding", key) == b"hashtable", f"{key} with 2 queued runs"
    other = drumbeat.App(app.settings.url, namespace=app.settings.namespace + "e")
    try:
        other.enqueue_many([drumbeat.Prepared("t.x", [], {})])
        for key in (other.keys.jobs, other.keys.state):
            assert r.object("encoding", key) == b"hashtable", f"{key} after one enqueue"
    finally:
        other.close()
