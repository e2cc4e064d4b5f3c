"""The Jobs page and its JSON: one job looked up by id, the running jobs, the jobs waiting
in one queue at one priority, and the delayed jobs of one queue (waiting in its `due` for a
later time, or backing off before a retry), each a page at a time (never more than a page is
read, whatever the queue holds).

What Redis keeps of a job, and so what can be shown: its spec (task, arguments) until it
completes; its state (queue, priority, attempt); its claim (worker, claimed at) and lease while
it runs; its saved progress; its outcome (result, or error and traceback) for ``result_ttl``;
its error record while dead. Not recorded: when it was enqueued, when earlier attempts ran, and
when a successful job finished (only when its result expires).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from drumbeat import admin
from drumbeat.cli import shapes
from drumbeat.connections import pipeline
from drumbeat.errors import SerializationError
from drumbeat.job import decode_outcome, decode_progress, decode_spec
from drumbeat.keys import DEFAULT_QUEUE, Keys
from drumbeat.protocol import (
    FIELD_SEP,
    LIMIT_PREFIX,
    MAX_PRIORITY,
    MIN_PRIORITY,
    RUN_PREFIX,
    parse_owner,
)
from drumbeat.schedule import decode_schedule_spec

if TYPE_CHECKING:
    from drumbeat.app import App
    from drumbeat.scripts import Scripts

    from .web import Pages

__all__ = [
    "PAGE",
    "RUNNING_LIMIT",
    "DueCursor",
    "JobsPages",
    "delayed_json",
    "job_json",
    "queued_json",
    "running_json",
]

#: Queued jobs listed on one page.
PAGE = 50
#: Running jobs listed (the leases closest to expiry first; the page sorts them by age).
RUNNING_LIMIT = 100
#: `due` reads one page of delayed jobs makes at most: limiter keys' markers share `due` with
#: the jobs and are skipped, so a stretch of markers ends a page short, with a cursor to go on
#: from.
DUE_READS = 8
#: What a job's record does not hold, said on the page and in the JSON.
NOT_RECORDED = (
    "when it was enqueued",
    "when earlier attempts ran",
    "when a successful job finished (its result is kept until result_expires)",
)


def _str(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def _ms(value: Any) -> int | None:
    return None if value is None else int(float(value))


@dataclass(frozen=True, slots=True)
class State:
    """A job's entry in `state` (protocol.JOB_STATE_FIELDS; the short layout has no unknown
    and queue)."""

    attempt: int
    stalls: int
    priority: int
    queue: str
    dedup_key: str | None


def parse_state(raw: bytes | str | None) -> State | None:
    if raw is None:
        return None
    parts = _str(raw).split(FIELD_SEP)
    try:
        if len(parts) == 5:
            attempt, stalls, priority, _, dedup = parts
            queue = ""
        elif len(parts) == 7:
            attempt, stalls, priority, _, _, queue, dedup = parts
        else:
            return None
        return State(
            int(attempt), int(stalls), int(priority), queue or DEFAULT_QUEUE, dedup or None
        )
    except ValueError:
        return None


def describe(job_id: str, spec: bytes | None) -> dict[str, Any]:
    """Task and arguments of a `jobs` entry: a job's spec, or ``<task>|<schedule spec>`` for
    a schedule's run."""
    out: dict[str, Any] = {"task": None, "args": None, "kwargs": None, "schedule": None}
    if job_id.startswith(RUN_PREFIX):
        out["schedule"] = job_id[len(RUN_PREFIX) :]
        if spec is not None and FIELD_SEP.encode() in spec:
            task, _, blob = spec.partition(FIELD_SEP.encode())
            out["task"] = task.decode(errors="replace")
            with contextlib.suppress(Exception):  # a foreign record: shown without arguments
                out["args"], out["kwargs"], _, _ = decode_schedule_spec(blob)
        return out
    if spec is not None:
        try:
            decoded = decode_spec(spec)
        except SerializationError as exc:
            out["task"] = f"(unreadable record: {exc})"
        else:
            out.update(task=decoded.task, args=decoded.args, kwargs=decoded.kwargs)
    return out


