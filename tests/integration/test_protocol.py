"""Records formatted by Python (protocol.py's field order) are read by the real Lua scripts, and
what the scripts write back parses in Python to the same fields."""

from __future__ import annotations

from pathlib import Path

import redis

import drumbeat
from drumbeat import admin, protocol
from drumbeat.protocol import (
    FIELD_SEP,
    JOB_STATE_FIELDS,
    SCHEDULE_FIELDS,
    SHORT_JOB_STATE_FIELDS,
)
from drumbeat.schedule import Record, parse_record

LIB = (Path(protocol.__file__).parent / "lua" / "_lib.lua").read_text()


def _lib_eval(r: redis.Redis, body: str, keys: list[str], args: list[object]) -> object:
    """Runs ``body`` with _lib.lua's helpers in scope, as every script runs."""
    return r.eval(LIB + "\n" + body, len(keys), *keys, *args)  # type: ignore[arg-type]


def _state(fields: dict[str, object]) -> str:
    return FIELD_SEP.join(str(fields[f]) for f in JOB_STATE_FIELDS)


def _parse_state(raw: bytes) -> dict[str, str]:
    parts = raw.decode().split(FIELD_SEP, len(JOB_STATE_FIELDS) - 1)
    if len(parts) < len(JOB_STATE_FIELDS):  # the short layout: default queue, never unknown
        return {"unknown": "0", "queue": ""} | dict(zip(SHORT_JOB_STATE_FIELDS, parts, strict=True))
    return dict(zip(JOB_STATE_FIELDS, parts, strict=True))


def test_job_state_and_owner_round_trip_through_a_claim(app: drumbeat.App, r: redis.Redis) -> None:
    k = app.keys
    # Priority 12 is out of range: Lua clamps it to MAX_PRIORITY while it parses.
    for job_id, priority, seq in (("j1", 7, 5), ("j2", 12, 6)):
        state = {"attempt": 2, "stalls": 1, "priority": priority, "seq": seq, "unknown": 0,
                 "queue": "", "dedupkey": "k:1"}  # fmt: skip
        r.hset(k.state, job_id, _state(state))
        r.hset(k.jobs, job_id, b"spec")
        r.zadd(k.ready, {job_id: protocol.ready_score(min(priority, protocol.MAX_PRIORITY), seq)})

    result = app.scripts.claim("w-1", 10, 60_000, 100).run(r)

    assert [(j.id, j.attempt, j.stalls, j.priority, j.extra) for j in result.jobs] == [
        ("j2", 3, 1, protocol.MAX_PRIORITY, "k:1"),
        ("j1", 3, 1, 7, "k:1"),
    ]
    for job in result.jobs:
        raw = r.hget(k.state, job.id)
        assert raw is not None
        stored = _parse_state(raw)
        assert (stored["attempt"], stored["stalls"], stored["dedupkey"]) == ("3", "1", "k:1")
        owner_raw = r.hget(k.owners, job.id)
        assert owner_raw is not None
        owner = protocol.parse_owner(owner_raw.decode())
        assert owner == protocol.Owner(job.token, "w-1", result.now_ms), owner_raw


def test_a_state_keeps_the_short_layout_unless_it_needs_the_long_one(
    app: drumbeat.App, r: redis.Redis
) -> None:
    # The short layout (every state before queues existed): attempt|stalls|priority|seq|dedupkey.
    r.hset(app.keys.state, "old", "2|1|5|7|k:2")
    r.hset(app.keys.jobs, "old", b"spec")
    r.zadd(app.keys.ready, {"old": protocol.ready_score(5, 7)})
    # The long one: another queue, handed back once for want of its task.
    r.hset(app.keys.state, "new", "0|0|5|8|1700000000000|builds|k:3")
    r.hset(app.keys.jobs, "new", b"spec")
    r.zadd(app.keys.ready_of("builds"), {"new": protocol.ready_score(5, 8)})
    claim = app.scripts.claim("w-1", 10, 60_000, 100, queues=["default", "builds"])
    old, new = claim.run(r).jobs
    assert (old.id, old.attempt, old.stalls, old.priority, old.extra) == ("old", 3, 1, 5, "k:2")
    assert (old.queue, old.unknown_ms) == ("default", 0)
    assert r.hget(app.keys.state, "old") == b"3|1|5|7|k:2", "the short layout is kept"
    assert (new.id, new.attempt, new.priority, new.extra) == ("new", 1, 5, "k:3")
    assert (new.queue, new.unknown_ms) == ("builds", 1_700_000_000_000)
    assert r.hget(app.keys.state, "new") == b"1|0|5|8|1700000000000|builds|k:3"


