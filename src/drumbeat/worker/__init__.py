"""One worker process, one concern per module:

- `process`: the `Worker` itself: starts, supervises and stops the parts below.
- `running`: each claimed job as a task, to its outcome; lost leases and cancels.
- `claiming`: the claim loop (shards, the idle wait, the time slots' lane after each claim).
- `claims`: the claims held, keyed by (job id, fencing token), and the running ones.
- `settling`: outcomes to Redis in batches, one table from outcome type to script.
- `leases`: the heartbeat thread that renews leases and registers the worker.
- `housekeeping`: reaping expired leases, results, dead letters and gone workers.
- `checkpoints`: what a task's checkpoints do: lend the slot, save progress, stop.
- `signals`: the shard's pub/sub channel: urgent work waiting, due times, cancels.
- `hooks`: the seams for code that runs at process and job start and end.
- `retrying`: which Redis errors are ridden out, and the backoff between tries.
- `link`, `waiter`: the hand-driven connections of the hot path.
"""

from .hooks import Hooks, JobEnd, JobInfo
from .main import run_worker
from .process import Worker

__all__ = ["Hooks", "JobEnd", "JobInfo", "Worker", "run_worker"]
