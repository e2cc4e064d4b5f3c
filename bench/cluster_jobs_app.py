"""The drumbeat app of `bench.cluster_jobs` for ``drumbeat worker bench.cluster_jobs_app:app
--processes N``: one no-op task. The URL, the namespace and the job shards come from
``DRUMBEAT_REDIS_URL``, ``DRUMBEAT_NAMESPACE`` and ``DRUMBEAT_JOB_SHARDS`` (set by the bench)."""

from __future__ import annotations

import drumbeat

TASK = "bench.cluster_jobs.noop"

app = drumbeat.App()


@app.task(name=TASK)
async def noop(i: int) -> None:
    """Nothing: what is measured is what Redis does per job."""
