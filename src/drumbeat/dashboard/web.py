"""The dashboard's app: the guard in front of every route, the Overview and Dead-letters pages
(server-rendered with Jinja2, autoescaped), the JSON they show (``/api/...``, the shapes
``--json`` prints in the CLI), ``/metrics``, login, and the dead-letter and queue actions (POST
with a CSRF token). The Jobs, Schedules and Batches pages live in `jobs`, `schedules` and
`batches`, the overview's charts in `charts`. Reads run in a worker thread, so a slow Redis
never stalls the event loop.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from importlib import resources
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp

from drumbeat import admin, metrics, scale_signal
from drumbeat.cli.shapes import dead_letters_json, status_json

from . import charts
from .batches import BatchesPages
from .jobs import JobsPages
from .schedules import SchedulesPages
from .security import CSRF_FIELD, CSRF_HEADER, Guard

if TYPE_CHECKING:
    from drumbeat.app import App

__all__ = ["DEAD_PAGE", "create_app", "dead_json", "overview_json"]

#: Dead letters listed on one page (the newest first).
DEAD_PAGE = 100
#: Seconds between two refreshes of the overview (htmx polls the page and swaps its body).
REFRESH_SECONDS = 2

_HERE = resources.files("drumbeat") / "dashboard"
_SECURITY_HEADERS = {
    # Scripts and styles only from the dashboard itself: were an escape missed, an injected
    # <script> still would not run.
    "content-security-policy": "default-src 'self'; script-src 'self'; style-src 'self'; "
    "img-src 'self' data:; frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",
}


def overview_json(app: App) -> dict[str, Any]:
    """``drumbeat status --json``, plus ready jobs per queue and priority, parked jobs per
    queue (``parked_by_queue``; the total is ``queue.parked``), and the last 15
    minutes' throughput and schedule lateness (`charts.series_json`)."""
    stats = admin.queue_stats(app)
    schedules = admin.schedule_stats(app)
    signal = scale_signal.read_signal(app)
    out = status_json(app.settings.namespace, stats, schedules, signal, app.settings.concurrency)
    out["queues"] = {q: list(counts) for q, counts in admin.ready_by_queue(stats).items()}
    out["parked_by_queue"] = {q.name: q.parked for q in stats.queues}
    out["paused_queues"] = [q.name for q in stats.queues if q.paused]
    out["charts"] = charts.series_json(app)
    return out


def dead_json(app: App, limit: int = DEAD_PAGE) -> dict[str, Any]:
    """``drumbeat dead --json``: the newest ``limit`` dead letters and how many there are."""
    return dead_letters_json(admin.dead_letters(app, limit), admin.dead_count(app))


def _environment() -> Environment:
    env = Environment(
        loader=FileSystemLoader(str(_HERE / "templates")),
        autoescape=select_autoescape(["html"]),
    )
    env.filters["pretty"] = lambda v: json.dumps(v, ensure_ascii=False, default=repr)
    env.filters["urlquote"] = lambda v: quote(str(v), safe="")
    return env


