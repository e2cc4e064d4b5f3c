"""Batches without Redis: every key a batch script is given is of the batch's job shard, and a
batch's status reads as a mapping of its counts."""

from __future__ import annotations

import pytest

import drumbeat
from drumbeat.batch_send import _plan
from drumbeat.batches import Batch, BatchStatus
from drumbeat.job_ids import job_shard_of


@pytest.mark.parametrize("job_shards", [1, 3])
def test_every_key_a_batch_script_is_given_is_of_its_shard(job_shards: int) -> None:
    app = drumbeat.App("redis://127.0.0.1:1/0", namespace="ns", job_shards=job_shards)

    @app.task(queue="builds")
    def build(i: int) -> None: ...

    @app.task
    def publish() -> None: ...

    for batch_id in ["a" * 32, "b" * 32 + ".2"][:job_shards]:
        keys, _ = app.job_shard(batch_id)
        members = [build.prepare(i) for i in range(3)]
        calls, _, opening, held = _plan(
            app, batch_id, members, [("c", publish.prepare())], None, add=False
        )
        batch = Batch(app, batch_id)
        for call in [
            *calls,
            opening,
            batch._control("close_batch"),
            batch._control("cancel_batch"),
        ]:
            assert all(k.startswith(f"drumbeat:{keys.tag}:") for k in call.keys), call.name
        assert {keys.members, keys.batches, keys.batchttl, keys.batchdone} <= set(opening.keys)
        assert {keys.ready_of("builds"), keys.due_of("builds")} <= set(opening.keys)
        ids = [a for c in calls for a in c.args if isinstance(a, str) and len(a) >= 32]
        assert {job_shard_of(i) for i in [*ids, *held]} == {job_shard_of(batch_id)}


def test_a_status_is_a_mapping_of_its_counts() -> None:
    status = BatchStatus("x", 5, 1, 2, 1, 1, "closed", ended=False)
    assert dict(status) == {"total": 5, "pending": 1, "succeeded": 2, "failed": 1, "cancelled": 1}
    assert status["failed"] == status.failed == 1
    with pytest.raises(KeyError):
        status["state"]
