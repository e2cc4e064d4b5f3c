"""Rate and concurrency limits: what a task (or a call, or a named limiter) allows, checked when
it is declared, and the limiter keys a job's run must acquire (pure: no Redis here).

A limit is kept per *limiter key*: ``t:<task>`` for a task's own limits, ``t:<task>=<value>``
(or ``t:<task>#<digest>`` for a value that cannot appear in a key) when ``limit_by`` names an
argument, ``n:<name>`` for a named limiter (`App.limiter`). The worker acquires every key of a
job right after claiming it (acquire_limits.lua) and releases them when the run ends
(release_limits.lua); see docs/internals.md, "Limits".
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import InvalidJob

_RATE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*/\s*(s|m|h)\s*")
_PER_MS = {"s": 1000.0, "m": 60_000.0, "h": 3_600_000.0}
# A limit_by value goes into a key as itself when it is short and plain, else as a digest.
_PLAIN_VALUE = re.compile(r"[A-Za-z0-9_.:@/+-]{1,64}")


def parse_rate(rate: str, what: str = "rate_limit") -> float:
    """The interval in ms between starts that ``"N/s"``, ``"N/m"`` or ``"N/h"`` allows."""
    m = _RATE.fullmatch(rate) if isinstance(rate, str) else None
    if m is None:
        raise InvalidJob(
            f"{what} {rate!r} is malformed; expected 'N/s', 'N/m' or 'N/h' with N > 0 "
            "(starts per second, minute or hour), e.g. '200/s'"
        )
    n = float(m.group(1))
    if n <= 0:
        raise InvalidJob(f"{what} {rate!r} must allow more than 0 starts; expected N > 0")
    return _PER_MS[m.group(2)] / n


def _check_count(value: Any, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidJob(f"{what} must be an int >= 1, got {value!r}")


@dataclass(frozen=True, slots=True)
class Limit:
    """What one limiter key allows: starts spaced by ``interval_ms`` (0: no rate limit) with a
    burst of ``burst``, and at most ``concurrency`` runs at once (0: no concurrency limit)."""

    interval_ms: float = 0.0
    burst: int = 1
    concurrency: int = 0

    @property
    def tolerance_ms(self) -> float:
        """How far ahead of its theoretical arrival time a start may come (GCRA's tau)."""
        return (self.burst - 1) * self.interval_ms

    def args(self) -> list[str | int]:
        """The limit as acquire_limits.lua takes it (after the key's name)."""
        return [f"{self.interval_ms:.6f}", f"{self.tolerance_ms:.6f}", self.concurrency]


def make_limit(rate: str | None, burst: int | None, concurrency: int | None, what: str) -> Limit:
    """A checked `Limit`; ``what`` names its owner in errors."""
    if burst is not None:
        _check_count(burst, f"{what}: rate_burst")
        if rate is None:
            raise InvalidJob(f"{what}: rate_burst={burst} needs a rate limit too")
    if concurrency is not None:
        _check_count(concurrency, f"{what}: concurrency limit")
    interval = parse_rate(rate, f"{what}: rate limit") if rate is not None else 0.0
    return Limit(interval, burst or 1, concurrency or 0)


@dataclass(frozen=True, slots=True)
class Limits:
    """The limits a task (or one call of it) runs under: its own (`own`, keyed by the value of
    argument `limit_by` if set) and a named limiter's."""

    own: Limit | None = None
    limit_by: str | None = None
    limiter: str | None = None

    def __bool__(self) -> bool:
        return self.own is not None or self.limiter is not None

    def to_record(self) -> list[Any]:
        """As a job's spec carries per-call limits (field ``l``)."""
        own = self.own
        return [
            None if own is None else [own.interval_ms, own.burst, own.concurrency],
            self.limit_by,
            self.limiter,
        ]

    @classmethod
    def from_record(cls, raw: Any) -> Limits:
        """Per-call limits from a job's spec (`to_record`); malformed ones are refused."""
        try:
            own_raw, limit_by, limiter = raw
            own = None
            if own_raw is not None:
                interval, burst, concurrency = own_raw
                own = Limit(float(interval), int(burst), int(concurrency))
            if limit_by is not None and not isinstance(limit_by, str):
                raise TypeError("limit_by")
            if limiter is not None and not isinstance(limiter, str):
                raise TypeError("limiter")
        except (TypeError, ValueError) as exc:
            raise InvalidJob(f"malformed limits in the job record ({exc}): {raw!r}") from None
        return cls(own, limit_by, limiter)


def make_limits(
    *,
    what: str,
    rate_limit: str | None = None,
    rate_burst: int | None = None,
    concurrency_limit: int | None = None,
    limit_by: str | None = None,
    limiter: str | None = None,
    fn: Callable[..., Any] | None = None,
) -> Limits:
    """Checked `Limits` for a task (``fn``: its function, whose arguments ``limit_by`` must
    name) or a call; ``what`` names it in errors."""
    own = None
    if rate_limit is not None or concurrency_limit is not None or rate_burst is not None:
        own = make_limit(rate_limit, rate_burst, concurrency_limit, what)
    if limit_by is not None:
        if own is None:
            raise InvalidJob(
                f"{what}: limit_by={limit_by!r} keys the task's own limits, but it has none; "
                "add rate_limit= or concurrency_limit="
            )
        if not isinstance(limit_by, str) or not limit_by.isidentifier():
            raise InvalidJob(f"{what}: limit_by must name an argument, got {limit_by!r}")
        if fn is not None:
            check_argument(fn, limit_by, what)
    plain = isinstance(limiter, str) and _PLAIN_VALUE.fullmatch(limiter)
    if limiter is not None and not plain:
        raise InvalidJob(
            f"{what}: limiter must be the name given to app.limiter(...), got {limiter!r}"
        )
    return Limits(own, limit_by, limiter)


def check_argument(fn: Callable[..., Any], name: str, what: str) -> None:
    """Refuses a ``limit_by`` that names no argument of ``fn``."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin without a signature: checked per call
        return
    usable = [
        p.name
        for p in params.values()
        if p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    ]
    if name not in usable:
        raise InvalidJob(
            f"{what}: limit_by={name!r} is not an argument of {fn.__qualname__}; "
            f"expected one of {usable}"
        )


def argument_value(
    fn: Callable[..., Any], name: str, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> Any:
    """The value argument ``name`` takes in a call of ``fn`` (its default if not passed)."""
    if name in kwargs:
        return kwargs[name]
    try:
        bound = _signature(fn).bind_partial(*args, **kwargs)
    except TypeError as exc:
        raise InvalidJob(f"cannot find argument {name!r} of the call: {exc}") from None
    if name in bound.arguments:
        return bound.arguments[name]
    param = _signature(fn).parameters.get(name)
    if param is None or param.default is inspect.Parameter.empty:
        raise InvalidJob(f"the call passes no value for limit_by argument {name!r}")
    return param.default


# A task's signature, read once: a worker finds the limit_by value of every run it acquires
# limits for (inspect.signature took a third of a limited schedule's run in the worker).
_signature = functools.lru_cache(maxsize=1024)(inspect.signature)


def value_key(value: Any) -> str:
    """A limit_by value as it appears in a limiter key: itself when short and plain, else
    ``#`` and a digest of its JSON form (so 7 and "7" stay apart: ``=7`` and ``=s:7``...)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return f"={value}"
    if isinstance(value, str) and _PLAIN_VALUE.fullmatch(value):
        return f"=s:{value}"
    try:
        text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError):
        text = repr(value)
    return "#" + hashlib.blake2b(text.encode(), digest_size=12).hexdigest()


def task_key(task: str) -> str:
    return f"t:{task}"


def limiter_key(name: str) -> str:
    return f"n:{name}"
