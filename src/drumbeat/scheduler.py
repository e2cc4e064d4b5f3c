"""Schedules in Redis: routing ids to shards, upserts, pause / resume / remove / run-now, and
listing with state. Builds script calls; `App` runs them on its sync or async client."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Awaitable, Callable, Generator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import redis
import redis.asyncio as redis_async
from redis.exceptions import NoScriptError

from .errors import InvalidJob, UnknownTask
from .keys import DEFAULT_QUEUE, WHEEL_BUCKETS, Keys, bucket_of
from .middleware import check_header_size, check_headers
from .protocol import ROUTE_FIELD
from .schedule import (
    Cadence,
    Mode,
    _stable_hash,
    check_schedule_id,
    decode_schedule_spec,
    encode_schedule_spec,
    parse_record,
)
from .scripts import Call, Scripts
from .serialization import encode_call
from .slot_changes import SlotChanges
from .slots import SlotScripts
from .task import Options, Task

if TYPE_CHECKING:
    from .app import App

T = TypeVar("T")


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
    queue: str | None = None
    rate_limit: str | None = None
    rate_burst: int | None = None
    concurrency_limit: int | None = None
    limit_by: str | None = None
    limiter: str | None = None
    headers: Mapping[str, str] | None = field(default=None, hash=False)
    """Headers every run carries (``current_job().headers``, `JobInfo.headers`)."""

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
    last_lateness_ms: int | None
    """How long after its due time the last run started (None before the first run, and for
    a schedule whose last run ended before drumbeat recorded it)."""
    runs: int
    failures: int
    misfires: int
    last_error: str | None
    """The error of the most recent failed run (kept after later successes)."""
    generation: int
    queue: str = DEFAULT_QUEUE
    """The queue its runs go to."""


@dataclass(frozen=True, slots=True)
class Upserts:
    """The script calls of one `App.schedule_many`, grouped by shard, and the way back to the
    caller's order."""

    calls: list[Call[list[int]]]
    order: list[int]
    """The input position of each schedule, in the order the calls hold them."""
    moves: list[Call[int]] = field(default_factory=list)
    """Run before `calls`: each schedule leaves the shard it does not belong in (with
    schedule_shards > 1, a schedule that became limited or routed moves to the jobs' shard,
    and back when it no longer is)."""

    def in_order(self, results: Sequence[list[int]]) -> list[int]:
        """The calls' codes, one per schedule, in input order."""
        codes = [0] * len(self.order)
        flat = (code for result in results for code in result)
        for position, code in zip(self.order, flat, strict=True):
            codes[position] = code
        return codes


