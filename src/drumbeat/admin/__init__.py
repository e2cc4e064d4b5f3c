"""Read-only inspection of one App (its queues, running jobs, workers and schedules), and the
dead-letter admin (retry, purge): what `drumbeat status`, the dashboard, the metrics and the
autoscaler read.

Everything here is synchronous and reads the time from Redis (``TIME``), never the local
clock, so ages are right however far this machine's clock drifts from the workers'.
"""

from drumbeat.protocol import PRIORITY_SPAN

from .batches import BatchInfo, batch_callbacks, batch_info, list_batches
from .dead_letters import (
    DeadLetter,
    Revived,
    dead_count,
    dead_letters,
    purge_dead,
    retry_dead,
)
from .queues import (
    WORKER_TTL_LEASES,
    QueueCounts,
    QueueStats,
    RunningJob,
    WorkerStats,
    level_range,
    queue_stats,
    ready_by_queue,
    running_jobs,
)
from .schedules import Lateness, ScheduleStats, lateness_summary, schedule_stats

__all__ = [
    "PRIORITY_SPAN",
    "WORKER_TTL_LEASES",
    "BatchInfo",
    "DeadLetter",
    "Lateness",
    "QueueCounts",
    "QueueStats",
    "Revived",
    "RunningJob",
    "ScheduleStats",
    "WorkerStats",
    "batch_callbacks",
    "batch_info",
    "dead_count",
    "dead_letters",
    "lateness_summary",
    "level_range",
    "list_batches",
    "purge_dead",
    "queue_stats",
    "ready_by_queue",
    "retry_dead",
    "running_jobs",
    "schedule_stats",
]
