"""bench.slots_probe's scripts do the work whose cost it reports: every due entry claimed once
into the worker's in-flight hash, and settled with its next entry in its next slot."""

from __future__ import annotations

import pytest
import redis
from bench.redis_cpu import _register
from bench.slots_probe import INFLIGHT, SLOTS, WHERE, one_round, prepare, scripts, slot_key

from tests.conftest import RedisServer

# The probe copies what an app wrote into the wheel (the time slots are not its input).
pytestmark = pytest.mark.usefixtures("wheel_store")


def test_the_probe_claims_each_due_entry_once_and_settles_it_into_its_next_slot(
    own_redis: RedisServer, own_r: redis.Redis
) -> None:
    app = _register(own_redis.url, 300)
    try:
        probe = scripts(own_r)
        slots, _entries = prepare(own_r, 300, 120, 20)
        assert len(slots) == 6
        assert own_r.hlen(WHERE) == 300
        for _ in range(2):
            old = slots
            slots, _claim_ir, _settle_ir = one_round(own_r, probe, slots, 20, 120, cg=None)
            assert len(slots) == 6
            assert not set(slots) & set(old)
            assert not any(own_r.exists(slot_key(s)) for s in old)  # every entry claimed
            assert own_r.hlen(INFLIGHT) == 0  # and settled
        entries = [e for s in slots for e in own_r.lrange(slot_key(s), 0, -1)]
        assert len(entries) == 120
        assert {e.split(b"|")[0] for e in entries} == {f"s{i}".encode() for i in range(120)}
        # Settled twice: the runs counter (the record's fourth field) is 2.
        assert {e.split(b"|")[4] for e in entries} == {b"2"}
        assert own_r.hget(WHERE, "s7") == str(slots[0]).encode()
        assert own_r.zcard(SLOTS) == 6 + 180 // 20  # the due slots and the later ones
    finally:
        app.close()
