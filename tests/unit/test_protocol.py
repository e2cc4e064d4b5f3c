"""protocol.py and lua/_lib.lua agree: every shared constant, every record layout.

The round trips through real Redis (a record formatted here, parsed and written back by the
scripts) are in tests/integration/test_protocol.py.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from drumbeat import protocol
from drumbeat.protocol import (
    FIELD_SEP,
    JOB_STATE_FIELDS,
    JOB_STATE_TEXT_FIELDS,
    OWNER_FIELDS,
    RUN_STATE_FIELDS,
    RUN_STATE_SEP,
    SCHEDULE_FIELDS,
    SHORT_JOB_STATE_FIELDS,
)

LIB = (Path(protocol.__file__).parent / "lua" / "_lib.lua").read_text()

#: Constants both sides use: _lib.lua declares each as `local NAME = value`.
SHARED = [
    "MAX_PRIORITY",
    "MIN_PRIORITY",
    "PRIORITY_SPAN",
    "RUN_PREFIX",
    "UPCOMING",
    "UPCOMING_MS",
    "LATENESS_WINDOW_MS",
    "LATENESS_WINDOWS",
    "LATENESS_BINS_PER_DOUBLING",
    "THROUGHPUT_WINDOW_MS",
    "THROUGHPUT_WINDOWS",
    "PAUSED_FLAG",
    "PAUSED_AT",
    "QUEUED_AT",
    "LIMIT_PREFIX",
    "PAUSE_PREFIX",
    "ROUTE_FIELD",
    "PARKED_FIELD",
    "MARKERS_FIELD",
    "KEEP_FIELD",
    "LEASES_KEEP",
]
#: Constants only Lua needs (a new one must be placed in one of the two lists).
LUA_ONLY = {"CALL_MANY_CHUNK", "LIMIT_PURGE", "LIMIT_RECHECK_MS", "LIMIT_NEAR_MS", "LIMIT_HOLD_MS",
            "MAX_LATENESS_BIN", "KEEP_VALUE"}  # fmt: skip

LAYOUTS = {
    "JOB_STATE_FIELDS": FIELD_SEP.join(JOB_STATE_FIELDS),
    "SHORT_JOB_STATE_FIELDS": FIELD_SEP.join(SHORT_JOB_STATE_FIELDS),
    "OWNER_FIELDS": FIELD_SEP.join(OWNER_FIELDS),
    "RUN_STATE_FIELDS": RUN_STATE_SEP.join(RUN_STATE_FIELDS),
    "SCHEDULE_FIELDS": FIELD_SEP.join(SCHEDULE_FIELDS),
}


def _lua_constants() -> dict[str, int | str]:
    """Top-level ``local NAME = <integer or 'string'>`` lines of _lib.lua."""
    found: dict[str, int | str] = {}
    for name, value in re.findall(r"^local ([A-Z][A-Z0-9_]*) = (.+?)\s*$", LIB, re.MULTILINE):
        if value.startswith("{"):  # a lookup table (DIGITS): Lua's own, nothing to share
            continue
        string = re.fullmatch(r"'([^']*)'", value)
        if string:
            found[name] = string.group(1)
        else:
            assert re.fullmatch(r"\d+", value), f"{name} = {value}: expected an integer or a string"
            found[name] = int(value)
    return found


def _function(name: str) -> str:
    """The body of a top-level ``local function name(...)`` of _lib.lua."""
    m = re.search(rf"^local function {name}\(.*?^end$", LIB, re.MULTILINE | re.DOTALL)
    assert m, f"_lib.lua should define local function {name}"
    return m.group(0)


def test_every_lua_constant_is_shared_or_declared_lua_only() -> None:
    assert set(_lua_constants()) == set(SHARED) | LUA_ONLY


@pytest.mark.parametrize("name", SHARED)
def test_shared_constant_agrees(name: str) -> None:
    lua = _lua_constants()
    assert name in lua, f"_lib.lua should declare `local {name} = ...` (protocol.py has it)"
    assert lua[name] == getattr(protocol, name), (
        f"{name} is {lua[name]!r} in _lib.lua but {getattr(protocol, name)!r} in protocol.py"
    )


def test_layouts_documented_in_lua_match_the_field_order() -> None:
    documented = dict(re.findall(r"^-- Layout \((\w+)\): (\S+)$", LIB, re.MULTILINE))
    assert documented == LAYOUTS


def _captures(pattern: str) -> int:
    return pattern.count("(") - pattern.count("%(")


def test_lua_parsers_and_formatters_have_one_slot_per_field() -> None:
    # The patterns and format strings, not just the comments, have one slot per field.
    short = re.search(r"string\.match\(s, '(.*?)'\)", _function("parse_state"))
    assert short and _captures(short.group(1)) == len(SHORT_JOB_STATE_FIELDS)
    # The long layout: the short one's last field holds unknown|queue|dedupkey.
    rest = re.search(r"string\.match\(k, '(.*?)'\)", _function("parse_state"))
    assert rest and _captures(rest.group(1)) == len(JOB_STATE_FIELDS) - 4
    # format_state concatenates (string.format would call sprintf per field): the fields it
    # names, in order, with a separator after each but the last, are the layouts'.
    state = _function("format_state")
    head = re.search(r"local head = (.*?)\n  if", state, re.DOTALL)
    assert head and head.group(1).count(f"'{FIELD_SEP}'") == 4
    short_tail, long_tail = re.findall(r"return head \.\. (.*)", state)
    assert long_tail.count(f"'{FIELD_SEP}'") == 2

    def named(text: str) -> list[str]:
        return ["dedupkey" if f == "key" else f for f in re.findall(r"\bs\.(\w+)", text)]

    assert named(head.group(1) + short_tail) == list(SHORT_JOB_STATE_FIELDS)
    assert named(head.group(1) + long_tail) == list(JOB_STATE_FIELDS)
    assert all(f in JOB_STATE_TEXT_FIELDS for f in named(short_tail + long_tail)[-2:])
    schedule = re.search(r"local pattern = '(.*?)'", _function("parse_schedule"))
    assert schedule and _captures(schedule.group(1)) == len(SCHEDULE_FIELDS)
    take = _function("take_all")
    assert "= string.format('%d', token + i) .. owner_tail" in take
    owner_tail = re.search(r"local owner_tail = (.*)", take)
    assert owner_tail and owner_tail.group(1).count(f"'{FIELD_SEP}'") == len(OWNER_FIELDS) - 1
    # A run's state names its due time, grid slot, generation and manual flag in this order
    # (queue_runs builds it in Python: `slots.Queueing.run_key`).
    assert RUN_STATE_FIELDS == ("due", "grid", "gen", "manual") and RUN_STATE_SEP == ":"


def test_lateness_bins_cover_their_values() -> None:
    for ms in [*range(2000), 2**20 - 1, 2**20, 10**7, 2**31]:
        b = protocol.lateness_bin(ms)
        assert protocol.bin_upper_ms(b - 1) <= ms < protocol.bin_upper_ms(b), (ms, b)


def test_ready_score_orders_priority_then_fifo() -> None:
    span = protocol.PRIORITY_SPAN
    assert protocol.ready_score(protocol.MAX_PRIORITY, 0) == 0
    assert protocol.ready_score(protocol.MIN_PRIORITY, span - 1) == 10 * span - 1
    assert protocol.ready_score(5, span - 1) < protocol.ready_score(4, 0)
    assert float(protocol.ready_score(protocol.MIN_PRIORITY, span - 1)).is_integer()
    assert protocol.ready_score(0, span - 1) < 2**53, "scores must stay exact doubles"


def test_the_highest_lateness_bin_is_that_of_2_to_the_53_ms() -> None:
    lua = _lua_constants()
    per_doubling = int(lua["LATENESS_BINS_PER_DOUBLING"])
    assert lua["MAX_LATENESS_BIN"] == math.floor(per_doubling * math.log2(2**53 + 1))