class Scheduler:
    """The schedule store of one app: shard routing and the script calls for each operation.

    With ``schedule_shards`` 1, schedules live in the jobs' shard. With S > 1, a schedule
    lives in one of S schedule shards by a hash of its id, unless its runs are limited or go
    to a queue other than the default one: such a schedule lives in the jobs' shard, where
    the limiter keys and the queues are, so one limiter holds for all its runs and every job
    (a limit is exact across shards) and its runs reach their queue. Limited work is bounded
    by its limit, so it needs no spreading. `shards` lists every shard schedules live in (the
    jobs' shard last), `apart` the S schedule shards; an id's record is in one of its `homes`.
    """

    def __init__(self, app: App) -> None:
        self.app = app
        ns, n = app.settings.namespace, app.settings.schedule_shards
        self.apart: list[Keys] = [] if n == 1 else [Keys(ns, i) for i in range(n)]
        self.shards: list[Keys] = [*self.apart, Keys(ns)]
        self.scripts = [Scripts(k) for k in self.shards]
        self.slot_scripts = [SlotScripts(k) for k in self.shards]
        self.slot_changes = [SlotChanges(k) for k in self.shards]
        self.apart_scripts = self.scripts[: len(self.apart)]
        self.jobs_shard = len(self.shards) - 1
        """The index of the jobs' shard in `shards`."""

    def shard_of(self, schedule_id: str) -> int:
        """The shard a schedule of the default queue without limits lives in."""
        if not self.apart:
            return self.jobs_shard
        return _stable_hash("shard", schedule_id) % len(self.apart)

    def homes(self, schedule_id: str) -> list[int]:
        """The shards a schedule may live in: its hashed one, then the jobs' shard."""
        shard = self.shard_of(schedule_id)
        return [shard] if shard == self.jobs_shard else [shard, self.jobs_shard]

    def _by_shard(self, ids: Iterable[str]) -> dict[int, list[str]]:
        """Each id under every shard it may live in (writes there are no-ops where it does
        not: each script skips an id without a record)."""
        out: dict[int, list[str]] = defaultdict(list)
        for schedule_id in ids:
            for shard in self.homes(check_schedule_id(schedule_id)):
                out[shard].append(schedule_id)
        return out

    def _chunks(self, items: list[Any], per_call: int = 1) -> Iterator[list[Any]]:
        step = self.app.settings.batch_limit * per_call
        for i in range(0, len(items), step):
            yield items[i : i + step]

    # -- writes ------------------------------------------------------------------------------

    def upserts(
        self, schedules: Iterable[Schedule], now_ms: int, queues: Sequence[str] = ()
    ) -> Upserts:
        """Validate and encode every schedule first (nothing is written if one is bad).
        ``queues``: with schedule_shards > 1, the queues a run of a schedule that moves may
        wait in (`App.known_queues`)."""
        groups: dict[int, list[tuple[str, int, int, int, str, bytes, str]]] = defaultdict(list)
        positions: dict[int, list[int]] = defaultdict(list)
        leaving: dict[int, list[str]] = defaultdict(list)
        for position, (shard, item, _limited) in enumerate(self._encoded(schedules, now_ms)):
            groups[shard].append(item)
            positions[shard].append(position)
            for other in self.homes(item[0]):
                if other != shard:
                    leaving[other].append(item[0])
        calls = [
            self.scripts[shard].upsert_schedules(chunk)
            for shard, items in groups.items()
            for chunk in self._chunks(items)
        ]
        # Nothing to move in most calls, but which schedules moved is not known without a read
        # per schedule: the removal is that read (a no-op for an id without a record there).
        # Removed first: a crash in between loses the schedule until it is registered again,
        # where the other order would run it twice.
        moves = [
            self.scripts[other].unschedule(chunk, queues)
            for other, ids in leaving.items()
            for chunk in self._chunks(ids)
        ]
        return Upserts(calls, [p for shard in groups for p in positions[shard]], moves)

    def _encoded(
        self, schedules: Iterable[Schedule], now_ms: int
    ) -> list[tuple[int, tuple[str, int, int, int, str, bytes, str], bool]]:
        """Each schedule checked and encoded, in order, as (its shard, its upsert item: id,
        priority, grid ms, due ms, task name, spec, queue; whether it is limited)."""
        out = []
        settings, codec = self.app.settings, self.app.codec
        for s in schedules:
            if not isinstance(s, Schedule):
                raise InvalidJob(f"schedule_many takes drumbeat.Schedule items, got {s!r}")
            check_schedule_id(s.id)
            task = self._task(s.task)
            cadence = s.cadence
            cadence.validate(settings.min_interval)
            priority = task.config.priority if s.priority is None else s.priority
            queue = task.config.queue if s.queue is None else s.queue
            Options(priority=priority, queue=queue)  # checks both
            encode_call(codec, s.args, s.kwargs, settings.max_payload_bytes)  # names a bad one
            limits = task.call_limits(
                f"schedule {s.id!r}",
                rate_limit=s.rate_limit,
                rate_burst=s.rate_burst,
                concurrency_limit=s.concurrency_limit,
                limit_by=s.limit_by,
                limiter=s.limiter,
            )
            limited = bool(limits or task.limits)
            if limited:  # an unknown limiter, a limit_by the args lack
                self.app.limits_of(limits or task.limits, task, s.args, s.kwargs)
            spec = encode_schedule_spec(
                codec,
                list(s.args),
                dict(s.kwargs),
                cadence,
                None if limits is None else limits.to_record(),
                headers=self._headers(s),
            )
            grid, due = cadence.first_due(s.id, now_ms)
            # Limited or routed: in the jobs' shard, with the limiter keys and the queues.
            shard = self.jobs_shard if limited or queue != DEFAULT_QUEUE else self.shard_of(s.id)
            out.append((shard, (s.id, priority, grid, due, task.name, spec, queue), limited))
        return out

    # -- the time-slot store (Settings.schedule_store "slots", the default) ------------------

    def slot_split(self, schedules: Iterable[Schedule], now_ms: int) -> SlotSplit:
        """The schedules the time slots keep (plain ones: per shard, their `SlotChanges.upsert`
        items) and those the wheel keeps (limited, or routed to another queue: the time slots
        cannot keep them yet), in input order."""
        split = SlotSplit()
        for i, (shard, (sid, priority, grid, due, task, spec, queue), limited) in enumerate(
            self._encoded(schedules, now_ms)
        ):
            if limited or queue != DEFAULT_QUEUE:
                split.kept.append(i)
                split.places.append(None)
            else:
                split.places.append((shard, len(split.groups[shard])))
                split.groups[shard].append((sid, priority, grid, due, task, spec))
        return split

    def slot_upsert(self, client: redis.Redis, split: SlotSplit) -> list[int | None]:
        """Upserts the plain schedules of ``split``, one call per `batch_limit`; one code per
        schedule of the split (None for those the wheel keeps)."""
        got: dict[int, list[int]] = {}
        for shard, items in split.groups.items():
            got[shard] = []
            for chunk in self._chunks(items):
                got[shard] += self.slot_changes[shard].upsert(client, chunk)
        return [None if p is None else got[p[0]][p[1]] for p in split.places]

    async def aslot_upsert(self, client: redis_async.Redis, split: SlotSplit) -> list[int | None]:
        """`slot_upsert` for async callers."""
        got: dict[int, list[int]] = {}
        for shard, items in split.groups.items():
            got[shard] = []
            for chunk in self._chunks(items):
                got[shard] += await self.slot_changes[shard].aupsert(client, chunk)
        return [None if p is None else got[p[0]][p[1]] for p in split.places]

    def slot_held(self, ids: Sequence[str]) -> Plan[list[Any]]:
        """Whether the time slots keep each of ``ids``: one item, a flag each."""
        yield (yield Reads([("HEXISTS", self.shards[self.shard_of(i)].where, i) for i in ids]))

    def slot_each(self, ids: Iterable[str], act: Callable[[SlotChanges, list[str]], int]) -> int:
        """The sum of ``act`` (a `SlotChanges` call: remove, pause, ...) over ``ids``,
        per shard and `batch_limit` chunk."""
        return sum(
            act(self.slot_changes[shard], chunk)
            for shard, items in self._slot_ids(ids).items()
            for chunk in self._chunks(items)
        )

    async def aslot_each(
        self, ids: Iterable[str], act: Callable[[SlotChanges, list[str]], Awaitable[int]]
    ) -> int:
        """`slot_each` for async calls."""
        done = 0
        for shard, items in self._slot_ids(ids).items():
            for chunk in self._chunks(items):
                done += await act(self.slot_changes[shard], chunk)
        return done

    def slot_resumed(self, now_ms: int) -> Callable[[str, bytes], tuple[int, int, int]]:
        """For `SlotChanges.resume`: a paused schedule's (generation, grid slot, due time)
        when resumed at ``now_ms``, from its record (the paused stretch is not caught up)."""

        def resumed(schedule_id: str, record: bytes) -> tuple[int, int, int]:
            parsed = parse_record(record)
            cadence = decode_schedule_spec(parsed.spec)[2]
            return (parsed.generation, *cadence.first_due(schedule_id, now_ms))

        return resumed

    def _slot_ids(self, ids: Iterable[str]) -> dict[int, list[str]]:
        """Ids by the shard they live in with the time slots (never the jobs' shard but with
        schedule_shards 1: limited and routed schedules are refused)."""
        out: dict[int, list[str]] = defaultdict(list)
        for schedule_id in ids:
            out[self.shard_of(check_schedule_id(schedule_id))].append(schedule_id)
        return out

    def _headers(self, s: Schedule) -> dict[str, str] | None:
        """A schedule's headers, checked (None when it has none)."""
        if not s.headers:
            return None
        headers = check_headers(s.headers, f"schedule {s.id!r}")
        check_header_size(headers, self.app.settings.max_header_bytes, f"schedule {s.id!r}")
        return headers

    def _task(self, task: Task[Any, Any] | str) -> Task[Any, Any]:
        if isinstance(task, Task):
            if self.app.tasks.get(task.name) is not task:
                raise UnknownTask(f"task {task.name!r} is not registered with this app")
            return task
        try:
            return self.app.get_task(task)
        except UnknownTask as exc:
            raise UnknownTask(f"cannot schedule an unknown task: {exc}") from None

    # `queues`: every queue the schedules' runs may go to (`App.known_queues`).

    def unschedules(self, ids: Iterable[str], queues: Sequence[str]) -> list[Call[int]]:
        return self._per_shard(ids, Scripts.unschedule, queues)

    def pauses(self, ids: Iterable[str], queues: Sequence[str]) -> list[Call[int]]:
        return self._per_shard(ids, Scripts.pause_schedules, queues)

    def runs_now(self, ids: Iterable[str], queues: Sequence[str]) -> list[Call[int]]:
        return self._per_shard(ids, Scripts.run_now, queues)

    def _per_shard(self, ids: Iterable[str], make: Any, queues: Sequence[str]) -> list[Call[int]]:
        return [
            make(self.scripts[shard], chunk, queues)
            for shard, items in self._by_shard(ids).items()
            for chunk in self._chunks(items)
        ]

    def resumes(self, stored: Mapping[str, bytes], now_ms: int) -> list[Call[int]]:
        """Resume calls for the schedules read from Redis (`stored`: id -> record)."""
        items: dict[int, list[tuple[str, int, int]]] = defaultdict(list)
        for schedule_id, value in stored.items():
            cadence = self.decode(schedule_id, value).cadence
            grid, due = cadence.first_due(schedule_id, now_ms)
            for shard in self.homes(schedule_id):  # a no-op where it has no record
                items[shard].append((schedule_id, grid, due))
        return [
            self.scripts[shard].resume_schedules(chunk)
            for shard, its in items.items()
            for chunk in self._chunks(its)
        ]

    # -- reads -------------------------------------------------------------------------------
    #
    # Each read is a plan: a generator that yields `Reads` (one pipelined round trip; the
    # driver sends back the replies) and the items it has found. `drive` and `adrive` execute
    # a plan on the sync or the async client, so both APIs share every command and parser.

    def records(self, ids: Sequence[str]) -> Plan[tuple[str, bytes]]:
        """The stored records of ``ids`` that exist, as (id, record)."""
        reads = [(i, shard) for i in ids for shard in self.homes(check_schedule_id(i))]
        values = yield Reads(
            [("HGET", self.shards[shard].schedules(bucket_of(i)), i) for i, shard in reads]
        )
        found: dict[str, bytes] = {}
        for (i, _), v in zip(reads, values, strict=True):
            if v is not None:
                found.setdefault(i, v)
        yield from ((i, found[i]) for i in dict.fromkeys(ids) if i in found)

    def read(self, client: redis.Redis, ids: Sequence[str]) -> dict[str, bytes]:
        """The stored records of ``ids`` that exist."""
        return dict(drive(client, self.records(ids)))

    async def aread(self, client: redis_async.Redis, ids: Sequence[str]) -> dict[str, bytes]:
        return dict(await adrive(client, self.records(ids)))

    def listing(self, prefix: str = "") -> Plan[ScheduleInfo]:
        """Every schedule whose id starts with ``prefix``, with its state: each shard's buckets
        read in pipelined batches (a bucket is small, so one HGETALL reads it whole)."""
        for keys in self.shards:
            names = _task_names((yield Reads([("HGETALL", keys.tasks)]))[0])
            for first in range(0, WHEEL_BUCKETS, _READ_BATCH):
                buckets = range(first, min(first + _READ_BATCH, WHEEL_BUCKETS))
                found = yield Reads([("HGETALL", keys.schedules(b)) for b in buckets])
                batch = [
                    (bucket, field.decode(), value)
                    for bucket, fields in zip(buckets, found, strict=True)
                    for field, value in fields.items()
                    if field.decode().startswith(prefix)
                ]
                if not batch:
                    continue
                reads: list[Command] = [("ZSCORE", keys.wheel(b), i) for b, i, _ in batch]
                *dues, faults = yield Reads(
                    [*reads, ("HMGET", keys.faults, *[i for _, i, _ in batch])]
                )
                for (_, schedule_id, value), due, fault in zip(batch, dues, faults, strict=True):
                    yield self.decode(schedule_id, value, names, due, fault)

    def iterate(self, client: redis.Redis, prefix: str = "") -> Iterator[ScheduleInfo]:
        return drive(client, self.listing(prefix))

    async def alist(self, client: redis_async.Redis, prefix: str = "") -> list[ScheduleInfo]:
        return await adrive(client, self.listing(prefix))

    def lookup(self, schedule_id: str) -> Plan[ScheduleInfo]:
        """One schedule with its state, if it exists."""
        bucket = bucket_of(schedule_id)
        for shard in self.homes(check_schedule_id(schedule_id)):
            keys = self.shards[shard]
            value, due, fault, names = yield Reads(
                [
                    ("HGET", keys.schedules(bucket), schedule_id),
                    ("ZSCORE", keys.wheel(bucket), schedule_id),
                    ("HGET", keys.faults, schedule_id),
                    ("HGETALL", keys.tasks),
                ]
            )
            if value is not None:
                yield self.decode(schedule_id, value, _task_names(names), due, fault)
                return

    def home(self, schedule_id: str) -> Plan[int]:
        """The shard a schedule lives in (an index of `shards`), if it exists: in the time
        slots of its hashed shard, or in the wheel of one of its `homes`."""
        bucket, homes = bucket_of(schedule_id), self.homes(check_schedule_id(schedule_id))
        reads: list[Command] = [
            ("HEXISTS", self.shards[i].schedules(bucket), schedule_id) for i in homes
        ]
        slotted = self.app.settings.schedule_store == "slots"
        if slotted:
            reads.append(("HEXISTS", self.shards[self.shard_of(schedule_id)].where, schedule_id))
        found = yield Reads(reads)
        if slotted and found.pop():
            yield self.shard_of(schedule_id)
            return
        for shard, there in zip(homes, found, strict=True):
            if there:
                yield shard
                return

    def home_of(self, client: redis.Redis, schedule_id: str) -> int | None:
        """The shard a schedule lives in (an index of `shards`), or None."""
        return next(drive(client, self.home(schedule_id)), None)

    async def ahome_of(self, client: redis_async.Redis, schedule_id: str) -> int | None:
        found = await adrive(client, self.home(schedule_id))
        return found[0] if found else None

    def info(self, client: redis.Redis, schedule_id: str) -> ScheduleInfo | None:
        """One schedule with its state, or None."""
        return next(drive(client, self.lookup(schedule_id)), None)

    async def ainfo(self, client: redis_async.Redis, schedule_id: str) -> ScheduleInfo | None:
        found = await adrive(client, self.lookup(schedule_id))
        return found[0] if found else None

    @property
    def slot_shards(self) -> list[int]:
        """The shards that hold schedules kept as time slots (`shards` indexes)."""
        return list(range(len(self.apart))) or [self.jobs_shard]

    def count(self, client: redis.Redis) -> int:
        """How many schedules there are (HLEN of every bucket, summed in Redis; with the time
        slots, plus each shard's `where`: the wheel keeps the limited and routed ones)."""
        slotted = 0
        if self.app.settings.schedule_store == "slots":
            with client.pipeline(transaction=False) as pipe:
                for shard in self.slot_shards:
                    pipe.hlen(self.shards[shard].where)
                slotted = sum(int(n) for n in pipe.execute())
        calls = [
            scripts.count_schedules(range(first, min(first + _COUNT_BATCH, WHEEL_BUCKETS)))
            for scripts in self.scripts
            for first in range(0, WHEEL_BUCKETS, _COUNT_BATCH)
        ]
        with client.pipeline(transaction=False) as pipe:
            for call in calls:
                # Not .evalsha: a Redis Cluster pipeline refuses it (by name).
                pipe.execute_command(*call.command())  # type: ignore[no-untyped-call]
            replies = pipe.execute(raise_on_error=False)
        # A Redis that lost its scripts (restart, failover) answered NOSCRIPT: run those again.
        return slotted + sum(
            call.run(client) if isinstance(reply, NoScriptError) else _raise_or(reply)
            for call, reply in zip(calls, replies, strict=True)
        )

    def decode(
        self,
        schedule_id: str,
        value: bytes,
        names: Mapping[str, str] | None = None,
        due: float | None = None,
        fault: bytes | None = None,
    ) -> ScheduleInfo:
        record = parse_record(value)
        args, kwargs, cadence, _ = decode_schedule_spec(record.spec)
        return ScheduleInfo(
            id=schedule_id,
            task=(names or {}).get(record.task_code, "?"),
            args=args,
            kwargs=kwargs,
            cadence=cadence,
            priority=record.priority,
            paused=record.paused,
            next_due_ms=None if due is None else int(due),
            last_run_ms=record.last_start_ms,
            last_duration_ms=record.last_ms if record.last_start_ms else None,
            last_lateness_ms=record.last_late_ms if record.last_start_ms else None,
            runs=record.runs,
            failures=record.failures,
            misfires=record.misfires,
            last_error=fault.decode(errors="replace") if fault else None,
            generation=record.generation,
            # `names` holds the `tasks` fields after their "#": the route's too.
            queue=(names or {}).get(ROUTE_FIELD[1:] + record.task_code, DEFAULT_QUEUE),
        )


