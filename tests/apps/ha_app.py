"""An app for the Sentinel and TLS process tests: its URL (``redis+sentinel://`` or
``rediss://``) and namespace come from ``DRUMBEAT_REDIS_URL`` and ``DRUMBEAT_NAMESPACE``."""

from __future__ import annotations

import os

import drumbeat

app = drumbeat.App()


@app.task(name="pid")
def pid() -> int:
    return os.getpid()
