"""An app for the CLI tests, configured from the environment the test sets up.

``DRUMBEAT_REDIS_URL`` and ``DRUMBEAT_TEST_NAMESPACE`` must be set before it is imported; the
tests drop it from ``sys.modules`` around each test, so each test gets its own namespace.
"""

from __future__ import annotations

import os
import time

import drumbeat

app = drumbeat.App(
    os.environ["DRUMBEAT_REDIS_URL"], namespace=os.environ["DRUMBEAT_TEST_NAMESPACE"]
)


@app.task(name="add")
def add(a: int, b: int = 0) -> int:
    return a + b


@app.task(name="urgent", priority=7)
async def urgent(note: str = "") -> str:
    return f"done {note}".strip()


@app.task(name="boom", retries=0)
def boom(message: str = "boom") -> None:
    raise RuntimeError(message)


not_an_app = add


@app.task(name="nap")
def nap(seconds: float) -> float:
    """A sync task that ignores shutdown: its thread outlives the worker's grace period."""
    time.sleep(seconds)
    return seconds


# Dotted names, for the short-name lookup of `drumbeat enqueue`: ``render`` stands for
# tasks.reports.render alone, ``build`` for two tasks (so it is ambiguous).
@app.task(name="tasks.reports.render", priority=2)
def render(page: int) -> int:
    return page


@app.task(name="tasks.build")
def build(n: int) -> int:
    return n


@app.task(name="legacy.build")
def legacy_build(n: int) -> int:
    return n
