"""The heartbeat: renews the worker's leases and registers it, from a thread of its own.

A task that hogs the event loop (or the GIL in bursts) cannot make its own lease lapse, since
renewal runs apart from task code, on its own connection. It owns nothing: it reads the claim
table (`ClaimTable.owned`) and hands lost claims back to the loop.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

import redis

from .claims import ClaimKey, ClaimTable

if TYPE_CHECKING:
    from drumbeat.scripts import Scripts

log = logging.getLogger("drumbeat.worker")


class Heartbeat:
    """``start()`` the thread; ``stop()`` ends it (within one Redis call)."""

    def __init__(
        self,
        *,
        worker_id: str,
        shards: list[Scripts],
        table: ClaimTable,
        client: Callable[[], redis.Redis],
        lease_ms: int,
        info: Callable[[], bytes],
        on_lost: Callable[[list[ClaimKey]], None],
        on_cancel: Callable[[str], None],
    ) -> None:
        self.worker_id = worker_id
        self.shards = shards
        self.table = table
        self._new_client = client
        self.lease_ms = lease_ms
        self.interval = lease_ms / 3000
        self._info = info
        self._on_lost = on_lost
        self._on_cancel = on_cancel
        self._stop = threading.Event()
        self.beat_once = threading.Event()
        """Set after the first beat, renewed or not (the worker registers before claiming)."""
        self._thread = threading.Thread(target=self._run, name="drumbeat-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        client = self._new_client()
        try:
            while True:
                try:
                    self.beat(client)
                except (redis.RedisError, OSError) as exc:
                    log.warning("lease renewal failed (%s: %s); retrying", type(exc).__name__, exc)
                except Exception:
                    # A bug here must not end the thread: every lease would lapse while the
                    # worker kept running its jobs.
                    log.exception("lease renewal crashed; retrying")
                self.beat_once.set()
                if self._stop.wait(self.interval):
                    return
        finally:
            client.close()

    def beat(self, client: redis.Redis) -> None:
        """One renewal: every shard with claims, and shard 0 always (it holds the worker's
        registration)."""
        owned = self.table.owned()
        info = self._info()
        for shard in sorted(owned.keys() | {0}):
            call = self.shards[shard].extend_leases(
                self.worker_id, self.lease_ms, info, owned[shard]
            )
            renewed = call.run(client)
            if renewed.lost:
                self._on_lost(renewed.lost)
            for job_id in renewed.cancelled:  # a cancel whose signal this worker missed
                self._on_cancel(job_id)
