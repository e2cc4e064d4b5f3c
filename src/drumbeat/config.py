"""Settings: one frozen dataclass, each field documented, readable from ``DRUMBEAT_*`` variables."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Literal

from .errors import ConfigurationError

Codec = Literal["json", "msgpack"]

#: The most values Lua's unpack() returns (LUAI_MAXCSTACK = 8000, less its own argument). The
#: scripts unpack lists that grow with `concurrency` and `batch_limit`; past these bounds a script
#: would fail mid-call ("too many results to unpack").
LUA_UNPACK_MAX = 7999
#: A claim takes up to `concurrency` jobs, read in one ``HMGET`` of their ids (_lib.lua pop_ready).
MAX_CONCURRENCY = LUA_UNPACK_MAX
#: A claim steps aside up to `batch_limit` due limiter markers in one ``ZADD`` of (score, marker)
#: pairs, two values each (claim.lua); acks, reaps and runs unpack one id per item.
MAX_BATCH_LIMIT = LUA_UNPACK_MAX // 2
#: `Settings.handover_wait`'s default lies this far past `Settings.ready_wait`: a recycling
#: worker's own deadline must not run out before the supervisor's wait for its successor does.
HANDOVER_MARGIN = 15.0


def _check_choices(settings: Settings) -> None:
    """The settings that take one of a few names."""
    for name, allowed in (("codec", ("json", "msgpack")),):
        if getattr(settings, name) not in allowed:
            raise ConfigurationError(
                f"{name} must be one of {', '.join(allowed)}, got {getattr(settings, name)!r}"
            )


def check_concurrency(concurrency: int) -> None:
    """Raises `ConfigurationError` unless a worker can hold this many claims."""
    if not 1 <= concurrency <= MAX_CONCURRENCY:
        raise ConfigurationError(
            f"concurrency must be between 1 and {MAX_CONCURRENCY} (a claim takes that many jobs "
            f"in one Lua call, whose unpack() handles at most {LUA_UNPACK_MAX} values), "
            f"got {concurrency!r}"
        )


def check_handover_wait(handover_wait: float | None, ready_wait: float) -> None:
    """Raises `ConfigurationError` unless a recycling worker's own deadline outlasts its
    supervisor's wait for the successor: sooner, it would retire before its successor serves.
    ``None`` (the default, derived from ``ready_wait``) always does."""
    if handover_wait is None:
        return
    if not handover_wait > 0:
        raise ConfigurationError(f"handover_wait must be > 0, got {handover_wait!r}")
    if not handover_wait > ready_wait:
        raise ConfigurationError(
            f"handover_wait must be longer than ready_wait ({ready_wait:g} s: a recycling "
            f"worker would retire before the supervisor stopped waiting for its successor), "
            f"got {handover_wait!r}; leave it unset for ready_wait + {HANDOVER_MARGIN:g} s"
        )


@dataclass(frozen=True, slots=True)
class Settings:
    """How an app talks to Redis and how its workers behave. Durations are in seconds."""

    url: str | None = None
    """Redis URL (``redis://``, ``rediss://``, ``unix://``, ``redis+cluster://``,
    ``rediss+cluster://``, ``redis[s]+sentinel://``: see `connections`); ``None`` starts the
    embedded Redis."""

    embedded: bool = True
    """Without a `url`, start (or reuse) the embedded Redis: a private ``redis-server`` on this
    machine, which no other machine sees (``DRUMBEAT_EMBEDDED``). False (``DRUMBEAT_EMBEDDED=0``)
    makes a missing URL a `ConfigurationError`: set it on every machine of a deployment, so
    that one missing ``DRUMBEAT_REDIS_URL`` fails at start instead of sending its jobs to a
    Redis of its own."""

    namespace: str = "default"
    """Prefix that keeps apps sharing one Redis apart; part of every key's hash tag."""

    codec: Codec = "json"
    """Payload encoding: ``json`` (readable) or ``msgpack`` (compact, also carries bytes)."""

    max_payload_bytes: int = 512 * 1024
    """Largest encoded job payload or result accepted."""

    max_header_bytes: int = 4096
    """Largest a job's headers may encode to (as compact JSON); past it the enqueue fails."""

    lease: float = 15.0
    """How long a claimed job is held without renewal before another worker may take it over."""

    max_stalls: int = 3
    """Lease expiries (worker crashed or hung) a job survives before it is dead-lettered."""

    result_ttl: float = 3600.0
    """Default time a finished job's outcome (status and result) is kept; 0 keeps nothing."""

    dead_ttl: float = 7 * 24 * 3600.0
    """Time a dead-lettered job is kept for inspection and retry."""

    concurrency: int = 10
    """Jobs one worker process runs at once (its slots); at most `MAX_CONCURRENCY`."""

    shutdown_grace: float = 10.0
    """On the first SIGTERM/SIGINT, time running jobs get to finish before being handed back."""

    idle_block: float = 2.0
    """Longest a worker blocks in Redis waiting for work before it looks again."""

    maintenance_interval: float = 1.0
    """How often each worker reaps expired leases, results and dead letters."""

    batch_limit: int = 500
    """Upper bound on the items one Lua call handles (claims, acks, reaps); at most
    `MAX_BATCH_LIMIT`."""

    schedule_shards: int = 1
    """Shards schedules are spread over, each under its own hash tag (for Redis Cluster);
    1 keeps them beside the jobs."""

    job_shards: int = 1
    """Shards jobs are spread over, each under its own hash tag (for Redis Cluster: spread them
    over the masters); 1 keeps every job in the namespace's main shard. A job's id names its
    shard, so `Job` calls go straight to it; jobs with a dedup key go to the shard the key
    hashes to, limited jobs to the main shard (where their limits live). Priority and order are
    strict within a shard; across shards a worker takes from each in turn."""

    progress_interval: float = 1.0
    """Least time between two saves of a job's progress at its checkpoints; progress is also
    saved before a checkpoint lends the slot and before a shutdown hands the job back."""

    min_interval: float = 1.0
    """Shortest ``every=`` a schedule may have, in seconds."""

    hang_timeout: float = 30.0
    """A worker whose event loop has not run for this long is hung: its heartbeat stops renewing
    its leases (so other workers take its jobs over), and under a supervisor
    (``--processes``) it is killed and replaced, as is one wedged this long (every thread of its
    sync task pool still running a task past its timeout). Also a new process's allowance from
    its start to its first beat. At least 1.0."""

    scale_interval: float = 1.0
    """Seconds between two scaling decisions of a supervisor run with ``--autoscale``."""

    scale_down_after: float = 30.0
    """Seconds a supervisor's pool must stay larger than the backlog needs before it retires
    one process (``DRUMBEAT_SCALE_DOWN_AFTER``); each further process waits as long again."""

    ready_wait: float = 60.0
    """Seconds a supervisor gives a new worker (a recycled one's successor, a rolling restart's)
    to say it serves (registered, claiming: after its ``on_startup`` hooks) before it stops the
    worker it replaces all the same (``DRUMBEAT_READY_WAIT``). Raise it for apps whose start-up
    takes longer, so that capacity never dips while they warm up."""

    handover_wait: float | None = None
    """Seconds a recycling worker waits for its supervisor's word to retire before it retires on
    its own (``DRUMBEAT_HANDOVER_WAIT``); only under an older supervisor, as today's always
    gives the word. ``None``: `ready_wait` + `HANDOVER_MARGIN`; a value of its own must exceed
    `ready_wait`."""

    metrics: bool = True
    """Workers count settled jobs per task and outcome, and their run times, in Redis (for
    ``GET /metrics`` of ``drumbeat dashboard``); one extra command in each settle write."""

    unknown_task_grace: float = 300.0
    """Seconds a job whose task no worker that claimed it knew keeps being handed back (for a
    worker of a newer deploy that knows it) before it is dead-lettered
    (``DRUMBEAT_UNKNOWN_TASK_GRACE``)."""

    extra: dict[str, Any] = field(default_factory=dict, compare=False)
    """Free-form settings for extensions; ignored by the core."""

    def __post_init__(self) -> None:
        _check_choices(self)
        for name in (
            "lease", "shutdown_grace", "idle_block", "maintenance_interval", "scale_interval",
            "ready_wait",
        ):  # fmt: skip
            if getattr(self, name) <= 0:
                raise ConfigurationError(f"{name} must be > 0, got {getattr(self, name)!r}")
        if self.hang_timeout < 1.0:
            raise ConfigurationError(
                f"hang_timeout must be >= 1.0 s (a shorter one takes a garbage collection or a "
                f"busy machine for a hang), got {self.hang_timeout!r}"
            )
        for name in ("progress_interval", "scale_down_after", "unknown_task_grace"):
            if getattr(self, name) < 0:
                raise ConfigurationError(
                    f"{name} must be >= 0 seconds, got {getattr(self, name)!r}"
                )
        check_handover_wait(self.handover_wait, self.ready_wait)
        if self.min_interval <= 0:
            raise ConfigurationError(f"min_interval must be > 0, got {self.min_interval!r}")
        for name in ("max_payload_bytes", "max_header_bytes", "schedule_shards", "job_shards"):
            if getattr(self, name) < 1:
                raise ConfigurationError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        check_concurrency(self.concurrency)
        if not 1 <= self.batch_limit <= MAX_BATCH_LIMIT:
            raise ConfigurationError(
                f"batch_limit must be between 1 and {MAX_BATCH_LIMIT} (a claim unpacks two Lua "
                f"values per item, and Lua's unpack() handles at most {LUA_UNPACK_MAX}), "
                f"got {self.batch_limit!r}"
            )
        if self.result_ttl < 0 or self.dead_ttl <= 0 or self.max_stalls < 0:
            raise ConfigurationError("result_ttl >= 0, dead_ttl > 0 and max_stalls >= 0 expected")

    @property
    def lease_ms(self) -> int:
        return int(self.lease * 1000)

    @property
    def handover_deadline(self) -> float:
        """`handover_wait`, or its default when unset (derived here, not stored: a `replace`
        of `ready_wait` moves it along)."""
        if self.handover_wait is None:
            return self.ready_wait + HANDOVER_MARGIN
        return self.handover_wait

    def replace(self, **changes: Any) -> Settings:
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_env(cls, prefix: str = "DRUMBEAT_", **overrides: Any) -> Settings:
        """Build settings from ``{prefix}{FIELD}`` variables (e.g. ``DRUMBEAT_REDIS_URL``).

        ``url`` is read from ``{prefix}REDIS_URL``; keyword overrides win over the environment.
        """
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if f.name == "extra":
                continue
            var = prefix + ("REDIS_URL" if f.name == "url" else f.name.upper())
            raw = os.environ.get(var)
            if raw is None or raw == "":
                continue
            default = f.default
            try:
                if isinstance(default, bool):
                    values[f.name] = raw.lower() in ("1", "true", "yes", "on")
                elif isinstance(default, int):
                    values[f.name] = int(raw)
                elif isinstance(default, float) or f.type == "float | None":
                    values[f.name] = float(raw)
                else:
                    values[f.name] = raw
            except ValueError:
                raise ConfigurationError(
                    f"{var}={raw!r} is not a valid {type(default).__name__}"
                ) from None
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)
