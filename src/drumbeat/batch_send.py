"""The MULTI that writes a batch, or adds to one: the members' enqueue calls (made by the app's
enqueue path: producer middleware, size checks, queues), then open_batch.lua, which counts them
and writes the callbacks held (batches.py has the handle; docs/workflows.md, batches)."""

from __future__ import annotations

import dataclasses
import itertools
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import redis
from redis.exceptions import RedisClusterException

from .errors import BatchEnded, ConfigurationError, InvalidJob
from .job import Job
from .job_ids import job_shard_of, new_job_id
from .script_sources import SOURCES
from .scripts import Call
from .task import Prepared
from .workflows import raise_if_refused

if TYPE_CHECKING:
    from .app import App

# A batch's fields are kept result_ttl after it ended, and at least this long: its callbacks,
# queued at its end, read it (`current_job().batch`) even where outcomes are not kept.
_KEEP_AT_LEAST_MS = 600_000

# Batches go to the job shards in turn, each process from its own place in the turn.
_TURN = itertools.count(int.from_bytes(os.urandom(2), "big"))


def new_batch_id(app: App, everything: Sequence[Prepared]) -> str:
    """A new batch's id, in its job shard: the main one if anything of it is limited (limiter
    keys live there), else the next of this process's turn over the shards (its own turn: an
    enqueue takes a step of the app's per call, and a batch makes several). Every member and
    callback goes there."""
    limited = any(
        p.options.limits or _limited(app, p.task) for p in everything if isinstance(p, Prepared)
    )
    return new_job_id(app.enqueuer.shard_for(None, limited, next(_TURN)))


def _limited(app: App, task: str) -> bool:
    known = app.tasks.get(task)
    return bool(known is not None and known.limits)


def _pinned(app: App, batch_id: str, p: Prepared, what: str) -> Prepared:
    """``p`` with its batch named (it goes in its record) and, with several job shards, its
    id in the batch's shard; `InvalidJob` for what a batch cannot hold yet."""
    if not isinstance(p, Prepared):
        raise InvalidJob(f"a batch takes jobs made by task.prepare(...), got {type(p).__name__}")
    o = p.options
    if o.job_id is not None:
        raise InvalidJob(f"a batch's {what} (task {p.task!r}) cannot be a chain's step")
    if what != "member" and (o.delay or o.at is not None or o.key is not None or o.depends_on):
        raise InvalidJob(
            f"a batch's {what} (task {p.task!r}) cannot have delay=, at=, depends_on or a "
            "dedup key (key=): it is held until its batch ends"
        )
    shard = job_shard_of(batch_id)
    if o.key is not None and app.enqueuer.shard_for(o.key, False, 0) != shard:
        raise InvalidJob(
            f"a member of task {p.task!r} has the dedup key {o.key!r}, which lives in job shard "
            f"{app.enqueuer.shard_for(o.key, False, 0)}, and batch {batch_id} lives in job shard "
            f"{shard}: a key is deduplicated in its own shard (Settings.job_shards)"
        )
    if shard and (o.limits or _limited(app, p.task)):
        raise InvalidJob(
            f"a job of task {p.task!r} has limits, which live in the main job shard, and batch "
            f"{batch_id} lives in job shard {shard}"
        )
    job_id = new_job_id(shard) if len(app.job_keys) > 1 else None
    return dataclasses.replace(p, options=dataclasses.replace(o, batch=batch_id, job_id=job_id))


def _plan(
    app: App,
    batch_id: str,
    members: Sequence[Prepared],
    callbacks: Sequence[tuple[str, Prepared]],
    sent: Any,
    *,
    add: bool,
    open: bool = False,
    parent: str = "",
) -> tuple[list[Call[Any]], list[list[int]], Call[int], list[str]]:
    """The enqueue calls of the members, the open_batch call sent after them in one MULTI (it
    writes the callbacks, encoded by the same enqueue path, held), and the callbacks' ids."""
    pinned = [_pinned(app, batch_id, p, "member") for p in members]
    calls, positions = app.enqueuer.calls(pinned, sent) if pinned else ([], [])
    queues = [str(c.args[0]) for c in calls]
    groups: list[Any] = []
    held: list[str] = []
    for role, p in callbacks:
        call = app.enqueuer.calls([_pinned(app, batch_id, p, "callback")], sent)[0][0]
        at = 1 if call.name == "enqueue" else 2  # enqueue.lua's or enqueue_after.lua's args
        job_id, spec, priority = call.args[at], call.args[at + 1], call.args[at + 2]
        groups += [role, job_id, spec, priority, call.args[0]]
        queues.append(str(call.args[0]))
        held.append(str(job_id))
    keys, scripts = app.job_shard(batch_id)
    names = scripts.workflow_names([q or "default" for q in queues])
    ids = [
        _flag(pinned[i].options) + str(job_id)
        for call, where in zip(calls, positions, strict=True)
        for job_id, i in zip(_ids(call), where, strict=True)
    ]
    k = [keys.jobs, keys.seq, keys.queues, *scripts.workflow_keys(names)]
    k += [keys.due_of(n) for n in names]
    ttl = ttl_ms(app)
    keep = max(ttl, _KEEP_AT_LEAST_MS)
    args: list[Any] = [batch_id, "add" if add else "new", 0 if open else 1, keep, ttl, parent]
    args += [len(names), *names, len(callbacks), *groups, *ids]
    return calls, positions, Call("open_batch", k, args, int), held


