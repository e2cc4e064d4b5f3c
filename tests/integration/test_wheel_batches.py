"""The schedule scripts' batched writes (issue 15, Redis CPU per run) keep what the per-item
writes did: a bucket with more due runs than one read takes them all, bucket markers end at each
bucket's earliest due time, a settled run's record is what the full parse and format gave, and
the lateness histogram adds up across calls and windows."""

from __future__ import annotations

import re
import time
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


def _id_in_another_bucket(schedule_id: str) -> str:
    """A schedule id whose wheel bucket is not ``schedule_id``'s."""
    return next(
        i for i in (f"c{n}" for n in range(10_000)) if bucket_of(i) != bucket_of(schedule_id)
    )


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


def test_runs_of_mixed_priorities_are_taken_best_first_and_the_rest_stay_due_in_their_bucket(
    app: drumbeat.App, r: redis.Redis
) -> None:
    """A claim with no room for every due run leaves the rest in their bucket, due, and its
    marker at the first of them: queued in `ready` instead, each cost writes to `state`,
    `ready` and `jobs` and their reads back, so a pool that fell behind fell further behind."""
    keys, scripts = app.scheduler.shards[0], Scripts(app.scheduler.shards[0])
    now = _now_ms(r)
    ids = _ids_in_bucket(4)
    bucket = bucket_of(ids[0])
    # The due order is ids[0] first; the priority 5 ones come later and must still go first.
    _put(app, r, {ids[0]: now - 4000, ids[1]: now - 3000})
    _put(app, r, {ids[2]: now - 2000, ids[3]: now - 1000}, priority=5)
    taken = scripts.promote_runs([bucket], "w1", 2, 60_000).run(r).jobs
    assert [j.id for j in taken] == ["s:" + ids[2], "s:" + ids[3]], "priority 5 first, in order"
    assert r.zcard(keys.ready) == 0, "nothing queued"
    assert r.hmget(keys.state, ["s:" + ids[0], "s:" + ids[1]]) == [None, None]
    assert r.zrange(keys.wheel(bucket), 0, -1, withscores=True) == [
        (ids[0].encode(), now - 4000),
        (ids[1].encode(), now - 3000),
    ], "the two left wait in their bucket at their due times"
    assert r.zscore(keys.due, protocol.wheel_marker(bucket)) == now - 4000, "due at the first"
    # The next claim of any worker takes them, due order, with their lateness from their due.
    claim = scripts.claim("w2", 10, 60_000, 100, [bucket]).run(r)
    assert [j.id for j in claim.jobs] == ["s:" + ids[0], "s:" + ids[1]]
    assert [j.extra.split(":")[0] for j in claim.jobs] == [str(now - 4000), str(now - 3000)]
    assert r.zcard(keys.wheel(bucket)) == 0


def test_runs_are_queued_by_priority_while_jobs_wait_in_ready(
    app: drumbeat.App, r: redis.Redis
) -> None:
    """With jobs waiting in `ready`, priority decides across them and the due runs: every due
    run read is queued there and the best are popped."""
    keys, scripts = app.scheduler.shards[0], Scripts(app.scheduler.shards[0])
    now = _now_ms(r)
    ids = _ids_in_bucket(3)
    _put(app, r, {ids[0]: now - 3000, ids[1]: now - 2000, ids[2]: now - 1000}, priority=5)
    app.enqueue_many(
        [
            drumbeat.Prepared("tasks.urgent", [], {}, drumbeat.Options(priority=9)),
            drumbeat.Prepared("tasks.idle", [], {}, drumbeat.Options(priority=0)),
        ]
    )
    taken = scripts.promote_runs([bucket_of(ids[0])], "w1", 2, 60_000).run(r).jobs
    assert taken[0].priority == 9 and not taken[0].id.startswith("s:"), "the urgent job first"
    assert taken[1].id == "s:" + ids[0], "then the runs of priority 5, due order"
    queued = [m.decode() for m in r.zrange(keys.ready, 0, -1)]
    assert queued[:2] == ["s:" + ids[1], "s:" + ids[2]] and len(queued) == 3, "idle job last"
    assert r.zcard(keys.wheel(bucket_of(ids[0]))) == 0, "every due run left its bucket"


