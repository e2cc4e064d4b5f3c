"""The Jobs page (``/jobs``) and its JSON (``/api/jobs/...``, ``/api/job/<id>``): one job looked
up by id (`job_record`) and the listings of running, queued and delayed jobs (`job_lists`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from drumbeat.keys import DEFAULT_QUEUE
from drumbeat.protocol import MAX_PRIORITY, MIN_PRIORITY

from .job_lists import PAGE, RUNNING_LIMIT, DueCursor, delayed_json, queued_json, running_json
from .job_record import job_json
from .query import BadQuery, int_param, optional_int, queue_name, shard_param

if TYPE_CHECKING:
    from drumbeat.app import App

    from .web import Pages

# The JSON of the listings and of one job is reached from here too (`dashboard.jobs.job_json`).
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


def _queue_params(app: App, request: Request) -> tuple[str, int, int | None, int, int]:
    queue = queue_name(app, request)
    priority = int_param(request, "priority", MIN_PRIORITY, MAX_PRIORITY, MAX_PRIORITY)
    after = optional_int(request, "after", 0, 2**53)
    limit = int_param(request, "limit", 1, 1000, PAGE)
    return queue, priority, after, limit, shard_param(app, request)


def _due_cursor(request: Request, name: str) -> DueCursor | None:
    raw = request.query_params.get(name, "")
    return DueCursor.parse(raw) if raw else None


def _delayed_params(app: App, request: Request) -> tuple[str, DueCursor | None, int, int]:
    queue = queue_name(app, request)
    limit = int_param(request, "limit", 1, 1000, PAGE)
    return queue, _due_cursor(request, "after"), limit, shard_param(app, request)


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
            limit = int_param(request, "limit", 0, 1000, RUNNING_LIMIT)
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
