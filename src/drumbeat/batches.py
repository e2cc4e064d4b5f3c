"""Batches: jobs enqueued as one group, with callbacks once every member ended (`App.batch`).

A member's end is counted in the batch's fields of the shard's `batches` hash by the script
that ends it (lua/_workflows.lua: count_member), and the batch's callbacks wait in `deps` as a
dependent does until the last count releases them. The page for users is docs/workflows.md.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis

from .batch_send import asend, new_batch_id, send, ttl_ms
from .connections import MAX_BLOCK
from .errors import DrumbeatError, JobNotFound, ResultTimeout
from .job import Job, cancel_call
from .job_ids import job_shard_of, new_job_id
from .scripts import Call
from .task import Prepared

if TYPE_CHECKING:
    from .app import App

# The fields of one batch in `batches` that `status` reads (lua/_workflows.lua writes them).
_FIELDS = ("", "|n", "|left", "|ko", "|x", "|end")
_STATES = {"o": "open", "c": "closed", "x": "cancelled"}
# A waiter whose connection was lost tries again this often (until its deadline).
_RECONNECT_S = 0.2


@dataclass(frozen=True, slots=True)
class BatchStatus(Mapping[str, int]):
    """Where a batch stands; also a mapping of its counts (``total``, ``pending``,
    ``succeeded``, ``failed``, ``cancelled``)."""

    id: str
    total: int
    """Members added so far."""
    pending: int
    """Members not yet ended (queued, delayed, running, retrying)."""
    succeeded: int
    failed: int
    """Members dead-lettered."""
    cancelled: int
    """Members cancelled."""
    state: str
    """``open`` (members may be added; it cannot end yet), ``closed`` or ``cancelled``."""
    ended: bool
    """Every member ended and it is closed: its callbacks were released (or cancelled)."""

    def __getitem__(self, name: str) -> int:
        if name not in _COUNTS:
            raise KeyError(name)
        return int(getattr(self, name))

    def __iter__(self) -> Iterator[str]:
        return iter(_COUNTS)

    def __len__(self) -> int:
        return len(_COUNTS)


_COUNTS = ("total", "pending", "succeeded", "failed", "cancelled")


class Batch:
    """A handle on one batch (`App.batch`; in a member or a callback: ``current_job().batch``).

    ``jobs`` are the members added through this handle, ``on_complete`` / ``on_success`` its
    callbacks' jobs when this handle made them."""

    def __init__(
        self,
        app: App,
        batch_id: str,
        jobs: Sequence[Job[Any]] = (),
        on_complete: Job[Any] | None = None,
        on_success: Job[Any] | None = None,
    ) -> None:
        self.app = app
        self.id = batch_id
        self.jobs: list[Job[Any]] = list(jobs)
        self.on_complete = on_complete
        self.on_success = on_success
        self._keys, self._scripts = app.job_shard(batch_id)

    def __repr__(self) -> str:
        return f"<Batch {self.id} ({len(self.jobs)} jobs here)>"

    # -- reading -------------------------------------------------------------------------------

    def status(self) -> BatchStatus:
        """Its counts and state; `JobNotFound` if there is no such batch (or it ended and its
        record expired: `Settings.result_ttl` after its end)."""
        return self._parse(self.app.redis.hmget(self._keys.batches, self._fields()))

    async def astatus(self) -> BatchStatus:
        client = await self.app.aredis()
        return self._parse(await client.hmget(self._keys.batches, self._fields()))

    def failed_ids(self) -> list[str]:
        """The ids of the members that did not succeed (dead-lettered or cancelled), in the
        order they ended."""
        r = self.app.redis
        n = r.hget(self._keys.batches, self.id + "|f")
        return _decoded(r.hmget(self._keys.batches, self._failed(n)))

    async def afailed_ids(self) -> list[str]:
        client = await self.app.aredis()
        n = await client.hget(self._keys.batches, self.id + "|f")
        return _decoded(await client.hmget(self._keys.batches, self._failed(n)))

    def _fields(self) -> list[str]:
        return [self.id + f for f in _FIELDS]

    def _failed(self, n: Any) -> list[str]:
        return [f"{self.id}|f{i}" for i in range(1, int(n or 0) + 1)] or [self.id + "|f0"]

    def _parse(self, raw: Sequence[Any]) -> BatchStatus:
        head, total, left, ko, x, end = (_text(v) for v in raw)
        if head is None:
            raise JobNotFound(
                f"batch {self.id} does not exist, or it ended and its record expired "
                "(Settings.result_ttl after its end)"
            )
        n, pending, failed, cancelled = (int(v or 0) for v in (total, left, ko, x))
        succeeded = n - pending - failed - cancelled  # not counted apart: a success is cheaper
        state = _STATES.get(head[:1], "closed")
        return BatchStatus(
            self.id, n, pending, succeeded, failed, cancelled, state, ended=end is not None
        )

    # -- waiting -------------------------------------------------------------------------------

    def wait(self, timeout: float | None = None) -> BatchStatus:
        """Blocks until the batch ended (no polling: its end is told on the shard's
        `batchdone` channel) and returns its status; `ResultTimeout` after ``timeout`` s. A
        lost connection (Redis restarted, failed over) is made again, and the status read."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                return self._wait(deadline, timeout)
            except (redis.ConnectionError, redis.TimeoutError):
                time.sleep(min(_RECONNECT_S, self._next_wait(deadline, timeout)))

    def _wait(self, deadline: float | None, timeout: float | None) -> BatchStatus:
        pubsub = self.app.connections.blocking.pubsub()
        try:
            pubsub.subscribe(self._keys.batchdone)
            _confirmed(pubsub.get_message(timeout=MAX_BLOCK))  # subscribed before the read
            while not (found := self.status()).ended:
                until = time.monotonic() + self._next_wait(deadline, timeout)
                while (left := until - time.monotonic()) > 0:
                    if self._told(pubsub.get_message(timeout=left)):
                        break
            return found
        finally:
            pubsub.close()

    async def await_done(self, timeout: float | None = None) -> BatchStatus:
        """`wait` for async callers."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                return await self._await(deadline, timeout)
            except (redis.ConnectionError, redis.TimeoutError):
                await asyncio.sleep(min(_RECONNECT_S, self._next_wait(deadline, timeout)))

    async def _await(self, deadline: float | None, timeout: float | None) -> BatchStatus:
        pubsub = (await self.app.connections.ablocking()).pubsub()
        try:
            await pubsub.subscribe(self._keys.batchdone)
            _confirmed(await pubsub.get_message(timeout=MAX_BLOCK))
            while not (found := await self.astatus()).ended:
                until = time.monotonic() + self._next_wait(deadline, timeout)
                while (left := until - time.monotonic()) > 0:
                    if self._told(await pubsub.get_message(timeout=left)):
                        break
            return found
        finally:
            await pubsub.aclose()

    def _told(self, message: Any) -> bool:
        return bool(
            message and message.get("type") == "message" and _text(message["data"]) == self.id
        )

    def _next_wait(self, deadline: float | None, timeout: float | None) -> float:
        # The status is read again at least every MAX_BLOCK s: a message sent while the
        # connection was being re-made is not heard.
        if deadline is None:
            return MAX_BLOCK
        left = deadline - time.monotonic()
        if left <= 0:
            raise ResultTimeout(f"batch {self.id} did not end within {timeout} s")
        return min(left, MAX_BLOCK)

    # -- changing ------------------------------------------------------------------------------

    def add(self, members: Iterable[Prepared]) -> list[Job[Any]]:
        """Adds members to the batch, until it ended (an open batch, or a closed one with
        members left: a member may add to its own batch); `BatchEnded` afterwards, with
        nothing of them enqueued."""
        jobs = send(self.app, self.id, list(members), (), add=True)
        self.jobs += jobs
        return jobs

    async def aadd(self, members: Iterable[Prepared]) -> list[Job[Any]]:
        jobs = await asend(self.app, self.id, list(members), (), add=True)
        self.jobs += jobs
        return jobs

    def add_batch(
        self,
        members: Iterable[Prepared],
        *,
        on_complete: Prepared | None = None,
        on_success: Prepared | None = None,
        open: bool = False,
    ) -> Batch:
        """A batch nested in this one (as `App.batch` makes one): it counts here as one member
        (succeeded if all of its own did), and so does each of its callbacks, so this batch
        ends after them. `BatchEnded` if this one ended."""
        return make_batch(
            self.app,
            members,
            on_complete=on_complete,
            on_success=on_success,
            open=open,
            parent=self.id,
        )

    async def aadd_batch(
        self,
        members: Iterable[Prepared],
        *,
        on_complete: Prepared | None = None,
        on_success: Prepared | None = None,
        open: bool = False,
    ) -> Batch:
        """`add_batch` for async callers."""
        return await amake_batch(
            self.app,
            members,
            on_complete=on_complete,
            on_success=on_success,
            open=open,
            parent=self.id,
        )

    def close(self) -> bool:
        """Closes an open batch: it ends once no member is left (at once if none is). False
        if it was closed already."""
        return bool(self._control("close_batch").run(self.app.redis))

    async def aclose(self) -> bool:
        return bool(await self._control("close_batch").arun(await self.app.aredis()))

    def cancel(self) -> bool:
        """Cancels the batch: its callbacks never run (cancelled), and its pending members
        are cancelled (queued ones at once, running ones at their next checkpoint). False if
        it had ended or was cancelled already. A nested batch pending is cancelled too."""
        r = self.app.redis
        if not self._control("cancel_batch").run(r):
            return False
        queues = self.app.known_queues()
        for member in self._pending(r.hscan_iter(self._keys.members, count=1000)):
            if r.hexists(self._keys.batches, member):
                Batch(self.app, member).cancel()
            else:
                cancel_call(self.app, member, queues).run(r)
        return True

    async def acancel(self) -> bool:
        client = await self.app.aredis()
        if not await self._control("cancel_batch").arun(client):
            return False
        queues = await self.app.aknown_queues()
        found = [p async for p in client.hscan_iter(self._keys.members, count=1000)]
        for member in self._pending(found):
            if await client.hexists(self._keys.batches, member):
                await Batch(self.app, member).acancel()
            else:
                await cancel_call(self.app, member, queues).arun(client)
        return True

    def _pending(self, members: Iterable[tuple[Any, Any]]) -> list[str]:
        # A scan of the shard's members: cancelling is rare, a member's end must stay O(1).
        return [_text(job) or "" for job, batch in members if _text(batch) == self.id]

    def _control(self, name: str) -> Call[int]:
        names = self._scripts.workflow_names(self.app.queues())
        keys = self._scripts.workflow_keys(names)
        args: list[Any] = [self.id, ttl_ms(self.app), *names]
        return Call(name, keys, args, int)


