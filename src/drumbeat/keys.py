"""The Redis key schema: the only code that formats a Redis key.

Every key is ``drumbeat:{<namespace>[:<shard>]}:<name>``: no shard for the main one (jobs, and
schedules unless spread), ``<n>`` for schedule shard n, ``j<k>`` for job shard k > 0. The braces
make the namespace (and shard) a Redis Cluster hash tag, so every key one script touches lives
in one slot. The table in ``docs/redis-keys.md`` describes each key; ``tests/unit/test_keys.py``
checks the two agree.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

# Names are checked in names.py and job ids made in job_ids.py; much of the package still
# imports them from here, so they are re-exported (``x as x`` is an export to mypy).
from drumbeat.names import check_name

PREFIX = "drumbeat"

#: The per-shard keys, with the Redis type each one has. ``docs/redis-keys.md`` lists the same.
SHARD_KEYS: dict[str, str] = {
    "ready": "zset",
    "due": "zset",
    "leases": "zset",
    "jobs": "hash",
    "state": "hash",
    "owners": "hash",
    "uniq": "hash",
    "uniqfor": "hash",
    "uniqends": "zset",
    "results": "hash",
    "expires": "zset",
    "dead": "zset",
    "errors": "hash",
    "seq": "string",
    "fence": "string",
    "wake": "zset",
    "workers": "zset",
    "workerinfo": "hash",
    "tasks": "hash",
    "faults": "hash",
    "lateness": "hash",
    "waiting": "zset",
    "progress": "hash",
    "cancels": "hash",
    "signals": "channel",
    "supervisors": "zset",
    "supervisorinfo": "hash",
    "metrics": "hash",
    "throughput": "hash",
    "queues": "set",
    "parking": "hash",
    "slots": "zset",
    "where": "hash",
    "runners": "zset",
    "pending": "hash",
    "stalled": "hash",
    "busy": "hash",
    "paused": "hash",
    "pauses": "set",
    "upgraded": "string",
    "deps": "hash",
    "dependents": "hash",
    "edges": "hash",
    "freed": "zset",
    "orphans": "hash",
    "members": "hash",
    "batches": "hash",
    "batchttl": "zset",
    "batchdone": "channel",
    "batchlist": "zset",
}

#: The queue a job goes to unless its task or its call names another.
DEFAULT_QUEUE = "default"

#: Keys of one queue: ``<name>`` for the default queue (the names every namespace had before
#: queues existed, so its data needs no migration), ``<name>:<queue>`` for any other.
QUEUE_KEYS: dict[str, str] = {"ready": "zset", "due": "zset", "wake": "zset"}

#: Keys of one bucket of a shard's timing wheel, ``<name>:<bucket>``: the schedule store before
#: the time slots, read only to move what an older version left there (schedules/upgrade.py).
BUCKET_KEYS: dict[str, str] = {"wheel": "zset", "schedules": "hash"}

#: Keys of the time slots, the schedule store (docs/design/time-slots.md): ``slot:<ms>``, the
#: entries due in that millisecond; ``inflight:<incarnation>``, the lots one worker process
#: incarnation may still hold runs of;
#: ``claimed:<incarnation>:<n>:<ms>``, a lot: the entries its n-th claim took from slot ms.
SLOT_KEYS: dict[str, str] = {"slot": "list", "inflight": "hash", "claimed": "list"}

#: Buckets of the timing wheel per shard; a schedule's phase in its interval is its bucket's
#: place among them (`schedule.phase_ms`), so the phases stay what the wheel gave them.
WHEEL_BUCKETS = 16384


# The hash's parameters, set up once: a copy of it hashes an id in half the time of a new one.
_BUCKET_HASH = hashlib.blake2b(digest_size=8, person=b"bucket")


def bucket_of(schedule_id: str) -> int:
    """The wheel bucket of a schedule: a stable hash of its id (the same in every process)."""
    h = _BUCKET_HASH.copy()
    h.update(schedule_id.encode())
    return int.from_bytes(h.digest(), "big") % WHEEL_BUCKETS


#: Keys of one limiter key (limits.py: ``t:<task>[=<value>]`` or ``n:<limiter>``),
#: ``<name>:<limiter key>``.
LIMIT_KEYS: dict[str, str] = {"limit": "hash", "permits": "zset", "parked": "zset"}

#: Keys made per job; each one has a Redis expiry.
JOB_KEYS: dict[str, str] = {"done": "list"}


@dataclass(frozen=True, slots=True)
class Keys:
    """The keys of one shard of one namespace."""

    namespace: str
    shard: int | str | None = None
    """None: the main shard; n: schedule shard n; ``j<k>``: job shard k (see `job_keys`)."""
    _tag: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_name(self.namespace, "namespace")
        inner = self.namespace if self.shard is None else f"{self.namespace}:{self.shard}"
        # Formed once: every key of the hot path is built from it.
        object.__setattr__(self, "_tag", "{" + inner + "}")

    @property
    def tag(self) -> str:
        """The Cluster hash tag shared by every key of this shard."""
        return self._tag

    @classmethod
    def job_keys(cls, namespace: str, shard: int) -> Keys:
        """The keys of job shard ``shard`` (0: the main shard)."""
        return cls(namespace) if shard == 0 else cls(namespace, f"j{shard}")

    def key(self, name: str) -> str:
        if name not in SHARD_KEYS:
            raise KeyError(f"unknown shard key {name!r}")
        return f"{PREFIX}:{self.tag}:{name}"

    def done(self, job_id: str) -> str:
        """The list a finished job's outcome is announced on, for `Job.result` to block on."""
        return f"{PREFIX}:{self.tag}:done:{job_id}"

    # Named accessors keep call sites short and typo-proof.
    @property
    def ready(self) -> str:
        return self.key("ready")

    @property
    def due(self) -> str:
        return self.key("due")

    @property
    def leases(self) -> str:
        return self.key("leases")

    @property
    def jobs(self) -> str:
        return self.key("jobs")

    @property
    def state(self) -> str:
        return self.key("state")

    @property
    def owners(self) -> str:
        return self.key("owners")

    @property
    def uniq(self) -> str:
        return self.key("uniq")

    @property
    def uniqfor(self) -> str:
        return self.key("uniqfor")

    @property
    def uniqends(self) -> str:
        return self.key("uniqends")

    @property
    def results(self) -> str:
        return self.key("results")

    @property
    def expires(self) -> str:
        return self.key("expires")

    @property
    def dead(self) -> str:
        return self.key("dead")

    @property
    def errors(self) -> str:
        return self.key("errors")

    @property
    def seq(self) -> str:
        return self.key("seq")

    @property
    def fence(self) -> str:
        return self.key("fence")

    @property
    def wake(self) -> str:
        return self.key("wake")

    @property
    def workers(self) -> str:
        return self.key("workers")

    @property
    def workerinfo(self) -> str:
        return self.key("workerinfo")

    def queue_key(self, name: str, queue: str) -> str:
        """A key of one queue (`QUEUE_KEYS`); the default queue's has no suffix."""
        if name not in QUEUE_KEYS:
            raise KeyError(f"unknown queue key {name!r}")
        suffix = "" if queue == DEFAULT_QUEUE else f":{queue}"
        return f"{PREFIX}:{self.tag}:{name}{suffix}"

    def ready_of(self, queue: str) -> str:
        return self.queue_key("ready", queue)

    def due_of(self, queue: str) -> str:
        return self.queue_key("due", queue)

    def wake_of(self, queue: str) -> str:
        return self.queue_key("wake", queue)

    @property
    def queues(self) -> str:
        return self.key("queues")

    def bucket_key(self, name: str, bucket: int) -> str:
        if name not in BUCKET_KEYS or not 0 <= bucket < WHEEL_BUCKETS:
            raise KeyError(f"unknown bucket key {name!r}:{bucket}")
        return f"{PREFIX}:{self.tag}:{name}:{bucket}"

    def wheel(self, bucket: int) -> str:
        return self.bucket_key("wheel", bucket)

    def schedules(self, bucket: int) -> str:
        return self.bucket_key("schedules", bucket)

    def slot(self, ms: int) -> str:
        """The entries of the schedules due in millisecond ``ms`` (time slots)."""
        return f"{PREFIX}:{self.tag}:slot:{ms}"

    def inflight(self, incarnation: str) -> str:
        """The lots whose runs one worker process incarnation may still hold (lot -> the
        claim's ms)."""
        return f"{PREFIX}:{self.tag}:inflight:{check_name(incarnation, 'incarnation')}"

    def claimed(self, incarnation: str, lot: str) -> str:
        """A lot of a worker process incarnation (``<claim number>:<slot ms>``): the entries
        that claim took from that slot."""
        return f"{PREFIX}:{self.tag}:claimed:{check_name(incarnation, 'incarnation')}:{lot}"

    @property
    def slots(self) -> str:
        """The non-empty time slots, each by its ms."""
        return self.key("slots")

    @property
    def where(self) -> str:
        """Schedule id -> the ms of the time slot its entry waits in."""
        return self.key("where")

    @property
    def runners(self) -> str:
        """Worker process incarnations holding time-slot entries -> their lease deadline."""
        return self.key("runners")

    @property
    def busy(self) -> str:
        """Worker process incarnation -> the time-slot runs it holds (the autoscaler's busy
        count: those runs hold no lease of their own)."""
        return self.key("busy")

    @property
    def stalled(self) -> str:
        """Slot ms -> how many runs back from a lapsed lease wait at the end of that slot."""
        return self.key("stalled")

    @property
    def paused(self) -> str:
        """Schedule id -> the entry of a paused schedule kept as time slots (`where`: "p")."""
        return self.key("paused")

    @property
    def pauses(self) -> str:
        """The names of the paused queues (`App.pause_queue`); every shard keeps a copy, which
        its claims read."""
        return self.key("pauses")

    @property
    def pending(self) -> str:
        """Schedule id -> a change made while its run was in flight, applied when it settles."""
        return self.key("pending")

    @property
    def upgraded(self) -> str:
        """Set once the shard's timing wheel (the store before the time slots) has moved."""
        return self.key("upgraded")

    def limit_key(self, name: str, limiter: str) -> str:
        """A key of one limiter key (`LIMIT_KEYS`)."""
        if name not in LIMIT_KEYS:
            raise KeyError(f"unknown limit key {name!r}")
        return f"{PREFIX}:{self.tag}:{name}:{limiter}"

    def limit(self, limiter: str) -> str:
        """GCRA state and the limit of one limiter key."""
        return self.limit_key("limit", limiter)

    def permits(self, limiter: str) -> str:
        """Runs (and tickets) holding one limiter key."""
        return self.limit_key("permits", limiter)

    def parked(self, limiter: str) -> str:
        """Jobs waiting for one limiter key."""
        return self.limit_key("parked", limiter)

    @property
    def parking(self) -> str:
        """Per queue: jobs parked on limiter keys, and limiter markers in its `due` (counters
        the limit scripts keep, so status need not scan)."""
        return self.key("parking")

    @property
    def tasks(self) -> str:
        return self.key("tasks")

    @property
    def faults(self) -> str:
        return self.key("faults")

    @property
    def lateness(self) -> str:
        return self.key("lateness")

    @property
    def waiting(self) -> str:
        return self.key("waiting")

    @property
    def progress(self) -> str:
        return self.key("progress")

    @property
    def cancels(self) -> str:
        return self.key("cancels")

    @property
    def deps(self) -> str:
        """Jobs waiting for their dependencies: how many are left (workflows)."""
        return self.key("deps")

    @property
    def dependents(self) -> str:
        """How many dependents each job has (their edges are in `edges`)."""
        return self.key("dependents")

    @property
    def edges(self) -> str:
        """The dependents of each job, one field each: ``<job id>|<i>``."""
        return self.key("edges")

    @property
    def orphans(self) -> str:
        """Dependents dead-lettered through a dependency, and the dependency's list of them, so
        that a retry of the dependency brings them back to wait (lua/_workflows.lua)."""
        return self.key("orphans")

    @property
    def freed(self) -> str:
        """Dependents released into a queue whose keys their releaser lacked (reap moves them)."""
        return self.key("freed")

    @property
    def members(self) -> str:
        """Batch members while they live: job id -> batch id (batches.py)."""
        return self.key("members")

    @property
    def batches(self) -> str:
        """Each batch's head and counters, ``<batch id>|<field>`` (lua/_workflows.lua)."""
        return self.key("batches")

    @property
    def batchttl(self) -> str:
        """Ended batches by the ms their fields go (reap forgets them then)."""
        return self.key("batchttl")

    @property
    def batchdone(self) -> str:
        """The channel a batch's end is told on (its id), for `Batch.wait`."""
        return self.key("batchdone")

    @property
    def batchlist(self) -> str:
        """Every batch of the shard until it is forgotten, by the ms it was made (the listing
        of ``drumbeat batches ls``)."""
        return self.key("batchlist")

    @property
    def supervisors(self) -> str:
        return self.key("supervisors")

    @property
    def supervisorinfo(self) -> str:
        return self.key("supervisorinfo")

    @property
    def metrics(self) -> str:
        """Counters of settled jobs for ``GET /metrics`` (tally.lua), on the jobs' shard."""
        return self.key("metrics")

    @property
    def throughput(self) -> str:
        """Attempts settled per 10 s over the last 15 minutes (tally.lua), for the overview."""
        return self.key("throughput")

    @property
    def signals(self) -> str:
        """The shard's pub/sub channel (named like a key, so it hashes to the shard's slot)."""
        return self.key("signals")
