"""Fixtures of the dashboard tests: the dashboard served by uvicorn on a free port (in a thread)
against the test Redis, a worker on a thread of its own, and a real headless Chromium (Debian's
``chromium`` package) driven by Playwright.

Without Chromium the browser tests are skipped, saying what to install; with ``CI`` set that is
a failure instead (.ci/run installs it), as with PostgreSQL. Playwright never downloads a
browser here: it launches the system one by path.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("starlette", reason="pip install 'drumbeat[dashboard]'")

import uvicorn

import drumbeat
from drumbeat.dashboard import Guard, create_app

MISSING_CHROMIUM = "Chromium is not installed (apt-get install chromium)"
MISSING_PLAYWRIGHT = "Playwright for Python is not installed (pip install -e '.[dev]')"

#: Where screenshots go (CI keeps them as artefacts).
ARTIFACTS = Path(
    os.environ.get("DRUMBEAT_TEST_ARTIFACTS")
    or Path(__file__).resolve().parents[2] / ".artifacts" / "web"
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def find_chromium() -> str | None:
    """``DRUMBEAT_TEST_CHROMIUM``, else Debian's chromium (or another on PATH)."""
    if "DRUMBEAT_TEST_CHROMIUM" in os.environ:
        return os.environ["DRUMBEAT_TEST_CHROMIUM"] or None
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def _missing(what: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{what}; CI must run the dashboard's browser tests (.ci/run installs it)")
    pytest.skip(what)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """A headless Chromium for the module. Not for the session: Playwright's sync API keeps an
    event loop running in the main thread while it is open, so a later test of the same worker
    that calls ``asyncio.run`` (the CLI's, say) would fail."""
    executable = find_chromium()
    if executable is None:
        _missing(MISSING_CHROMIUM)
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing(MISSING_PLAYWRIGHT)
    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=executable, headless=True)
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def page(browser: Any, request: pytest.FixtureRequest) -> Iterator[Any]:
    """A fresh browser context and page; a screenshot of where it ended is saved."""
    context = browser.new_context()
    opened = context.new_page()
    opened.set_default_timeout(15_000)
    try:
        yield opened
    finally:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(Exception):
            opened.screenshot(path=str(ARTIFACTS / f"{request.node.name}.png"), full_page=True)
        context.close()


class Served:
    """The dashboard of ``app`` served on a free loopback port until `stop`."""

    def __init__(self, app: drumbeat.App, guard: Guard) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.guard = guard
        config = uvicorn.Config(
            create_app(app, guard), host="127.0.0.1", port=self.port, log_level="warning",
            access_log=False, lifespan="off",
        )  # fmt: skip
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="dashboard", daemon=True)

    def start(self) -> None:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise AssertionError(f"the dashboard did not start on {self.url}")
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)


@contextlib.contextmanager
def serve(app: drumbeat.App, **guard: Any) -> Iterator[Served]:
    served = Served(app, Guard(host="127.0.0.1", **guard))
    served.start()
    try:
        yield served
    finally:
        served.stop()


class ThreadWorker:
    """A `drumbeat.Worker` on an event loop of its own thread (the tests here are sync)."""

    def __init__(self, app: drumbeat.App, concurrency: int = 1) -> None:
        self.app = app
        self.concurrency = concurrency
        self.worker: drumbeat.Worker | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name="worker", daemon=True)

    def _main(self) -> None:
        asyncio.run(self._run())

    async def _run(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.worker = drumbeat.Worker(self.app, concurrency=self.concurrency)
        self._ready.set()
        try:
            await self.worker.run()
        finally:
            await self.app.aclose()

    def __enter__(self) -> ThreadWorker:
        self._thread.start()
        assert self._ready.wait(20), "the worker thread did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None and self.worker is not None
        self._loop.call_soon_threadsafe(self.worker.stop)
        self._thread.join(30)
        assert not self._thread.is_alive(), "the worker did not stop within 30 s"
