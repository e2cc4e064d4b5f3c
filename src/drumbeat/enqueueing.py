"""Enqueueing: how prepared jobs become script calls and reach Redis (`App` composes an
`Enqueuer` as ``app.enqueuer``; batches and chains build their calls here too).

Each job is checked, encoded and passed through the producer middleware, then grouped: one
enqueue call per run of jobs of one queue in one job shard. The first call goes alone (it loads
the script if Redis lacks it), the rest in one pipeline.
"""

from __future__ import annotations

import itertools
import os
import zlib
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import redis
from redis.exceptions import NoScriptError

from .errors import InvalidJob
from .job import Job, encode_spec
from .job_ids import job_shard_of, new_job_id
from .keys import DEFAULT_QUEUE
from .middleware import Enqueueing, check_header_size, check_headers
from .names import check_name
from .scripts import Call
from .serialization import check_size, encode_call
from .task import Prepared, unique_ms_of
from .workflows import (
    after_previous,
    chain_steps,
    check_dependent,
    raise_if_refused,
    sent_one_by_one,
    shard_of_dependent,
)

if TYPE_CHECKING:
    from .app import App

T = TypeVar("T")

# (queue, shard, items, positions, whether its jobs wait for others: enqueue_after)
_Group = tuple[str, int, list[str | bytes | int], list[int], bool]


