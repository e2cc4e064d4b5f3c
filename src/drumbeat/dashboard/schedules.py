"""The Schedules page and its JSON: search by id prefix a page at a time, and the actions
pause, resume, run now and remove (the `App` methods ``drumbeat schedules`` calls).

No index orders schedules by id: a search scans each shard's `where` (one field per schedule;
`schedules.reads.batches`), `schedules.reads.SCAN_COUNT` schedules a scan call, stops once a
page is full, and hands back a cursor (shard, scan cursor, matches of that scan call seen) for
the next page. A page examines at most `EXAMINED_PER_PAGE` schedules in Redis: a prefix that
matches few gets a short page and a cursor to search on from. Pages list schedules in scan
order, not by id; an exact id is looked up directly and listed first.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from drumbeat.cli.schedules import cadence_text, schedule_state
from drumbeat.cli.shapes import schedule_json as cli_schedule_json
from drumbeat.cli.shapes import timestamp
from drumbeat.errors import InvalidJob
from drumbeat.schedules import ScheduleInfo, reads
from drumbeat.schedules.plans import drive

if TYPE_CHECKING:
    from drumbeat.app import App

    from .web import Pages

__all__ = ["ACTIONS", "PAGE", "Cursor", "SchedulesPages", "find", "schedule_json"]

#: Schedules listed on one page.
PAGE = 50
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
    """Where the next page starts: a shard (an index of `ScheduleStore.shards`), an `HSCAN`
    cursor of its `where`, and the matches of that scan call seen."""

    shard: int = 0
    bucket: int = 0
    skip: int = 0

    def __str__(self) -> str:
        return f"{self.shard}.{self.bucket}.{self.skip}"

    @classmethod
    def parse(cls, text: str) -> Cursor:
        """A cursor as `__str__` wrote it."""
        try:
            shard, bucket, skip = (int(part) for part in text.split("."))
        except ValueError:
            raise ValueError(
                f"cursor must be <shard>.<bucket>.<skip> as a page's next link gives it, "
                f"got {text!r}"
            ) from None
        if min(shard, bucket, skip) < 0 or bucket >= 2**64:
            raise ValueError(f"cursor {text!r} is out of range")
        return cls(shard, bucket, skip)


def find(
    app: App, prefix: str, cursor: Cursor, limit: int
) -> tuple[list[ScheduleInfo], Cursor | None]:
    """Up to ``limit`` schedules whose id starts with ``prefix`` from ``cursor`` on (fewer
    once `EXAMINED_PER_PAGE` schedules were examined), and the cursor of the next page (None
    after the last): each shard's `where` scanned from the cursor's scan call on, its matches
    already listed skipped."""
    shards = len(app.scheduler.shards)
    found: list[ScheduleInfo] = []
    shard, scan, skip = cursor.shard, cursor.bucket, cursor.skip
    examined = 0
    while shard < shards:
        for batch in drive(app.redis, reads.batches(app.scheduler, shard, prefix, scan)):
            taken = batch.infos[skip : skip + limit - len(found)]
            found += taken
            if len(found) >= limit and skip + len(taken) < len(batch.infos):
                return found, Cursor(shard, batch.cursor, skip + len(taken))
            skip, examined = 0, examined + reads.SCAN_COUNT
            if batch.following == 0:
                break
            if len(found) >= limit or examined >= EXAMINED_PER_PAGE:
                return found, Cursor(shard, batch.following, 0)
        shard, scan = shard + 1, 0
        if len(found) >= limit:
            return found, (Cursor(shard, 0, 0) if shard < shards else None)
    return found, None


def schedule_json(info: ScheduleInfo, now_ms: int) -> dict[str, Any]:
    """``drumbeat schedules show --json`` (how late its last run started included), plus the
    cadence as text and how overdue its next one is."""
    due = info.next_due_ms
    return {
        **cli_schedule_json(info, schedule_state(info)),
        "cadence_text": cadence_text(info.cadence),
        "overdue_ms": max(0, now_ms - due) if due is not None else None,
    }


def _searched(app: App, following: Cursor | None) -> float:
    """The share of every shard's `where` scanned up to ``following`` (1.0 when done)."""
    if following is None:
        return 1.0
    # Redis walks a hash's table in reverse binary order: a scan cursor's bits reversed are
    # the share of the table it has passed.
    passed = int(f"{following.bucket:064b}"[::-1], 2) / 2**64
    return (following.shard + passed) / len(app.scheduler.shards)


def _now_ms(app: App) -> int:
    seconds, micros = app.redis.time()
    return int(seconds) * 1000 + int(micros) // 1000


def search_json(app: App, prefix: str, cursor: Cursor | None, limit: int = PAGE) -> dict[str, Any]:
    """A page of schedules whose id starts with ``prefix``; ``total`` only without a prefix
    (counting the matches of one would scan every schedule)."""
    first = cursor is None
    listed, following = find(app, prefix, cursor or Cursor(), limit)
    if first and prefix:  # an exact id first, wherever the scan finds it
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
        **timestamp("now", now_ms),
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
        cursor = Cursor.parse(raw_cursor) if raw_cursor else None
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
