"""The heartbeat: renews the worker's leases and registers it, from a thread of its own.

A task that hogs the event loop (or the GIL in bursts) cannot make its own lease lapse, since
renewal runs apart from task code, on its own connection. But a loop blocked for good (hung)
must not keep its jobs for ever: once the loop has been silent `Settings.hang_timeout`
(`Liveness`), renewal stops, so the leases lapse and other workers take the jobs over; it
resumes if the loop runs again. It owns nothing: it reads the claim table
(`ClaimTable.owned`) and hands lost claims back to the loop.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

import redis

from .claims import ClaimKey, ClaimTable
from .retrying import REDIS_FAILURES, Backoff

if TYPE_CHECKING:
    from drumbeat.scripts import Scripts

    from .liveness import Liveness

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
        liveness: Liveness | None = None,
        hang_timeout: float = float("inf"),
        renew: Callable[[redis.Redis], None] | None = None,
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
        self._liveness = liveness
        self.hang_timeout = hang_timeout
        self._renew = renew
        """Renews what has no lease per claim (the time slots' runs: `SlotLane.renew`)."""
        self._silent = 0  # how far into a silence of the loop it has logged (0, 1 or 2)
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
        # A failed renewal is tried again at the next beat, except while a slot migrates: then
        # every 0.1 s, so the leases are renewed as soon as it ends, before housekeeping, which
        # holds their expiry back for a beat after a migration, takes the jobs over.
        backoff = Backoff(first=self.interval, most=self.interval)
        try:
            while True:
                pause = self.interval
                try:
                    if self._loop_alive():
                        self.beat(client)
                    backoff.reset()
                except REDIS_FAILURES as exc:
                    pause = backoff.failed(log, "lease renewal", exc)
                except Exception:
                    # A bug here must not end the thread: every lease would lapse while the
                    # worker kept running its jobs.
                    log.exception("lease renewal crashed; retrying")
                self.beat_once.set()
                if self._stop.wait(pause):
                    return
        finally:
            client.close()

    def _loop_alive(self) -> bool:
        """False once the worker's loop has been silent `hang_timeout` (it is hung: its jobs
        must come back). Logs where the loop is stuck at half that, in case it is killed."""
        if self._liveness is None:
            return True
        silent = self._liveness.silent_for()
        if silent <= self.hang_timeout / 2:
            if self._silent:
                log.warning("the event loop runs again after %.1f s; renewing leases", silent)
            self._silent = 0
            return True
        if self._silent == 0:
            self._silent = 1
            log.warning("the event loop has not run for %.1f s (a task blocking it: time.sleep "
                        "or CPU-bound code in an async def?); it is at:\n%s", silent,
                        self._liveness.where())  # fmt: skip
        if silent <= self.hang_timeout:
            return True
        if self._silent == 1:
            self._silent = 2
            log.error("the event loop has not run for %.1f s (hang_timeout %g s): this worker "
                      "is hung; its %d leases are no longer renewed, so their jobs go to other "
                      "workers", silent, self.hang_timeout, len(self.table))  # fmt: skip
        return False

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
        if self._renew is not None:
            self._renew(client)
