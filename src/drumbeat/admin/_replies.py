"""Reply helpers shared by the admin readers (redis-py replies: bytes, or str when decoded)."""

from __future__ import annotations

from typing import Any

from drumbeat.replies import text

__all__ = ["int_or_none", "members", "pairs", "text", "time_ms"]


def int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def pairs(raw: Any) -> list[tuple[str, float]]:
    """A ``WITHSCORES`` reply as (member, score) pairs."""
    return [(text(member), float(score)) for member, score in raw]


def members(raw: Any) -> list[str]:
    return [text(member) for member in raw]


def time_ms(raw: Any) -> int:
    """A ``TIME`` reply in ms."""
    seconds, micros = raw
    return int(seconds) * 1000 + int(micros) // 1000