class _Guarded(BaseHTTPMiddleware):
    """Host check, authentication and read-only, before any route; security headers on every
    response. (Each action checks the CSRF token itself: it is in the form body, which the
    route reads.)"""

    def __init__(self, asgi: ASGIApp, guard: Guard, page: Callable[..., HTMLResponse]) -> None:
        super().__init__(asgi)
        self.guard = guard
        self.page = page

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        response = await self._check(request, call_next)
        response.headers.update(_SECURITY_HEADERS)
        return response

    async def _check(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        guard, path = self.guard, request.url.path
        if not guard.host_allowed(request):
            return Response(
                "this dashboard listens on loopback and answers only loopback host names "
                "(localhost, 127.0.0.1, [::1]); got Host: " + request.headers.get("host", ""),
                status_code=400,
                media_type="text/plain",
            )
        if path == "/login" or path.startswith("/static/"):
            return await call_next(request)
        if not guard.authenticated(request):
            if path.startswith(("/api/", "/metrics")) or request.method != "GET":
                return JSONResponse(
                    {"error": "a token is required: send Authorization: Bearer <token>, or log "
                              "in at /login"},
                    status_code=401, headers={"www-authenticate": 'Bearer realm="drumbeat"'},
                )  # fmt: skip
            return self.page(request, "login.html", {"next": path}, status_code=401)
        if request.method == "POST" and self.guard.read_only:
            return JSONResponse(
                {"error": "the dashboard runs with --read-only: no action is allowed"},
                status_code=403,
            )
        return await call_next(request)


class Pages:
    """The routes of one App's dashboard."""

    def __init__(self, app: App, guard: Guard) -> None:
        self.app = app
        self.guard = guard
        self.env = _environment()

    def page(
        self, request: Request, name: str, context: dict[str, Any], status_code: int = 200
    ) -> HTMLResponse:
        guard = self.guard
        html = self.env.get_template(name).render(
            request=request,
            namespace=self.app.settings.namespace,
            csrf=guard.csrf,
            read_only=guard.read_only,
            token_auth=guard.token is not None,
            refresh=REFRESH_SECONDS,
            **context,
        )
        return HTMLResponse(html, status_code=status_code)

    async def overview(self, request: Request) -> Response:
        data = await run_in_threadpool(overview_json, self.app)
        drawn = charts.overview_charts(data["charts"])
        return self.page(request, "overview.html", {"o": data, "page": "overview", "charts": drawn})

    async def dead(self, request: Request) -> Response:
        data = await run_in_threadpool(dead_json, self.app, DEAD_PAGE)
        notice = request.query_params.get("done", "")
        return self.page(request, "dead.html", {"d": data, "page": "dead", "notice": notice})

    async def api_overview(self, request: Request) -> Response:
        return JSONResponse(await run_in_threadpool(overview_json, self.app))

    async def api_dead(self, request: Request) -> Response:
        try:
            limit = min(1000, max(0, int(request.query_params.get("limit", DEAD_PAGE))))
        except ValueError:
            return JSONResponse({"error": "limit must be an integer (0..1000)"}, status_code=400)
        return JSONResponse(await run_in_threadpool(dead_json, self.app, limit))

    async def prometheus(self, request: Request) -> Response:
        body = await run_in_threadpool(metrics.render, self.app)
        return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")

    async def dead_action(self, request: Request) -> Response:
        action = request.path_params["action"]
        if action not in ("retry", "purge"):
            return JSONResponse({"error": "expected /dead/retry or /dead/purge"}, 404)
        form = await request.form()
        refused = self.csrf_refused(request, form)
        if refused is not None:
            return refused
        ids = [v for v in form.getlist("id") if isinstance(v, str)]
        every = form.get("all") == "1"
        if not ids and not every:
            return JSONResponse({"error": "give id=<job id> (repeatable) or all=1"}, 400)
        targets = None if every else ids
        if action == "retry":
            revived = await run_in_threadpool(admin.retry_dead, self.app, targets)
            reply = {"retry": revived.jobs, "dependents": revived.dependents,
                     "outside_batch": revived.outside_batch}  # fmt: skip
            said = f"{revived.jobs} requeued"
            if revived.dependents:
                said += f" and {revived.dependents} dependents dead-lettered with them"
        else:
            reply = {"purge": await run_in_threadpool(admin.purge_dead, self.app, targets)}
            said = f"{reply['purge']} purged"
        if "application/json" in request.headers.get("accept", ""):
            return JSONResponse(reply)
        return RedirectResponse(f"/dead?done={quote(said)}", status_code=303)

    async def queue_action(self, request: Request) -> Response:
        """Pauses or resumes the queue the form names (`App.pause_queue`)."""
        action = request.path_params["action"]
        if action not in ("pause", "resume"):
            return JSONResponse({"error": "expected /queues/pause or /queues/resume"}, 404)
        form = await request.form()
        refused = self.csrf_refused(request, form)
        if refused is not None:
            return refused
        queue = form.get("queue")
        if not isinstance(queue, str) or not queue:
            return JSONResponse({"error": "give queue=<queue name>"}, 400)
        apply = self.app.pause_queue if action == "pause" else self.app.resume_queue
        try:
            changed = await run_in_threadpool(apply, queue)
        except ValueError as exc:  # a name the key schema refuses
            return JSONResponse({"error": str(exc)}, 400)
        if "application/json" in request.headers.get("accept", ""):
            return JSONResponse({"queue": queue, action: changed})
        return RedirectResponse("/", status_code=303)

    def csrf_refused(self, request: Request, form: FormData) -> Response | None:
        """Every action checks the CSRF token the pages embed (form field or header)."""
        given = request.headers.get(CSRF_HEADER) or form.get(CSRF_FIELD, "")
        if isinstance(given, str) and self.guard.csrf_ok(given):
            return None
        return JSONResponse(
            {"error": f"missing or wrong CSRF token: a POST must carry the token the page "
                      f"embeds, as form field {CSRF_FIELD!r} or header {CSRF_HEADER!r}"},
            status_code=403,
        )  # fmt: skip

    async def login(self, request: Request) -> Response:
        if request.method == "GET":
            target = _local(request.query_params.get("next", "/"))
            return self.page(request, "login.html", {"next": target})
        form = await request.form()
        given, target = form.get("token", ""), _local(form.get("next", "/"))
        if not isinstance(given, str) or not self.guard.token_matches(given):
            return self.page(request, "login.html", {"next": target, "wrong": True}, 401)
        response = RedirectResponse(target, status_code=303)
        self.guard.set_session(response)
        return response


def _local(target: Any) -> str:
    """A path on this dashboard to go to after logging in (never another host)."""
    ok = isinstance(target, str) and target.startswith("/") and not target.startswith("//")
    return target if ok else "/"


def create_app(app: App, guard: Guard) -> Starlette:
    """The ASGI app serving ``app``'s dashboard, guarded by ``guard``."""
    pages = Pages(app, guard)
    routes = [
        *JobsPages(pages).routes(),
        *SchedulesPages(pages).routes(),
        *BatchesPages(pages).routes(),
        Route("/", pages.overview),
        Route("/dead", pages.dead),
        Route("/dead/{action:str}", pages.dead_action, methods=["POST"]),
        Route("/queues/{action:str}", pages.queue_action, methods=["POST"]),
        Route("/api/overview", pages.api_overview),
        Route("/api/dead", pages.api_dead),
        Route("/metrics", pages.prometheus),
        Route("/login", pages.login, methods=["GET", "POST"]),
        Mount("/static", StaticFiles(directory=str(_HERE / "static")), name="static"),
    ]
    middleware = [Middleware(_Guarded, guard=guard, page=pages.page)]
    return Starlette(routes=routes, middleware=middleware)
