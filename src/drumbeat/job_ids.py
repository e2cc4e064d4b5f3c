"""Job ids, which name their job shard: a job of job shard k > 0 has the id
``<32 hex digits>.<k>``, one of the main shard the 32 hex digits alone, so a `Job` call finds its
shard (`keys.Keys.job_keys`) from the id, with no lookup.
"""

from __future__ import annotations

import os
import re

__all__ = ["job_shard_of", "new_job_id"]

_SHARDED_JOB_ID = re.compile(r"[0-9a-f]{32}\.([1-9][0-9]*)")


def new_job_id(shard: int = 0) -> str:
    """A fresh job id that names job shard ``shard``."""
    hexed = os.urandom(16).hex()
    return hexed if shard == 0 else f"{hexed}.{shard}"


def job_shard_of(job_id: str) -> int:
    """The job shard a job id names (0, the main shard, for any id not made by `new_job_id`
    for another one: a schedule's run is found through its schedule)."""
    m = _SHARDED_JOB_ID.fullmatch(job_id)
    return int(m[1]) if m else 0
