"""Each script carries the _lib.lua definitions it uses, and only those."""

from __future__ import annotations

import re
from importlib import resources

import pytest

from drumbeat.scripts import SCRIPT_NAMES, SOURCES

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


def test_a_script_leaves_out_the_lib_definitions_it_does_not_use() -> None:
    enqueue = SOURCES["enqueue"]
    assert "local function promote_buckets" not in enqueue
    assert "local function record_lateness" not in enqueue
    assert len(enqueue) < len(LIB) / 2, "the enqueue script should not carry most of _lib.lua"
