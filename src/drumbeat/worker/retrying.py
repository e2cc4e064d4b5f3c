"""How a worker rides out failure: which Redis errors it waits out, the backoff between tries,
and the supervision that restarts a crashed part of the worker.

A worker outlives its Redis: a restart (connection refused, then ``LOADING`` while it reads its
AOF), a failover (``READONLY`` from the old primary until clients reconnect), a full server
(``OOM`` under ``noeviction``) or a long script (``BUSY``) all end by themselves. The worker
waits with a doubling pause and tries again, logging one line per failure; any other error is a
bug or a refusal that retrying will not change.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any

import redis

# Error replies, by their first word, that mean "not now" rather than "never". UNBLOCKED is
# what a blocked command (the idle wait) gets from a server that turns into a replica.
_TRANSIENT_REPLIES = (
    "OOM", "READONLY", "BUSY", "LOADING", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN", "UNBLOCKED",
)  # fmt: skip


# What a Redis Cluster answers while its slots move or a replica takes over from a failed master:
# redis-py's parser strips these replies' first word (MOVED, ASK, TRYAGAIN, CLUSTERDOWN,
# MASTERDOWN) into the class, so they are known by class; its cluster client raises the last two
# when it cannot find a slot's owner (yet).
_CLUSTER_IN_FLUX = (
    redis.exceptions.AskError  # and MovedError, its subclass
    | redis.exceptions.TryAgainError
    | redis.exceptions.ClusterDownError  # and MasterDownError
    | redis.exceptions.ClusterError
    | redis.exceptions.SlotNotCoveredError
)


# What redis-py's cluster client raises, as a bare `RedisClusterException` (not a `RedisError`),
# when it cannot build its slot map: no node it knows answered (raised from the last node's
# error), or those that answered leave slots without a master (one failed, no replica promoted
# yet) or disagree (a failover under way). Known by message: redis-py gives them no class.
_CLUSTER_MAP_FAILURES = (
    "Redis Cluster cannot be connected",
    "All slots are not covered",
    "startup_nodes could not agree",
)

REDIS_FAILURES = (redis.RedisError, OSError, redis.exceptions.RedisClusterException)
"""What a call to Redis may raise other than a bug of the caller's: what the loops that retry
any failure (housekeeping, the lease heartbeat) catch. A cluster client's errors are not all
`RedisError`s."""


def is_transient(exc: BaseException) -> bool:
    """True for errors that go away by themselves: lost connections, timeouts, and the error
    replies of a server that is restarting, failing over, full or busy (or a cluster whose
    slots move, or that cannot be reached)."""
    if isinstance(exc, redis.ConnectionError | redis.TimeoutError | OSError | _CLUSTER_IN_FLUX):
        return True
    if isinstance(exc, redis.exceptions.RedisClusterException):
        cause = exc.__cause__
        if cause is not None and is_transient(cause):
            return True
        return str(exc).startswith(_CLUSTER_MAP_FAILURES)
    if isinstance(exc, redis.ResponseError):
        # The prefix is stripped by redis-py's parser for the codes it maps to a class (e.g.
        # ReadOnlyError), so the class is checked too.
        if isinstance(exc, redis.exceptions.ReadOnlyError | redis.exceptions.OutOfMemoryError):
            return True
        return _reply_code(str(exc)) in _TRANSIENT_REPLIES
    return False


# Redis before 7.0 wraps an error a command raised inside a script: "Error running script (call
# to f_<sha>): @user_script:<line>: @user_script: <line>: -OOM command not allowed ...".
_SCRIPT_ERROR = re.compile(r"Error running script .*?: -(\S+)")


def _reply_code(message: str) -> str:
    wrapped = _SCRIPT_ERROR.match(message)
    return wrapped.group(1) if wrapped else message.split(" ", 1)[0]


#: Seconds between tries while a slot migrates (see `Backoff.failed`).
MIGRATION_RETRY = 0.1


# What redis-py's cluster client raises once it has followed redirections (ASK, MOVED) and
# waited out TRYAGAIN replies 16 times for one call: in practice, a slot migrating for longer
# than its own retries last (about a second). It raises it bare, not from the last reply.
_REDIRECTED_TOO_OFTEN = "TTL exhausted"


def is_migrating(exc: BaseException) -> bool:
    """An ASK or TRYAGAIN reply, or redis-py's cluster client giving up after many of them: a
    key's slot is migrating (a MOVED, ASK's subclass, is not: the slot has moved, and the next
    try goes to its new owner)."""
    if isinstance(exc, redis.exceptions.MovedError):
        return False
    if isinstance(exc, redis.exceptions.ClusterError):
        return str(exc).startswith(_REDIRECTED_TOO_OFTEN)
    return isinstance(exc, redis.exceptions.AskError | redis.exceptions.TryAgainError)


class Backoff:
    """A doubling pause between tries, reset by a success."""

    def __init__(self, first: float = 0.05, most: float = 5.0) -> None:
        self.first = first
        self.most = most
        self.pause = first
        self.migrating = False
        self.moved = False

    def reset(self) -> None:
        self.pause = self.first
        self.migrating = False
        self.moved = False

    def failed(self, log: logging.Logger, what: str, exc: BaseException) -> float:
        """Logs the failure and returns how long to wait before the next try.

        While a slot migrates (a resharding), Redis refuses a call whose keys are not all on
        one side of it (TRYAGAIN), which an idle shard's claim and most acks never have (they
        name keys that exist only when needed), until the migration ends. That is no failure:
        the call is tried again every `MIGRATION_RETRY` s, said once, rather than after a
        pause that doubles up to `most` (a worker would start nothing for up to 5 s after the
        migration ended).

        A MOVED (the slot has a new owner: a resharding or a failover ended, and the caller's
        slot map is marked stale) is tried again at once, said at info level; a second one in
        a row backs off as any failure (a cluster whose nodes disagree)."""
        if isinstance(exc, redis.exceptions.MovedError) and not self.moved:
            log.info("%s: a slot moved (%s); trying again at its new owner", what, exc)
            self.moved = True
            return 0.0
        if is_migrating(exc):
            if not self.migrating:
                log.info("%s: a slot is migrating (%s); trying again every %.1f s until it "
                         "ends", what, exc, MIGRATION_RETRY)  # fmt: skip
            self.migrating = True
            return MIGRATION_RETRY
        pause = self.pause
        log.warning("%s failed (%s: %s); retrying in %.2f s", what, type(exc).__name__, exc, pause)
        self.pause = min(self.pause * 2, self.most)
        return pause

    async def wait(self, stopping: asyncio.Event, pause: float) -> None:
        """Sleeps ``pause`` seconds, or less if ``stopping`` is set meanwhile."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), pause)