def _shard(app: App, job_id: str) -> tuple[Keys, Scripts]:
    """A schedule's run lives in its schedule's shard; every other job in the job shard its
    id names."""
    if job_id.startswith(RUN_PREFIX):
        return app.run_shard(job_id[len(RUN_PREFIX) :])
    return app.job_shard(job_id)


def job_json(app: App, job_id: str) -> dict[str, Any]:
    """Everything Redis holds of one job (``status`` ``missing`` if nothing)."""
    keys, scripts = _shard(app, job_id)
    found = scripts.job_status(job_id, queues=app.known_queues()).run(app.redis)
    with pipeline(app.redis, transaction=True) as pipe:
        pipe.time()
        pipe.hget(keys.jobs, job_id)
        pipe.hget(keys.state, job_id)
        pipe.hget(keys.owners, job_id)
        pipe.zscore(keys.leases, job_id)
        pipe.hget(keys.results, job_id)
        pipe.zscore(keys.expires, job_id)
        pipe.zscore(keys.dead, job_id)
        pipe.hget(keys.errors, job_id)
        pipe.hget(keys.progress, job_id)
        pipe.hget(keys.cancels, job_id)
        now, spec, state_raw, owner, deadline, outcome, expires, died, error, progress, cancel = (
            pipe.execute()
        )
    state = parse_state(state_raw)
    queue = state.queue if state else DEFAULT_QUEUE
    with pipeline(app.redis, transaction=False) as pipe:
        pipe.zscore(keys.due_of(queue), job_id)
        pipe.zrank(keys.ready_of(queue), job_id)
        due, ahead = pipe.execute()
    status = _status(found.status, outcome)
    claim = parse_owner(_str(owner)) if owner is not None else None
    record = _outcome(outcome if outcome is not None else error)
    return {
        "id": job_id,
        "status": status,
        **describe(job_id, spec),
        "queue": queue if state or status != "missing" else None,
        "priority": state.priority if state else None,
        "attempt": state.attempt if state else record.get("attempt"),
        "stalls": state.stalls if state else None,
        "dedup_key": state.dedup_key if state else None,
        "queued_ahead": ahead if status == "queued" else None,
        "worker": claim.worker if claim else None,
        **shapes.timestamp("now", int(now[0]) * 1000 + int(now[1]) // 1000),
        **shapes.timestamp("due", _ms(due)),
        **shapes.timestamp("claimed", claim.claimed_ms if claim else None),
        **shapes.timestamp("lease_deadline", _ms(deadline)),
        **shapes.timestamp("failed", _ms(record.get("at_ms"))),
        **shapes.timestamp("died", _ms(died)),
        **shapes.timestamp("result_expires", _ms(expires)),
        **shapes.timestamp("cancel_requested", _ms(cancel)),
        "progress": decode_progress(progress),
        "result": record.get("result") if record.get("ok") else None,
        "error": None if record.get("ok") or not record else str(record.get("error", "")),
        "traceback": record.get("traceback") if isinstance(record.get("traceback"), str) else None,
        "not_recorded": list(NOT_RECORDED),
    }


def _status(found: str, outcome: bytes | None) -> str:
    """job_status.lua's answer, with ``finished`` told apart as complete, dead or cancelled."""
    if found != "finished":
        return found
    record = _outcome(outcome)
    if record.get("cancelled"):
        return "cancelled"
    return "complete" if record.get("ok") else "dead"


def _outcome(raw: bytes | None) -> dict[str, Any]:
    if raw is None:
        return {}
    try:
        return decode_outcome(raw)
    except Exception:  # a foreign or corrupt record: shown rather than failing the page
        return {"ok": False, "error": f"(unreadable outcome record) {raw[:200]!r}"}


def running_json(app: App, limit: int = RUNNING_LIMIT) -> dict[str, Any]:
    """The running jobs (the ``limit`` leases closest to expiry), longest-running first."""
    now_ms, total, running = admin.running_jobs(app, limit)
    specs: dict[str, Any] = {}
    plain = [r.id for r in running if not r.id.startswith(RUN_PREFIX)]
    if plain:
        with pipeline(app.redis, transaction=False) as pipe:
            for job_id in plain:  # each in the job shard its id names
                pipe.hget(app.job_shard(job_id)[0].jobs, job_id)
            specs = dict(zip(plain, pipe.execute(), strict=True))
    jobs = [
        {
            "id": r.id,
            **describe(r.id, specs.get(r.id)),
            "worker": r.worker,
            "running_s": r.lease_age,
            "lease_left_s": r.lease_left,
            **shapes.timestamp("claimed", r.claimed_ms),
            "progress": r.progress,
        }
        for r in sorted(running, key=lambda r: r.claimed_ms)
    ]
    return {**shapes.timestamp("now", now_ms), "total": total, "running": jobs}


def queued_json(
    app: App,
    queue: str,
    priority: int,
    after: int | None = None,
    limit: int = PAGE,
    *,
    shard: int = 0,
) -> dict[str, Any]:
    """The jobs waiting in ``queue`` at ``priority`` in job shard ``shard``, in the order they
    will run, starting after the score ``after`` (the ``next`` of the previous page); with the
    level's counts (in that shard: each shard keeps its own order)."""
    keys = app.job_keys[shard]
    ready = keys.ready_of(queue)
    low, high = admin.level_range(priority)
    start = low if after is None else f"({after}"
    with pipeline(app.redis, transaction=True) as pipe:
        for p in range(MIN_PRIORITY, MAX_PRIORITY + 1):
            pipe.zcount(ready, *admin.level_range(p))
        pipe.zrange(ready, start, high, byscore=True, offset=0, num=limit, withscores=True)
        *counts, page = pipe.execute()
    listed = [(_str(member), int(score)) for member, score in page]
    ids = [job_id for job_id, _ in listed]
    specs, states = [], []
    if ids:
        with pipeline(app.redis, transaction=False) as pipe:
            pipe.hmget(keys.jobs, ids)
            pipe.hmget(keys.state, ids)
            specs, states = pipe.execute()
    jobs = []
    for (job_id, score), spec, raw in zip(listed, specs, states, strict=True):
        state = parse_state(raw)
        jobs.append(
            {"id": job_id, **describe(job_id, spec), "attempt": state.attempt if state else None,
             "score": score}
        )  # fmt: skip
    more = len(listed) == limit and limit > 0
    return {
        "queue": queue,
        "shard": shard,
        "priority": priority,
        "count": int(counts[priority]),
        "counts_by_priority": [int(n) for n in counts],
        "jobs": jobs,
        "next": listed[-1][1] if more else None,
    }


@dataclass(frozen=True, slots=True)
class DueCursor:
    """Where the next page of delayed jobs starts: a due time (ms), and how many members of
    `due` with that very score the pages before listed or skipped (due times tie: jobs
    enqueued together with one delay), so that a page reads from its cursor on only."""

    score: int
    skip: int

    def __str__(self) -> str:
        return f"{self.score}.{self.skip}"

    @classmethod
    def parse(cls, text: str) -> DueCursor:
        try:
            score, skip = (int(part) for part in text.split("."))
        except ValueError:
            raise BadQuery(
                f"after must be <due ms>.<skip> as a page's next gives it, got {text!r}"
            ) from None
        if skip < 0:
            raise BadQuery(f"after {text!r} has a negative skip; expected >= 0")
        return cls(score, skip)


def _is_marker(member: str, state: bytes | None) -> bool:
    """A limiter key's marker in `due`, not a job: it has the prefix and no state (a job id
    may hold ``:``, but every job in `due` has a state)."""
    return state is None and member.startswith(LIMIT_PREFIX)


def delayed_json(
    app: App, queue: str, after: DueCursor | None = None, limit: int = PAGE, *, shard: int = 0
) -> dict[str, Any]:
    """The jobs waiting in ``queue``'s `due` (delayed, or backing off before a retry), the
    soonest due first, starting at ``after`` (the ``next`` of the previous page); markers are
    skipped. ``in_due`` counts the members of `due`, markers included (the overview's delayed
    count leaves them out by the `parking` counters)."""
    keys = app.job_keys[shard]
    due = keys.due_of(queue)
    with pipeline(app.redis, transaction=True) as pipe:
        pipe.time()
        pipe.zcard(due)
        now, in_due = pipe.execute()
    score, skip = (None, 0) if after is None else (after.score, after.skip)
    listed: list[tuple[str, int, bytes | None, bytes | None]] = []
    more = limit > 0  # until a read reaches the end of `due`
    for _ in range(DUE_READS if limit > 0 else 0):
        page = cast("list[tuple[bytes, float]]", app.redis.zrange(
            due, "-inf" if score is None else score, "+inf",
            byscore=True, offset=skip, num=limit, withscores=True,
        ))  # fmt: skip
        members = [_str(member) for member, _ in page]
        specs, states = [], []
        if members:
            with pipeline(app.redis, transaction=False) as pipe:
                pipe.hmget(keys.jobs, members)
                pipe.hmget(keys.state, members)
                specs, states = pipe.execute()
        seen = 0
        for member, (_, raw_score), spec, state in zip(members, page, specs, states, strict=True):
            seen += 1
            at = int(raw_score)
            score, skip = (at, skip + 1) if at == score else (at, 1)
            if not _is_marker(member, state):
                listed.append((member, at, spec, state))
                if len(listed) == limit:
                    break
        if len(page) < limit and seen == len(page):
            more = False
            break
        if len(listed) == limit:
            break
    jobs = []
    for job_id, at, spec, raw in listed:
        state = parse_state(raw)
        jobs.append({
            "id": job_id, **describe(job_id, spec),
            "attempt": state.attempt if state else None,
            "priority": state.priority if state else None,
            **shapes.timestamp("due", at),
        })  # fmt: skip
    return {
        **shapes.timestamp("now", int(now[0]) * 1000 + int(now[1]) // 1000),
        "queue": queue,
        "shard": shard,
        "in_due": int(in_due),
        "jobs": jobs,
        "next": str(DueCursor(score, skip)) if more and score is not None else None,
    }


# -- routes ------------------------------------------------------------------------------------


class BadQuery(ValueError):
    """A query parameter out of its range; the message says what was expected."""


def _int_param(request: Request, name: str, low: int, high: int, default: int) -> int:
    found = _optional_int(request, name, low, high)
    return default if found is None else found


def _optional_int(request: Request, name: str, low: int, high: int) -> int | None:
    raw = request.query_params.get(name, "")
    if raw == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        raise BadQuery(f"{name} must be an integer ({low}..{high}), got {raw!r}") from None
    if not low <= value <= high:
        raise BadQuery(f"{name} must be in {low}..{high}, got {value}")
    return value


def _queue_name(app: App, request: Request) -> str:
    queue = request.query_params.get("queue") or DEFAULT_QUEUE
    known = [DEFAULT_QUEUE, *(q for q in app.known_queues() if q != DEFAULT_QUEUE)]
    if queue not in known:
        raise BadQuery(f"no queue {queue!r}; expected one of {', '.join(known)}")
    return queue


def _queue_params(app: App, request: Request) -> tuple[str, int, int | None, int, int]:
    queue = _queue_name(app, request)
    priority = _int_param(request, "priority", MIN_PRIORITY, MAX_PRIORITY, MAX_PRIORITY)
    after = _optional_int(request, "after", 0, 2**53)
    limit = _int_param(request, "limit", 1, 1000, PAGE)
    return queue, priority, after, limit, _shard_param(app, request)


def _shard_param(app: App, request: Request) -> int:
    """The job shard a listing reads (``shard``; 0, the main one, by default)."""
    return _int_param(request, "shard", 0, len(app.job_keys) - 1, 0)


def _due_cursor(request: Request, name: str) -> DueCursor | None:
    raw = request.query_params.get(name, "")
    return DueCursor.parse(raw) if raw else None


def _delayed_params(app: App, request: Request) -> tuple[str, DueCursor | None, int, int]:
    queue = _queue_name(app, request)
    limit = _int_param(request, "limit", 1, 1000, PAGE)
    return queue, _due_cursor(request, "after"), limit, _shard_param(app, request)


def _bad(exc: BadQuery) -> JSONResponse:
    return JSONResponse({"error": str(exc)}, status_code=400)


class JobsPages:
    """``/jobs`` and its JSON."""

    def __init__(self, pages: Pages) -> None:
        self.pages = pages
        self.app = pages.app

    def routes(self) -> list[Route]:
        return [
            Route("/jobs", self.page),
            Route("/api/jobs/running", self.api_running),
            Route("/api/jobs/queued", self.api_queued),
            Route("/api/jobs/delayed", self.api_delayed),
            Route("/api/job/{job_id:path}", self.api_job),
        ]

    def _page_data(self, request: Request) -> dict[str, Any]:
        app = self.app
        job_id = request.query_params.get("id", "").strip()
        queue, priority, after, _, shard = _queue_params(app, request)
        due_after = _due_cursor(request, "due_after")
        # Without a priority asked for, the best one with jobs waiting.
        if "priority" not in request.query_params:
            counts = queued_json(app, queue, priority, limit=0, shard=shard)["counts_by_priority"]
            priority = next((p for p in range(MAX_PRIORITY, -1, -1) if counts[p]), MAX_PRIORITY)
        return {
            "job": job_json(app, job_id) if job_id else None,
            "asked": job_id,
            "running": running_json(app),
            "queued": queued_json(app, queue, priority, after, shard=shard),
            "queues": [DEFAULT_QUEUE, *(q for q in app.known_queues() if q != DEFAULT_QUEUE)],
            "first_page": after is None,
            "delayed": delayed_json(app, queue, due_after, shard=shard),
            "shards": len(app.job_keys),
            # What each listing link carries to stay in this shard ("" in the main one).
            "in_shard": f"&shard={shard}" if shard else "",
            "first_due_page": due_after is None,
        }

    async def page(self, request: Request) -> Response:
        try:
            data = await run_in_threadpool(self._page_data, request)
        except BadQuery as exc:
            return _bad(exc)
        return self.pages.page(request, "jobs.html", {**data, "page": "jobs"})

    async def api_job(self, request: Request) -> Response:
        found = await run_in_threadpool(job_json, self.app, request.path_params["job_id"])
        return JSONResponse(found, status_code=404 if found["status"] == "missing" else 200)

    async def api_running(self, request: Request) -> Response:
        try:
            limit = _int_param(request, "limit", 0, 1000, RUNNING_LIMIT)
        except BadQuery as exc:
            return _bad(exc)
        return JSONResponse(await run_in_threadpool(running_json, self.app, limit))

    async def api_queued(self, request: Request) -> Response:
        try:
            queue, priority, after, limit, shard = await run_in_threadpool(
                _queue_params, self.app, request
            )
        except BadQuery as exc:
            return _bad(exc)
        found = await run_in_threadpool(
            queued_json, self.app, queue, priority, after, limit, shard=shard
        )
        return JSONResponse(found)

    async def api_delayed(self, request: Request) -> Response:
        try:
            queue, after, limit, shard = await run_in_threadpool(_delayed_params, self.app, request)
        except BadQuery as exc:
            return _bad(exc)
        found = await run_in_threadpool(delayed_json, self.app, queue, after, limit, shard=shard)
        return JSONResponse(found)
