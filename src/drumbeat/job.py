"""The Job handle (status, result) and the records stored for a job: its spec and its outcome."""

from __future__ import annotations

import functools
import json
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from .connections import MAX_BLOCK
from .errors import JobCancelled, JobFailed, JobNotFound, ResultTimeout, SerializationError
from .protocol import RUN_PREFIX
from .serialization import CODECS, Codec, encode_value

if TYPE_CHECKING:
    from .app import App
    from .keys import Keys
    from .scripts import Call, Scripts

R = TypeVar("R")

# Waiting without a deadline still re-reads the status this often, in case the outcome was not
# stored (result_ttl=0) and no announcement will ever come. The blocking clients' read timeout
# is made for waits of up to this long.
_LONGEST_BLOCK = MAX_BLOCK
_WATCH_MARGIN_MS = 5_000
_WAITING_BLOCK = 1.0


class JobStatus(StrEnum):
    QUEUED = "queued"
    """Waiting in `ready` for a free slot."""
    SCHEDULED = "scheduled"
    """Waiting in `due` for its time: delayed, or backing off before a retry."""
    WAITING = "waiting"
    """Waiting for its dependencies to end (`Task.options(depends_on=...)`), in no queue."""
    RUNNING = "running"
    COMPLETE = "complete"
    DEAD = "dead"
    """Failed for good; in the dead-letter set (or its outcome says so)."""
    CANCELLED = "cancelled"
    """Stopped by `Job.cancel` before it ran, or at a checkpoint while it ran."""
    MISSING = "missing"
    """Unknown id, or its outcome expired."""


@dataclass(frozen=True, slots=True)
class Spec:
    """The immutable part of a job, as the worker decodes it."""

    task: str
    args: list[Any]
    kwargs: dict[str, Any]
    limits: Any = None
    """The call's own limits (`limits.Limits.to_record`), or None: its task's."""
    headers: dict[str, str] = field(default_factory=dict)
    """The job's headers (`Task.options(headers=...)`, producer middleware); {} if none."""
    deps: tuple[str, ...] = ()
    """The ids of the jobs it depended on (`Task.options(depends_on=...)`); () if none."""
    batch: str | None = None
    """The batch it is a member or a callback of (`App.batch`); None if none."""


def codec_of(data: bytes) -> Codec:
    """JSON records are objects and start with ``{``; anything else is msgpack.

    Workers read both, so producers and workers may switch codecs without a migration, and
    records written by Lua (always JSON) decode the same way.
    """
    return CODECS["json"] if data[:1] == b"{" else CODECS["msgpack"]


def encode_spec(
    codec: Codec,
    task: str,
    args_blob: bytes,
    limits: Any = None,
    headers: Mapping[str, str] | None = None,
    *,
    deps: Sequence[str] = (),
    batch: str | None = None,
) -> bytes:
    """The stored spec: ``{"t": task, "c": [args, kwargs]}``, arguments already encoded,
    ``"l"``: the call's own limits when it has them, ``"h"``: its headers when it has any (a
    record without them, as earlier versions wrote, reads as no headers), ``"d"``: the ids of
    its dependencies when it has any, ``"b"``: its batch when it has one."""
    if codec.name == "json":
        tail = b"}" if limits is None else b',"l":' + json.dumps(limits).encode() + b"}"
        if headers:
            tail = b',"h":' + json.dumps(headers, separators=(",", ":")).encode() + tail
        if deps:
            tail = b',"d":' + json.dumps(list(deps), separators=(",", ":")).encode() + tail
        if batch:
            tail = b',"b":' + json.dumps(batch).encode() + tail
        return _json_head(task) + args_blob + tail
    record = {"t": task, "c": codec.loads(args_blob)}
    if limits is not None:
        record["l"] = limits
    if headers:
        record["h"] = dict(headers)
    if deps:
        record["d"] = list(deps)
    if batch:
        record["b"] = batch
    return codec.dumps(record)


@functools.lru_cache(maxsize=1024)
def _json_head(task: str) -> bytes:
    """A JSON spec up to its arguments (the same for every job of a task)."""
    return b'{"t":' + json.dumps(task).encode() + b',"c":'


def decode_spec(data: bytes) -> Spec:
    """Decode a stored spec; raises ``SerializationError`` naming what is wrong."""
    try:
        raw = codec_of(data).loads(data)
    except Exception as exc:
        raise SerializationError(f"malformed job record ({exc.__class__.__name__}: {exc})") from exc
    call = raw.get("c") if isinstance(raw, dict) else None
    if (
        not isinstance(raw, dict)
        or not isinstance(raw.get("t"), str)
        or not isinstance(call, list)
        or len(call) != 2
        or not isinstance(call[0], list)
        or not isinstance(call[1], dict)
    ):
        raise SerializationError(
            'malformed job record: expected {"t": task name, "c": [args list, kwargs dict]}, '
            f"got {str(raw)[:200]!r}"
        )
    headers = raw.get("h")  # absent in records of earlier versions
    deps = raw.get("d")
    return Spec(
        raw["t"],
        call[0],
        call[1],
        raw.get("l"),
        headers if isinstance(headers, dict) else {},
        tuple(d for d in deps if isinstance(d, str)) if isinstance(deps, list) else (),
        raw["b"] if isinstance(raw.get("b"), str) else None,
    )


