"""What the scripts reply: one typed value per kind of reply, and the parser that builds it
from the raw reply (bytes or str, as the client decodes). `scripts.Call` pairs each script call
with its parser."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .keys import DEFAULT_QUEUE
from .protocol import LIMIT_PREFIX, PAUSE_PREFIX

if TYPE_CHECKING:
    from .schedules.slots import Claims


def parse_ints(raw: Any) -> list[int]:
    return [int(x) for x in raw]


def _parse_pairs(raw: Any) -> list[tuple[str, int]]:
    return [(_str(raw[i]), int(raw[i + 1])) for i in range(0, len(raw), 2)]


@dataclass(frozen=True, slots=True)
class Renewed:
    lost: list[tuple[str, int]]
    """(id, token) of the claims this worker no longer owns."""
    cancelled: list[str]
    """Ids of jobs it owns whose cancel was requested."""


def parse_renewed(raw: Any) -> Renewed:
    return Renewed(_parse_pairs(raw[0]), [_str(x) for x in raw[1]])


def _str(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def text(value: bytes | str) -> str:
    """``value`` as text for display: bytes that are not UTF-8 shown replaced, never raised."""
    return value.decode(errors="replace") if isinstance(value, bytes) else value


@dataclass(slots=True)  # not frozen: a frozen init costs a setattr call per field, per run
class SlotRun:
    """A run claimed from the time slots (`slots.py`): held under its worker's incarnation,
    with its schedule's record as claimed (the worker builds the next one from it)."""

    claims: Claims
    """The claims of the incarnation it is held under, in its shard."""
    lot: str
    """The lot it was claimed into (``<claim number>:<slot ms>``)."""
    fields: list[str]
    """Its schedule's record as claimed, split into its fields (`slots.settled_fields`)."""
    claimed_ms: int
    """When the claim ran (Redis ms): the run's start."""
    due_ms: int
    """Its due time (after a stall, its first one)."""
    first_ms: int | None
    """After a stall, when it first started."""
    slot_ms: int
    """The slot it was claimed from (its settle's fencing: `where` names it until then)."""
    queue: str | None = None
    """The queue its schedule's runs go to, when routed (the run goes there as a job)."""

    @property
    def incarnation(self) -> str:
        return self.claims.incarnation

    def run_key(self) -> str:
        """Its place in its schedule as a queued run's state holds it (`protocol.RUN_STATE_FIELDS`,
        then the first start after a stall): built only when the run becomes a job, as the
        runner reads a time-slot run's from its fields."""
        gen, grid = self.fields[0], self.fields[1]
        key = f"{self.due_ms}:{grid}:{gen}:{1 if int(grid) > self.due_ms else 0}"
        return key if self.first_ms is None else f"{key}:{self.first_ms}"


#: Fields per claimed item in a claim reply (see `take_all` in _lib.lua).
CLAIMED_FIELDS = 9


@dataclass(slots=True)  # not frozen: a frozen init costs a setattr call per field, per job
class Claimed:
    """A job as the claim script hands it out."""

    id: str
    spec: bytes | None
    attempt: int
    stalls: int
    token: int
    priority: int
    extra: str
    """The dedup key of a job; "<due>:<grid>:<generation>:<manual>" of a queued schedule run
    (a time-slot run's is in its `slot_run`: "")."""
    progress: bytes | None = None
    """The progress the job last saved at a checkpoint (encoded), if any."""
    where: bytes | str | None = None
    """``<queue>|<unknown ms>`` as the claim replied, None for most jobs (the default queue,
    never handed back for want of its task); read through `queue` and `unknown_ms`."""
    slot_run: SlotRun | None = None
    """Set for a run claimed from the time slots (`slots.py`), which has no lease of its own."""
    decoded: Any = None
    """A job's record (`job.Spec`) once decoded: a job hook that read it leaves it for the
    runner, so a run decodes its record once."""

    @property
    def queue(self) -> str:
        """The queue the job belongs to."""
        if not self.where:
            return DEFAULT_QUEUE
        return _str(self.where).partition("|")[0] or DEFAULT_QUEUE

    @property
    def unknown_ms(self) -> int:
        """When a worker that lacked its task first handed it back (Redis ms), or 0."""
        if not self.where:
            return 0
        return int(_str(self.where).partition("|")[2] or 0)


