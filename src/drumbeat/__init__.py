"""drumbeat: a Redis-backed priority job queue and scheduler that keeps a lot of work on time."""

from .app import App
from .batches import Batch, BatchStatus
from .config import Settings
from .context import Context, acheckpoint, checkpoint, current_job
from .errors import (
    BatchEnded,
    ConfigurationError,
    DrumbeatError,
    InvalidJob,
    JobCancelled,
    JobFailed,
    JobNotFound,
    LeaseLost,
    PayloadTooLarge,
    ResultTimeout,
    Retry,
    SerializationError,
    UnknownDependency,
    UnknownTask,
    WorkerCrashed,
)
from .job import Job, JobStatus
from .middleware import Enqueueing, Middleware
from .resources import Resource, aresource, resource
from .schedule import Cadence
from .schedules import Schedule, ScheduleInfo
from .server_checks import EvictionPolicyWarning
from .task import Bound, CallOptions, Options, Prepared, Task
from .task_ref import TaskRef
from .worker import JobEnd, JobInfo, Worker, run_worker
from .workflows import Dependency

__version__ = "0.1.0"

__all__ = [
    "App",
    "Batch",
    "BatchEnded",
    "BatchStatus",
    "Bound",
    "Cadence",
    "CallOptions",
    "ConfigurationError",
    "Context",
    "Dependency",
    "DrumbeatError",
    "Enqueueing",
    "EvictionPolicyWarning",
    "InvalidJob",
    "Job",
    "JobCancelled",
    "JobEnd",
    "JobFailed",
    "JobInfo",
    "JobNotFound",
    "JobStatus",
    "LeaseLost",
    "Middleware",
    "Options",
    "PayloadTooLarge",
    "Prepared",
    "Resource",
    "ResultTimeout",
    "Retry",
    "Schedule",
    "ScheduleInfo",
    "SerializationError",
    "Settings",
    "Task",
    "TaskRef",
    "UnknownDependency",
    "UnknownTask",
    "Worker",
    "WorkerCrashed",
    "acheckpoint",
    "aresource",
    "checkpoint",
    "current_job",
    "resource",
    "run_worker",
]