_NONE_OUTCOMES = {name: codec.dumps({"ok": True, "result": None}) for name, codec in CODECS.items()}


def encode_success(codec: Codec, value: Any, limit: int) -> bytes:
    if value is None:  # the common case for jobs run for their side effects
        return _NONE_OUTCOMES[codec.name]
    try:
        return encode_value(codec, {"ok": True, "result": value}, limit, "the task's result")
    except SerializationError as exc:
        raise SerializationError(
            f"the task's result of type {type(value).__name__} cannot be encoded as {codec.name}"
        ) from exc


def encode_failure(
    codec: Codec, error: str, traceback: str | None, attempt: int, now_ms: int
) -> bytes:
    record = {"ok": False, "error": error, "traceback": traceback, "attempt": attempt}
    record["at_ms"] = now_ms
    return codec.dumps(record)


def encode_cancelled(codec: Codec, attempt: int, now_ms: int) -> bytes:
    record = {"ok": False, "cancelled": True, "error": "cancelled", "attempt": attempt}
    record["at_ms"] = now_ms
    return codec.dumps(record)


def encode_progress(codec: Codec, value: Any, limit: int) -> bytes:
    """A task's progress, encoded and size-checked like a payload (in an object, so that
    `codec_of` tells the codec apart whatever the value)."""
    return encode_value(codec, {"p": value}, limit, "the job's progress")


def decode_progress(data: bytes | str | None) -> Any:
    """A stored progress value; None when there is none (or it cannot be read: the task then
    starts over, which repeats work but loses none)."""
    if not data:
        return None
    if isinstance(data, str):
        data = data.encode()
    try:
        record = codec_of(data).loads(data)
        return record.get("p") if isinstance(record, dict) else None
    except Exception:
        return None


def decode_outcome(data: bytes) -> dict[str, Any]:
    raw = codec_of(data).loads(data)
    if not isinstance(raw, dict):
        raise SerializationError(f"malformed outcome record: {str(raw)[:200]!r}")
    raw.setdefault("ok", False)  # records written by Lua (reap) are failures
    return raw


