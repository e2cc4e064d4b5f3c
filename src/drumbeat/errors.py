"""Every exception drumbeat raises, under one root.

::

    DrumbeatError
    ├── ConfigurationError        settings, URLs, the embedded Redis, the server's own config
    ├── InvalidJob (ValueError)   an enqueue that would write something wrong: bad priority,
    │   │                         negative delay, a name that breaks the key schema, ...
    │   ├── SerializationError    arguments or a result that the codec cannot encode
    │   ├── PayloadTooLarge       an encoded payload over `Settings.max_payload_bytes`
    │   ├── UnknownDependency (LookupError) a ``depends_on`` job that is unknown, or ended
    │   │                         with its outcome not kept or expired
    │   └── BatchEnded            `Batch.add` to a batch that ended, was cancelled, or is
    │                             unknown
    ├── UnknownTask (LookupError) a task name no registered task answers to
    ├── LeaseLost                 this worker's lease on a job was taken over (fencing)
    ├── WorkerCrashed             a part of a worker kept failing; the worker stopped
    ├── JobFailed                 `Job.result()` of a job that ended in the dead-letter set
    ├── JobCancelled              `Job.result()` of a job stopped by `Job.cancel()`
    ├── JobNotFound (LookupError) no such job, or its record has expired
    ├── ResultTimeout (TimeoutError) `Job.result(timeout=...)` ran out of time
    └── NotIdle (TimeoutError)    `drumbeat.testing.run_until_idle` timed out with work pending

Control flow stays apart from errors: `Retry` asks for another attempt and is not a failure
report, so it derives from `Exception` but not from `DrumbeatError`. It is honoured even with
the default ``retries=0``, up to its own bound (see `Retry`).
"""

from __future__ import annotations


class DrumbeatError(Exception):
    """Root of drumbeat's exceptions."""


class ConfigurationError(DrumbeatError):
    """A setting, URL or server configuration that drumbeat cannot work with."""


class InvalidJob(DrumbeatError, ValueError):
    """An enqueue or option that would write something wrong; nothing was written."""


class SerializationError(InvalidJob):
    """A value the payload codec cannot encode or decode."""


class PayloadTooLarge(InvalidJob):
    """An encoded payload larger than the configured limit."""


class UnknownDependency(InvalidJob, LookupError):
    """A dependency that is no job: unknown, or ended with its outcome not kept or expired."""


class BatchEnded(InvalidJob):
    """`Batch.add` to a batch that ended, was cancelled, or is unknown; nothing was added."""


class UnknownTask(DrumbeatError, LookupError):
    """No task is registered under this name."""


class LeaseLost(DrumbeatError):
    """The job's lease was taken over, so this worker may no longer ack, retry or renew it."""


class WorkerCrashed(DrumbeatError):
    """A part of the worker (claim loop, flusher, housekeeping) kept crashing, so the worker
    stopped rather than run on without it; the process should exit non-zero and be replaced."""


class JobFailed(DrumbeatError):
    """The job exhausted its attempts and went to the dead-letter set."""

    def __init__(self, job_id: str, error: str, traceback: str | None = None) -> None:
        super().__init__(f"job {job_id} failed: {error}")
        self.job_id = job_id
        self.error = error
        self.traceback = traceback


class JobCancelled(DrumbeatError):
    """The job was cancelled (`Job.cancel`) before it ran or at a checkpoint while it ran."""


class JobNotFound(DrumbeatError, LookupError):
    """No job with this id exists (or its record expired)."""


class ResultTimeout(DrumbeatError, TimeoutError):
    """The job did not finish within the time `Job.result` was given."""


class NotIdle(DrumbeatError, TimeoutError):
    """`drumbeat.testing.run_until_idle` ran out of time with work still pending; the message
    says what (ready, running, delayed or retrying, parked)."""


_MAX_DELAY = 10 * 365 * 24 * 3600.0


class Retry(Exception):  # a request for another attempt, not an error report
    """Raise from a task to run it again after ``delay`` seconds (default: the task's backoff).

    An explicit request is honoured even on a task with the default ``retries=0`` (a task that
    raises `Retry` means to run again), bounded so that it cannot loop forever: the job is
    retried at most ``max_retries`` times in all, counting the retries that ordinary exceptions
    used (those still follow the task's ``retries``). ``max_retries`` defaults to the task's
    ``retries``, but at least `DEFAULT_MAX_RETRIES` (3, as Celery's ``self.retry()``). A request
    past the bound sends the job to the dead-letter set with the error "retry requested but the
    task's retries (N) are used up", never silently. In a schedule's run, `Retry` counts as a
    failed run; the schedule goes on at its next slot.

    Args:
        delay: seconds before the next attempt; None takes the task's backoff.
        max_retries: this request's own bound on the job's retries (0: dead-letter now).
    """

    DEFAULT_MAX_RETRIES = 3

    def __init__(self, delay: float | None = None, *, max_retries: int | None = None) -> None:
        if max_retries is not None and (
            isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0
        ):
            raise ValueError(f"Retry: max_retries must be an int >= 0 or None, got {max_retries!r}")
        if delay is not None and not (isinstance(delay, int | float) and 0 <= delay < _MAX_DELAY):
            raise ValueError(
                f"Retry: delay must be a number of seconds >= 0 and < {_MAX_DELAY:.0f} "
                f"(ten years), or None for the task's backoff; got {delay!r}"
            )
        super().__init__(f"retry requested (delay={delay})")
        self.delay = delay
        self.max_retries = max_retries

    def limit(self, task_retries: int) -> int:
        """How many retries this request allows the job in all, for a task with ``retries``."""
        if self.max_retries is not None:
            return self.max_retries
        return max(task_retries, self.DEFAULT_MAX_RETRIES)


class Interrupted(BaseException):  # control flow: a task's `except Exception` must not stop it
    """Raised inside a task at a checkpoint to stop it: the job was cancelled (``reason``
    "cancelled"; it is never retried) or the worker is shutting down ("handback"; the job goes
    back to the queue with its progress). Let it propagate; ``finally`` blocks still run."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"job interrupted at a checkpoint: {reason}")
        self.reason = reason
