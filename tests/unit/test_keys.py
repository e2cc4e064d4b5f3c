"""The key schema: keys.py and docs/redis-keys.md agree, and a shard's keys share one slot."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from drumbeat.keys import (
    BUCKET_KEYS,
    JOB_KEYS,
    LIMIT_KEYS,
    QUEUE_KEYS,
    SHARD_KEYS,
    SLOT_KEYS,
    WHEEL_BUCKETS,
    Keys,
    check_name,
)

DOC = Path(__file__).resolve().parents[2] / "docs" / "redis-keys.md"


# The parameter part of the per-item keys' names in the table (`done:<job id>`, `wheel:<bucket>`).
_SUFFIXES = ":<job id>|:<bucket>|:<limiter key>|:<ms>|:<incarnation>(?::<n>:<ms>)?"


def _doc_rows() -> dict[str, str]:
    rows = {}
    for line in DOC.read_text().splitlines():
        m = re.match(rf"\| `([a-z]+)(?:{_SUFFIXES})?` \| (\w+) \|", line)
        if m:
            rows[m.group(1)] = m.group(2)
    return rows


def test_doc_table_matches_keys_module() -> None:
    assert _doc_rows() == {**SHARD_KEYS, **JOB_KEYS, **BUCKET_KEYS, **LIMIT_KEYS, **SLOT_KEYS}


def _crc16(data: bytes) -> int:
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


def _slot(key: str) -> int:
    start = key.find("{")
    end = key.find("}", start + 1)
    if start != -1 and end > start + 1:
        key = key[start + 1 : end]
    return _crc16(key.encode()) % 16384


@pytest.mark.parametrize("shard", [None, 0, 7])
def test_all_keys_of_a_shard_hash_to_one_slot(shard: int | None) -> None:
    keys = Keys("orders", shard)
    names = [keys.key(n) for n in SHARD_KEYS] + [keys.done("abc123")]
    names += [keys.bucket_key(n, b) for n in BUCKET_KEYS for b in (0, WHEEL_BUCKETS - 1)]
    names += [keys.queue_key(n, q) for n in QUEUE_KEYS for q in ("default", "builds", "a:b")]
    names += [keys.limit_key(n, k) for n in LIMIT_KEYS for k in ("t:app.place=7", "n:mercari")]
    names += [keys.slot(1764841234567), keys.inflight("host.12.ab3f")]
    names += [keys.claimed("host.12.ab3f", "9:1764841234567")]
    assert len({_slot(k) for k in names}) == 1
    assert all(k.startswith(f"drumbeat:{keys.tag}:") for k in names)


def test_shards_have_distinct_tags() -> None:
    assert Keys("orders", 1).tag != Keys("orders", 2).tag != Keys("orders").tag


def test_crc16_matches_redis_reference_vector() -> None:
    # From the Redis Cluster spec: CRC16 of "123456789" is 0x31C3.
    assert _crc16(b"123456789") == 0x31C3


@pytest.mark.parametrize("bad", ["", "a b", "a{b", "a}b", "a|b", "-lead", "x" * 201, "tab\t"])
def test_names_that_break_the_schema_are_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        check_name(bad, "namespace")


def test_task_names_may_hold_locals() -> None:
    assert check_name("mod.f.<locals>.g", "task name")
    with pytest.raises(ValueError):
        check_name("mod.f.<locals>.g", "namespace")


def test_the_default_queue_keeps_the_keys_it_had() -> None:
    keys = Keys("orders")
    assert [keys.ready_of("default"), keys.due_of("default"), keys.wake_of("default")] == [
        keys.ready,
        keys.due,
        keys.wake,
    ]
    assert keys.ready_of("builds") == "drumbeat:{orders}:ready:builds"


def test_a_job_id_names_its_job_shard() -> None:
    from drumbeat.job_ids import job_shard_of, new_job_id
    from drumbeat.keys import Keys

    assert job_shard_of(new_job_id()) == 0 and "." not in new_job_id()
    assert [job_shard_of(new_job_id(k)) for k in (1, 2, 17)] == [1, 2, 17]
    # Not ids of a job shard: a schedule's run (its schedule id may hold a dot), a foreign id.
    for other in ("s:monitor.1", "abc.1", f"{'0' * 32}.0", f"{'0' * 32}.x", f"{'A' * 32}.1"):
        assert job_shard_of(other) == 0, other
    assert Keys.job_keys("ns", 0) == Keys("ns")
    assert Keys.job_keys("ns", 2).ready == "drumbeat:{ns:j2}:ready"


def test_a_schedules_bucket_is_fixed_for_the_life_of_a_namespace() -> None:
    """Schedules are found by their bucket: a change of the hash would lose every stored one."""
    from drumbeat.keys import bucket_of

    assert [bucket_of(i) for i in ("monitor:1", "s0", "", "é")] == [4522, 10916, 5759, 14233]
