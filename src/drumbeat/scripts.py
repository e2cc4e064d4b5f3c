"""The Lua scripts, called by sha (their sources: script_sources.py), one typed method each.

Each method returns a `Call` (sha, keys, args and a parser) that runs on the sync or the async
client alike, alone or in a pipeline, so the sync and async APIs share one definition of every
operation. Every key a script touches is passed in ``KEYS`` (Cluster-safe).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import redis
import redis.asyncio as aredis
from redis.exceptions import NoScriptError

from .keys import DEFAULT_QUEUE, Keys
from .replies import (
    ClaimResult,
    Enqueued,
    JobState,
    Lent,
    Reaped,
    Renewed,
    parse_claim,
    parse_enqueue,
    parse_ints,
    parse_lent,
    parse_reap,
    parse_renewed,
    parse_status,
)
from .script_sources import SHAS, SOURCES

T = TypeVar("T")


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
                            k.progress, k.pauses)  # fmt: skip
        self._claim_queue_keys: dict[str, tuple[str, str, str]] = {}

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
        *,
        queues: Sequence[str] = (DEFAULT_QUEUE,),
    ) -> Call[ClaimResult]:
        """Claims from ``queues`` (the default queue first, if served); ``promote``: the most
        due entries read from each queue's `due`."""
        k = self.k
        keys = [*self._claim_keys]
        for queue in queues:
            queue_keys = self._claim_queue_keys.get(queue)
            if queue_keys is None:
                queue_keys = (k.ready_of(queue), k.due_of(queue), k.wake_of(queue))
                self._claim_queue_keys[queue] = queue_keys
            keys += queue_keys
        args: list[str | int] = [worker, limit, lease_ms, promote, len(queues)]
        args += [_queue_arg(q) for q in queues]
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
        names = self.workflow_names([*queues, *self.release_into])
        keys += self.workflow_keys(names)
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
        names = self.workflow_names([*queues, *self.release_into])
        keys += self.workflow_keys(names)
        args: list[str | bytes | int] = [ttl_ms, len(names), *names]
        return Call("bury", keys, args + [x for item in items for x in item], parse_ints)

    def enqueue_after(
        self, groups: Sequence[str | bytes | int], queue: str = DEFAULT_QUEUE, ttl_ms: int = 0
    ) -> Call[list[Enqueued]]:
        """Jobs of one queue that wait for others (enqueue_after.lua): per job its id, spec,
        priority, dedup key, n, then n dependencies ("<1 may fail, else 0><job id>")."""
        k = self.k
        keys = [k.jobs, k.seq, k.queues, k.uniqfor, k.uniqends]
        keys += self.workflow_keys([_queue_name(queue)])
        return Call("enqueue_after", keys, [_queue_arg(queue), ttl_ms, *groups], parse_enqueue)

    @staticmethod
    def workflow_names(queues: Sequence[str]) -> list[str]:
        """The queue names whose keys a settle gets: the default queue first, each once."""
        return [DEFAULT_QUEUE, *_others(queues)]

    def workflow_keys(self, names: Sequence[str]) -> list[str]:
        """The keys _workflows.lua's `workflow_keys` reads, then each queue's ready and wake."""
        k = self.k
        keys = [k.deps, k.dependents, k.edges, k.freed, k.dead, k.errors, k.results, k.expires]
        keys += [k.state, k.uniq, k.signals, k.members, k.batches, k.batchttl, k.batchdone]
        keys += [k.jobs, k.progress, k.orphans, k.metrics, k.batchlist]
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
        keys += self.workflow_keys([DEFAULT_QUEUE, *others])
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

    def revive(self, ids: Sequence[str], queues: Sequence[str] = ()) -> Call[list[int]]:
        """[requeued, dependents back, batch members outside their ended batch] (revive.lua);
        ``queues``: the other queues than the default one the jobs may be of (else skipped)."""
        k = self.k
        keys = [k.dead, k.errors, k.state, k.ready, k.results, k.expires, k.seq, k.wake]
        keys += [k.uniq, k.jobs] + [k.done(i) for i in ids]
        others = _others(queues)
        for queue in others:
            keys += [k.ready_of(queue), k.wake_of(queue)]
        keys += self.workflow_keys([DEFAULT_QUEUE, *others])  # its dependents come back
        return Call("revive", keys, [len(ids), *ids, *others], parse_ints)

    def tally(self, fields: Sequence[str | int]) -> Call[int]:
        """Adds to the `metrics` counters and the `throughput` series: ``fields`` are pairs
        of field, increment."""
        return Call("tally", [self.k.metrics, self.k.throughput], fields, int)

    def count_pending(
        self,
        queues: Sequence[str],
        window_ms: int,
        limit: int,
        *,
        cutoff_ms: int | None = None,
        slots: Sequence[int] = (),
    ) -> Call[list[int]]:
        """The work pending on this shard in ``queues`` (the default one first): [ready, due
        within ``window_ms``, held, parked, ms until the first due one counted (-1: none), work
        waiting in paused queues, schedule runs due, the cutoff, then the slots to pass next];
        ``limit`` bounds the entries read from each `due` and the slots listed.

        Args:
            cutoff_ms: every run of a time slot due by it counts (-1: Redis' now, which the
                reply gives back); None: schedule runs are not counted.
            slots: the slots the last reply listed (their `slot:<ms>` keys are read).
        """
        k = self.k
        keys = [k.leases, k.busy, k.parking, k.pauses, k.slots]
        for queue in queues:
            keys += [k.ready_of(queue), k.due_of(queue)]
        keys += [k.slot(ms) for ms in slots]
        cutoff = "" if cutoff_ms is None else cutoff_ms
        args = [window_ms, limit, len(queues), cutoff, *queues, *slots]
        return Call("count_pending", keys, args, parse_ints)

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

    def purge(self, ids: Sequence[str]) -> Call[int]:
        k = self.k
        keys = [k.dead, k.errors, k.state, k.jobs, k.progress, k.orphans]
        return Call("purge", keys, list(ids), int)

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
        keys += self.workflow_keys([DEFAULT_QUEUE, *others])
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


def _queue_arg(queue: str) -> str:
    """A queue's name as scripts store it in a job's state: empty for the default queue."""
    return "" if queue == DEFAULT_QUEUE else queue


def _queue_name(queue: str) -> str:
    """A queue's name as `Keys.ready_of` takes it (the default queue's is ``default``)."""
    return queue or DEFAULT_QUEUE


def _others(queues: Sequence[str]) -> list[str]:
    """The queues other than the default one, each once, in order."""
    return [q for q in dict.fromkeys(queues) if q != DEFAULT_QUEUE]
