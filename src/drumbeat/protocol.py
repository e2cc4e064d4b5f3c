"""What Python and the Lua scripts must agree on: shared constants and the layout of the records
both sides read.

Redis scripts cannot import, so ``lua/_lib.lua`` mirrors this module: each constant as
``local NAME = value`` under the same name, each record layout in a ``-- Layout (NAME): ...``
comment beside the Lua code that formats and parses it. Change both together:
``tests/unit/test_protocol.py`` reads ``_lib.lua`` and fails when they disagree, and
``tests/integration/test_protocol.py`` sends records formatted here through the real scripts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

# -- priorities and the `ready` score ----------------------------------------------------------

MIN_PRIORITY = 0
MAX_PRIORITY = 9
#: Width of one priority level's score range in `ready`: room for 4.4e12 sequence numbers per
#: level while the score stays an exact double.
PRIORITY_SPAN = 2**42


def ready_score(priority: int, seq: int) -> int:
    """A job's score in `ready`: lower pops first, so the highest priority gets the smallest
    base; ``seq`` keeps FIFO order inside a level."""
    return (MAX_PRIORITY - priority) * PRIORITY_SPAN + seq


# -- member prefixes ---------------------------------------------------------------------------

#: Marks a schedule's run among job ids in `ready`, `leases`, `state`, `owners` and `jobs`.
RUN_PREFIX = "s:"
#: Marked a bucket of the timing wheel (the store before the time slots) among the job ids in
#: `due`: ``w:<bucket>`` (schedules/upgrade.py drops what is left of them).
WHEEL_PREFIX = "w:"


#: Marks a limiter key's marker among the job ids in `due`: ``l:<key name>`` (see limits.py).
LIMIT_PREFIX = "l:"
#: A claim's report of a queue it serves that is paused (`App.pause_queue`): ``p:<queue>``.
PAUSE_PREFIX = "p:"
#: In a shard's `tasks` table, ``#q<code>`` names the queue of a (task, queue) pair's code.
ROUTE_FIELD = "#q"


#: A field of the `state`, `owners` and `jobs` hashes that is never deleted, with a value too
#: long for a listpack, so Redis keeps them as hash tables (see _lib.lua); never a job id.
KEEP_FIELD = "~"

#: The member of `leases` that is never deleted, too long for a listpack and scored +inf, so
#: Redis keeps the sorted set a skiplist (see _lib.lua) and no reaper takes it for a lease; a
#: count of leases held leaves it out (`LEASES_HELD`: ZCOUNT bounds).
LEASES_KEEP = (
    "~drumbeat keeps this member so that Redis stores this sorted set as a skiplist "
    "(docs/redis-keys.md)"
)
LEASES_HELD = ("-inf", "(+inf")

#: Fields of a shard's `parking` hash, followed by a queue name ("default" for the default
#: queue): jobs parked on limiter keys, and limiter markers in the queue's `due`.
PARKED_FIELD = "p|"
MARKERS_FIELD = "m|"


def wheel_marker(bucket: int) -> str:
    return f"{WHEEL_PREFIX}{bucket}"


# -- claiming time slots -----------------------------------------------------------------------

#: A claim of the time slots names at most UPCOMING slots that come due within UPCOMING_MS
#: (when the worker asks for them: its list ran short).
UPCOMING = 128
UPCOMING_MS = 100

# -- the lateness histogram (`lateness` hash) --------------------------------------------------

#: A ring of LATENESS_WINDOWS windows of LATENESS_WINDOW_MS each: fifteen minutes (the overview's
#: chart) and the window being filled. Status and the autoscaler read the last minute of it.
LATENESS_WINDOW_MS = 10_000
LATENESS_WINDOWS = 91
#: Bin ``b`` holds lateness below ``2 ** ((b + 1) / LATENESS_BINS_PER_DOUBLING) - 1`` ms
#: (about 19 % wide).
LATENESS_BINS_PER_DOUBLING = 4


def lateness_bin(ms: int) -> int:
    """The bin of a lateness of ``ms``, computed as ``record_lateness`` in Lua computes it (the
    same operations, so the same doubles: log2 could round differently at powers of two)."""
    return math.floor(LATENESS_BINS_PER_DOUBLING * math.log(ms + 1) / math.log(2))


def bin_upper_ms(b: int) -> float:
    """Upper bound of lateness bin ``b``."""
    return float(2 ** ((b + 1) / LATENESS_BINS_PER_DOUBLING) - 1)


def bin_percentile_ms(counts: Mapping[int, int], q: float) -> float:
    """The ``q`` quantile (0..1) of lateness counted per bin (``counts``: bin -> runs, not
    empty), as the upper bound of the bin it falls in."""
    total, seen = sum(counts.values()), 0
    for b in sorted(counts):
        seen += counts[b]
        if seen >= q * total:
            return bin_upper_ms(b)
    return bin_upper_ms(max(counts))


# -- the throughput series (`throughput` hash) -------------------------------------------------

#: A ring of THROUGHPUT_WINDOWS windows of THROUGHPUT_WINDOW_MS each, counting settled attempts
#: (tally.lua): fifteen minutes and the window being filled, for the overview's chart.
THROUGHPUT_WINDOW_MS = 10_000
THROUGHPUT_WINDOWS = 91

# -- record layouts: fields joined by FIELD_SEP, in this order ---------------------------------

FIELD_SEP = "|"
FIELD_SEP_BYTES = FIELD_SEP.encode()
#: A job's (or a run's) entry in `state`. For a run, ``dedupkey`` holds RUN_STATE_FIELDS.
#: ``unknown``: ms a worker lacking its task first handed it back, else 0; ``queue``: empty for
#: the default queue.
JOB_STATE_FIELDS = ("attempt", "stalls", "priority", "seq", "unknown", "queue", "dedupkey")
#: The layout of a job of the default queue never handed back for want of its task (most jobs,
#: and every state written before queues existed): unknown 0, queue empty.
SHORT_JOB_STATE_FIELDS = ("attempt", "stalls", "priority", "seq", "dedupkey")
#: The fields of JOB_STATE_FIELDS formatted as text (the rest are integers).
JOB_STATE_TEXT_FIELDS = ("queue", "dedupkey")
#: A run's place in its schedule, joined by RUN_STATE_SEP in the ``dedupkey`` field of its state
#: (and in `Claimed.extra`); ``manual`` is 1 for a run queued by ``run_now``.
RUN_STATE_FIELDS = ("due", "grid", "gen", "manual")
RUN_STATE_SEP = ":"


def run_times(extra: str) -> tuple[int | None, int | None]:
    """A run's due time (the first of RUN_STATE_FIELDS in its claim's ``extra``) and, once a
    stall recorded it (a fifth field), when it first started; (None, None) when ``extra`` is
    not a run's."""
    parts = extra.split(RUN_STATE_SEP)
    try:
        due = int(parts[0])
        first = int(parts[4]) if len(parts) > len(RUN_STATE_FIELDS) else None
    except ValueError:
        return None, None
    return due, first


