"""The Lua scripts' sources: which scripts exist, the text each runs (its file after the
_lib.lua and _workflows.lua definitions it uses) and its sha; read once, at import."""

from __future__ import annotations

import hashlib
import re
from importlib import resources

SCRIPT_NAMES = (
    "enqueue",
    "enqueue_after",
    "claim",
    "complete",
    "retry",
    "bury",
    "extend_leases",
    "handback",
    "reap",
    "job_status",
    "revive",
    "purge",
    "finish_runs",
    "queue_runs",
    "save_progress",
    "claim_urgent",
    "cancel",
    "scale_signal",
    "beat_supervisor",
    "tally",
    "defer_unknown",
    "acquire_limits",
    "release_limits",
    "slot_schedules",
    "unslot_schedules",
    "claim_slots",
    "settle_slots",
    "reap_runners",
    "handback_slots",
    "renew_runner",
    "pause_slots",
    "resume_slots",
    "run_slots_now",
    "move_bucket_to_slots",
    "count_pending",
    "pause_queue",
    "resume_queue",
    "open_batch",
    "close_batch",
    "cancel_batch",
)


_DEFINITION = re.compile(r"^local (?:function )?([A-Za-z_]\w*)", re.M)
_NAME = re.compile(r"[A-Za-z_]\w*")


def _definitions(lib: str) -> dict[str, str]:
    """_lib.lua's top-level definitions (``local NAME = ...``, ``local function NAME``), each
    with the comment lines just above it, in file order."""
    starts = []
    for m in _DEFINITION.finditer(lib):
        start = m.start()
        while start > 0:  # take in the comment block right above
            above = lib.rfind("\n", 0, start - 1) + 1
            if not lib.startswith("--", above):
                break
            start = above
        starts.append((start, m.group(1)))
    ends = [start for start, _ in starts[1:]] + [len(lib)]
    return {name: lib[start:end] for (start, name), end in zip(starts, ends, strict=True)}


def _with_lib(body: str, lib: dict[str, str]) -> str:
    """``body`` after the _lib.lua definitions it uses, directly or through each other.

    Only those: a script runs its whole text on every call, so each unused helper would cost
    a closure per call, and a cold Redis (light load) pays for every line it reads."""
    needed: set[str] = set()
    todo = [n for n in set(_NAME.findall(body)) if n in lib]
    while todo:
        name = todo.pop()
        if name not in needed:
            needed.add(name)
            todo += [n for n in set(_NAME.findall(lib[name])) if n in lib and n not in needed]
    return "".join(text for name, text in lib.items() if name in needed) + "\n" + body


def _load_sources() -> dict[str, str]:
    lua = resources.files("drumbeat") / "lua"
    # The workflow helpers after _lib.lua's, which they use.
    lib = _definitions((lua / "_lib.lua").read_text())
    lib.update(_definitions((lua / "_workflows.lua").read_text()))
    return {name: _with_lib((lua / f"{name}.lua").read_text(), lib) for name in SCRIPT_NAMES}


SOURCES = _load_sources()
SHAS = {name: hashlib.sha1(src.encode()).hexdigest() for name, src in SOURCES.items()}
