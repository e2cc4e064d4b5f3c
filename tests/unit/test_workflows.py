"""Workflows without Redis: what ``depends_on`` normalizes to, and the keys the workflow
scripts are given (all of one shard: Cluster-safe)."""

from __future__ import annotations

import pytest

from drumbeat import Dependency, InvalidJob
from drumbeat.keys import Keys
from drumbeat.scripts import Scripts
from drumbeat.workflows import dependencies


def test_depends_on_normalizes_to_ids_each_once_with_whether_it_may_fail() -> None:
    assert dependencies(None) == ()
    assert dependencies("a") == (("a", False),)
    assert dependencies(["a", Dependency(["b", "c"], allow_failure=True), "b"]) == (
        ("a", False),
        ("b", True),  # named plainly too: a Dependency that allows its failure wins
        ("c", True),
    )
    assert dependencies(Dependency("a")) == (("a", False),)
    with pytest.raises(InvalidJob, match="schedule's run"):
        dependencies(["s:nightly"])
    with pytest.raises(InvalidJob, match="Job handles or ids"):
        dependencies([42])  # type: ignore[list-item]


@pytest.mark.parametrize("shard", [None, "j3"])
def test_every_key_a_workflow_script_is_given_is_of_one_shard(shard: str | None) -> None:
    k = Keys("ns", shard)
    s = Scripts(k)
    s.release_into = ("builds",)
    calls = [
        s.enqueue_after(["id", b"{}", 0, "", 1, "0dep"], "publish"),
        s.complete([("id", 1, b"{}", 1000, "")], ["q2"], cancelled=True),
        s.bury([("id", 1, b"{}", 1000)], ["q2"]),
        s.cancel("id", 1000, ["q2"]),
        s.reap(
            max_stalls=3, limit=10, dead_ttl_ms=1, worker_ttl_ms=1, result_ttl_ms=1, queues=["q2"]
        ),
        s.job_status("id", 0, ["q2"]),
    ]
    for call in calls:
        assert all(key.startswith(f"drumbeat:{k.tag}:") for key in call.keys), call.name
    assert {k.deps, k.dependents, k.edges, k.freed} <= set(calls[1].keys)
    assert {k.ready_of(q) for q in ("default", "q2", "builds")} <= set(calls[1].keys)