#: The current claim of a job in `owners`; the worker id never holds FIELD_SEP.
OWNER_FIELDS = ("token", "worker", "claimed_ms")
#: A schedule in `schedules:<bucket>` (parsed by `schedule.parse_record`). ``flags`` is the
#: priority, plus PAUSED_FLAG while paused; ``last_start`` is relative to ``grid`` and empty
#: before the first run; ``late``: ms the last run started after its due time (meaningful
#: once there is a last start; never written empty, see _lib.lua); ``task`` is the task
#: name's code in `tasks`; ``spec`` may hold FIELD_SEP.
SCHEDULE_FIELDS = (
    "gen", "grid", "flags", "runs", "failures", "misfires", "last_start", "last_ms", "late",
    "task", "spec",
)  # fmt: skip
#: Where a record's spec is, last (a split on FIELD_SEP at most this many times keeps it whole).
SPEC_FIELD = SCHEDULE_FIELDS.index("spec")
#: The layout records had before ``late`` (read as they are, upgraded when next written).
OLD_SCHEDULE_FIELDS = tuple(f for f in SCHEDULE_FIELDS if f != "late")
PAUSED_FLAG = 10
#: What a time slots' `where` says of a paused schedule: its entry waits in `paused`.
PAUSED_AT = "p"
#: What `where` says of a schedule whose run waits or runs as a job (queue_runs.lua).
QUEUED_AT = "q"


@dataclass(frozen=True, slots=True)
class Owner:
    """A job's current claim, as `owners` holds it."""

    token: int
    worker: str
    claimed_ms: int


def parse_owner(raw: str) -> Owner | None:
    """An `owners` value, or None when it is not one (a foreign or damaged entry)."""
    parts = raw.split(FIELD_SEP)
    if len(parts) != len(OWNER_FIELDS):
        return None
    fields = dict(zip(OWNER_FIELDS, parts, strict=True))
    try:
        return Owner(int(fields["token"]), fields["worker"], int(fields["claimed_ms"]))
    except ValueError:
        return None