def test_a_claim_opens_buckets_only_until_its_room_is_filled(
    app: drumbeat.App, r: redis.Redis
) -> None:
    """Buckets past the one that fills the room are not read: a passed one keeps its due
    marker, a reported one (stepped aside by the claim) goes back to its bucket's head."""
    keys, scripts = app.scheduler.shards[0], Scripts(app.scheduler.shards[0])
    now = _now_ms(r)
    first = _ids_in_bucket(3)
    others = [
        _ids_in_bucket(2, b)
        for b in sorted({bucket_of(f"o{n}") for n in range(200)} - {bucket_of(first[0])})[:2]
    ]
    _put(app, r, dict.fromkeys(first, now - 5000))
    _put(app, r, {others[0][0]: now - 4000, others[0][1]: now - 3000})
    _put(app, r, {others[1][0]: now - 2000, others[1][1]: now - 1000})
    b0, b1, b2 = bucket_of(first[0]), bucket_of(others[0][0]), bucket_of(others[1][0])
    # Passed buckets (a claim): the room of 2 is filled by the first; the others keep theirs.
    claim = scripts.claim("w1", 2, 60_000, 100, [b0, b1]).run(r)
    assert len(claim.jobs) == 2 and all(j.id[2:] in first for j in claim.jobs)
    assert r.zcard(keys.wheel(b0)) == 1 and r.zcard(keys.wheel(b1)) == 2
    assert r.zscore(keys.due, protocol.wheel_marker(b0)) == now - 5000
    assert r.zscore(keys.due, protocol.wheel_marker(b1)) == now - 4000, "not opened: as it was"
    # Reported buckets (promote_runs), their markers stepped aside for a second by the claim.
    for b in (b0, b1, b2):
        r.zadd(keys.due, {protocol.wheel_marker(b): now + 1000})
    promoted = scripts.promote_runs([b0, b1, b2], "w1", 2, 60_000).run(r).jobs
    assert [j.id[2:] for j in promoted] == [
        next(
            i
            for i in first
            if r.zscore(keys.wheel(b0), i) is None and f"s:{i}" not in {j.id for j in claim.jobs}
        ),
        others[0][0],
    ], "the last of the first bucket, then the first of the second"
    assert r.zscore(keys.due, protocol.wheel_marker(b1)) == now - 3000, "due at its last run"
    assert r.zscore(keys.due, protocol.wheel_marker(b2)) == now - 2000, "back at its head"
    assert r.zcard(keys.wheel(b2)) == 2 and r.zcard(keys.ready) == 0


def test_markers_of_every_bucket_a_claim_passes_are_rescored_or_dropped(
    app: drumbeat.App, r: redis.Redis
) -> None:
    keys, scripts = app.scheduler.shards[0], Scripts(app.scheduler.shards[0])
    now = _now_ms(r)
    a, a_later = _ids_in_bucket(2)
    b = _id_in_another_bucket(a)
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
    # A busy worker (no room) promotes them: they wait in `ready`.
    taken = scripts.promote_runs([bucket_of(ids[0])], "w1", 0, 60_000).run(r).jobs
    assert len(taken) == 0 and r.zcard(keys.ready) == 3, "three runs wait in ready"
    for key in (keys.jobs, keys.state):
        assert r.object("encoding", key) == b"hashtable", f"{key} with 3 queued runs"
    other = drumbeat.App(app.settings.url, namespace=app.settings.namespace + "e")
    try:
        other.enqueue_many([drumbeat.Prepared("t.x", [], {})])
        for key in (other.keys.jobs, other.keys.state):
            assert r.object("encoding", key) == b"hashtable", f"{key} after one enqueue"
    finally:
        other.close()


