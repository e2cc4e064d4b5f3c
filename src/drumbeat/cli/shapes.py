"""The JSON that ``--json`` prints, one function per shape (documented in ``docs/cli.md``).

Plain objects with snake_case keys; a key is never left out (``null`` when unknown). A point
in time is given twice: ``<name>_ms``, epoch milliseconds by the Redis server's clock, and
``<name>_at``, the same instant as an ISO 8601 UTC string (``2026-12-01T08:30:00.123Z``).
Durations are milliseconds in keys ending ``_ms`` that have no ``_at`` twin.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from typing import Any

import typer

from drumbeat import admin
from drumbeat.scale_signal import Signal
from drumbeat.schedules import ScheduleInfo

__all__ = [
    "autoscale_json",
    "dead_letters_json",
    "emit",
    "json_option",
    "queues_json",
    "schedule_json",
    "status_json",
    "supervisors_json",
    "timestamp",
]


def json_option(shape: str) -> Any:
    """A ``--json`` flag whose help gives the shape printed (docs/cli.md has every field)."""
    return typer.Option(
        "--json",
        help=f"Print JSON for scripts instead of tables: {shape}. Times are given as epoch ms "
        "(*_ms) and as ISO 8601 UTC (*_at); see docs/cli.md.",
    )


def emit(value: dict[str, Any]) -> None:
    """Print ``value`` as indented JSON on stdout; values JSON cannot hold print as repr."""
    typer.echo(json.dumps(value, indent=2, ensure_ascii=False, default=repr))


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def timestamp(name: str, ms: int | None) -> dict[str, Any]:
    """``{name_ms: ms, name_at: iso}``, both ``None`` when ``ms`` is."""
    return {f"{name}_ms": ms, f"{name}_at": None if ms is None else iso(ms)}


def dead_letters_json(letters: list[admin.DeadLetter], total: int) -> dict[str, Any]:
    return {
        "total": total,
        "dead_letters": [
            {
                "id": d.id,
                "task": d.task,
                **timestamp("died", d.died_ms),
                "attempt": d.attempt,
                "error": d.error,
                "traceback": d.traceback,
                "progress": d.progress,
            }
            for d in letters
        ],
    }


def batch_json(info: admin.BatchInfo, *, failed: bool) -> dict[str, Any]:
    """``drumbeat batches ls --json``'s shape of one batch; with ``failed``, ``batches show``'s
    (its failed members' ids too)."""
    status = info.status
    out: dict[str, Any] = {"id": info.id, "state": status.state, "ended": status.ended}
    out.update(dict(status))
    for name, ms in (("made", info.made_ms), ("ended", info.ended_ms)):
        out[f"{name}_ms"] = ms
        out[f"{name}_at"] = None if ms is None else iso(ms)
    out["on_complete"], out["on_success"] = info.on_complete, info.on_success
    if failed:
        out["failed_ids"] = list(info.failed_ids)
    return out


def schedule_json(info: ScheduleInfo, state: str) -> dict[str, Any]:
    c = info.cadence
    return {
        "id": info.id,
        "task": info.task,
        "args": info.args,
        "kwargs": info.kwargs,
        "cadence": {
            "every": c.every,
            "cron": c.cron,
            "tz": c.tz,
            "mode": c.mode,
            "grace": c.grace,
            "jitter": c.jitter,
        },
        "priority": info.priority,
        "queue": info.queue,
        "state": state,
        **timestamp("next_due", info.next_due_ms),
        **timestamp("last_run", info.last_run_ms),
        "last_duration_ms": info.last_duration_ms,
        "last_lateness_ms": info.last_lateness_ms,
        "runs": info.runs,
        "failures": info.failures,
        "misfires": info.misfires,
        "last_error": info.last_error,
        "generation": info.generation,
    }


def autoscale_json(signal: Signal, concurrency: int) -> dict[str, Any]:
    """The desired capacity and its inputs, for an external autoscaler (KEDA): the slots that
    would start everything waiting now, and the processes of ``concurrency`` slots that makes."""
    needed = signal.running + signal.backlog
    sups = signal.supervisors
    return {
        "ready": signal.ready,
        "ready_by_priority": list(signal.ready_by_priority),
        "due_unclaimed": signal.due_now,
        "schedule_runs_due": signal.due_runs,
        "schedule_lag_ms": signal.lag_ms,
        "waiting_for_slots": signal.waiting_for_slots,
        "paused": signal.paused,
        "lateness_p99_ms": signal.lateness_p99_ms,
        "running": signal.running,
        "slots": signal.slots,
        "workers": signal.workers,
        "slots_needed": needed,
        "concurrency": concurrency,
        "processes_needed": math.ceil(needed / concurrency),
        "supervised_live": sum(s.live for s in sups),
        "supervised_desired": sum(s.desired for s in sups),
        "supervised_max": sum(s.maximum for s in sups),
    }


def supervisors_json(signal: Signal) -> list[dict[str, Any]]:
    return [
        {
            "id": s.id,
            "host": s.host,
            "pid": s.pid,
            "live": s.live,
            "desired": s.desired,
            "min": s.minimum,
            "max": s.maximum,
            "concurrency": s.concurrency,
            "slots": s.slots,
            "needed": s.needed,
            "reason": s.reason,
            **timestamp("reason", s.reason_ms),
            **timestamp("started", s.started_ms),
            **timestamp("heartbeat", s.heartbeat_ms),
        }
        for s in signal.supervisors
    ]


def queues_json(stats: admin.QueueStats) -> list[dict[str, Any]]:
    """Per queue (``drumbeat status`` and ``drumbeat queues ls``): its counts, and whether it
    is paused."""
    return [
        {
            "name": queue.name,
            "ready": queue.ready,
            "ready_by_priority": list(queue.ready_by_priority),
            "delayed": queue.delayed,
            "parked": queue.parked,
            "paused": queue.paused,
        }
        for queue in stats.queues
    ]


def status_json(
    namespace: str,
    stats: admin.QueueStats,
    schedules: admin.ScheduleStats,
    signal: Signal | None = None,
    concurrency: int = 1,
) -> dict[str, Any]:
    late = schedules.lateness
    scaling: dict[str, Any] = {}
    if signal is not None:
        scaling = {
            "supervisors": supervisors_json(signal),
            "autoscale": autoscale_json(signal, concurrency),
        }
    return {
        "namespace": namespace,
        **timestamp("now", stats.now_ms),
        "queue": {
            "ready": stats.ready,
            "ready_by_priority": list(stats.ready_by_priority),
            "delayed": stats.delayed,
            "parked": stats.parked,
            "waiting": stats.waiting,
            "running": stats.running_total,
            "dead": stats.dead,
        },
        "queues": queues_json(stats),
        "running": [
            {
                "id": job.id,
                "worker": job.worker,
                **timestamp("claimed", job.claimed_ms),
                **timestamp("lease_deadline", job.deadline_ms),
                "progress": job.progress,
            }
            for job in stats.running
        ],
        "workers": [
            {
                "id": w.id,
                "host": w.host,
                "pid": w.pid,
                "concurrency": w.concurrency,
                "running": w.running,
                "processed": w.processed,
                **timestamp("started", w.started_ms),
                **timestamp("heartbeat", w.heartbeat_ms),
            }
            for w in stats.workers
        ],
        "silent_workers": stats.stale_workers,
        "schedules": {
            "total": schedules.total,
            "shards": schedules.shards,
            "runs_last_minute": late.runs,
            "lateness_p50_ms": late.p50_ms,
            "lateness_p99_ms": late.p99_ms,
            "lateness_max_ms": late.max_ms,
        },
        **scaling,
    }
