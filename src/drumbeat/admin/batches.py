"""Batches listed and shown (`drumbeat batches ls | show`), over every job shard.

A batch's fields are those of `batches` (lua/_workflows.lua names them); a shard's batches are
found in its `batchlist` (batch id -> the ms it was made), which an entry leaves when the reaper
forgets the batch (`Settings.result_ttl` after its end, at least 10 minutes).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from drumbeat.batches import BatchStatus
from drumbeat.errors import JobNotFound

from ._replies import pairs, text

if TYPE_CHECKING:
    from drumbeat.app import App

__all__ = ["BatchInfo", "batch_callbacks", "batch_info", "list_batches"]

# The fields of one batch that a listing reads: its head, then the counts (added, not ended,
# dead-lettered, cancelled) and the ms it ended. Batch.status reads the same.
_FIELDS = ("", "|n", "|left", "|ko", "|x", "|end")
_STATES = {"o": "open", "c": "closed", "x": "cancelled"}


@dataclass(frozen=True, slots=True)
class BatchInfo:
    """One batch: its counts and state, when it was made and ended, and its callbacks."""

    status: BatchStatus
    made_ms: int | None
    """When it was made (None: made by a version that did not list batches)."""
    ended_ms: int | None
    on_complete: str | None
    """The id of its on_complete callback, if it has one."""
    on_success: str | None
    failed_ids: tuple[str, ...] = ()
    """The members that did not succeed, in the order they ended (`batch_info` only)."""

    @property
    def id(self) -> str:
        return self.status.id

    @property
    def made_at(self) -> datetime | None:
        return None if self.made_ms is None else datetime.fromtimestamp(self.made_ms / 1000, UTC)

    @property
    def phase(self) -> str:
        """``open``, ``closed`` (members still pending), ``ended`` or ``cancelled``: its state
        as `drumbeat batches` and the dashboard show it."""
        status = self.status
        if status.state == "cancelled" or not status.ended:
            return status.state
        return "ended"


def list_batches(app: App, limit: int = 50) -> list[BatchInfo]:
    """The newest ``limit`` batches over the job shards, newest first, open or ended (an ended
    one is listed until it is forgotten)."""
    if limit <= 0:
        return []
    client = app.redis
    with client.pipeline(transaction=False) as pipe:
        for k in app.job_keys:
            pipe.zrange(k.batchlist, 0, limit - 1, desc=True, withscores=True)
        tops = pipe.execute()
    entries = [(int(score), bid, k) for k, top in zip(app.job_keys, tops, strict=True)
               for bid, score in pairs(top)]  # fmt: skip
    entries = sorted(entries, key=lambda e: (-e[0], e[1]))[:limit]
    with client.pipeline(transaction=False) as pipe:
        for _, bid, k in entries:
            pipe.hmget(k.batches, [bid + f for f in _FIELDS])
        raw = pipe.execute()
    found = (_info(bid, made, fields) for (made, bid, _), fields in zip(entries, raw, strict=True))
    return [info for info in found if info is not None]  # None: forgotten since the first read


def batch_info(app: App, batch_id: str) -> BatchInfo:
    """One batch with its failed members' ids; `JobNotFound` if there is no such batch (or it
    was forgotten)."""
    keys, _ = app.job_shard(batch_id)
    client = app.redis
    with client.pipeline(transaction=False) as pipe:
        pipe.hmget(keys.batches, [batch_id + f for f in _FIELDS])
        pipe.zscore(keys.batchlist, batch_id)
        fields, made = pipe.execute()
    info = _info(batch_id, None if made is None else int(made), fields)
    if info is None:
        raise JobNotFound(
            f"batch {batch_id} does not exist, or it ended and its record expired "
            "(Settings.result_ttl after its end)"
        )
    failed = app.get_batch(batch_id).failed_ids()
    return BatchInfo(
        info.status, info.made_ms, info.ended_ms, info.on_complete, info.on_success,
        tuple(failed),
    )  # fmt: skip


def _info(batch_id: str, made_ms: int | None, fields: list[Any]) -> BatchInfo | None:
    head, total, left, ko, x, end = (None if v is None else text(v) for v in fields)
    if head is None:
        return None
    n, pending, failed, cancelled = (int(v or 0) for v in (total, left, ko, x))
    parts = head.split("|")  # "<state>|<ttl ms>|<on_complete id>|<on_success id>"
    state = _STATES.get(parts[0], "closed")
    status = BatchStatus(
        batch_id, n, pending, n - pending - failed - cancelled, failed, cancelled, state,
        ended=end is not None,
    )  # fmt: skip
    on_complete = parts[2] if len(parts) > 2 and parts[2] else None
    on_success = parts[3] if len(parts) > 3 and parts[3] else None
    return BatchInfo(status, made_ms, None if end is None else int(end), on_complete, on_success)


def batch_callbacks(app: App, info: BatchInfo) -> dict[str, tuple[str, str]]:
    """Its callbacks: role (``on_complete``, ``on_success``) -> (job id, job status), for the
    ones it has."""
    return {
        role: (job_id, app.job(job_id).status().value)
        for role, job_id in (("on_complete", info.on_complete), ("on_success", info.on_success))
        if job_id is not None
    }