class Job(Generic[R]):
    """A handle on one enqueued job. ``created`` is False when a dedup key matched a live job."""

    def __init__(self, app: App, job_id: str, created: bool = True) -> None:
        self.app = app
        self.id = job_id
        self.created = created
        self._keys, self._scripts = app.job_shard(job_id)  # the shard its id names
        # A schedule's run lives with its schedule: looked up when schedules are spread.
        self._run = job_id[len(RUN_PREFIX) :] if job_id.startswith(RUN_PREFIX) else None

    def __repr__(self) -> str:
        return f"<Job {self.id}>" if self.created else f"<Job {self.id} (duplicate)>"

    @property
    def duplicate(self) -> bool:
        """True when the enqueue that returned this handle added no job: its dedup key was
        taken, by a job still queued or running or by one whose ``unique_for`` window has not
        ended (its handle is this one: the first job's id, whose outcome may have expired)."""
        return not self.created

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Job) and other.id == self.id and other.app is self.app

    def __hash__(self) -> int:
        return hash(self.id)

    def progress(self) -> Any:
        """The progress the job last saved at a checkpoint; None if none (or it finished)."""
        return decode_progress(self.app.redis.hget(self._keys.progress, self.id))

    async def aprogress(self) -> Any:
        client = await self.app.aredis()
        return decode_progress(await client.hget(self._keys.progress, self.id))

    def cancel(self) -> bool:
        """Cancels the job: a queued or delayed one is removed at once (status `cancelled`);
        a running one stops at its next checkpoint (an async task at once), its outcome is
        `cancelled` and it is never retried. Returns whether anything was cancelled."""
        call = cancel_call(self.app, self.id, self.app.known_queues())
        return bool(call.run(self.app.redis))

    async def acancel(self) -> bool:
        call = cancel_call(self.app, self.id, await self.app.aknown_queues())
        return bool(await call.arun(await self.app.aredis()))

    def _shard(self) -> tuple[Keys, Scripts]:
        if self._run is None:
            return self._keys, self._scripts
        return self.app.run_shard(self._run)

    async def _ashard(self) -> tuple[Keys, Scripts]:
        if self._run is None:
            return self._keys, self._scripts
        return await self.app.arun_shard(self._run)

    def status(self) -> JobStatus:
        call = self._shard()[1].job_status(self.id, queues=self.app.queues())
        status = _status(call.run(self.app.redis))
        # A run claimed from the time slots is no job: it runs while its worker's lot holds it.
        if status is JobStatus.MISSING and self._run is not None:
            return JobStatus.RUNNING if self.app.scheduler.run_flying(self._run) else status
        return status

    async def astatus(self) -> JobStatus:
        call = (await self._ashard())[1].job_status(self.id, queues=self.app.queues())
        status = _status(await call.arun(await self.app.aredis()))
        if status is JobStatus.MISSING and self._run is not None:
            return JobStatus.RUNNING if await self.app.scheduler.arun_flying(self._run) else status
        return status

    def result(self, timeout: float | None = None) -> R:
        """Wait for the job to finish and return its result, blocking in Redis (no polling).

        Raises `JobFailed` if it was dead-lettered, `ResultTimeout` after ``timeout`` seconds,
        `JobNotFound` if there is no such job or its outcome was not kept.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        keys, scripts = self._shard()
        client, done = self.app.redis, keys.done(self.id)
        # Its own client: a wait outlasts the read timeout that ordinary commands get.
        blocking = self.app.connections.blocking
        while True:
            found = scripts.job_status(self.id, _watch_ms(deadline)).run(client)
            if (value := _settled(self.id, found)) is not _PENDING:
                return value  # type: ignore[no-any-return]
            wait = _next_wait(deadline, self.id, timeout, found.status)
            # BLMOVE onto the same list: the marker stays for every other waiter.
            # (Redis 6+ takes fractional seconds; redis-py's annotation says int.)
            blocking.blmove(done, done, wait, "RIGHT", "LEFT")  # type: ignore[arg-type]

    async def aresult(self, timeout: float | None = None) -> R:
        """`result` for async callers."""
        deadline = None if timeout is None else time.monotonic() + timeout
        keys, scripts = await self._ashard()
        client, done = await self.app.aredis(), keys.done(self.id)
        blocking = await self.app.connections.ablocking()
        while True:
            found = await scripts.job_status(self.id, _watch_ms(deadline)).arun(client)
            if (value := _settled(self.id, found)) is not _PENDING:
                return value  # type: ignore[no-any-return]
            wait = _next_wait(deadline, self.id, timeout, found.status)
            await blocking.blmove(done, done, wait, "RIGHT", "LEFT")  # type: ignore[arg-type]


def cancel_call(app: App, job_id: str, queues: Sequence[str] = ()) -> Call[int]:
    """1 cancelled (it waited), 2 cancel requested (it runs), 0 nothing to cancel; a waiting
    job is found in the default queue and in ``queues``."""
    _, scripts = app.job_shard(job_id)
    return scripts.cancel(job_id, round(app.settings.result_ttl * 1000), queues)


_PENDING = object()


def _status(found: Any) -> JobStatus:
    if found.status == "finished":
        outcome = decode_outcome(found.outcome) if found.outcome is not None else {"ok": False}
        if outcome.get("cancelled"):
            return JobStatus.CANCELLED
        return JobStatus.COMPLETE if outcome["ok"] else JobStatus.DEAD
    return JobStatus(found.status)


def _settled(job_id: str, found: Any) -> Any:
    status = _status(found)
    if status is JobStatus.COMPLETE:
        return decode_outcome(found.outcome)["result"]
    if status is JobStatus.DEAD:
        outcome = decode_outcome(found.outcome) if found.outcome else {}
        raise JobFailed(
            job_id, str(outcome.get("error", "dead-lettered")), outcome.get("traceback")
        )
    if status is JobStatus.CANCELLED:
        raise JobCancelled(f"job {job_id} was cancelled")
    if status is JobStatus.MISSING:
        raise JobNotFound(
            f"job {job_id} does not exist, or it finished and its outcome was not kept "
            "(result_ttl=0) or has expired"
        )
    return _PENDING


def _watch_ms(deadline: float | None) -> int:
    """How long the status read marks the job as waited for: this round's wait, plus a margin
    for the round trips (a job nobody waits for is never announced on `done`)."""
    left = _LONGEST_BLOCK if deadline is None else deadline - time.monotonic()
    return math.ceil(max(0.0, min(left, _LONGEST_BLOCK)) * 1000) + _WATCH_MARGIN_MS


def _next_wait(
    deadline: float | None, job_id: str, timeout: float | None, status: str = ""
) -> float:
    # A job waiting for its dependencies may be dead-lettered with one of them by a script
    # that cannot name its `done` list (it learns of it only then): its status is read again
    # each second instead.
    longest = _WAITING_BLOCK if status == "waiting" else _LONGEST_BLOCK
    if deadline is None:
        return longest
    left = deadline - time.monotonic()
    if left <= 0:
        raise ResultTimeout(f"job {job_id} did not finish within {timeout} s")
    return min(left, longest)
