"""Each script carries the _lib.lua definitions it uses, and only those; the worker's calls
name the schema's keys, and its claim replies parse."""

from __future__ import annotations

import re
from importlib import resources
from typing import Any

import pytest

from drumbeat.keys import WHEEL_BUCKETS, Keys, bucket_of
from drumbeat.replies import Claimed, parse_claim
from drumbeat.scripts import SCRIPT_NAMES, SOURCES, Scripts

LIB = (resources.files("drumbeat") / "lua" / "_lib.lua").read_text()
DEFINED = set(re.findall(r"^local (?:function )?([A-Za-z_]\w*)", LIB, re.M))


def _code(source: str) -> str:
    return re.sub(r"--[^\n]*", "", source)  # names in comments do not count


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_every_lib_name_a_script_uses_is_defined_in_it(name: str) -> None:
    source = SOURCES[name]
    defined = set(re.findall(r"^local (?:function )?([A-Za-z_]\w*)", source, re.M))
    used = set(re.findall(r"[A-Za-z_]\w*", _code(source))) & DEFINED
    assert used <= defined, f"{name}.lua uses {sorted(used - defined)} without their definitions"


_CALL = re.compile(r"redis\.call\((?:[^()]|\([^()]*\))*\)")
_NUMBER_ARGUMENT = re.compile(r",\s*-?\d+(?:\.\d+)?\s*(?=[,)])")


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_scripts_pass_redis_no_number_literals(name: str) -> None:
    """Redis formats a number a script passes to ``redis.call`` with ``%.17g`` (a few thousand
    instructions in glibc's printf): an idle claim passed about ten (``ZRANGE key 0 0``,
    ``LIMIT 0 n``), 9 % of its instructions (`bench.redis_cpu idle`). Literals go as strings."""
    calls = _CALL.findall(_code(SOURCES[name]))
    assert calls, f"{name}.lua should call Redis"
    numbers = [call for call in calls if _NUMBER_ARGUMENT.search(call)]
    assert not numbers, f"{name}.lua passes number literals to Redis: {numbers}"


def test_a_script_leaves_out_the_lib_definitions_it_does_not_use() -> None:
    enqueue = SOURCES["enqueue"]
    assert "local function promote_buckets" not in enqueue
    assert "local function record_lateness" not in enqueue
    assert len(enqueue) < len(LIB) / 2, "the enqueue script should not carry most of _lib.lua"


@pytest.mark.parametrize("shard", [None, 3])
def test_the_keys_of_hot_path_calls_are_the_keys_of_the_schema(shard: int | None) -> None:
    # The worker's calls name their keys from prefixes made once: they must stay the schema's.
    k = Keys("ns", shard)
    scripts = Scripts(k)
    buckets = [0, 7, WHEEL_BUCKETS - 1]
    of_buckets = [key for b in buckets for key in (k.wheel(b), k.schedules(b))]
    claim = scripts.claim("w", 5, 1000, 10, buckets, queues=["default", "q2"], routes=["q3"])
    assert list(claim.keys) == [
        k.jobs, k.state, k.owners, k.leases, k.fence, k.seq, k.lateness, k.tasks, k.progress,
        k.pauses, k.ready_of("default"), k.due_of("default"), k.wake_of("default"),
        k.ready_of("q2"), k.due_of("q2"), k.wake_of("q2"), k.ready_of("q3"), k.wake_of("q3"),
        *of_buckets,
    ]  # fmt: skip
    promote = scripts.promote_runs(buckets, "w", 5, 1000)
    assert list(promote.keys) == [
        k.due, k.ready, k.jobs, k.state, k.seq, k.wake, k.tasks, k.owners, k.leases, k.fence,
        k.lateness, *of_buckets,
    ]  # fmt: skip
    ids = ["s:a", "s:b"]
    finish = scripts.finish_runs([(i, 1, "ok", 1, 0, 5, 5, "", None) for i in ids])
    run_buckets = list(dict.fromkeys(bucket_of(i[2:]) for i in ids))
    assert list(finish.keys) == [
        k.due, k.leases, k.owners, k.state, k.faults, k.wake, k.jobs,
        *[key for b in run_buckets for key in (k.wheel(b), k.schedules(b))],
    ]  # fmt: skip
    with pytest.raises(KeyError, match="unknown bucket"):
        scripts.bucket_keys(WHEEL_BUCKETS)


def test_a_claim_reply_parses_into_its_items() -> None:
    head: list[Any] = [1000, -1, [], None, 3]
    run = [b"s:a", b"t|[[1],5]", 1, 0, 41, 5, b"990:990:0:0", None, None]
    job = ["j1", b"", 2, 1, 42, 7, "key", b"\x91\x01", b"q2|1234"]
    result = parse_claim(head + run + job)
    assert result.jobs == [
        Claimed("s:a", b"t|[[1],5]", 1, 0, 41, 5, "990:990:0:0"),
        Claimed("j1", None, 2, 1, 42, 7, "key", b"\x91\x01", b"q2|1234"),
    ]
    assert (result.jobs[1].queue, result.jobs[1].unknown_ms) == ("q2", 1234)
    assert (result.now_ms, result.next_due_ms, result.best) == (1000, None, 3)