def _flag(o: Any) -> str:
    """How open_batch.lua takes a member: d with dependencies (its enqueue may dead-letter it),
    k with a dedup key (it may be a duplicate), else 0."""
    return "d" if o.depends_on else "k" if o.key is not None else "0"


def _ids(call: Call[Any]) -> list[Any]:
    """The job ids an enqueue call sends (enqueue.lua: groups of 7; enqueue_after.lua: 5 + n)."""
    if call.name == "enqueue":
        return list(call.args[1::7])
    ids, i = [], 2
    while i < len(call.args):
        ids.append(call.args[i])
        i += 5 + int(call.args[i + 4])
    return ids


def ttl_ms(app: App) -> int:
    return round(app.settings.result_ttl * 1000)


def send(
    app: App,
    batch_id: str,
    members: Sequence[Prepared],
    callbacks: Sequence[tuple[str, Prepared]],
    *,
    add: bool,
    open: bool = False,
    parent: str = "",
) -> list[Job[Any]]:
    def write(sent: Any) -> list[Job[Any]]:
        calls, positions, opening, held = _plan(
            app, batch_id, members, callbacks, sent, add=add, open=open, parent=parent
        )
        with _transaction(app.redis) as pipe:
            for call in [*calls, opening]:
                pipe.execute_command(*_eval(call))
            raw = pipe.execute(raise_on_error=False)
        return _replies(app, calls, positions, held, raw)

    return _refused(lambda: app.producing.around(write))


async def asend(
    app: App,
    batch_id: str,
    members: Sequence[Prepared],
    callbacks: Sequence[tuple[str, Prepared]],
    *,
    add: bool,
    open: bool = False,
    parent: str = "",
) -> list[Job[Any]]:
    async def write(sent: Any) -> list[Job[Any]]:
        calls, positions, opening, held = _plan(
            app, batch_id, members, callbacks, sent, add=add, open=open, parent=parent
        )
        async with _transaction(await app.aredis()) as pipe:
            for call in [*calls, opening]:
                pipe.execute_command(*_eval(call))
            raw = await pipe.execute(raise_on_error=False)
        return _replies(app, calls, positions, held, raw)

    try:
        return await app.producing.aaround(write)
    except redis.ResponseError as exc:
        _raise_refused(exc)
        raise


def _transaction(client: Any) -> Any:
    """A MULTI pipeline on ``client``; `ConfigurationError` on a Redis Cluster with a redis-py
    that cannot send one there (before 8.0, which the tests of batches on a cluster use)."""
    try:
        return client.pipeline(transaction=True)
    except RedisClusterException as exc:
        raise ConfigurationError(
            f"a batch is written in one MULTI, which redis-py {redis.__version__} does not send "
            f"to a Redis Cluster ({exc}): upgrade to redis>=8.0 for batches on a cluster"
        ) from None


def _eval(call: Call[Any]) -> tuple[Any, ...]:
    # EVAL, not EVALSHA: inside MULTI a NOSCRIPT would fail that one call and let the others
    # write, so a member could be enqueued but not counted. Redis caches the script all the same.
    return ("EVAL", SOURCES[call.name], len(call.keys), *call.keys, *call.args)


def _replies(
    app: App,
    calls: Sequence[Call[Any]],
    positions: Sequence[list[int]],
    held: Sequence[str],
    raw: Sequence[Any],
) -> list[Job[Any]]:
    """The members' jobs then the callbacks', or the first error Redis answered with."""
    for reply in raw:
        if isinstance(reply, Exception):
            raise reply
    results = [call.parse(reply) for call, reply in zip(calls, raw, strict=False)]
    return app.enqueuer.jobs_of(results, positions) + [Job(app, job_id) for job_id in held]


def _refused(send: Any) -> list[Job[Any]]:
    try:
        return send()  # type: ignore[no-any-return]
    except redis.ResponseError as exc:
        _raise_refused(exc)
        raise


def _raise_refused(exc: Exception) -> None:
    text = str(exc)
    for what in ("BATCH_ENDED", "BATCH_CANCELLED", "BATCH_UNKNOWN"):
        if what in text:
            said = {"BATCH_ENDED": "has ended", "BATCH_CANCELLED": "was cancelled"}
            raise BatchEnded(
                f"batch {text.split(what, 1)[1].strip()} {said.get(what, 'is unknown')}: "
                "nothing was added to it"
            ) from exc
    raise_if_refused(exc)
