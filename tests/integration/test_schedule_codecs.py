"""A schedule's spec is written with the app's codec, and the time slots keep it as it was:
a msgpack spec is binary, not text, and its plain, limited and routed runs run, settle and run
again as a JSON one's do (the worker reads each entry as text, keeping the bytes that are not
UTF-8, and writes them back as they were)."""

from __future__ import annotations

from typing import Any

import pytest

import drumbeat
from drumbeat.testing import arun_until_idle


@pytest.mark.parametrize("codec", ["json", "msgpack"])
async def test_every_kind_of_schedule_runs_twice_with_each_codec(
    redis_url: str, namespace: str, codec: str
) -> None:
    app = drumbeat.App(redis_url, namespace=namespace, codec=codec)  # type: ignore[arg-type]
    try:
        await _run_each_kind_twice(app, codec)
    finally:
        await app.aclose()


async def _run_each_kind_twice(app: drumbeat.App, codec: str) -> None:
    runs: list[tuple[str, Any, Any]] = []

    @app.task(name="tick")
    async def tick(kind: str, word: Any, price: int = 0) -> None:
        runs.append((kind, word, price))

    @app.task(name="build", queue="builds")
    async def build(kind: str, word: Any, price: int = 0) -> None:
        runs.append((kind, word, price))

    # msgpack carries bytes (its spec then holds bytes that are not UTF-8); JSON does not.
    word: Any = b"\x93\xff raw" if codec == "msgpack" else "キーワード"
    await app.aschedule_many([
        drumbeat.Schedule("plain", "tick", every=3600, args=("plain", word), kwargs={"price": 1}),
        drumbeat.Schedule("limited", "tick", every=3600, args=("limited", word),
                          concurrency_limit=1),
        drumbeat.Schedule("routed", "build", every=3600, args=("routed", word)),
    ])  # fmt: skip
    queues = ["default", "builds"]
    for n in (1, 2):
        assert await app.arun_now("plain", "limited", "routed") == 3
        # A limited or routed run is a job for that one attempt: two runs each (its slot's
        # run hands it to its queue, then the job runs).
        assert await arun_until_idle(app, queues=queues, timeout=10) >= 3
        assert sorted(runs) == sorted(
            [("plain", word, 1), ("limited", word, 0), ("routed", word, 0)] * n
        )
        for sid in ("plain", "limited", "routed"):
            info = await app.aget_schedule(sid)
            assert info is not None, sid
            # Its settle wrote a record the next run and these reads decode.
            assert (info.runs, info.failures, info.args) == (n, 0, [sid, word]), info
            assert info.next_due_ms is not None
