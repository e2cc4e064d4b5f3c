"""Periodic schedules: their definition, how it is stored, and the cadence math.

Everything here is pure (no Redis, no clock reads): times come in as epoch milliseconds of the
Redis server's clock, so the math is property-tested on its own (``tests/unit/test_cadence.py``).

Cadence rules:
- **fixed rate** (default): runs sit on a grid ``phase + k * interval``; the next run is the
  previous grid slot + interval, however long the run took, so the cadence never drifts.
- **coalescing**: a run that starts late stands for every slot that passed before it started,
  and for the next one too if that is less than half an interval away, so catching up (an
  outage, a cold start) runs each schedule once, never once per missed slot nor twice in a row;
  when a run ends after later slots have passed (a run longer than the interval), the schedule
  runs once more at once, at the latest passed slot.
- **fixed delay** (``mode="delay"``): the next run is the end of this one + interval.
- **misfire grace**: a run that starts more than ``grace`` after its due time is skipped and
  counted instead of run late.
- **phase** comes from a stable hash of the id, so schedules added together spread over their
  interval; **jitter** adds a further stable offset per run.
- **cron** schedules use croniter in the schedule's time zone (DST included).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

from .errors import InvalidJob
from .keys import WHEEL_BUCKETS, bucket_of
from .names import MAX_NAME_LENGTH, check_name
from .protocol import (
    FIELD_SEP,
    FIELD_SEP_BYTES,
    OLD_SCHEDULE_FIELDS,
    PAUSED_FLAG,
    SCHEDULE_FIELDS,
    SPEC_FIELD,
)
from .protocol import RUN_PREFIX as RUN_PREFIX  # noqa: PLC0414 (worker, runner import it here)
from .serialization import CODECS, Codec

Mode = Literal["rate", "delay"]


def stable_hash(*parts: str | int) -> int:
    """A hash that is the same in every process and Python version (unlike ``hash()``)."""
    data = "\x1f".join(str(p) for p in parts).encode()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def phase_ms(schedule_id: str, interval_ms: int) -> int:
    """Where in its interval a schedule fires: uniform over ``[0, interval)`` across ids.

    One of 16,384 phases by a stable hash of the id (its bucket in the timing wheel, the store
    before the time slots, so phases stayed when it went): the schedules of one phase that
    share an interval fall due in the same millisecond, so they wait in one time slot, and one
    claim takes all their runs, while phases, and so schedules, spread evenly over the
    interval.
    """
    return bucket_of(schedule_id) * interval_ms // WHEEL_BUCKETS


def jitter_ms(schedule_id: str, grid_ms: int, jitter: int) -> int:
    """A per-run offset in ``[0, jitter]``, stable for one (schedule, slot)."""
    return 0 if jitter <= 0 else stable_hash("jitter", schedule_id, grid_ms) % (jitter + 1)


def first_slot(now_ms: int, interval_ms: int, phase: int) -> int:
    """The first grid slot ``phase + k * interval`` at or after ``now``."""
    k = -((phase - now_ms) // interval_ms)  # ceil((now - phase) / interval)
    return phase + k * interval_ms


def next_rate_slot(
    grid_ms: int, interval_ms: int, now_ms: int, start_ms: int | None = None
) -> tuple[int, int]:
    """Next slot of a fixed-rate schedule whose run on slot ``grid_ms`` started at
    ``start_ms`` (None: on time) and just ended at ``now``.

    Returns ``(slot, coalesced)``: normally ``grid + interval``. A run that started late
    stands for the slots that passed before it started, and for the next one too when that is
    less than half an interval after its start: catching up (a cold start with every schedule
    due at once, an outage), each schedule runs once, not twice in a row. If the slot so found
    has passed by the end of the run (a run longer than the interval), the latest passed slot,
    due at once. ``coalesced`` counts the slots skipped.
    """
    nxt = grid_ms + interval_ms
    if start_ms is not None and start_ms > grid_ms:
        floor = start_ms + (interval_ms + 1) // 2
        if nxt < floor:
            nxt += -((nxt - floor) // interval_ms) * interval_ms  # the first slot >= floor
    if nxt <= now_ms:
        nxt = grid_ms + ((now_ms - grid_ms) // interval_ms) * interval_ms
    return nxt, (nxt - grid_ms) // interval_ms - 1


def is_misfire(due_ms: int, start_ms: int, grace_ms: int) -> bool:
    return grace_ms > 0 and start_ms - due_ms > grace_ms


def next_cron(expr: str, tz: str, after_ms: int) -> int:
    """The first time strictly after ``after_ms`` that ``expr`` matches in ``tz``.

    DST, as in Vixie cron: a wall time skipped by the spring change fires when the clock
    jumps; a wall time repeated by the autumn change fires once, at its first occurrence, when
    the expression names its hours (a daily job never runs twice in one day), while jobs that
    run every hour or more often keep running through the repeated hour.
    """
    zone = ZoneInfo(tz)
    it = croniter(expr, datetime.fromtimestamp(after_ms / 1000, zone))
    hourly = expr.split()[1] == "*"
    while True:
        nxt: datetime = it.get_next(datetime)
        local = datetime.fromtimestamp(nxt.timestamp(), zone)
        repeated = local.replace(fold=0).timestamp() != local.timestamp()
        if hourly or not repeated:
            return int(nxt.timestamp() * 1000)


@dataclass(frozen=True, slots=True)
class Cadence:
    """When a schedule runs: every ``interval`` seconds, or on a cron expression."""

    every: float | None = None
    cron: str | None = None
    tz: str = "UTC"
    mode: Mode = "rate"
    grace: float | None = None
    jitter: float = 0.0

    def validate(self, floor: float) -> None:
        if (self.every is None) == (self.cron is None):
            raise InvalidJob("a schedule needs exactly one of every= (seconds) or cron=")
        if self.every is not None:
            self._validate_every(self.every, floor)
        try:
            ZoneInfo(self.tz)
        except (ZoneInfoNotFoundError, ValueError):
            raise InvalidJob(f"unknown time zone {self.tz!r}; use an IANA name") from None
        if self.cron is not None:
            if not isinstance(self.cron, str) or not croniter.is_valid(self.cron):
                raise InvalidJob(
                    f"invalid cron expression {self.cron!r}; expected five fields, "
                    "e.g. '*/5 * * * *'"
                )
            if self.mode != "rate":
                raise InvalidJob("mode='delay' applies to every= schedules, not cron")
        if self.mode not in ("rate", "delay"):
            raise InvalidJob(f"mode must be 'rate' or 'delay', got {self.mode!r}")
        if self.grace is not None and self.grace <= 0:
            raise InvalidJob(f"grace must be > 0 seconds or None, got {self.grace}")
        if self.jitter < 0:
            raise InvalidJob(f"jitter must be >= 0 seconds, got {self.jitter}")

    @staticmethod
    def _validate_every(every: float, floor: float) -> None:
        if isinstance(every, bool) or not isinstance(every, int | float):
            raise InvalidJob(f"every must be a number of seconds, got {every!r}")
        if not every > 0:
            raise InvalidJob(f"every must be > 0 seconds, got {every}")
        if every < floor:
            raise InvalidJob(
                f"every={every} s is below the floor of {floor} s (Settings.min_interval)"
            )

    @property
    def interval_ms(self) -> int:
        return round((self.every or 0) * 1000)

    @property
    def grace_ms(self) -> int:
        return 0 if self.grace is None else round(self.grace * 1000)

    @property
    def jitter_ms(self) -> int:
        return round(self.jitter * 1000)

    def to_wire(self) -> dict[str, Any]:
        """Only what differs from the defaults: most monitors store just ``{"e": 5}``."""
        out: dict[str, Any] = {}
        if self.every is not None:
            out["e"] = self.every
        if self.cron is not None:
            out["c"] = self.cron
        if self.tz != "UTC":
            out["z"] = self.tz
        if self.mode != "rate":
            out["m"] = self.mode
        if self.grace is not None:
            out["g"] = self.grace
        if self.jitter:
            out["j"] = self.jitter
        return out

    @classmethod
    def from_wire(cls, raw: dict[str, Any]) -> Cadence:
        return cls(
            every=raw.get("e"),
            cron=raw.get("c"),
            tz=raw.get("z", "UTC"),
            mode=raw.get("m", "rate"),
            grace=raw.get("g"),
            jitter=raw.get("j", 0.0),
        )

    def first_due(self, schedule_id: str, now_ms: int) -> tuple[int, int]:
        """``(grid slot, due time)`` of the first run of a schedule registered at ``now``."""
        if self.cron is not None:
            grid = next_cron(self.cron, self.tz, now_ms)
        else:
            grid = first_slot(now_ms, self.interval_ms, phase_ms(schedule_id, self.interval_ms))
        return grid, grid + jitter_ms(schedule_id, grid, self.jitter_ms)

    def after_run(
        self, schedule_id: str, grid_ms: int, now_ms: int, start_ms: int | None = None
    ) -> tuple[int, int, int]:
        """``(next grid slot, next due time, slots coalesced)`` once the run on ``grid_ms``,
        started at ``start_ms`` (None: on time), ended at ``now``."""
        if self.cron is not None:
            # Strictly after now: slots that passed during the run are covered by it.
            grid, skipped = next_cron(self.cron, self.tz, max(grid_ms, now_ms)), 0
        elif self.mode == "delay":
            grid, skipped = now_ms + self.interval_ms, 0
        else:
            grid, skipped = next_rate_slot(grid_ms, self.interval_ms, now_ms, start_ms)
        return grid, grid + jitter_ms(schedule_id, grid, self.jitter_ms), skipped


def check_schedule_id(schedule_id: str) -> str:
    try:
        return check_name(schedule_id, "schedule id")
    except ValueError as exc:
        raise InvalidJob(f"{exc} (at most {MAX_NAME_LENGTH} characters)") from None


# -- stored form -------------------------------------------------------------------------------
#
# A schedule's record (its entry in the time slots after "<id>|"), its fields in the order of
# `protocol.SCHEDULE_FIELDS`:
#   "gen|grid|flags|runs|failures|misfires|last_start - grid|last_ms|late|task code|<spec>"
# with flags = priority + PAUSED_FLAG if paused, late = ms the last run started after its due
# time (written with the run's start and duration when it settles; 0 before the first run).
# Records written before `late` existed lack the field; they are read as they are (a spec
# never starts with a digit, so the layouts cannot be mistaken) and gain it (0) when next
# written. The spec is the arguments and the cadence, positional and without defaults, so a
# typical monitor's record stays small: JSON ``[args, cadence]`` or ``[args, cadence,
# kwargs]``, where the cadence is just the interval when nothing else differs from the
# defaults (msgpack alike).


@dataclass(frozen=True, slots=True)
class Record:
    """A stored schedule, parsed."""

    generation: int
    grid_ms: int
    priority: int
    paused: bool
    runs: int
    failures: int
    misfires: int
    last_start_ms: int | None
    last_ms: int
    last_late_ms: int | None
    """How long after its due time the last run started (None before it, or if not known)."""
    task_code: str
    spec: bytes


def encode_schedule_spec(
    codec: Codec,
    args: list[Any],
    kwargs: dict[str, Any],
    cadence: Cadence,
    limits: list[Any] | None = None,
    *,
    headers: dict[str, str] | None = None,
) -> bytes:
    """``[args, cadence]``, ``[args, cadence, kwargs]`` or, for a schedule with limits of its
    own (`limits.Limits.to_record`), ``[args, cadence, kwargs, limits]``, and for one with
    headers ``[args, cadence, kwargs, limits or null, headers]``: the fewest elements that
    hold it (a worker of an earlier version reads the first three and ignores the rest)."""
    wire = cadence.to_wire()
    compact: Any = wire["e"] if wire.keys() == {"e"} else wire
    if headers:
        return codec.dumps([args, compact, kwargs, limits, headers])
    if limits is not None:
        return codec.dumps([args, compact, kwargs, limits])
    return codec.dumps([args, compact, kwargs] if kwargs else [args, compact])


def decode_schedule_spec(blob: bytes) -> tuple[list[Any], dict[str, Any], Cadence, Any]:
    """``(args, kwargs, cadence, limits)`` of a spec, ``limits`` None when the schedule has
    none of its own (JSON arrays start with ``[``; else msgpack)."""
    return decode_schedule_call(blob)[:4]


def run_call(claimed: bytes, queued: bool) -> tuple[bytes, bytes]:
    """A schedule run's (task name, schedule spec) from the record its claim gave:
    ``<task name>|<spec>`` from the time slots, ``<task name>|<schedule record>`` for a run
    queued as a job (``queued``). ``ValueError`` for one that has not all its fields."""
    name, rest = claimed.split(FIELD_SEP_BYTES, 1)
    if queued:
        rest = rest.split(FIELD_SEP_BYTES, SPEC_FIELD)[SPEC_FIELD]
    return name, rest


def decode_schedule_call(
    blob: bytes | str,
) -> tuple[list[Any], dict[str, Any], Cadence, Any, dict[str, str]]:
    """`decode_schedule_spec` and the schedule's headers ({} when it has none, or they are
    not a dict). A spec as text is a field of a record the worker split (JSON)."""
    if isinstance(blob, str):
        # (A msgpack spec's bytes that are not UTF-8 were kept as surrogates: `slots.wire`.)
        raw = (_json_array(blob) if blob[:1] == "["
               else CODECS["msgpack"].loads(blob.encode("utf-8", "surrogateescape")))  # fmt: skip
    else:
        raw = _json_array(blob.decode()) if blob[:1] == b"[" else CODECS["msgpack"].loads(blob)
    cadence = raw[1]
    headers = raw[4] if len(raw) > 4 else None
    return (
        raw[0],
        raw[2] if len(raw) > 2 else {},
        Cadence.from_wire(cadence) if isinstance(cadence, dict) else _every(cadence),
        raw[3] if len(raw) > 3 else None,
        headers if isinstance(headers, dict) else {},
    )


# The C scanner `json.JSONDecoder.decode` calls (an attribute typeshed does not declare).
_scan_json: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def _json_array(text: str) -> Any:
    """``text`` decoded as the JSON codec decodes it. A worker decodes a spec per run: the C
    scanner alone takes a quarter of the time of `json.loads` (whose regexes skip whitespace
    around the value), which reads what it did not take (whitespace, or an error to raise)."""
    try:
        value, end = _scan_json(text, 0)
    except StopIteration:
        end = -1
    return value if end == len(text) else CODECS["json"].loads(text.encode())


# The cadences stored as just an interval, by (type, value): a worker decodes one per run, and
# the schedules of an app share a few intervals. Bounded, since records are data.
_EVERY: dict[tuple[type, Any], Cadence] = {}
_EVERY_MAX = 256


def _every(every: Any) -> Cadence:
    if type(every) not in (int, float, str):  # not an interval: left to whoever checks it
        return Cadence(every=every)
    key = (type(every), every)
    cadence = _EVERY.get(key)
    if cadence is None:
        cadence = Cadence(every=every)
        if len(_EVERY) < _EVERY_MAX:
            _EVERY[key] = cadence
    return cadence


def _fields(value: bytes) -> dict[str, bytes]:
    """A record's fields by name, of either layout (the spec is last and may hold the
    separator: only the fields before it are split off)."""
    sep = FIELD_SEP.encode()
    parts = value.split(sep, len(SCHEDULE_FIELDS) - 1)
    if len(parts) == len(SCHEDULE_FIELDS) and parts[-2].isdigit():
        return dict(zip(SCHEDULE_FIELDS, parts, strict=True))
    parts = value.split(sep, len(OLD_SCHEDULE_FIELDS) - 1)
    if len(parts) == len(OLD_SCHEDULE_FIELDS) and parts[-2].isdigit():
        return {"late": b"", **dict(zip(OLD_SCHEDULE_FIELDS, parts, strict=True))}
    raise ValueError(
        f"malformed schedule record: {value[:80]!r}; expected {len(SCHEDULE_FIELDS)} fields "
        f"{FIELD_SEP.join(SCHEDULE_FIELDS)}"
    )


def parse_record(value: bytes) -> Record:
    f = _fields(value)
    grid, flags = int(f["grid"]), int(f["flags"])
    return Record(
        generation=int(f["gen"]),
        grid_ms=grid,
        priority=flags % PAUSED_FLAG,
        paused=flags >= PAUSED_FLAG,
        runs=int(f["runs"]),
        failures=int(f["failures"]),
        misfires=int(f["misfires"]),
        last_start_ms=grid + int(f["last_start"]) if f["last_start"] else None,
        last_ms=int(f["last_ms"]),
        last_late_ms=int(f["late"]) if f["late"] else None,
        task_code=f["task"].decode(),
        spec=f["spec"],
    )