def test_a_claim_reports_as_many_due_buckets_as_it_has_slots_left(
    app: drumbeat.App, r: redis.Redis
) -> None:
    """Each due bucket holds a due run: a claim with 2 slots reports (and steps aside) 2, oldest
    first; the others stay due for other workers' claims. A busy worker (no slots) reports all,
    for its checkpoints to see what waits."""
    keys, scripts = app.scheduler.shards[0], Scripts(app.scheduler.shards[0])
    now = _now_ms(r)
    ids = [_ids_in_bucket(1, b)[0] for b in sorted({bucket_of(f"r{n}") for n in range(50)})[:4]]
    _put(app, r, {i: now - 4000 + n for n, i in enumerate(ids)})
    result = scripts.claim("w1", 2, 60_000, 100).run(r)
    assert result.buckets == [bucket_of(ids[0]), bucket_of(ids[1])]
    for n, i in enumerate(ids):
        score = r.zscore(keys.due, protocol.wheel_marker(bucket_of(i)))
        assert score is not None
        if n < 2:
            assert score > now, "reported: stepped aside"
        else:
            assert score == now - 4000 + n, "not reported: still due"
    assert scripts.claim("w2", 0, 60_000, 100).run(r).buckets == [
        bucket_of(ids[2]),
        bucket_of(ids[3]),
    ]


def test_a_claim_reads_one_due_entry_more_than_its_slots(app: drumbeat.App, r: redis.Redis) -> None:
    """Under a backlog of due entries a claim reads its slots' worth and one more: the one more
    sends a burst of due jobs through `ready`, where priority decides; the rest stay due (read
    and left behind by every claim, they cost Redis a third of its CPU per run)."""
    app.enqueue_many(
        [
            drumbeat.Prepared(
                "tasks.job", [n], {}, drumbeat.Options(priority=n, delay=0.05 + n * 0.01)
            )
            for n in range(5)
        ]
    )
    time.sleep(0.3)
    claimed = app.scripts.claim("w1", 2, 60_000, 100).run(r).jobs
    # Due 10 ms apart in enqueue order: the first three read, the best two taken.
    assert sorted(j.priority for j in claimed) == [1, 2], "the best two of the three read"
    assert r.zcard(app.keys.ready) == 1, "the third read waits in ready"
    assert r.zcard(app.keys.due) == 2, "two never read: still due"


def test_a_claim_opens_only_the_passed_buckets_whose_markers_are_due(
    app: drumbeat.App, r: redis.Redis
) -> None:
    """A worker passes the buckets due a little after it sends its claim; one whose marker is
    not due yet holds no due run, and when the claim read every due marker it is not opened
    (each open is a read of the bucket). Seen here through a bucket whose marker was put after
    its run's due time on purpose: opened, the run would be taken."""
    keys, scripts = app.scheduler.shards[0], Scripts(app.scheduler.shards[0])
    now = _now_ms(r)
    (due_id,) = _ids_in_bucket(1)
    later_id = _id_in_another_bucket(due_id)
    _put(app, r, {due_id: now - 1000, later_id: now - 500})
    later_marker = protocol.wheel_marker(bucket_of(later_id))
    r.zadd(keys.due, {later_marker: now + 60_000})
    passed = [bucket_of(due_id), bucket_of(later_id)]
    result = scripts.claim("w1", 10, 60_000, 100, passed, upcoming=0).run(r)
    assert [job.id for job in result.jobs] == ["s:" + due_id], "the bucket not due: not opened"
    assert r.zscore(keys.wheel(bucket_of(later_id)), later_id) == now - 500
    assert r.zscore(keys.due, later_marker) == now + 60_000, "its marker as it was"
    # With more due markers than the claim reads (a backlog) it cannot tell which passed
    # buckets are due, and opens them all.
    for n in range(3):
        r.zadd(keys.due, {f"l:busy{n}": now - 10})
    result = scripts.claim("w1", 1, 60_000, 100, [bucket_of(later_id)], upcoming=0).run(r)
    assert [job.id for job in result.jobs] == ["s:" + later_id]