def test_enqueue_scores_a_job_as_ready_score(app: drumbeat.App, r: redis.Redis) -> None:
    @app.task
    def job() -> None: ...

    for priority in (protocol.MIN_PRIORITY, 4, protocol.MAX_PRIORITY):
        handle = job.options(priority=priority).enqueue()
        raw = r.hget(app.keys.state, handle.id)
        assert raw is not None
        stored = _parse_state(raw)
        assert int(stored["priority"]) == priority
        assert r.zscore(app.keys.ready, handle.id) == protocol.ready_score(
            priority, int(stored["seq"])
        )


def _record(fields: dict[str, object]) -> bytes:
    head = FIELD_SEP.join(str(fields[f]) for f in SCHEDULE_FIELDS[:-1]) + FIELD_SEP
    spec = fields["spec"]
    assert isinstance(spec, bytes)
    return head.encode() + spec


def test_schedule_record_round_trips_through_lua(app: drumbeat.App, r: redis.Redis) -> None:
    grid = 1_700_000_005_000
    fields: dict[str, object] = {
        "gen": 3, "grid": grid, "flags": 4, "runs": 120, "failures": 2, "misfires": 1,
        "last_start": -4998, "last_ms": 12, "late": 3, "task": 7, "spec": b'[[1],"x|y"]',
    }  # fmt: skip
    expected = Record(3, grid, 4, False, 120, 2, 1, grid - 4998, 12, 3, "7", b'[[1],"x|y"]')
    assert parse_record(_record(fields)) == expected
    never = _record(fields | {"last_start": "", "late": "", "flags": 4 + protocol.PAUSED_FLAG})
    for record in (_record(fields), never):
        echoed = _lib_eval(r, "return format_schedule(parse_schedule(ARGV[1]))", [], [record])
        assert echoed == record, "Lua reads and writes back every field as Python wrote it"
    # A record written before `late` existed: read, and written back in today's layout.
    old = b"3|%d|4|120|2|1|-4998|12|7|" % grid + b'[[1],"x|y"]'
    echoed = _lib_eval(r, "return format_schedule(parse_schedule(ARGV[1]))", [], [old])
    assert echoed == _record(fields | {"late": 0})


def test_lateness_bins_and_windows_match_lua(app: drumbeat.App, r: redis.Redis) -> None:
    samples = [*range(300), 511, 512, 1023, 1024, 2**20 - 1, 2**20, 12_345, 99_999, 2**31]
    now = 1_700_000_123_456
    body = """
      local samples = {}
      for i = 2, #ARGV do samples[#samples + 1] = tonumber(ARGV[i]) end
      record_lateness(KEYS[1], tonumber(ARGV[1]), samples)
    """
    _lib_eval(r, body, [app.keys.lateness], [now, *samples])
    held = {key.decode(): int(v) for key, v in r.hgetall(app.keys.lateness).items()}
    window = now // protocol.LATENESS_WINDOW_MS
    slot = window % protocol.LATENESS_WINDOWS
    expected: dict[str, int] = {f"w{slot}": window, f"m{slot}": max(samples)}
    for ms in samples:
        for key in (f"b{slot}:{protocol.lateness_bin(ms)}", f"c{protocol.lateness_bin(ms)}"):
            expected[key] = expected.get(key, 0) + 1
    expected["cs"] = sum(samples)  # the cumulative bins and sum, for /metrics
    assert held == expected
    summary = admin.lateness_summary(held, now)
    assert summary.runs == len(samples) and summary.max_ms == max(samples)


def test_a_huge_lateness_sum_is_recorded(app: drumbeat.App, r: redis.Redis) -> None:
    # Past 17 digits a Lua number reaches Redis with an exponent ("2e+18"), which HINCRBY would
    # refuse, failing the claim script that records it.
    samples = [10**16] * 200
    body = """
      local samples = {}
      for i = 2, #ARGV do samples[#samples + 1] = tonumber(ARGV[i]) end
      record_lateness(KEYS[1], tonumber(ARGV[1]), samples)
    """
    _lib_eval(r, body, [app.keys.lateness], [1_700_000_123_456, *samples])
    assert int(r.hget(app.keys.lateness, "cs")) == sum(samples)
