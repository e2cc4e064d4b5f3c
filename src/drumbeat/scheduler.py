"""Schedules in Redis: routing ids to shards, upserts, pause / resume / remove / run-now, and
listing with state. Builds script calls; `App` runs them on its sync or async client."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import redis

from .errors import InvalidJob, UnknownTask
from .job import codec_of
from .keys import Keys
from .schedule import (
    RUN_PREFIX,
    Cadence,
    Mode,
    _stable_hash,
    check_schedule_id,
    encode_spec_json,
    split_stored,
)
from .scripts import Call, Scripts
from .serialization import encode_call
from .task import Options, Task

if TYPE_CHECKING:
    from .app import App


@dataclass(frozen=True, slots=True)
class Schedule:
    """One schedule for `App.schedule_many`; the fields are `App.schedule`'s arguments."""

    id: str
    task: Task[Any, Any] | str
    every: float | None = None
    cron: str | None = None
    args: Sequence[Any] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    priority: int | None = None
    tz: str = "UTC"
    mode: Mode = "rate"
    grace: float | None = None
    jitter: float = 0.0

    @property
    def cadence(self) -> Cadence:
        return Cadence(self.every, self.cron, self.tz, self.mode, self.grace, self.jitter)


@dataclass(frozen=True, slots=True)
class ScheduleInfo:
    """A schedule and its state, as `App.schedules` lists it. Times are epoch ms (Redis clock)."""

    id: str
    task: str
    args: list[Any]
    kwargs: dict[str, Any]
    cadence: Cadence
    priority: int
    paused: bool
    next_due_ms: int | None
    """None while a run is queued or in flight, or while paused."""
    last_run_ms: int | None
    last_duration_ms: int | None
    runs: int
    failures: int
    misfires: int
    last_error: str | None
    """The error of the most recent failed run (kept after later successes)."""
    generation: int


