"""The Schedules page and its JSON: search by id prefix a page at a time, and the actions
pause, resume, run now and remove (the `App` methods ``drumbeat schedules`` calls).

Schedules are spread over 16,384 wheel buckets per shard by a hash of their id, so no index
orders them by id: a search walks the buckets in order with `find_schedules.lua` (HSCAN with
MATCH in Redis, a few thousand buckets per call), stops once a page is full, and hands back a
cursor (shard, bucket, matches seen in it) for the next page. A page never transfers more than
its own schedules, whatever the total, and examines at most `EXAMINED_PER_PAGE` of them in
Redis: a prefix that matches few gets a short page and a cursor to search on from. Pages list
schedules in bucket order, not by id; an exact id is looked up directly and listed first.
With the time slots (`Settings.schedule_store` "slots") a search scans each shard's `where`
instead (`slot_reads.batches`), `slot_reads.SCAN_COUNT` schedules a scan call.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from drumbeat import slot_reads
from drumbeat.cli import shapes
from drumbeat.cli.schedules import cadence_text, schedule_state
from drumbeat.connections import pipeline
from drumbeat.errors import InvalidJob
from drumbeat.keys import WHEEL_BUCKETS, bucket_of
from drumbeat.scheduler import ScheduleInfo, _task_names, drive

if TYPE_CHECKING:
    from drumbeat.app import App

    from .web import Pages

__all__ = ["ACTIONS", "PAGE", "Cursor", "SchedulesPages", "find", "schedule_json"]

#: Schedules listed on one page.
PAGE = 50
#: Wheel buckets one `find_schedules` call walks (~62,000 schedules of a million).
BUCKETS_PER_CALL = 1024
#: Schedules one page examines at most (the call that passes it finishes): a prefix that
#: matches few of a million gets a short page and a cursor to search on from, so that no
#: request walks them all (~200 ms on a loaded 2-core machine; this many, ~40 ms).
EXAMINED_PER_PAGE = 125_000
#: What a schedule's record does not hold, said on the page and in the JSON.
NOT_RECORDED = (
    "the lateness of runs before the last (the overview charts p50/p99 over every schedule)",
)

_GLOB = re.compile(r"([\\*?\[\]])")


@dataclass(frozen=True, slots=True)
class Cursor:
    """Where the next page starts: a shard, a bucket, and the matches of that bucket seen.
    With the time slots (`Settings.schedule_store` "slots"): the place of a shard among
    `Scheduler.slot_shards`, an `HSCAN` cursor of its `where`, and the matches of that scan
    call seen."""

    shard: int = 0
    bucket: int = 0
    skip: int = 0

    def __str__(self) -> str:
        return f"{self.shard}.{self.bucket}.{self.skip}"

    @classmethod
    def parse(cls, text: str, *, buckets: int = WHEEL_BUCKETS) -> Cursor:
        """A cursor as `__str__` wrote it; ``buckets``: the bound of its middle part (the
        wheel's buckets; a scan cursor's 2**64 with the time slots)."""
        try:
            shard, bucket, skip = (int(part) for part in text.split("."))
        except ValueError:
            raise ValueError(
                f"cursor must be <shard>.<bucket>.<skip> as a page's next link gives it, "
                f"got {text!r}"
            ) from None
        if min(shard, bucket, skip) < 0 or bucket >= buckets:
            raise ValueError(f"cursor {text!r} is out of range")
        return cls(shard, bucket, skip)


def find(
    app: App, prefix: str, cursor: Cursor, limit: int
) -> tuple[list[ScheduleInfo], Cursor | None]:
    """Up to ``limit`` schedules whose id starts with ``prefix`` from ``cursor`` on (fewer
    once `EXAMINED_PER_PAGE` schedules were examined), and the cursor of the next page (None
    after the last). With the time slots, their shards come first (cursor shards 0..n-1),
    then the wheel's (n on), which keeps the limited and routed schedules."""
    if app.settings.schedule_store != "slots":
        return _find_wheel(app, prefix, cursor, limit)
    n = len(app.scheduler.slot_shards)
    found: list[ScheduleInfo] = []
    if cursor.shard < n:
        found, following = _find_slots(app, prefix, cursor, limit)
        if following is not None or len(found) >= limit:
            return found, following or Cursor(n, 0, 0)
        cursor = Cursor(n, 0, 0)
    more, after = _find_wheel(
        app, prefix, Cursor(cursor.shard - n, cursor.bucket, cursor.skip), limit - len(found)
    )
    return found + more, None if after is None else Cursor(
        after.shard + n, after.bucket, after.skip
    )