class Enqueuer:
    """The enqueue path of one app: which job shard a new job goes to, its script calls, and
    sending them."""

    def __init__(self, app: App) -> None:
        self.app = app
        # Producers spread jobs over the shards in turn, each from its own place in the turn.
        self._turn = itertools.count(int.from_bytes(os.urandom(2), "big"))

    def next_turn(self) -> int:
        """This producer's next step in its turn over the job shards (`shard_for`)."""
        return next(self._turn)

    def shard_for(self, key: str | None, limited: bool, turn: int) -> int:
        """Where a new job goes: a limited one to the main shard (its limiter keys live there,
        so the limit is one for all), one with a dedup key to the shard the key hashes to (so
        one key is deduplicated in one place), any other to this producer's turn."""
        n = len(self.app.job_keys)
        if n == 1 or limited:
            return 0
        if key is not None:
            return zlib.crc32(key.encode()) % n
        return turn % n

    # -- sending -------------------------------------------------------------------------------

    def enqueue_many(self, jobs: Iterable[Prepared]) -> list[Job[Any]]:
        """`App.enqueue_many`: the producer middleware around the calls of ``jobs``."""
        try:
            return self.app.producing.around(lambda sent: self._send(jobs, sent))
        except redis.ResponseError as exc:
            raise_if_refused(exc)
            raise

    async def aenqueue_many(self, jobs: Iterable[Prepared]) -> list[Job[Any]]:
        """`enqueue_many` for async callers."""
        try:
            return await self.app.producing.aaround(lambda sent: self._asend(jobs, sent))
        except redis.ResponseError as exc:
            raise_if_refused(exc)
            raise

    def _send(self, jobs: Iterable[Prepared], sent: list[Enqueueing] | None) -> list[Job[Any]]:
        calls, positions = self.calls(jobs, sent)
        if not calls:
            return []
        # The first call alone loads the script if Redis lacks it; the rest go in a pipeline.
        results = [self.run_direct(calls[0])]
        if len(calls) > 1:
            with self.app.redis.pipeline(transaction=False) as pipe:
                for call in calls[1:]:
                    # Not .evalsha: a Redis Cluster pipeline refuses it (by name).
                    pipe.execute_command(*call.command())  # type: ignore[no-untyped-call]
                raw = pipe.execute(raise_on_error=False)
            for call, reply in zip(calls[1:], raw, strict=True):
                # Scripts flushed meanwhile (a restart, SCRIPT FLUSH): a call refused with
                # NOSCRIPT did nothing, so running it again cannot add a job twice.
                again = isinstance(reply, NoScriptError)
                results.append(call.run(self.app.redis) if again else _parsed(call, reply))
        return self.jobs_of(results, positions)

    async def _asend(
        self, jobs: Iterable[Prepared], sent: list[Enqueueing] | None
    ) -> list[Job[Any]]:
        calls, positions = self.calls(jobs, sent)
        if not calls:
            return []
        client = await self.app.aredis()
        results = [await calls[0].arun(client)]
        if len(calls) > 1:
            async with client.pipeline(transaction=False) as pipe:
                for call in calls[1:]:
                    pipe.execute_command(*call.command())  # as in _send
                raw = await pipe.execute(raise_on_error=False)
            for call, reply in zip(calls[1:], raw, strict=True):
                again = isinstance(reply, NoScriptError)  # as in _send
                results.append(await call.arun(client) if again else _parsed(call, reply))
        return self.jobs_of(results, positions)

    def run_direct(self, call: Call[T]) -> T:
        """Runs ``call`` on this thread's own connection (`direct.Direct`); through the
        client (which loads a missing script, and retries a failed connection by its policy)
        when that fails."""
        try:
            raw = self.app.connections.direct.execute(*call.command())
        except (NoScriptError, redis.ConnectionError, redis.TimeoutError):
            # Refused with NOSCRIPT, the call did nothing; a lost connection is retried as the
            # client retries any command (the job's id is chosen here: a repeat writes the same
            # job again, it does not add another).
            return call.run(self.app.redis)
        return call.parse(raw)

    def jobs_of(self, results: Sequence[Any], positions: Sequence[list[int]]) -> list[Job[Any]]:
        """Each call's jobs (`calls` returned the positions), back in the order given."""
        jobs: list[Job[Any]] = [None] * sum(map(len, positions))  # type: ignore[list-item]
        for batch, where in zip(results, positions, strict=True):
            for e, i in zip(batch, where, strict=True):
                jobs[i] = Job(self.app, e.id, e.created)
        return jobs

    # -- chains --------------------------------------------------------------------------------

    def chain(self, steps: Iterable[Prepared]) -> list[Job[Any]]:
        """`App.chain`: one enqueue for the whole chain unless a step must learn the id of
        the one before (`sent_one_by_one`)."""
        chained = chain_steps(self.app, _checked_steps(steps))
        if not sent_one_by_one(chained):
            return self.enqueue_many(chained)
        jobs: list[Job[Any]] = []
        for step in chained:
            jobs += self.enqueue_many([after_previous(step, jobs[-1] if jobs else None)])
        return jobs

    async def achain(self, steps: Iterable[Prepared]) -> list[Job[Any]]:
        """`chain` for async callers."""
        chained = chain_steps(self.app, _checked_steps(steps))
        if not sent_one_by_one(chained):
            return await self.aenqueue_many(chained)
        jobs: list[Job[Any]] = []
        for step in chained:
            jobs += await self.aenqueue_many([after_previous(step, jobs[-1] if jobs else None)])
        return jobs

    # -- the calls -----------------------------------------------------------------------------

    def calls(
        self, jobs: Iterable[Prepared], sent: list[Enqueueing] | None = None
    ) -> tuple[list[Call[Any]], list[list[int]]]:
        """The enqueue calls of ``jobs`` and, per call, the positions of its jobs among them
        (the replies are put back in the order given); each job through the producer
        middleware, noted in ``sent`` (None: the app has none).

        One call per run of jobs of one queue in one shard, at most `batch_limit` jobs each: a
        shard keeps the order of its jobs (the script writes to that queue's keys, and `seq`
        orders them). A call's unkeyed jobs share one shard, and once their batch is full the
        next batch goes to the next shard: batches spread; keyed ones go where their keys hash
        to, each shard's in as few calls as its queues allow."""
        app = self.app
        groups: list[_Group] = []
        current: dict[int, int] = {}  # shard -> its group being filled
        limit, batch = app.settings.max_payload_bytes, app.settings.batch_limit
        turn = self.next_turn()
        for i, prepared in enumerate(jobs):
            if not isinstance(prepared, Prepared):
                raise InvalidJob(
                    f"enqueue_many takes jobs made by task.prepare(...) or "
                    f"task.options(...).prepare(...), got {type(prepared).__name__}"
                )
            o = prepared.options
            known = app.tasks.get(prepared.task)
            limits = o.limits or (known.limits if known is not None else None)
            if known is None:
                _check_task_name(prepared.task)
            elif limits:
                app.limits_of(limits, known, prepared.args, prepared.kwargs)
            args_blob = encode_call(app.codec, prepared.args, prepared.kwargs, limit)
            queue = o.queue or self._queue_of(prepared.task)
            unique_ms = unique_ms_of(prepared, known)
            shard, after, pinned = self._dependent_shard(prepared, unique_ms, bool(limits), turn)
            g = current.get(shard)
            spread = len(app.job_keys) > 1 and o.key is None and not limits and not pinned
            if spread and g is not None and len(groups[g][3]) >= batch:
                turn = self.next_turn()  # a full batch of unkeyed jobs: the next shard's turn
                shard = self.shard_for(None, False, turn)
                g = current.get(shard)
            if (g is None or groups[g][0] != queue or len(groups[g][3]) >= batch
                    or groups[g][4] != after):  # fmt: skip
                groups.append((queue, shard, [], [], after))
                g = current[shard] = len(groups) - 1
            job_id, headers = o.job_id or new_job_id(shard), o.headers
            if sent is not None:
                sent.append(app.producing.start(job_id, prepared.task, queue, o.priority, headers))
                headers = sent[-1].headers
            what = f"job of task {prepared.task!r}"
            if headers:  # checked again: middleware may have added to them
                headers = check_headers(headers, what)
                check_header_size(headers, app.settings.max_header_bytes, what)
            record = None if o.limits is None else o.limits.to_record()
            deps = [job for job, _ in o.depends_on]
            spec = encode_spec(
                app.codec, prepared.task, args_blob, record, headers, deps=deps, batch=o.batch
            )
            check_size(spec, limit, what)
            if after:
                groups[g][2].extend((job_id, spec, o.priority, o.key or "", len(deps)))
                groups[g][2].extend(f"{int(fails)}{job}" for job, fails in o.depends_on)
            else:
                groups[g][2].extend(
                    (job_id, spec, o.priority, o.delay_ms, o.at_ms, o.key or "", unique_ms)
                )
            groups[g][3].append(i)
        ttl_ms = round(app.settings.result_ttl * 1000)
        calls = [
            app.job_scripts[shard].enqueue_after(items, queue, ttl_ms)
            if after
            else app.job_scripts[shard].enqueue(items, queue)
            for queue, shard, items, _, after in groups
        ]
        return calls, [positions for _, _, _, positions, _ in groups]

    def _dependent_shard(
        self, prepared: Prepared, unique_ms: int, limited: bool, turn: int
    ) -> tuple[int, bool, bool]:
        """(shard, whether it goes through enqueue_after.lua, whether its shard is fixed) of a
        new job: a job with dependencies, or a chain's step (its id given), goes where they
        are; any other where `shard_for` says."""
        o = prepared.options
        if o.job_id is None and not o.depends_on:
            return self.shard_for(o.key, limited, turn), False, False
        if o.job_id is not None:
            shard = job_shard_of(o.job_id)
        elif o.key is None and not limited:
            shard = job_shard_of(o.depends_on[0][0])
        else:
            shard = self.shard_for(o.key, limited, turn)
        if shard >= len(self.app.job_keys):
            raise InvalidJob(f"job shard {shard} is beyond Settings.job_shards here")
        if not o.depends_on:  # a chain's first step: with enqueue_after only if it may
            return shard, not (o.delay or o.at is not None or unique_ms), True
        check_dependent(prepared, unique_ms)
        return shard_of_dependent(prepared, shard), True, True

    def _queue_of(self, task: str) -> str:
        known = self.app.tasks.get(task)
        return DEFAULT_QUEUE if known is None else known.config.queue


def _checked_steps(steps: Iterable[Prepared]) -> list[Prepared]:
    steps = list(steps)
    for step in steps:
        if not isinstance(step, Prepared):
            raise InvalidJob(
                f"chain takes jobs made by task.prepare(...) or task.options(...).prepare(...), "
                f"got {type(step).__name__}"
            )
    return steps


def _parsed(call: Call[T], reply: Any) -> T:
    """A pipelined reply: the call's result, or the error Redis answered with, raised."""
    if isinstance(reply, Exception):
        raise reply
    return call.parse(reply)


def _check_task_name(name: str) -> None:
    try:
        check_name(name, "task name")
    except ValueError as exc:
        raise InvalidJob(str(exc)) from None