class Scheduler:
    """The schedule store of one app: shard routing and the script calls for each operation."""

    def __init__(self, app: App) -> None:
        self.app = app
        ns, n = app.settings.namespace, app.settings.schedule_shards
        self.shards: list[Keys] = [Keys(ns)] if n == 1 else [Keys(ns, i) for i in range(n)]
        self.scripts = [Scripts(k) for k in self.shards]

    def shard_of(self, schedule_id: str) -> int:
        return _stable_hash("shard", schedule_id) % len(self.shards)

    def _by_shard(self, ids: Iterable[str]) -> dict[int, list[str]]:
        out: dict[int, list[str]] = defaultdict(list)
        for schedule_id in ids:
            out[self.shard_of(check_schedule_id(schedule_id))].append(schedule_id)
        return out

    def _chunks(self, items: list[Any], per_call: int = 1) -> Iterator[list[Any]]:
        step = self.app.settings.batch_limit * per_call
        for i in range(0, len(items), step):
            yield items[i : i + step]

    # -- writes ------------------------------------------------------------------------------

    def upserts(self, schedules: Iterable[Schedule], now_ms: int) -> list[Call[list[int]]]:
        """Validate and encode every schedule first (nothing is written if one is bad)."""
        groups: dict[int, list[str | bytes | int]] = defaultdict(list)
        settings, codec = self.app.settings, self.app.codec
        for s in schedules:
            if not isinstance(s, Schedule):
                raise InvalidJob(f"schedule_many takes drumbeat.Schedule items, got {s!r}")
            check_schedule_id(s.id)
            task = self._task(s.task)
            cadence = s.cadence
            cadence.validate(settings.min_interval)
            priority = task.config.priority if s.priority is None else s.priority
            Options(priority=priority)
            args = encode_call(codec, s.args, s.kwargs, settings.max_payload_bytes)
            spec = encode_spec_json(task.name, args, cadence)
            if codec.name != "json":
                spec = codec.dumps(codec_of(spec).loads(spec))
            grid, due = cadence.first_due(s.id, now_ms)
            groups[self.shard_of(s.id)] += [s.id, priority, grid, due, spec]
        return [
            self.scripts[shard].upsert_schedules(chunk)
            for shard, items in groups.items()
            for chunk in self._chunks(items, per_call=5)
        ]

    def _task(self, task: Task[Any, Any] | str) -> Task[Any, Any]:
        if isinstance(task, Task):
            if self.app.tasks.get(task.name) is not task:
                raise UnknownTask(f"task {task.name!r} is not registered with this app")
            return task
        try:
            return self.app.get_task(task)
        except UnknownTask as exc:
            raise UnknownTask(f"cannot schedule an unknown task: {exc}") from None

    def unschedules(self, ids: Iterable[str]) -> list[Call[int]]:
        return self._per_shard(ids, Scripts.unschedule)

    def pauses(self, ids: Iterable[str]) -> list[Call[int]]:
        return self._per_shard(ids, Scripts.pause_schedules)

    def runs_now(self, ids: Iterable[str]) -> list[Call[int]]:
        return self._per_shard(ids, Scripts.run_now)

    def _per_shard(self, ids: Iterable[str], make: Any) -> list[Call[int]]:
        return [
            make(self.scripts[shard], chunk)
            for shard, items in self._by_shard(ids).items()
            for chunk in self._chunks(items)
        ]

    def resumes(self, stored: Mapping[str, bytes], now_ms: int) -> list[Call[int]]:
        """Resume calls for the schedules read from Redis (`stored`: id -> record)."""
        items: dict[int, list[tuple[str, int, int]]] = defaultdict(list)
        for schedule_id, value in stored.items():
            cadence = self.decode(schedule_id, value).cadence
            grid, due = cadence.first_due(schedule_id, now_ms)
            items[self.shard_of(schedule_id)].append((schedule_id, grid, due))
        return [
            self.scripts[shard].resume_schedules(chunk)
            for shard, its in items.items()
            for chunk in self._chunks(its)
        ]

    # -- reads -------------------------------------------------------------------------------

    def read(self, client: redis.Redis, ids: Sequence[str]) -> dict[str, bytes]:
        out: dict[str, bytes] = {}
        for shard, chunk in self._by_shard(ids).items():
            values: list[bytes | None] = client.hmget(self.shards[shard].schedules, chunk)  # type: ignore[assignment]
            out.update({i: v for i, v in zip(chunk, values, strict=True) if v is not None})
        return out

    async def aread(self, client: Any, ids: Sequence[str]) -> dict[str, bytes]:
        out: dict[str, bytes] = {}
        for shard, chunk in self._by_shard(ids).items():
            values = await client.hmget(self.shards[shard].schedules, chunk)
            out.update({i: v for i, v in zip(chunk, values, strict=True) if v is not None})
        return out

    def iterate(self, client: redis.Redis, prefix: str = "") -> Iterator[ScheduleInfo]:
        """Every schedule whose id starts with ``prefix``, with its state (HSCAN, in batches)."""
        pattern = _glob_escape(prefix) + "*"
        for keys in self.shards:
            batch: list[tuple[bytes, bytes]] = []
            seen: set[bytes] = set()  # HSCAN may return a field twice while Redis rehashes
            for item in client.hscan_iter(keys.schedules, match=pattern, count=1000):
                if item[0] in seen:
                    continue
                seen.add(item[0])
                batch.append(item)
                if len(batch) >= 1000:
                    yield from self._infos(client, keys, batch)
                    batch = []
            yield from self._infos(client, keys, batch)

    def _infos(
        self, client: redis.Redis, keys: Keys, batch: list[tuple[bytes, bytes]]
    ) -> Iterator[ScheduleInfo]:
        if not batch:
            return
        ids = [k.decode() for k, _ in batch]
        with client.pipeline(transaction=False) as pipe:
            pipe.zmscore(keys.due, [RUN_PREFIX + i for i in ids])
            pipe.hmget(keys.faults, ids)
            dues, faults = pipe.execute()
        for (schedule_id, (_, value)), due, fault in zip(
            zip(ids, batch, strict=True), dues, faults, strict=True
        ):
            info = self.decode(schedule_id, value, due, fault)
            yield info

    def decode(
        self,
        schedule_id: str,
        value: bytes,
        due: float | None = None,
        fault: bytes | None = None,
    ) -> ScheduleInfo:
        header, spec = split_stored(value)
        gen, _grid, paused, priority, runs, failures, misfires, last_start, last_ms = header
        raw = codec_of(spec).loads(spec)
        return ScheduleInfo(
            id=schedule_id,
            task=raw["t"],
            args=raw["c"][0],
            kwargs=raw["c"][1],
            cadence=Cadence.from_wire(raw["s"]),
            priority=priority,
            paused=bool(paused),
            next_due_ms=None if due is None else int(due),
            last_run_ms=last_start or None,
            last_duration_ms=last_ms if last_start else None,
            runs=runs,
            failures=failures,
            misfires=misfires,
            last_error=fault.decode(errors="replace") if fault else None,
            generation=gen,
        )


def _glob_escape(text: str) -> str:
    # Redis MATCH patterns are globs; a literal prefix must not be read as one.
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)