def _find_wheel(
    app: App, prefix: str, cursor: Cursor, limit: int
) -> tuple[list[ScheduleInfo], Cursor | None]:
    """`find` in the wheel's buckets."""
    scheduler = app.scheduler
    pattern = _GLOB.sub(r"\\\1", prefix) + "*"
    found: list[tuple[int, str, bytes]] = []
    shard, bucket, skip = cursor.shard, cursor.bucket, cursor.skip
    following: Cursor | None = None
    examined = 0
    while shard < len(scheduler.shards) and len(found) < limit:
        if examined >= EXAMINED_PER_PAGE:  # a rare prefix: hand back what was found so far
            following = Cursor(shard, bucket, 0)
            break
        buckets = range(bucket, min(bucket + BUCKETS_PER_CALL, WHEEL_BUCKETS))
        call = scheduler.scripts[shard].find_schedules(buckets, pattern, skip, limit - len(found))
        page = call.run(app.redis)
        examined += page.examined
        found += [(shard, schedule_id, record) for schedule_id, record in page.entries]
        if page.stopped >= 0:
            following = Cursor(shard, buckets[page.stopped], page.seen)
            break
        bucket, skip = buckets.stop, 0
        if bucket >= WHEEL_BUCKETS:
            shard, bucket = shard + 1, 0
    return _decode(app, found), following


def _find_slots(
    app: App, prefix: str, cursor: Cursor, limit: int
) -> tuple[list[ScheduleInfo], Cursor | None]:
    """`find` with the time slots: each shard's `where` scanned (`slot_reads.batches`) from
    the cursor's scan call on, its matches already listed skipped."""
    shards = app.scheduler.slot_shards
    found: list[ScheduleInfo] = []
    place, scan, skip = cursor.shard, cursor.bucket, cursor.skip
    examined = 0
    while place < len(shards):
        for batch in drive(
            app.redis, slot_reads.batches(app.scheduler, shards[place], prefix, scan)
        ):
            taken = batch.infos[skip : skip + limit - len(found)]
            found += taken
            if len(found) >= limit and skip + len(taken) < len(batch.infos):
                return found, Cursor(place, batch.cursor, skip + len(taken))
            skip, examined = 0, examined + slot_reads.SCAN_COUNT
            if batch.following == 0:
                break
            if len(found) >= limit or examined >= EXAMINED_PER_PAGE:
                return found, Cursor(place, batch.following, 0)
        place, scan = place + 1, 0
        if len(found) >= limit:
            return found, (Cursor(place, 0, 0) if place < len(shards) else None)
    return found, None


def _decode(app: App, found: list[tuple[int, str, bytes]]) -> list[ScheduleInfo]:
    """The schedules found, with their next due time, last error and task name (one round
    trip)."""
    if not found:
        return []
    shards = app.scheduler.shards
    by_shard: defaultdict[int, list[str]] = defaultdict(list)
    for shard, schedule_id, _ in found:
        by_shard[shard].append(schedule_id)
    with pipeline(app.redis, transaction=False) as pipe:
        for shard, ids in by_shard.items():
            pipe.hgetall(shards[shard].tasks)
            pipe.hmget(shards[shard].faults, ids)
        for shard, schedule_id, _ in found:
            pipe.zscore(shards[shard].wheel(bucket_of(schedule_id)), schedule_id)
        replies = pipe.execute()
    names: dict[int, dict[str, str]] = {}
    faults: dict[str, Any] = {}
    for i, (shard, ids) in enumerate(by_shard.items()):
        names[shard] = _task_names(replies[2 * i])
        faults.update(zip(ids, replies[2 * i + 1], strict=True))
    dues = replies[2 * len(by_shard) :]
    return [
        app.scheduler.decode(schedule_id, record, names[shard], due, faults.get(schedule_id))
        for (shard, schedule_id, record), due in zip(found, dues, strict=True)
    ]


def schedule_json(info: ScheduleInfo, now_ms: int) -> dict[str, Any]:
    """``drumbeat schedules show --json`` (how late its last run started included), plus the
    cadence as text and how overdue its next one is."""
    due = info.next_due_ms
    return {
        **shapes.schedule_json(info, schedule_state(info)),
        "cadence_text": cadence_text(info.cadence),
        "overdue_ms": max(0, now_ms - due) if due is not None else None,
    }


def _searched(app: App, following: Cursor | None) -> float:
    """The share of every shard's buckets walked up to ``following`` (1.0 when done)."""
    if following is None:
        return 1.0
    shards = len(app.scheduler.shards)
    if app.settings.schedule_store != "slots":
        return (following.shard * WHEEL_BUCKETS + following.bucket) / (shards * WHEEL_BUCKETS)
    n = len(app.scheduler.slot_shards)
    if following.shard < n:
        # Redis walks a hash's table in reverse binary order: a scan cursor's bits reversed
        # are the share of the table it has passed.
        passed = int(f"{following.bucket:064b}"[::-1], 2) / 2**64
    else:  # in the wheel's buckets, after the time slots' shards
        passed = following.bucket / WHEEL_BUCKETS
    return (following.shard + passed) / (n + shards)


def _now_ms(app: App) -> int:
    seconds, micros = app.redis.time()
    return int(seconds) * 1000 + int(micros) // 1000


