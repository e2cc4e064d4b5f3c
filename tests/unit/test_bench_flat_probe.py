"""bench.flat_probe's scripts do the work whose cost it reports: every due run claimed once,
with its record's task and arguments, and settled with its next run written back."""

from __future__ import annotations

import pytest
import redis
from bench.flat_probe import one_round, prepare
from bench.redis_cpu import _register

from tests.conftest import RedisServer
from tests.helpers import leased

# The probe copies what an app wrote into the wheel (the time slots are not its input).
pytestmark = pytest.mark.usefixtures("wheel_store")


def test_the_probe_claims_each_due_run_once_and_settles_it_for_its_next_run(
    own_redis: RedisServer, own_r: redis.Redis
) -> None:
    app = _register(own_redis.url, 300)
    try:
        scripts, keys = prepare(own_r, 300, 120)
        sched, records = keys[0][0], keys[0][1]
        assert own_r.zcard(sched) == own_r.hlen(records) == 300
        for _ in range(2):
            runs, _claim_ir, _settle_ir = one_round(own_r, scripts, keys, 120, None)
            assert runs == 120
        # Settled: the runs' next times are back in the zset, their counters counted twice.
        assert own_r.zcard(sched) == 300
        leases = keys[1][1]
        assert leased(own_r, leases) == 0
        record = own_r.hget(records, "s7")
        assert record is not None
        assert record.split(b"|")[3] == b"2"  # runs
        assert own_r.hget(records, "s200").split(b"|")[3] == b"0"  # not due: never ran
    finally:
        app.close()
