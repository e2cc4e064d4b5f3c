"""``drumbeat dashboard``: a small web UI over one App (Overview with its charts, Jobs,
Schedules, Dead letters), its JSON (``/api/...``) and its Prometheus metrics (``/metrics``).
Needs ``drumbeat[dashboard]``. One module per page: `web` (the app, Overview, Dead letters,
login), `jobs` (its JSON in `job_record` and `job_lists`), `schedules`, `charts`; `query` reads
the pages' query parameters.

Loopback only by default; see `security` for tokens, CSRF and ``--read-only``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from .security import TOKEN_ENV, Guard, InsecureBind, is_loopback
from .web import create_app, dead_json, overview_json

if TYPE_CHECKING:
    from drumbeat.app import App

__all__ = [
    "TOKEN_ENV",
    "Guard",
    "InsecureBind",
    "create_app",
    "dead_json",
    "is_loopback",
    "overview_json",
    "serve",
]

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8787


def serve(
    app: App,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    *,
    read_only: bool = False,
    announce: Callable[[str], object] = print,
) -> None:
    """Serves the dashboard until interrupted; ``announce`` is told where, once it may start.

    Raises:
        InsecureBind: ``host`` is not loopback and ``DRUMBEAT_DASHBOARD_TOKEN`` is not set.
    """
    import uvicorn  # noqa: PLC0415 - imported only to serve, not to build the app in tests

    guard = Guard(host=host, token=os.environ.get(TOKEN_ENV) or None, read_only=read_only)
    shown = f"[{host}]" if ":" in host else host
    announce(f"drumbeat dashboard on http://{shown}:{port}/ (Ctrl-C stops it)")
    uvicorn.run(
        create_app(app, guard),
        host=host,
        port=port,
        log_level="info",
        access_log=False,
        server_header=False,
        proxy_headers=False,
    )
