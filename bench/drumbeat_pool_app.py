"""The drumbeat app of the benchmark's tasks for ``drumbeat worker bench.drumbeat_pool_app:app
--processes N`` (the drain with several processes): the supervisor and each worker process
import it, with the Redis URL and namespace in ``DRUMBEAT_REDIS_URL`` and
``DRUMBEAT_NAMESPACE`` (set by `bench.drumbeat_system` before it runs the command)."""

from __future__ import annotations

import drumbeat

from .drumbeat_system import register

app = drumbeat.App()
register(app)
