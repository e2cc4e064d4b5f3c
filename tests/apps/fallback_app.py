"""An app given no Redis URL, for the tests of the embedded fallback (test_which_redis.py): it
uses ``DRUMBEAT_REDIS_URL`` when set and the embedded Redis of ``DRUMBEAT_HOME`` otherwise."""

from __future__ import annotations

import os

import drumbeat

app = drumbeat.App(namespace=os.environ.get("DRUMBEAT_TEST_NAMESPACE", "fallback"))


@app.task(name="add")
def add(a: int, b: int = 0) -> int:
    return a + b