# Buckets read per round trip when listing (most are empty or a few dozen entries).
_READ_BATCH = 1024
# Buckets per `count_schedules` call: a few ms of Redis time each, so other clients wait little.
_COUNT_BATCH = 4096


def _raise_or(reply: Any) -> int:
    if isinstance(reply, Exception):
        raise reply
    return int(reply)


Command = tuple[str | int | bytes, ...]


@dataclass(slots=True)
class SlotSplit:
    """`Scheduler.slot_split`: which store keeps each schedule of one upsert."""

    groups: defaultdict[int, list[tuple[str, int, int, int, str, bytes]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    """Per shard, the upsert items of the schedules the time slots keep."""
    places: list[tuple[int, int] | None] = field(default_factory=list)
    """Per schedule: (shard, place among its shard's items), or None where the wheel keeps it."""
    kept: list[int] = field(default_factory=list)
    """The places in the input of the schedules the wheel keeps."""


@dataclass(frozen=True, slots=True)
class Reads:
    """The commands of one pipelined round trip, yielded by a plan; their replies come back."""

    commands: list[Command]


Plan = Generator[Reads | T, list[Any], None]
"""A read as a generator: it yields `Reads` and gets their replies, and yields what it found."""


def drive(client: redis.Redis, plan: Plan[T]) -> Iterator[T]:
    """Runs a plan on the sync client, handing out what it finds as it goes."""
    step = next(plan, None)
    while step is not None:
        if isinstance(step, Reads):
            with client.pipeline(transaction=False) as pipe:
                _queue(pipe, step.commands)
                replies = pipe.execute()
        else:
            yield step
            replies = []
        step = _send(plan, replies)


async def adrive(client: redis_async.Redis, plan: Plan[T]) -> list[T]:
    """Runs a plan on the asyncio client; returns all it found."""
    found: list[T] = []
    step = next(plan, None)
    while step is not None:
        if isinstance(step, Reads):
            async with client.pipeline(transaction=False) as pipe:
                _queue(pipe, step.commands)
                replies = await pipe.execute()
        else:
            found.append(step)
            replies = []
        step = _send(plan, replies)
    return found


def _queue(pipe: Any, commands: list[Command]) -> None:
    # `Any`: redis-py types `execute_command` on one pipeline class and not the other, and which
    # one changes between versions.
    for command in commands:
        pipe.execute_command(*command)


def _send(plan: Plan[T], replies: list[Any]) -> Reads | T | None:
    try:
        return plan.send(replies)
    except StopIteration:
        return None


def _task_names(raw: Mapping[bytes, bytes]) -> dict[str, str]:
    """Task code -> name, from a shard's `tasks` table (see _lib.lua's task_code)."""
    return {k[1:].decode(): v.decode() for k, v in raw.items() if k.startswith(b"#") and k[1:]}
