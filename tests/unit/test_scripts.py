"""Each script carries the _lib.lua definitions it uses, and only those; the worker's calls
name the schema's keys, and its claim replies parse."""

from __future__ import annotations

import re
from importlib import resources
from typing import Any

import pytest

from drumbeat.keys import Keys
from drumbeat.replies import Claimed, parse_claim
from drumbeat.schedules.slots import Settled, SlotScripts
from drumbeat.script_sources import SCRIPT_NAMES, SOURCES
from drumbeat.scripts import Scripts

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
    claim = scripts.claim("w", 5, 1000, 10, queues=["default", "q2"])
    assert list(claim.keys) == [
        k.jobs, k.state, k.owners, k.leases, k.fence, k.seq, k.lateness, k.progress,
        k.pauses, k.ready_of("default"), k.due_of("default"), k.wake_of("default"),
        k.ready_of("q2"), k.due_of("q2"), k.wake_of("q2"),
    ]  # fmt: skip
    slots = SlotScripts(k)
    runs = [(1, Settled(i, f"{i}|r", 5, 0)) for i in ("a", "b")]
    assert list(slots.finish_runs(runs).keys) == [
        k.owners, k.leases, k.jobs, k.state, k.where, k.slots, k.pending, k.paused, k.faults,
        k.slot(5), k.slot(5),
    ]  # fmt: skip


def test_a_claim_reply_parses_into_its_items() -> None:
    head: list[Any] = [1000, -1, [b"l:t:x", b"p:builds"], 3]
    run = [b"s:a", b"t|[[1],5]", 1, 0, 41, 5, b"990:990:0:0", None, None]
    job = ["j1", b"", 2, 1, 42, 7, "key", b"\x91\x01", b"q2|1234"]
    result = parse_claim(head + run + job)
    assert result.jobs == [
        Claimed("s:a", b"t|[[1],5]", 1, 0, 41, 5, "990:990:0:0"),
        Claimed("j1", None, 2, 1, 42, 7, "key", b"\x91\x01", b"q2|1234"),
    ]
    assert (result.jobs[1].queue, result.jobs[1].unknown_ms) == ("q2", 1234)
    assert (result.now_ms, result.next_due_ms, result.best) == (1000, None, 3)
    assert (result.limiters, result.paused) == (["t:x"], ["builds"])
