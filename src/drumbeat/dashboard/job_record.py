"""One job as Redis holds it, for the Jobs page and ``/api/job/<id>``: its entry in `state`, its
task and arguments, and everything else recorded of it, read in one transaction.

What Redis keeps of a job, and so what can be shown: its spec (task, arguments) until it
completes; its state (queue, priority, attempt); its claim (worker, claimed at) and lease while
it runs; its saved progress; its outcome (result, or error and traceback) for ``result_ttl``;
its error record while dead. Not recorded: when it was enqueued, when earlier attempts ran, and
when a successful job finished (only when its result expires).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from drumbeat.cli.shapes import timestamp
from drumbeat.connections import pipeline
from drumbeat.errors import SerializationError
from drumbeat.job import decode_outcome, decode_progress, decode_spec
from drumbeat.keys import DEFAULT_QUEUE, Keys
from drumbeat.protocol import FIELD_SEP, RUN_PREFIX, parse_owner
from drumbeat.schedule import decode_schedule_spec

if TYPE_CHECKING:
    from drumbeat.app import App
    from drumbeat.scripts import Scripts

__all__ = ["NOT_RECORDED", "State", "as_text", "describe", "job_json", "parse_state"]

#: What a job's record does not hold, said on the page and in the JSON.
NOT_RECORDED = (
    "when it was enqueued",
    "when earlier attempts ran",
    "when a successful job finished (its result is kept until result_expires)",
)


def as_text(value: bytes | str) -> str:
    """A reply from Redis as text (bytes that are not UTF-8 replaced, not raised)."""
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def _ms(value: Any) -> int | None:
    return None if value is None else int(float(value))


@dataclass(frozen=True, slots=True)
class State:
    """A job's entry in `state` (protocol.JOB_STATE_FIELDS; the short layout has no unknown
    and queue)."""

    attempt: int
    stalls: int
    priority: int
    queue: str
    dedup_key: str | None


def parse_state(raw: bytes | str | None) -> State | None:
    if raw is None:
        return None
    parts = as_text(raw).split(FIELD_SEP)
    try:
        if len(parts) == 5:
            attempt, stalls, priority, _, dedup = parts
            queue = ""
        elif len(parts) == 7:
            attempt, stalls, priority, _, _, queue, dedup = parts
        else:
            return None
        return State(
            int(attempt), int(stalls), int(priority), queue or DEFAULT_QUEUE, dedup or None
        )
    except ValueError:
        return None


def describe(job_id: str, spec: bytes | None) -> dict[str, Any]:
    """Task and arguments of a `jobs` entry: a job's spec, or ``<task>|<schedule spec>`` for
    a schedule's run."""
    out: dict[str, Any] = {"task": None, "args": None, "kwargs": None, "schedule": None}
    if job_id.startswith(RUN_PREFIX):
        out["schedule"] = job_id[len(RUN_PREFIX) :]
        if spec is not None and FIELD_SEP.encode() in spec:
            task, _, blob = spec.partition(FIELD_SEP.encode())
            out["task"] = task.decode(errors="replace")
            with contextlib.suppress(Exception):  # a foreign record: shown without arguments
                out["args"], out["kwargs"], _, _ = decode_schedule_spec(blob)
        return out
    if spec is not None:
        try:
            decoded = decode_spec(spec)
        except SerializationError as exc:
            out["task"] = f"(unreadable record: {exc})"
        else:
            out.update(task=decoded.task, args=decoded.args, kwargs=decoded.kwargs)
    return out


def _shard(app: App, job_id: str) -> tuple[Keys, Scripts]:
    """A schedule's run lives in its schedule's shard; every other job in the job shard its
    id names."""
    if job_id.startswith(RUN_PREFIX):
        return app.run_shard(job_id[len(RUN_PREFIX) :])
    return app.job_shard(job_id)


def job_json(app: App, job_id: str) -> dict[str, Any]:
    """Everything Redis holds of one job (``status`` ``missing`` if nothing)."""
    keys, scripts = _shard(app, job_id)
    found = scripts.job_status(job_id, queues=app.known_queues()).run(app.redis)
    with pipeline(app.redis, transaction=True) as pipe:
        pipe.time()
        pipe.hget(keys.jobs, job_id)
        pipe.hget(keys.state, job_id)
        pipe.hget(keys.owners, job_id)
        pipe.zscore(keys.leases, job_id)
        pipe.hget(keys.results, job_id)
        pipe.zscore(keys.expires, job_id)
        pipe.zscore(keys.dead, job_id)
        pipe.hget(keys.errors, job_id)
        pipe.hget(keys.progress, job_id)
        pipe.hget(keys.cancels, job_id)
        now, spec, state_raw, owner, deadline, outcome, expires, died, error, progress, cancel = (
            pipe.execute()
        )
    state = parse_state(state_raw)
    queue = state.queue if state else DEFAULT_QUEUE
    with pipeline(app.redis, transaction=False) as pipe:
        pipe.zscore(keys.due_of(queue), job_id)
        pipe.zrank(keys.ready_of(queue), job_id)
        due, ahead = pipe.execute()
    status = _status(found.status, outcome)
    claim = parse_owner(as_text(owner)) if owner is not None else None
    record = _outcome(outcome if outcome is not None else error)
    return {
        "id": job_id,
        "status": status,
        **describe(job_id, spec),
        "queue": queue if state or status != "missing" else None,
        "priority": state.priority if state else None,
        "attempt": state.attempt if state else record.get("attempt"),
        "stalls": state.stalls if state else None,
        "dedup_key": state.dedup_key if state else None,
        "queued_ahead": ahead if status == "queued" else None,
        "worker": claim.worker if claim else None,
        **timestamp("now", int(now[0]) * 1000 + int(now[1]) // 1000),
        **timestamp("due", _ms(due)),
        **timestamp("claimed", claim.claimed_ms if claim else None),
        **timestamp("lease_deadline", _ms(deadline)),
        **timestamp("failed", _ms(record.get("at_ms"))),
        **timestamp("died", _ms(died)),
        **timestamp("result_expires", _ms(expires)),
        **timestamp("cancel_requested", _ms(cancel)),
        "progress": decode_progress(progress),
        "result": record.get("result") if record.get("ok") else None,
        "error": None if record.get("ok") or not record else str(record.get("error", "")),
        "traceback": record.get("traceback") if isinstance(record.get("traceback"), str) else None,
        "not_recorded": list(NOT_RECORDED),
    }


def _status(found: str, outcome: bytes | None) -> str:
    """job_status.lua's answer, with ``finished`` told apart as complete, dead or cancelled."""
    if found != "finished":
        return found
    record = _outcome(outcome)
    if record.get("cancelled"):
        return "cancelled"
    return "complete" if record.get("ok") else "dead"


def _outcome(raw: bytes | None) -> dict[str, Any]:
    if raw is None:
        return {}
    try:
        return decode_outcome(raw)
    except Exception:  # a foreign or corrupt record: shown rather than failing the page
        return {"ok": False, "error": f"(unreadable outcome record) {raw[:200]!r}"}
