"""bench.cluster_jobs' pure parts: the enqueue calls that spread jobs evenly over the job shards,
and the namespace whose job shards land evenly on the masters (a fake slot -> master map)."""

from __future__ import annotations

import pytest
from bench._cluster import even_namespace
from bench.cluster_jobs import batch_sizes, job_namespace
from redis.crc import key_slot

from drumbeat.keys import Keys


@pytest.mark.parametrize(
    ("jobs", "shards", "calls"), [(20_000, 6, 42), (500, 2, 2), (1001, 2, 4), (7, 3, 3), (9, 1, 1)]
)
def test_batch_sizes_are_a_multiple_of_the_shards_and_as_equal_as_can_be(
    jobs: int, shards: int, calls: int
) -> None:
    sizes = batch_sizes(jobs, shards, 500)
    assert sum(sizes) == jobs, f"{sizes} does not add up to {jobs} jobs"
    assert len(sizes) == calls, f"expected {calls} calls of at most 500 jobs, got {sizes}"
    assert len(sizes) % shards == 0, f"{len(sizes)} calls do not go round {shards} shards evenly"
    assert max(sizes) - min(sizes) <= 1 and max(sizes) <= 500, sizes


def test_batch_sizes_refuses_what_it_cannot_split() -> None:
    with pytest.raises(ValueError, match="at least as many jobs as shards, got 2 jobs, 4 shards"):
        batch_sizes(2, 4, 500)


def _slot_ranges(masters: int) -> dict[int, int]:
    """A fake cluster map: slot -> master, M equal ranges in reverse order (not SmallCluster's)."""
    return {slot: masters - 1 - slot * masters // 16384 for slot in range(16384)}


@pytest.mark.parametrize(("masters", "per_master"), [(1, 2), (2, 2), (3, 2), (3, 4)])
def test_the_namespace_puts_as_many_job_shards_on_every_master(
    masters: int, per_master: int
) -> None:
    slots = _slot_ranges(masters)

    def master_of(key: str) -> int:
        return slots[key_slot(key.encode())]

    shards = masters * per_master
    ns = job_namespace(master_of, masters, shards)
    on = [master_of(Keys.job_keys(ns, k).ready) for k in range(shards)]
    assert sorted(on) == sorted(list(range(masters)) * per_master), (
        f"namespace {ns!r} puts its {shards} job shards on masters {on}; expected {per_master} "
        "on each"
    )
    assert job_namespace(master_of, masters, shards) == ns, "the search must be stable"


def test_even_namespace_says_when_no_name_spreads_the_shards() -> None:
    with pytest.raises(RuntimeError, match="spreads 4 shards evenly over 2 masters"):
        even_namespace(lambda key: 0, 2, 4, lambda ns, k: f"{ns}:{k}", tries=50)
    with pytest.raises(ValueError, match="5 shards cannot land evenly on 2 masters"):
        even_namespace(lambda key: 0, 2, 5, lambda ns, k: f"{ns}:{k}")
