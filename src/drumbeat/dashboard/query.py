"""The query parameters of the dashboard's pages and JSON, read and range-checked: one out of its
range is a `BadQuery`, answered with 400 and a message that says what was expected.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.requests import Request

from drumbeat.keys import DEFAULT_QUEUE

if TYPE_CHECKING:
    from drumbeat.app import App

__all__ = ["BadQuery", "int_param", "optional_int", "queue_name", "shard_param"]


class BadQuery(ValueError):
    """A query parameter out of its range; the message says what was expected."""


def int_param(request: Request, name: str, low: int, high: int, default: int) -> int:
    """Query parameter ``name`` as an integer in ``low..high``; ``default`` when absent."""
    found = optional_int(request, name, low, high)
    return default if found is None else found


def optional_int(request: Request, name: str, low: int, high: int) -> int | None:
    """Query parameter ``name`` as an integer in ``low..high``; None when absent or empty."""
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


def queue_name(app: App, request: Request) -> str:
    """The ``queue`` asked for (the default queue when none), which must be one the app knows."""
    queue = request.query_params.get("queue") or DEFAULT_QUEUE
    known = [DEFAULT_QUEUE, *(q for q in app.known_queues() if q != DEFAULT_QUEUE)]
    if queue not in known:
        raise BadQuery(f"no queue {queue!r}; expected one of {', '.join(known)}")
    return queue


def shard_param(app: App, request: Request) -> int:
    """The job shard a listing reads (``shard``; 0, the main one, by default)."""
    return int_param(request, "shard", 0, len(app.job_keys) - 1, 0)