# -- making a batch (the MULTI that sends it: batch_send.py) -----------------------------------


def make_batch(
    app: App,
    members: Iterable[Prepared],
    *,
    on_complete: Prepared | None,
    on_success: Prepared | None,
    open: bool,
    parent: str = "",
) -> Batch:
    """`App.batch`."""
    members = list(members)
    callbacks = _callbacks(on_complete, on_success)
    batch_id = _new_id(app, [*members, *(p for _, p in callbacks)], parent)
    jobs = send(app, batch_id, members, callbacks, add=False, open=open, parent=parent)
    return Batch(
        app, batch_id, jobs[: len(members)], *_callback_jobs(jobs[len(members) :], callbacks)
    )


async def amake_batch(
    app: App,
    members: Iterable[Prepared],
    *,
    on_complete: Prepared | None,
    on_success: Prepared | None,
    open: bool,
    parent: str = "",
) -> Batch:
    """`App.abatch`."""
    members = list(members)
    callbacks = _callbacks(on_complete, on_success)
    batch_id = _new_id(app, [*members, *(p for _, p in callbacks)], parent)
    jobs = await asend(app, batch_id, members, callbacks, add=False, open=open, parent=parent)
    return Batch(
        app, batch_id, jobs[: len(members)], *_callback_jobs(jobs[len(members) :], callbacks)
    )


def _new_id(app: App, everything: Sequence[Prepared], parent: str) -> str:
    # A nested batch lives in its parent's job shard: one script counts it there.
    return new_job_id(job_shard_of(parent)) if parent else new_batch_id(app, everything)


def _callbacks(
    on_complete: Prepared | None, on_success: Prepared | None
) -> list[tuple[str, Prepared]]:
    """The callbacks by role, as open_batch.lua takes them (c: on_complete, s: on_success)."""
    return [(r, p) for r, p in (("c", on_complete), ("s", on_success)) if p is not None]


def _callback_jobs(
    jobs: Sequence[Job[Any]], callbacks: Sequence[tuple[str, Prepared]]
) -> tuple[Job[Any] | None, Job[Any] | None]:
    by_role = {role: job for (role, _), job in zip(callbacks, jobs, strict=True)}
    return by_role.get("c"), by_role.get("s")


def _confirmed(message: Any) -> None:
    if not message or message.get("type") != "subscribe":
        raise DrumbeatError(f"could not subscribe to a batch's channel (got {message!r})")


def _text(value: Any) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


def _decoded(values: Sequence[Any]) -> list[str]:
    return [v for v in (_text(x) for x in values) if v]