async def until_done(
    what: str, step: Callable[[], Coroutine[Any, Any, Any]], stopping: asyncio.Event
) -> None:
    """Runs a start-up ``step`` until it succeeds, waiting out what `is_transient` (a
    connection lost, Redis loading) as the claim loop does; a stop ends the tries (the last
    error raised)."""
    backoff = Backoff()
    while True:
        try:
            await step()
            return
        except Exception as exc:
            if not is_transient(exc) or stopping.is_set():
                raise
            await backoff.wait(stopping, backoff.failed(_log, what, exc))


#: A part of the worker that crashes this often within `CRASH_WINDOW` seconds stops the worker
#: (exit non-zero, so whatever runs it starts a fresh process) instead of restarting again.
CRASH_LIMIT = 5
CRASH_WINDOW = 60.0

_log = logging.getLogger("drumbeat.worker")


async def supervise(
    name: str, part: Callable[[], Coroutine[Any, Any, None]], give_up: Callable[[str], None]
) -> None:
    """Runs ``part``, restarting it with backoff when it crashes; past `CRASH_LIMIT` crashes in
    `CRASH_WINDOW` seconds it calls ``give_up`` instead: a worker that silently stopped
    claiming, settling or reaping would be worse than none."""
    crashes: deque[float] = deque()
    pause = 0.1
    while True:
        try:
            await part()
            return
        except Exception:
            now = time.monotonic()
            crashes.append(now)
            while crashes[0] < now - CRASH_WINDOW:
                crashes.popleft()
            if len(crashes) >= CRASH_LIMIT:
                _log.critical("%s crashed %d times in %.0f s; stopping the worker",
                              name, len(crashes), CRASH_WINDOW, exc_info=True)  # fmt: skip
                give_up(f"{name} crashed {len(crashes)} times in {CRASH_WINDOW:.0f} s")
                return
            _log.exception("%s crashed; restarting it in %.1f s", name, pause)
        await asyncio.sleep(pause)
        pause = min(pause * 2, 10.0)
