"""The Context a running task can read (which job, which attempt, its fencing token, its last
saved progress) and the checkpoints a long task calls between units of work."""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .batches import Batch
    from .job import Job


class Checkpoints(Protocol):
    """What a worker does at a task's checkpoints (the worker's side of `checkpoint`)."""

    @property
    def paused(self) -> float:
        """Seconds the run spent paused at checkpoints (lending its slot): not part of its
        timeout."""

    is_async: bool
    """Set by the runner: an async run can be cancelled at once, a sync one at a checkpoint."""

    def checkpoint(self, progress: Any) -> None: ...

    async def acheckpoint(self, progress: Any) -> None: ...


@dataclass(frozen=True, slots=True)
class Context:
    """What a task knows about the run it is part of."""

    job_id: str
    task: str
    attempt: int
    """1 on the first run; counts every claim, including runs a crashed worker never finished."""
    token: int
    """Fencing token of this claim: strictly larger for every later claim of any job in the shard.
    Store it beside side effects (``... WHERE token < :token``) to make them idempotent when a
    run whose lease was taken over finishes late."""
    priority: int
    worker: str
    schedule_id: str | None = None
    """The schedule this run belongs to; None for a one-off job."""
    due_ms: int | None = None
    """When this run was due (epoch ms, Redis clock); None for a one-off job."""
    progress: Any = None
    """The progress this job last saved at a checkpoint (in an earlier attempt, before a crash,
    a retry or a hand-back); None if it never saved any."""
    checkpoints: Checkpoints | None = field(default=None, repr=False, compare=False)
    granted_ms: int | None = None
    """When this run's rate and concurrency limits granted its start (epoch ms, Redis clock;
    the worker waits for it when it is a few ms ahead); None for a run of an unlimited task."""
    headers: dict[str, str] = field(default_factory=dict, hash=False)
    """The job's headers (`Task.options(headers=...)`, producer middleware; a schedule run's:
    its schedule's); {} when it has none. Kept through retries and hand-backs."""
    dependencies: tuple[Job[Any], ...] = ()
    """The jobs it waited for (`Task.options(depends_on=...)`; a chain's step: the step
    before it), in the order given; read a result with ``dependencies[0].result()``."""
    batch: Batch | None = None
    """The batch it is a member or a callback of (`App.batch`): its ``status()``,
    ``failed_ids()``, ``add(...)``; None if none."""


class _Unfrozen:
    """Context's slots, without its frozen setattr: filled, then made a Context (see
    `Running.context`)."""

    __slots__ = Context.__slots__


_CHECKPOINTS = Context.__slots__.index("checkpoints")


class Running:
    """What a job's run holds while it runs: its Context's fields (in `Context`'s order), made
    into the Context the first time a task asks (`current_job`; most tasks never do)."""

    __slots__ = ("_context", "checkpoints", "fields")

    def __init__(self, fields: tuple[Any, ...]) -> None:
        self.fields = fields
        self.checkpoints: Checkpoints | None = fields[_CHECKPOINTS]
        """Read at every `checkpoint`, which needs no Context."""
        self._context: Context | None = None

    def context(self) -> Context:
        ctx = self._context
        if ctx is None:
            # A frozen dataclass's __init__ makes a setattr call per field: 2 µs for these
            # eleven, a twentieth of what a worker spends on a run. The same slots filled
            # plainly, then the object made a Context (same layout), cost a quarter of that.
            c: Any = _Unfrozen()  # the type checker cannot read slots copied from Context
            (c.job_id, c.task, c.attempt, c.token, c.priority, c.worker, c.schedule_id,
             c.due_ms, c.progress, c.checkpoints, c.granted_ms,
             c.headers) = self.fields[:12]  # fmt: skip
            # A job's run passes its dependencies after them; a schedule's run has none.
            c.dependencies = self.fields[12] if len(self.fields) > 12 else ()
            c.batch = self.fields[13] if len(self.fields) > 13 else None
            c.__class__ = Context
            ctx = self._context = c
        return ctx


current_run: ContextVar[Running] = ContextVar("drumbeat_job")
"""The run of the job in this task or thread: the runner sets it around each run."""


def current_job() -> Context:
    """The Context of the job running in this task or thread; ``LookupError`` outside a job."""
    try:
        return current_run.get().context()
    except LookupError:
        raise LookupError("current_job() is only available while a drumbeat job runs") from None


def checkpoint(progress: Any = None) -> None:
    """Marks a point between two units of work of a long sync task.

    Here the worker may lend the task's slot to a job of strictly higher priority (the task
    waits, and resumes when that job ends), save ``progress`` (at most every
    `Settings.progress_interval`, and always before lending or a hand-back), and stop the task
    when the job was cancelled or the worker is shutting down (it is then handed back with its
    progress). The common path costs no Redis round trip. Outside a job it does nothing.

    Args:
        progress: where the task is (any value the payload codec can encode); the next attempt
            reads it as ``current_job().progress``. None saves nothing new.

    Raises:
        LeaseLost: the job's lease was taken over; this run's work is no longer its own.
        SerializationError: ``progress`` cannot be encoded, or is too large.
    """
    run = current_run.get(None)
    if run is not None and run.checkpoints is not None:
        run.checkpoints.checkpoint(progress)


async def acheckpoint(progress: Any = None) -> None:
    """The async twin of `checkpoint`, for ``async def`` tasks."""
    run = current_run.get(None)
    if run is not None and run.checkpoints is not None:
        await run.checkpoints.acheckpoint(progress)
