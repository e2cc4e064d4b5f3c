"""The Lua scripts: loaded once, called by sha, one typed method each.

Each method returns a `Call` (sha, keys, args and a parser) that runs on the sync or the async
client alike, alone or in a pipeline, so the sync and async APIs share one definition of every
operation. Every key a script touches is passed in ``KEYS`` (Cluster-safe).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any, Generic, TypeVar

import redis
import redis.asyncio as aredis
from redis.exceptions import NoScriptError

from .keys import DEFAULT_QUEUE, WHEEL_BUCKETS, Keys, bucket_of
from .protocol import UPCOMING
from .replies import (
    ClaimResult,
    Enqueued,
    Found,
    JobState,
    Lent,
    Reaped,
    Renewed,
    parse_claim,
    parse_enqueue,
    parse_found,
    parse_ints,
    parse_lent,
    parse_reap,
    parse_renewed,
    parse_status,
)

T = TypeVar("T")

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
    "upsert_schedules",
    "unschedule",
    "pause_schedules",
    "resume_schedules",
    "run_now",
    "promote_runs",
    "finish_runs",
    "save_progress",
    "claim_urgent",
    "cancel",
    "scale_signal",
    "beat_supervisor",
    "tally",
    "count_schedules",
    "defer_unknown",
    "find_schedules",
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


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """One script invocation, ready to run on any client."""

    name: str
    keys: Sequence[str]
    args: Sequence[str | bytes | int | float]
    parse: Callable[[Any], T]

    def run(self, client: redis.Redis) -> T:
        try:
            raw = client.evalsha(SHAS[self.name], len(self.keys), *self.keys, *self.args)
        except NoScriptError:  # a restarted or failed-over Redis forgot the script
            raw = client.eval(SOURCES[self.name], len(self.keys), *self.keys, *self.args)
        return self.parse(raw)

    def command(self) -> tuple[str | bytes | int | float, ...]:
        """The EVALSHA command of this call, for a connection driven by hand (`Waiter`)."""
        return ("EVALSHA", SHAS[self.name], len(self.keys), *self.keys, *self.args)

    async def arun(self, client: aredis.Redis) -> T:
        try:
            raw = await client.evalsha(SHAS[self.name], len(self.keys), *self.keys, *self.args)
        except NoScriptError:
            raw = await client.eval(SOURCES[self.name], len(self.keys), *self.keys, *self.args)
        return self.parse(raw)


class Scripts:
    """Typed constructors for every script call of one shard."""

    def __init__(self, keys: Keys) -> None:
        self.k = keys
        self.release_into: tuple[str, ...] = ()
        """Queues whose keys complete and bury get besides those asked for (a worker's: the
        queues it serves), so the dependents they release go straight to their `ready`."""
        self._enqueue_keys: dict[str, tuple[str, ...]] = {}
        # The keys a worker passes on every claim and settle, named once (each name is a few
        # string operations in `Keys`, and the hot path passes dozens per call).
        k = keys
        self._claim_keys = (k.jobs, k.state, k.owners, k.leases, k.fence, k.seq, k.lateness,
                            k.tasks, k.progress, k.pauses)  # fmt: skip
        self._claim_queue_keys: dict[str, tuple[str, str, str]] = {}
        self._finish_keys = (k.due, k.leases, k.owners, k.state, k.faults, k.wake, k.jobs)
        self._promote_keys = (k.due, k.ready, k.jobs, k.state, k.seq, k.wake, k.tasks, k.owners,
                              k.leases, k.fence, k.lateness)  # fmt: skip
        # A bucket's keys end in its number (`bucket_keys` checks that they still do).
        self._wheel_prefix = k.wheel(0)[:-1]
        self._schedules_prefix = k.schedules(0)[:-1]

    def bucket_keys(self, bucket: int) -> tuple[str, str]:
        """(`Keys.wheel`, `Keys.schedules`) of ``bucket``, as the hot path builds them."""
        if not 0 <= bucket < WHEEL_BUCKETS:
            raise KeyError(f"unknown bucket {bucket}; expected 0..{WHEEL_BUCKETS - 1}")
        number = str(bucket)
        return self._wheel_prefix + number, self._schedules_prefix + number

    def enqueue(
        self, groups: Sequence[str | bytes | int], queue: str = DEFAULT_QUEUE
    ) -> Call[list[Enqueued]]:
        """Jobs of one queue: groups of (id, spec, priority, delay_ms, at_ms, dedup key,
        unique_for ms)."""
        keys = self._enqueue_keys.get(queue)
        if keys is None:  # built once per queue: an enqueue of one job is the hot path
            k = self.k
            keys = (k.ready_of(queue), k.due_of(queue), k.jobs, k.state, k.uniq, k.seq,
                    k.wake_of(queue), k.signals, k.queues, k.uniqfor, k.uniqends)  # fmt: skip
            self._enqueue_keys[queue] = keys
        return Call("enqueue", keys, [_queue_arg(queue), *groups], parse_enqueue)

    def claim(
        self,
        worker: str,
        limit: int,
        lease_ms: int,
        promote: int,
        buckets: Sequence[int] = (),
        *,
        queues: Sequence[str] = (DEFAULT_QUEUE,),
        routes: Sequence[str] = (),
        upcoming: int = UPCOMING,
    ) -> Call[ClaimResult]:
        """Claims from ``queues`` (the default queue first, if served). ``buckets``: schedule
        buckets whose due runs this claim takes (`upcoming` of the last reply; only with the
        default queue first: schedules are kept by it). ``routes``: other queues the runs of
        those buckets may go to (the queues served are passed anyway). ``upcoming``: most
        upcoming buckets wanted in the reply (0: none; the query costs Redis more than an
        empty claim)."""
        k = self.k
        keys = [*self._claim_keys]
        for queue in queues:
            queue_keys = self._claim_queue_keys.get(queue)
            if queue_keys is None:
                queue_keys = (k.ready_of(queue), k.due_of(queue), k.wake_of(queue))
                self._claim_queue_keys[queue] = queue_keys
            keys += queue_keys
        others = [q for q in _others(routes) if q not in queues] if routes else []
        for queue in others:
            keys += [k.ready_of(queue), k.wake_of(queue)]
        for bucket in buckets:
            keys += self.bucket_keys(bucket)
        args: list[str | int] = [worker, limit, lease_ms, promote, len(queues), len(others)]
        args.append(upcoming)
        args += [_queue_arg(q) for q in queues]
        args += [*others, *buckets]
        return Call("claim", keys, args, parse_claim)

    def complete(
        self,
        items: Sequence[tuple[str, int, bytes, int, str]],
        queues: Sequence[str] = (DEFAULT_QUEUE,),
        *,
        cancelled: bool = False,
        ttl_ms: int = 0,
    ) -> Call[list[int]]:
        """Items are (id, token, outcome, ttl_ms, dedup key as claimed: `Claimed.extra`).
        Their dependents are released into ``queues`` at once (into `freed` if theirs is not
        among them); ``cancelled``: the jobs were cancelled, so their dependents are
        dead-lettered (with an outcome kept ``ttl_ms``) unless they allow it."""
        k = self.k
        keys = [k.leases, k.owners, k.jobs, k.state, k.uniq, k.results, k.expires, k.waiting]
        keys += [k.progress, k.cancels] + [k.done(i[0]) for i in items]
        names = self._workflow_names([*queues, *self.release_into])
        keys += self._workflow_keys(names)
        args: list[str | bytes] = ["cancelled" if cancelled else "ok", str(ttl_ms)]
        args += [str(len(names)), *names]
        for job_id, token, outcome, job_ttl_ms, dedup_key in items:
            args += [f"{job_id}|{token}|{job_ttl_ms}|{dedup_key}", outcome]
        return Call("complete", keys, args, parse_ints)

    def retry(
        self, items: Sequence[tuple[str, int, int, int]], queue: str = DEFAULT_QUEUE
    ) -> Call[list[int]]:
        """Items (of one queue) are (id, token, delay_ms, priority)."""
        k = self.k
        keys = [k.leases, k.owners, k.due_of(queue), k.wake_of(queue), k.signals]
        return Call("retry", keys, [x for item in items for x in item], parse_ints)

    def bury(
        self,
        items: Sequence[tuple[str, int, bytes, int]],
        queues: Sequence[str] = (DEFAULT_QUEUE,),
        *,
        ttl_ms: int = 0,
    ) -> Call[list[int]]:
        """Items are (id, token, error record, ttl_ms). Their dependents are dead-lettered
        (outcome kept ``ttl_ms``), or released into ``queues`` where they allow the failure."""
        k = self.k
        keys = [k.leases, k.owners, k.state, k.uniq, k.dead, k.errors, k.results, k.expires]
        keys += [k.waiting, k.cancels] + [k.done(i[0]) for i in items]
        names = self._workflow_names([*queues, *self.release_into])
        keys += self._workflow_keys(names)
        args: list[str | bytes | int] = [ttl_ms, len(names), *names]
        return Call("bury", keys, args + [x for item in items for x in item], parse_ints)

    def enqueue_after(
        self, groups: Sequence[str | bytes | int], queue: str = DEFAULT_QUEUE, ttl_ms: int = 0
    ) -> Call[list[Enqueued]]:
        """Jobs of one queue that wait for others (enqueue_after.lua): per job its id, spec,
        priority, dedup key, n, then n dependencies ("<1 may fail, else 0><job id>")."""
        k = self.k
        keys = [k.jobs, k.seq, k.queues, *self._workflow_keys([_queue_name(queue)])]
        return Call("enqueue_after", keys, [_queue_arg(queue), ttl_ms, *groups], parse_enqueue)

    @staticmethod
    def _workflow_names(queues: Sequence[str]) -> list[str]:
        """The queue names whose keys a settle gets: the default queue first, each once."""
        return [DEFAULT_QUEUE, *_others(queues)]

    def _workflow_keys(self, names: Sequence[str]) -> list[str]:
        """The keys _workflows.lua's `workflow_keys` reads, then each queue's ready and wake."""
        k = self.k
        keys = [k.deps, k.dependents, k.edges, k.freed, k.dead, k.errors, k.results, k.expires]
        keys += [k.state, k.uniq, k.signals]
        for name in names:
            keys += [k.ready_of(name), k.wake_of(name)]
        return keys

    def extend_leases(
        self, worker: str, lease_ms: int, info: bytes, owned: Sequence[tuple[str, int]]
    ) -> Call[Renewed]:
        """Renews the leases of ``owned`` (id, token) claims."""
        k = self.k
        keys = [k.leases, k.owners, k.workers, k.workerinfo, k.cancels]
        args: list[str | bytes | int] = [worker, lease_ms, info]
        args += [x for pair in owned for x in pair]
        return Call("extend_leases", keys, args, parse_renewed)

    def handback(
        self, owned: Sequence[tuple[str, int]], queue: str = DEFAULT_QUEUE
    ) -> Call[list[int]]:
        """Items (of one queue) are (id, token); one 1 (handed back) or 0 (lease lost) each."""
        k = self.k
        keys = [k.leases, k.owners, k.state, k.ready_of(queue), k.wake_of(queue), k.signals,
                k.lateness]  # fmt: skip
        args = [_queue_arg(queue), *(x for pair in owned for x in pair)]
        return Call("handback", keys, args, parse_ints)

    def defer_unknown(
        self,
        owned: Sequence[tuple[str, int]],
        least_ms: int,
        most_ms: int,
        queue: str = DEFAULT_QUEUE,
    ) -> Call[list[int]]:
        """Hands back jobs (of one queue) whose task this worker lacks, to its `due` for
        ``least_ms`` up to ``most_ms`` (see defer_unknown.lua); one 1 or 0 per item."""
        k = self.k
        keys = [k.leases, k.owners, k.state, k.due_of(queue), k.wake_of(queue)]
        args = [_queue_arg(queue), least_ms, most_ms, *(x for pair in owned for x in pair)]
        return Call("defer_unknown", keys, args, parse_ints)

    def acquire_limits(
        self,
        job_id: str,
        token: int,
        *,
        queue: str,
        lease_ms: int,
        horizon_ms: int,
        limits: Sequence[tuple[str, Sequence[str | int]]],
    ) -> Call[list[int]]:
        """Acquires every limiter key of a claimed job (see acquire_limits.lua): ``limits`` are
        (key name, `Limit.args()`). Returns [1, start ms] granted, [2, start ms] reserved,
        [3, i] parked on the i-th key, [0] lease lost."""
        k = self.k
        keys = [k.leases, k.owners, k.state, k.due_of(queue), k.wake_of(queue)]
        keys += [k.ready_of(queue), k.parking, k.lateness]
        args: list[str | int] = [job_id, token, lease_ms, horizon_ms]
        for name, limit in limits:
            keys += [k.limit(name), k.permits(name), k.parked(name)]
            args += [name, *limit]
        return Call("acquire_limits", keys, args, parse_ints)

    def release_limits(
        self,
        job_id: str,
        names: Sequence[str],
        *,
        token: int | None = None,
        queues: Sequence[str],
        horizon_ms: int,
        lease_ms: int,
        batch: int,
    ) -> Call[list[int]]:
        """Drops ``job_id``'s permits (if given; unless a run other than ``token``'s owns the
        job now) on the limiter keys ``names`` and moves parked jobs of ``queues`` on (see
        release_limits.lua); returns [how many moved, the earliest time it wrote to a `due`, or
        -1]."""
        k = self.k
        keys = [k.leases, k.state, k.parking, k.owners]
        for queue in queues:
            keys += [k.ready_of(queue), k.due_of(queue), k.wake_of(queue)]
        for name in names:
            keys += [k.limit(name), k.permits(name), k.parked(name)]
        args: list[str | int] = [job_id, "" if token is None else token, len(queues)]
        args += [horizon_ms, lease_ms, batch]
        args += [*queues, *names]
        return Call("release_limits", keys, args, parse_ints)

    def reap(
        self,
        *,
        max_stalls: int,
        limit: int,
        dead_ttl_ms: int,
        worker_ttl_ms: int,
        result_ttl_ms: int,
        queues: Sequence[str] = (),
        take_over: bool = True,
    ) -> Call[Reaped]:
        """``queues``: the queues other than the default one whose jobs may be requeued;
        ``take_over`` False leaves the jobs of expired leases where they are."""
        k = self.k
        keys = [
            k.leases, k.owners, k.state, k.ready, k.dead, k.errors, k.uniq,
            k.results, k.expires, k.jobs, k.wake, k.workers, k.workerinfo, k.waiting,
            k.cancels, k.progress, k.signals,
        ]  # fmt: skip
        others = _others(queues)
        for queue in others:
            keys += [k.ready_of(queue), k.wake_of(queue)]
        args: list[str | int] = [
            max_stalls, limit, dead_ttl_ms, worker_ttl_ms, result_ttl_ms, int(take_over),
        ]  # fmt: skip
        args += others
        keys += self._workflow_keys([DEFAULT_QUEUE, *others])
        return Call("reap", keys, args, parse_reap)

    def job_status(
        self, job_id: str, wait_ms: int = 0, queues: Sequence[str] = ()
    ) -> Call[JobState]:
        """Where the job is; with ``wait_ms``, its outcome is announced on `Keys.done` if it
        comes within that time (else nobody pushes there). A job of a queue not in
        ``queues`` (besides the default one) reads as queued while it waits."""
        k = self.k
        keys = [k.ready, k.due, k.leases, k.dead, k.results, k.state, k.waiting]
        others = _others(queues)
        for queue in others:
            keys += [k.ready_of(queue), k.due_of(queue)]
        keys.append(k.deps)
        return Call("job_status", keys, [job_id, wait_ms, *others], parse_status)

    def revive(self, ids: Sequence[str], queues: Sequence[str] = ()) -> Call[int]:
        """``queues``: the queues other than the default one the jobs may belong to (a job
        of another queue is skipped)."""
        k = self.k
        keys = [k.dead, k.errors, k.state, k.ready, k.results, k.expires, k.seq, k.wake]
        keys += [k.uniq, k.jobs] + [k.done(i) for i in ids]
        others = _others(queues)
        for queue in others:
            keys += [k.ready_of(queue), k.wake_of(queue)]
        return Call("revive", keys, [len(ids), *ids, *others], int)

    def tally(self, fields: Sequence[str | int]) -> Call[int]:
        """Adds to the `metrics` counters and the `throughput` series: ``fields`` are pairs
        of field, increment."""
        return Call("tally", [self.k.metrics, self.k.throughput], fields, int)

    def count_schedules(self, buckets: Sequence[int]) -> Call[int]:
        """How many schedules the given wheel buckets of this shard hold."""
        return Call("count_schedules", [self.k.schedules(b) for b in buckets], [], int)

    def count_pending(self, queues: Sequence[str], window_ms: int, limit: int) -> Call[list[int]]:
        """The work pending on this shard in ``queues`` (the default one first): [ready, due
        within ``window_ms``, held, parked, ms until the first due one counted (-1: none), jobs
        waiting in paused queues (not in the counts before)]; ``limit`` bounds the entries
        read from each `due`."""
        k = self.k
        keys = [k.leases, k.busy, k.parking, k.pauses]
        for queue in queues:
            keys += [k.ready_of(queue), k.due_of(queue)]
        return Call("count_pending", keys, [window_ms, limit, *queues], parse_ints)

    def pause_queue(self, queue: str) -> Call[int]:
        """Adds ``queue`` to this shard's copy of `pauses`; 1 if it was not paused there."""
        return Call("pause_queue", [self.k.pauses], [queue], int)

    def resume_queue(self, queue: str, wake: bool = True) -> Call[int]:
        """Takes ``queue`` out of this shard's copy of `pauses` and, with ``wake``, wakes the
        idle workers of that queue here; 1 if it was paused there."""
        k = self.k
        keys = [k.pauses]
        if wake:
            keys += [k.signals, k.ready_of(queue), k.wake_of(queue)]
        return Call("resume_queue", keys, [queue], int)

    def find_schedules(
        self, buckets: Sequence[int], pattern: str, skip: int, limit: int
    ) -> Call[Found]:
        """Up to ``limit`` schedules whose id matches ``pattern`` (a Redis glob) in the given
        consecutive wheel buckets, skipping the first ``skip`` matches of the first bucket."""
        keys = [self.k.schedules(b) for b in buckets]
        return Call("find_schedules", keys, [pattern, skip, limit], parse_found)

    def purge(self, ids: Sequence[str]) -> Call[int]:
        k = self.k
        return Call("purge", [k.dead, k.errors, k.state, k.jobs, k.progress], list(ids), int)

    # -- schedules ---------------------------------------------------------------------------
    #
    # Every schedule script takes, after its fixed keys, the two keys of each schedule's bucket
    # (`wheel:<b>`, `schedules:<b>`), in the order of the schedules in ARGV.

    def _buckets(self, ids: Sequence[str]) -> list[str]:
        keys: list[str] = []
        for schedule_id in ids:
            bucket = bucket_of(schedule_id)
            keys += [self.k.wheel(bucket), self.k.schedules(bucket)]
        return keys

    def upsert_schedules(
        self, items: Sequence[tuple[str, int, int, int, str, bytes, str]]
    ) -> Call[list[int]]:
        """Items are (id, priority, grid_ms, due_ms, task name, spec, queue)."""
        k = self.k
        keys = [k.due, k.state, k.wake, k.tasks, k.queues]
        keys += self._buckets([i[0] for i in items])
        args: list[str | bytes | int] = []
        for schedule_id, priority, grid, due, task, spec, queue in items:
            args += [schedule_id, bucket_of(schedule_id), priority, grid, due, task, spec]
            args.append(_queue_arg(queue))
        return Call("upsert_schedules", keys, args, parse_ints)

    def unschedule(self, ids: Sequence[str], queues: Sequence[str] = ()) -> Call[int]:
        """``queues``: the queues whose `ready` a withdrawn run may wait in."""
        k = self.k
        others = _others(queues)
        keys = [k.ready, k.state, k.jobs, k.faults, *map(k.ready_of, others), *self._buckets(ids)]
        return Call("unschedule", keys, [len(others), *ids], int)

    def pause_schedules(self, ids: Sequence[str], queues: Sequence[str] = ()) -> Call[int]:
        """``queues``: the queues whose `ready` a withdrawn run may wait in."""
        k = self.k
        others = _others(queues)
        keys = [k.ready, k.state, k.jobs, *map(k.ready_of, others), *self._buckets(ids)]
        return Call("pause_schedules", keys, [len(others), *ids], int)

    def resume_schedules(self, items: Sequence[tuple[str, int, int]]) -> Call[int]:
        """Items are (id, grid_ms, due_ms)."""
        k = self.k
        keys = [k.due, k.state, k.wake, *self._buckets([i[0] for i in items])]
        args = [x for i, grid, due in items for x in (i, bucket_of(i), grid, due)]
        return Call("resume_schedules", keys, args, int)

    def run_now(self, ids: Sequence[str], queues: Sequence[str] = ()) -> Call[int]:
        """``queues``: the queues the schedules' runs may go to."""
        k = self.k
        others = _others(queues)
        keys = [k.ready, k.leases, k.state, k.seq, k.wake, k.jobs, k.tasks]
        for queue in others:
            keys += [k.ready_of(queue), k.wake_of(queue)]
        keys += self._buckets(ids)
        return Call("run_now", keys, [len(others), *others, *ids], int)

    def save_progress(self, job_id: str, token: int, progress: bytes) -> Call[int]:
        k = self.k
        return Call("save_progress", [k.owners, k.progress], [job_id, token, progress], int)

    def claim_urgent(
        self,
        worker: str,
        min_priority: int,
        lease_ms: int,
        queues: Sequence[str] = (DEFAULT_QUEUE,),
    ) -> Call[Lent]:
        """Claims the best head of the ``queues``' `ready` keys if its priority is at least
        ``min_priority`` (a paused queue's are passed over)."""
        k = self.k
        keys = [k.jobs, k.state, k.owners, k.leases, k.fence, k.progress, k.lateness, k.pauses]
        keys += [k.ready_of(queue) for queue in queues]
        args: list[str | int] = [worker, min_priority, lease_ms, *queues]
        return Call("claim_urgent", keys, args, parse_lent)

    def cancel(self, job_id: str, ttl_ms: int, queues: Sequence[str] = ()) -> Call[int]:
        """1 cancelled (it waited), 2 cancel requested (it runs), 0 nothing to cancel (or a
        waiting job of a queue not in ``queues``, besides the default one)."""
        k = self.k
        keys = [k.ready, k.due, k.leases, k.jobs, k.state, k.uniq, k.results, k.expires]
        keys += [k.waiting, k.cancels, k.progress, k.signals, k.done(job_id), k.dead, k.parking]
        others = _others(queues)
        for queue in others:
            keys += [k.ready_of(queue), k.due_of(queue)]
        keys += self._workflow_keys([DEFAULT_QUEUE, *others])
        return Call("cancel", keys, [job_id, ttl_ms, *others], int)

    def scale_signal(
        self,
        worker_ttl_ms: int,
        registrations: bool,
        queues: Sequence[str] = (DEFAULT_QUEUE,),
        windows: int = 2,
    ) -> Call[Any]:
        """What the autoscaler sizes pools on (read-only; parsed by `scale_signal.parse_signal`);
        the backlog is summed over ``queues``, the lateness read from the last ``windows``
        windows."""
        k = self.k
        keys = [k.leases, k.lateness, k.workers, k.workerinfo, k.supervisors, k.supervisorinfo]
        keys += [k.parking, k.slots, k.busy, k.where, k.paused, k.pauses]
        for queue in queues:
            keys += [k.ready_of(queue), k.due_of(queue)]
        args: list[str | int] = [worker_ttl_ms, int(registrations), windows, *queues]
        return Call("scale_signal", keys, args, lambda raw: raw)

    def beat_supervisor(self, supervisor: str, info: bytes, ttl_ms: int) -> Call[int]:
        """Registers a supervisor (an empty ``info`` deregisters it); returns the Redis time."""
        k = self.k
        keys = [k.supervisors, k.supervisorinfo]
        return Call("beat_supervisor", keys, [supervisor, info, ttl_ms], int)

    def promote_runs(
        self,
        buckets: Sequence[int],
        worker: str,
        limit: int,
        lease_ms: int,
        routes: Sequence[str] = (),
    ) -> Call[ClaimResult]:
        """``routes``: the queues other than the default one the runs may go to."""
        k = self.k
        keys = [*self._promote_keys]
        others = _others(routes)
        for queue in others:
            keys += [k.ready_of(queue), k.wake_of(queue)]
        for bucket in buckets:
            keys += self.bucket_keys(bucket)
        args: list[str | int] = [worker, limit, lease_ms, len(others), *others, *buckets]
        return Call("promote_runs", keys, args, parse_claim)

    def finish_runs(
        self, items: Sequence[tuple[str, int, str, int, int, int, int, str, int | str | None]]
    ) -> Call[list[int]]:
        """Items are (member "s:<id>", token, outcome, duration_ms, generation, next grid_ms,
        next due_ms, error, the ended run's due ms (with ":<first start ms>" after a stall:
        `protocol.run_due_ms`) or None when unknown: its lateness is then not recorded)."""
        keys = [*self._finish_keys]
        # Each bucket's keys once (the runs of a bucket end together), named by their place.
        slots: dict[int, int] = {}
        packed = []
        for member, token, outcome, ms, gen, grid, due, error, was in items:
            bucket = bucket_of(member[2:])
            slot = slots.get(bucket)
            if slot is None:
                slot = slots[bucket] = len(slots) + 1
                keys += self.bucket_keys(bucket)
            was_due = "" if was is None else was
            packed.append(
                f"{member}|{token}|{outcome}|{ms}|{gen}|{grid}|{due}|{was_due}|{bucket}/{slot}|"
                f"{error}"
            )
        return Call("finish_runs", keys, packed, parse_ints)


def _queue_arg(queue: str) -> str:
    """A queue's name as scripts store it in a job's state: empty for the default queue."""
    return "" if queue == DEFAULT_QUEUE else queue


def _queue_name(queue: str) -> str:
    """A queue's name as `Keys.ready_of` takes it (the default queue's is ``default``)."""
    return queue or DEFAULT_QUEUE


def _others(queues: Sequence[str]) -> list[str]:
    """The queues other than the default one, each once, in order."""
    return [q for q in dict.fromkeys(queues) if q != DEFAULT_QUEUE]
