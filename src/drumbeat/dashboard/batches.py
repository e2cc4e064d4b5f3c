"""The Batches pages: the newest batches (``/batches``) and one batch (``/batches/<id>``: its
counts, failed members and callbacks), and their JSON (``/api/batches``, ``/api/batch/<id>``),
which is what ``drumbeat batches ls | show --json`` prints. Both read through `admin`
(`list_batches`, `batch_info`, `batch_callbacks`), as the CLI does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from drumbeat import admin
from drumbeat.cli.shapes import batch_json
from drumbeat.errors import JobNotFound

from .query import BadQuery, int_param

if TYPE_CHECKING:
    from drumbeat.app import App

    from .web import Pages

__all__ = ["PAGE", "SHOWN_FAILED", "BatchesPages", "batch_page_json", "batches_json"]

#: Batches listed on the page (the newest first; ``limit`` asks for up to 1000).
PAGE = 50
#: Failed members' ids one batch's page lists (a batch of 100,000 may have as many; its JSON
#: lists them all).
SHOWN_FAILED = 100


def batches_json(app: App, limit: int = PAGE) -> dict[str, Any]:
    """``drumbeat batches ls --json``: the newest ``limit`` batches, each with its ``phase``
    (open, closed, ended or cancelled) too."""
    infos = admin.list_batches(app, limit)
    return {"batches": [{**batch_json(i, failed=False), "phase": i.phase} for i in infos]}


def batch_page_json(app: App, batch_id: str) -> dict[str, Any] | None:
    """``drumbeat batches show --json`` of one batch, with its ``phase`` and its callbacks'
    status (``callbacks``: role -> {id, status}); None if there is no such batch (or it was
    forgotten)."""
    try:
        info = admin.batch_info(app, batch_id)
    except JobNotFound:
        return None
    callbacks = admin.batch_callbacks(app, info)
    out = {**batch_json(info, failed=True), "phase": info.phase}
    out["callbacks"] = {role: {"id": i, "status": s} for role, (i, s) in callbacks.items()}
    return out


class BatchesPages:
    """``/batches``, ``/batches/<id>`` and their JSON."""

    def __init__(self, pages: Pages) -> None:
        self.pages = pages
        self.app = pages.app

    def routes(self) -> list[Route]:
        return [
            Route("/batches", self.page),
            Route("/batches/{batch_id:str}", self.one),
            Route("/api/batches", self.api_list),
            Route("/api/batch/{batch_id:str}", self.api_one),
        ]

    async def page(self, request: Request) -> Response:
        try:
            limit = int_param(request, "limit", 1, 1000, PAGE)
        except BadQuery as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        data = await run_in_threadpool(batches_json, self.app, limit)
        return self.pages.page(
            request, "batches.html", {"b": data, "page": "batches", "limit": limit}
        )

    async def one(self, request: Request) -> Response:
        batch_id = request.path_params["batch_id"]
        found = await run_in_threadpool(batch_page_json, self.app, batch_id)
        context = {"x": found, "asked": batch_id, "page": "batches", "shown": SHOWN_FAILED}
        return self.pages.page(request, "batch.html", context, 404 if found is None else 200)

    async def api_list(self, request: Request) -> Response:
        try:
            limit = int_param(request, "limit", 0, 1000, PAGE)
        except BadQuery as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        return JSONResponse(await run_in_threadpool(batches_json, self.app, limit))

    async def api_one(self, request: Request) -> Response:
        batch_id = request.path_params["batch_id"]
        found = await run_in_threadpool(batch_page_json, self.app, batch_id)
        if found is None:
            return JSONResponse({"error": f"no batch {batch_id!r} (or it ended and expired)"}, 404)
        return JSONResponse(found)