@dataclass(frozen=True, slots=True)
class ClaimResult:
    now_ms: int
    next_due_ms: int | None
    best: int
    """Priority of the best job left in `ready` after the claim; -1 when it is empty."""
    jobs: list[Claimed]
    limiters: list[str] = field(default_factory=list)
    """Limiter keys whose markers came due, for `Scripts.release_limits`."""
    paused: list[str] = field(default_factory=list)
    """The queues served that are paused (`App.pause_queue`): the claim took nothing of
    theirs."""


def parse_claim(raw: Any) -> ClaimResult:
    next_due = int(raw[1])
    limiters: list[str] = []
    paused: list[str] = []
    for b in raw[2]:
        text = _str(b)
        if text.startswith(LIMIT_PREFIX):
            limiters.append(text[len(LIMIT_PREFIX) :])
        elif text.startswith(PAUSE_PREFIX):
            paused.append(text[len(PAUSE_PREFIX) :])
    return ClaimResult(
        int(raw[0]),
        None if next_due < 0 else next_due,
        int(raw[3]),
        _claimed(raw, 4),
        limiters,
        paused,
    )


@dataclass(frozen=True, slots=True)
class Lent:
    """What `Scripts.claim_urgent` took (at most one job) and what is left."""

    best: int
    """Priority of the best job left in `ready`; -1 when it is empty."""
    jobs: list[Claimed]


def _claimed(raw: Any, start: int) -> list[Claimed]:
    # One pass over the reply, CLAIMED_FIELDS at a time, each Claimed made positionally: a
    # worker parses one per run (index arithmetic and keywords cost twice as much).
    fields = iter(raw)
    for _ in range(start):
        next(fields)
    return [
        Claimed(
            job_id.decode() if type(job_id) is bytes else job_id,
            spec or None,
            int(attempt),
            int(stalls),
            int(token),
            int(priority),
            extra.decode() if type(extra) is bytes else extra,
            progress or None,
            where or None,
        )
        for job_id, spec, attempt, stalls, token, priority, extra, progress, where in zip(
            *([fields] * CLAIMED_FIELDS), strict=False
        )
    ]


def parse_lent(raw: Any) -> Lent:
    return Lent(int(raw[1]), _claimed(raw, 2))


@dataclass(frozen=True, slots=True)
class QueuedRuns:
    """What `SlotScripts.queue_runs` did with each run."""

    statuses: list[int]
    """Per run: 2 taken by the worker that sent them (in `taken`), 1 queued, 0 refused."""
    taken: list[Claimed]
    """The runs taken, in their order, each as a claim gives it."""


def parse_queued_runs(raw: Any) -> QueuedRuns:
    return QueuedRuns([int(x) for x in raw[0]], _claimed(raw, 1))


@dataclass(frozen=True, slots=True)
class Enqueued:
    id: str
    created: bool


def parse_enqueue(raw: Any) -> list[Enqueued]:
    return [Enqueued(_str(raw[i]), bool(int(raw[i + 1]))) for i in range(1, len(raw), 2)]


@dataclass(frozen=True, slots=True)
class Reaped:
    requeued: int
    more: bool
    """A sweep hit its limit: there is more to reap right away."""
    buried: list[str]


def parse_reap(raw: Any) -> Reaped:
    return Reaped(int(raw[0]), bool(int(raw[1])), [_str(x) for x in raw[2:]])


@dataclass(frozen=True, slots=True)
class JobState:
    status: str
    outcome: bytes | None
    state: str | None


def parse_status(raw: Any) -> JobState:
    return JobState(_str(raw[0]), raw[1] or None, _str(raw[2]) if raw[2] else None)