def search_json(app: App, prefix: str, cursor: Cursor | None, limit: int = PAGE) -> dict[str, Any]:
    """A page of schedules whose id starts with ``prefix``; ``total`` only without a prefix
    (counting the matches of one would walk every bucket)."""
    first = cursor is None
    listed, following = find(app, prefix, cursor or Cursor(), limit)
    if first and prefix:  # an exact id first, wherever its bucket is
        try:
            exact = app.get_schedule(prefix)
        except InvalidJob:  # not a whole id (a prefix may hold what an id may not)
            exact = None
        if exact is not None:
            listed = [exact, *(s for s in listed if s.id != prefix)]
    elif prefix:  # the first page listed the exact id, wherever the search comes to it
        listed = [s for s in listed if s.id != prefix]
    now_ms = _now_ms(app)
    return {
        **shapes.timestamp("now", now_ms),
        "prefix": prefix,
        "total": None if prefix else app.scheduler.count(app.redis),
        "schedules": [schedule_json(s, now_ms) for s in listed],
        "next": None if following is None else str(following),
        "searched": _searched(app, following),
        "not_recorded": list(NOT_RECORDED),
    }


# -- routes ------------------------------------------------------------------------------------

#: The actions (path ``/schedules/<action>``) and the `App` method each one calls.
ACTIONS = {"pause": "pause", "resume": "resume", "run-now": "run_now", "remove": "unschedule"}
_DONE = {"pause": "paused", "resume": "resumed", "run-now": "queued a run of", "remove": "removed"}


class SchedulesPages:
    """``/schedules``, its actions and its JSON."""

    def __init__(self, pages: Pages) -> None:
        self.pages = pages
        self.app = pages.app

    def routes(self) -> list[Route]:
        return [
            Route("/schedules", self.page),
            Route("/schedules/{action:str}", self.act, methods=["POST"]),
            Route("/api/schedules", self.api_search),
            Route("/api/schedule/{schedule_id:path}", self.api_one),
        ]

    def _query(self, request: Request) -> tuple[str, Cursor | None, int]:
        prefix = request.query_params.get("prefix", "").strip()
        raw_cursor = request.query_params.get("cursor", "")
        bound = 2**64 if self.app.settings.schedule_store == "slots" else WHEEL_BUCKETS
        cursor = Cursor.parse(raw_cursor, buckets=bound) if raw_cursor else None
        raw_limit = request.query_params.get("limit", str(PAGE))
        if not raw_limit.isdigit() or not 1 <= int(raw_limit) <= 1000:
            raise ValueError(f"limit must be an integer in 1..1000, got {raw_limit!r}")
        return prefix, cursor, int(raw_limit)

    async def page(self, request: Request) -> Response:
        try:
            prefix, cursor, limit = self._query(request)
        except ValueError as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        data = await run_in_threadpool(search_json, self.app, prefix, cursor, limit)
        notice = request.query_params.get("done", "")
        context = {
            "s": data, "page": "schedules", "notice": notice, "first_page": cursor is None,
            "limit": limit,
        }  # fmt: skip
        return self.pages.page(request, "schedules.html", context)

    async def api_search(self, request: Request) -> Response:
        try:
            prefix, cursor, limit = self._query(request)
        except ValueError as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        return JSONResponse(await run_in_threadpool(search_json, self.app, prefix, cursor, limit))

    async def api_one(self, request: Request) -> Response:
        schedule_id = request.path_params["schedule_id"]

        def read() -> dict[str, Any] | None:
            info = self.app.get_schedule(schedule_id)
            return None if info is None else schedule_json(info, _now_ms(self.app))

        try:
            found = await run_in_threadpool(read)
        except ValueError as exc:  # not a valid schedule id
            return JSONResponse({"error": str(exc)}, status_code=400)
        if found is None:
            return JSONResponse({"error": f"no schedule with id {schedule_id!r}"}, 404)
        return JSONResponse(found)

    async def act(self, request: Request) -> Response:
        action = request.path_params["action"]
        if action not in ACTIONS:
            expected = ", ".join(f"/schedules/{a}" for a in ACTIONS)
            return JSONResponse({"error": f"expected one of {expected}"}, 404)
        form = await request.form()
        refused = self.pages.csrf_refused(request, form)
        if refused is not None:
            return refused
        ids = list(dict.fromkeys(v for v in form.getlist("id") if isinstance(v, str) and v))
        if not ids:
            return JSONResponse({"error": "give id=<schedule id> (repeatable)"}, 400)
        method = getattr(self.app, ACTIONS[action])
        try:
            done = await run_in_threadpool(method, *ids)
        except ValueError as exc:  # not a valid schedule id
            return JSONResponse({"error": str(exc)}, status_code=400)
        if "application/json" in request.headers.get("accept", ""):
            return JSONResponse({action: done})
        back = form.get("prefix", "")
        back = back if isinstance(back, str) else ""
        text = f"{_DONE[action]} {done} schedule{'s' if done != 1 else ''}"
        return RedirectResponse(
            f"/schedules?prefix={quote(back, safe='')}&done={quote(text)}", status_code=303
        )
