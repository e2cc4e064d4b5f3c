"""One worker process: an asyncio loop with N slots that claims jobs in batches, runs them, and
settles their outcomes in batches; a heartbeat thread renews its leases apart from task code."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import re
import signal
import socket
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import redis
import redis.asyncio as aredis

from .app import check_server
from .keys import Keys, bucket_of
from .link import Link
from .runner import Again, Bury, Done, Outcome, RunDone, Runner
from .schedule import RUN_PREFIX, parse_record
from .scripts import Call, Claimed, ClaimResult, Reaped, Scripts
from .waiter import Waiter

if TYPE_CHECKING:
    from .app import App

log = logging.getLogger("drumbeat.worker")

# Errors talking to Redis that a worker rides out (it retries after a pause) rather than dies of.
_TRANSIENT = (redis.ConnectionError, redis.TimeoutError, OSError)


def _worker_id() -> str:
    host = re.sub(r"[^A-Za-z0-9_.:@/+=-]", "-", socket.gethostname()) or "host"
    return f"{host}.{os.getpid()}.{uuid.uuid4().hex[:6]}"


class Worker:
    """Runs the tasks of one `App`. ``await worker.run()`` returns after `stop`.

    Args:
        app: the app whose tasks this worker runs.
        concurrency: slots; defaults to `Settings.concurrency`.
    """

    def __init__(self, app: App, *, concurrency: int | None = None) -> None:
        self.app = app
        self.settings = app.settings
        self.concurrency = concurrency or self.settings.concurrency
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        self.id = _worker_id()
        self.executor = ThreadPoolExecutor(self.concurrency, thread_name_prefix="drumbeat-task")
        self.runner = Runner(app, self.id, self.executor)
        self.started_ms = int(time.time() * 1000)
        self.processed = 0
        self.failed = 0
        # Every shard this worker serves: jobs' shard first, then schedule shards if apart.
        self.shards: list[Scripts] = [app.scripts]
        if app.settings.schedule_shards > 1:
            self.shards += app.scheduler.scripts
        self._next_shard = 0
        # Claimed and not yet settled, for lease renewal: id -> (shard, claim). Ids are unique
        # across shards (job ids are uuids; a schedule lives in exactly one shard).
        self._held: dict[str, tuple[int, Claimed]] = {}
        self._running: dict[str, asyncio.Task[None]] = {}
        self._pending: list[tuple[int, Claimed, Outcome]] = []
        self._clock_offset_ms = 0
        self._stopping = asyncio.Event()
        self._hard = False
        self._closing = False
        self._slot_free = asyncio.Event()
        self._flush_wanted = asyncio.Event()
        self._heartbeat_stop = threading.Event()
        self._beat_once = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: aredis.Redis | None = None
        self._block: asyncio.Future[Any] | None = None
        self._waiter: Waiter | None = None
        # Hot-path connections: the claim loop's and the flusher's. (Acks sent with the next
        # claim, in one write, made a drain slower: the claim then waits for them.)
        self._link: Link | None = None
        self._settle_link: Link | None = None
        # Per shard: the schedule buckets heading `due` at the last reply; the next claim takes
        # their runs itself (see claim.lua).
        self._upcoming: dict[int, list[int]] = {}

    # -- lifecycle -------------------------------------------------------------------------

    def stop(self, hard: bool = False) -> None:
        """Stop claiming; running jobs get `Settings.shutdown_grace` (none if ``hard``)."""
        self._hard = self._hard or hard
        self._stopping.set()
        self._slot_free.set()

    def install_signal_handlers(self) -> None:
        """SIGTERM/SIGINT: the first stops gracefully, a second stops at once."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)

    def _on_signal(self, sig: signal.Signals) -> None:
        if self._stopping.is_set():
            log.warning(
                "%s again: stopping now; unfinished jobs return when leases expire", sig.name
            )
            self.stop(hard=True)
        else:
            log.info("%s: finishing running jobs (up to %.0f s), then stopping",
                     sig.name, self.settings.shutdown_grace)  # fmt: skip
            self.stop()

    async def run(self) -> None:
        """Claim and run jobs until `stop`; then shut down as `stop` asked."""
        self._loop = asyncio.get_running_loop()
        self._client = self.app.new_async_client(socket_timeout=self.settings.idle_block + 10)
        await check_server(self._client)
        self._link, self._settle_link = Link(self._client), Link(self._client)
        if len(self.shards) == 1:  # the pipelined wait claims from one shard
            self._waiter = Waiter(self._client, [self.shards[0].k.wake], self.settings.idle_block)
        heartbeat = threading.Thread(target=self._heartbeat, name="drumbeat-heartbeat", daemon=True)
        heartbeat.start()
        # Registered (visible to `drumbeat status` and the reaper) before it claims anything.
        await asyncio.to_thread(self._beat_once.wait, 5)
        flusher = asyncio.create_task(self._flusher(), name="drumbeat-flusher")
        maintenance = asyncio.create_task(self._maintenance(), name="drumbeat-maintenance")
        tasks = ", ".join(sorted(self.app.tasks)) or "none"
        log.info("worker %s started: %d slots, tasks: %s", self.id, self.concurrency, tasks)
        try:
            await self._claim_loop()
        finally:
            await self._cancel_block()
            await self._shutdown(flusher, maintenance)
            self._heartbeat_stop.set()
            heartbeat.join(timeout=5)
            await self._deregister()
            if self._waiter is not None:
                await self._waiter.aclose()
            await self._link.aclose()
            await self._settle_link.aclose()
            await self._client.aclose()
            self.executor.shutdown(wait=False, cancel_futures=True)
            log.info(
                "worker %s stopped: %d processed, %d failed", self.id, self.processed, self.failed
            )

    # -- claiming --------------------------------------------------------------------------

    async def _claim_loop(self) -> None:
        assert self._client is not None
        pause = 0.05
        while not self._stopping.is_set():
            free = self.concurrency - len(self._running)
            if free <= 0:
                # Clear before any await: a job finishing during the cancel sets it again.
                self._slot_free.clear()
                await self._cancel_block()
                await self._slot_free.wait()
                continue
            try:
                claimed, now_ms, next_due_ms = await self._claim(free)
                if claimed < free:
                    await self._wait_for_work(free - claimed, now_ms, next_due_ms)
                pause = 0.05
            except _TRANSIENT as exc:
                log.warning("claiming failed (%s); retrying in %.1f s", exc, pause)
                await self._sleep_unless_stopping(pause)
                pause = min(pause * 2, 5.0)

    async def _claim(self, free: int) -> tuple[int, int, int | None]:
        """Claims up to ``free`` items, shard after shard (starting at a rotating one, so no
        shard starves); returns (claimed, Redis now, earliest due time seen)."""
        assert self._link is not None
        s, n = self.settings, len(self.shards)
        claimed, now_ms, next_due = 0, 0, None
        start = self._next_shard
        self._next_shard = (start + 1) % n
        for i in range(n):
            shard = (start + i) % n
            call = self.shards[shard].claim(
                self.id, free - claimed, s.lease_ms, s.batch_limit, self._upcoming.get(shard, ())
            )
            (result,) = await self._link.run([call])
            took, result = await self._took(shard, result, free - claimed)
            claimed += took
            now_ms = result.now_ms
            if result.next_due_ms is not None:
                next_due = min(next_due or result.next_due_ms, result.next_due_ms)
            if claimed >= free:
                break
        return claimed, now_ms, next_due

    async def _took(self, shard: int, result: ClaimResult, free: int) -> tuple[int, ClaimResult]:
        """Starts what a claim took; takes the runs of the due schedule buckets it reported
        (as many as there are free slots; the rest wait in `ready`). Returns (started, the
        last reply)."""
        assert self._link is not None
        s, took = self.settings, 0
        while True:
            self._clock_offset_ms = result.now_ms - int(time.time() * 1000)
            self._upcoming[shard] = result.upcoming
            if any(job.spec is None for job in result.jobs):
                await self._fill_run_specs(shard, result.jobs)
            for job in result.jobs:
                self._start(shard, job)
            took += len(result.jobs)
            if not result.buckets:
                return took, result
            # The claim stepped these buckets aside for a second: promote them now.
            call = self.shards[shard].promote_runs(result.buckets, self.id, free - took, s.lease_ms)
            (result,) = await self._link.run([call])

    async def _fill_run_specs(self, shard: int, jobs: list[Claimed]) -> None:
        """A schedule's run taken straight from its bucket carries no copy of its spec in
        `jobs`; if it is claimed again (handed back, or its lease expired), its spec is read
        from the schedule's record here."""
        assert self._client is not None
        runs = [j for j in jobs if j.spec is None and j.id.startswith(RUN_PREFIX)]
        if not runs:
            return
        keys = self.shards[shard].k
        async with self._client.pipeline(transaction=False) as pipe:
            for job in runs:
                schedule_id = job.id[len(RUN_PREFIX) :]
                pipe.hget(keys.schedules(bucket_of(schedule_id)), schedule_id)
            pipe.hgetall(keys.tasks)
            *records, tasks = await pipe.execute()
        for job, record in zip(runs, records, strict=True):
            if record is not None:  # else the runner reports the run unreadable
                parsed = parse_record(record)
                name = tasks.get(b"#" + parsed.task_code.encode(), b"?")
                job.spec = name + b"|" + parsed.spec

    async def _wait_for_work(self, free: int, now_ms: int, next_due_ms: int | None) -> None:
        """Waits until a job is enqueued (a marker on `wake`), the next item is due, or
        `idle_block` passes, whichever comes first.

        Redis times blocked commands out only on its cron tick (every 100 ms at the default
        `hz`), far too coarse for due times. So one `BZPOPMIN` stays outstanding across waits,
        with the full `idle_block` as its timeout, and a local timer (from a due time Redis
        gave us, corrected by the measured clock offset) ends the wait at the due time. With
        nothing due within `idle_block`, the wait carries the next claim (`Waiter`).
        """
        assert self._client is not None
        timeout = self.settings.idle_block
        if next_due_ms is not None:
            timeout = min(timeout, (next_due_ms - now_ms) / 1000)
        if timeout <= 0:
            return
        if (
            timeout >= self.settings.idle_block
            and self._waiter is not None
            and (self._block is None or self._block.done())
        ):
            await self._wait_then_claim(free)
            return
        if self._block is None or self._block.done():
            wake_keys = [shard.k.wake for shard in self.shards]
            self._block = asyncio.ensure_future(
                self._client.bzpopmin(wake_keys, self.settings.idle_block)
            )
        stop = asyncio.ensure_future(self._stopping.wait())
        await asyncio.wait({self._block, stop}, timeout=timeout, return_when="FIRST_COMPLETED")
        stop.cancel()
        if self._block.done():
            self._block.exception()  # consumed; a failed block just means: look again

    async def _wait_then_claim(self, free: int) -> None:
        """Waits with a claim of up to ``free`` jobs pipelined behind the pop (slots only free
        up meanwhile, so it never overfills); stopping ends the wait early, and what the claim
        took is still started (the shutdown then finishes or hands it back)."""
        assert self._client is not None and self._waiter is not None
        s = self.settings
        call = self.shards[0].claim(
            self.id, free, s.lease_ms, s.batch_limit, self._upcoming.get(0, ())
        )
        waiting = asyncio.ensure_future(self._waiter.block_then(call))
        stop = asyncio.ensure_future(self._stopping.wait())
        # Redis ends the BZPOPMIN itself after idle_block; the local bound is only a backstop.
        await asyncio.wait({waiting, stop}, timeout=s.idle_block + 5, return_when="FIRST_COMPLETED")
        stop.cancel()
        if not waiting.done():
            await self._waiter.unblock(waiting)
        if waiting.cancelled():
            return
        try:
            raw = waiting.result()
        except redis.ResponseError as exc:  # the pop or CLIENT ID refused (an ACL, a proxy)
            log.warning("waiting with a pipelined claim failed (%s); using plain waits", exc)
            self._waiter = None
            return
        result = call.parse(raw) if raw is not None else await call.arun(self._client)
        await self._took(0, result, free)

    async def _cancel_block(self) -> None:
        """Drops the outstanding `BZPOPMIN` (a busy worker must not swallow wake markers meant
        for idle ones; cancelling costs its connection, a reconnect on the next wait)."""
        if self._block is not None and not self._block.done():
            self._block.cancel()
            await asyncio.gather(self._block, return_exceptions=True)
        self._block = None

    def _start(self, shard: int, job: Claimed) -> None:
        self._held[job.id] = (shard, job)
        self._running[job.id] = asyncio.create_task(
            self._execute(shard, job), name=f"drumbeat-job-{job.id}"
        )

    async def _execute(self, shard: int, job: Claimed) -> None:
        try:
            outcome = await self.runner.run(job, self.now_ms)
        finally:
            self._running.pop(job.id, None)
            self._slot_free.set()
        if isinstance(outcome, Bury):
            log.error("job %s dead-lettered: %s", job.id, outcome.reason)
        self._pending.append((shard, job, outcome))
        self._flush_wanted.set()

    def now_ms(self) -> int:
        """Redis server time in ms, as last seen by a claim (worker clocks drift)."""
        return int(time.time() * 1000) + self._clock_offset_ms

    # -- settling --------------------------------------------------------------------------

    async def _flusher(self) -> None:
        """Sends outcomes in batches: whatever finished while the last batch was in flight.

        It is never cancelled mid-batch (a cancelled ack would be neither sent nor kept);
        shutdown sets `_closing` and waits for it to drain.
        """
        while True:
            await self._flush_wanted.wait()
            self._flush_wanted.clear()
            await self._flush()
            if self._closing:
                return

    async def _flush(self) -> None:
        assert self._settle_link is not None
        pause = 0.05
        while self._pending:
            batch, self._pending = self._pending, []
            settles = self._settle_calls(batch)
            try:
                await self._settle(self._settle_link, settles)
                pause = 0.05
            except _TRANSIENT as exc:
                log.warning(
                    "settling %d jobs failed (%s); retrying in %.1f s", len(batch), exc, pause
                )
                self._pending[:0] = batch
                await asyncio.sleep(pause)
                pause = min(pause * 2, 5.0)
            else:
                self._settled(batch)

    def _settle_calls(
        self, batch: Sequence[tuple[int, Claimed, Outcome]]
    ) -> list[tuple[Call[list[int]], Sequence[tuple[Any, ...]], str]]:
        """One script call per kind of outcome, per shard, per `batch_limit` items: (call,
        its items, what it does)."""
        by_shard: dict[int, list[tuple[Claimed, Outcome]]] = defaultdict(list)
        for shard, job, outcome in batch:
            by_shard[shard].append((job, outcome))
        limit = self.settings.batch_limit
        calls: list[tuple[Call[list[int]], Sequence[tuple[Any, ...]], str]] = []
        for shard, items in by_shard.items():
            scripts = self.shards[shard]
            done = [
                (j.id, j.token, o.outcome, o.ttl_ms, j.extra)
                for j, o in items
                if isinstance(o, Done)
            ]
            again = [(j.id, j.token, o.delay_ms) for j, o in items if isinstance(o, Again)]
            buried = [(j.id, j.token, o.record, o.ttl_ms) for j, o in items if isinstance(o, Bury)]
            runs = [
                (j.id, j.token, o.outcome, o.duration_ms, o.generation, o.grid_ms, o.due_ms,
                 o.error)
                for j, o in items if isinstance(o, RunDone)
            ]  # fmt: skip
            kinds: list[tuple[Sequence[Any], Callable[[Any], Call[list[int]]], str]] = [
                (done, scripts.complete, "ack"),
                (again, scripts.retry, "retry"),
                (buried, scripts.bury, "dead-letter"),
                (runs, scripts.finish_runs, "reschedule"),
            ]
            for kind, make, what in kinds:
                for i in range(0, len(kind), limit):
                    chunk = kind[i : i + limit]
                    calls.append((make(chunk), chunk, what))
        return calls

    async def _settle(
        self, link: Link, settles: Sequence[tuple[Call[list[int]], Sequence[Any], str]]
    ) -> None:
        """Sends the calls in one write; a refused item (its lease was lost) is logged."""
        await link.send([call for call, _, _ in settles])
        for _, items, what in settles:
            try:
                _, accepted = await link.next()
            except redis.ResponseError as exc:
                # A script error will not go away by retrying: the jobs' leases lapse (they
                # are dropped from `_held` below) and they run again elsewhere.
                log.error("%s of %d jobs failed (%s); they run again when their leases expire",
                          what, len(items), exc)  # fmt: skip
                continue
            for item, ok in zip(items, accepted, strict=True):
                if not ok:
                    log.warning("%s of job %s refused: its lease was taken over (fencing "
                                "token %s)", what, item[0], item[1])  # fmt: skip

    def _settled(self, batch: Sequence[tuple[int, Claimed, Outcome]]) -> None:
        for _, job, outcome in batch:
            self._held.pop(job.id, None)
            if isinstance(outcome, Done):
                self.processed += 1
            elif isinstance(outcome, RunDone):
                self.processed += 1
                self.failed += outcome.outcome == "fail"
            elif isinstance(outcome, Bury):
                self.failed += 1

    # -- leases and housekeeping -----------------------------------------------------------

    def _heartbeat(self) -> None:
        """Renews leases from its own thread and connection, so a task that hogs the event loop
        (or the GIL in bursts) cannot make its own lease lapse."""
        client = redis.Redis.from_url(self.app.url, socket_connect_timeout=5, socket_timeout=5)
        interval = self.settings.lease / 3
        try:
            while True:
                # dict.copy() is one C call under the GIL: safe while the loop mutates it.
                held: dict[int, list[tuple[str, int]]] = defaultdict(list)
                for shard, job in self._held.copy().values():
                    held[shard].append((job.id, job.token))
                info = json.dumps({
                    "host": socket.gethostname(), "pid": os.getpid(),
                    "concurrency": self.concurrency, "running": len(self._running),
                    "started_ms": self.started_ms, "processed": self.processed,
                }).encode()  # fmt: skip
                try:
                    # Shard 0 always: it also carries this worker's heartbeat.
                    for shard in sorted(held.keys() | {0}):
                        lost = (
                            self.shards[shard]
                            .extend_leases(self.id, self.settings.lease_ms, info, held[shard])
                            .run(client)
                        )
                        if lost and self._loop is not None:
                            self._loop.call_soon_threadsafe(self._lease_lost, lost)
                except (redis.RedisError, OSError) as exc:
                    log.warning("lease renewal failed (%s); retrying", exc)
                self._beat_once.set()
                if self._heartbeat_stop.wait(interval):
                    return
        finally:
            client.close()

    def _lease_lost(self, ids: list[str]) -> None:
        for job_id in ids:
            task = self._running.get(job_id)
            if task is not None:
                log.warning("lease on job %s was taken over; cancelling this run", job_id)
                self._held.pop(job_id, None)
                task.cancel()

    async def _maintenance(self) -> None:
        assert self._client is not None
        s = self.settings
        reaps = [
            shard.reap(
                max_stalls=s.max_stalls,
                limit=s.batch_limit,
                dead_ttl_ms=round(s.dead_ttl * 1000),
                worker_ttl_ms=s.lease_ms * 3,
                result_ttl_ms=round(s.result_ttl * 1000),
            )
            for shard in self.shards
        ]
        # Ends by itself once stopping, not only by cancellation: a cancellation that lands
        # while the Redis client is between two awaits can be lost (seen under load: the task
        # stayed "cancelling" in its sleep and the shutdown waited for it forever).
        while not self._stopping.is_set():
            try:
                more = False
                for shard, reap in enumerate(reaps):
                    more = await self._reap(shard, reap) or more
                if more:
                    # A busy queue can expire thousands of outcomes a second; sweeping one
                    # batch per interval would let them pile up.
                    await asyncio.sleep(0)
                    continue
            except _TRANSIENT as exc:
                log.warning("housekeeping failed (%s)", exc)
            # Jitter keeps many workers from reaping in lockstep.
            await self._sleep_unless_stopping(s.maintenance_interval * (0.75 + random.random() / 2))

    async def _reap(self, shard: int, reap: Call[Reaped]) -> bool:
        """One housekeeping pass on one shard; True if it should run again at once."""
        assert self._client is not None
        reaped = await reap.arun(self._client)
        if reaped.requeued or reaped.buried:
            log.warning("shard %d: expired leases: %d requeued, %d dead-lettered",
                        shard, reaped.requeued, len(reaped.buried))  # fmt: skip
        if reaped.buried:
            await self._announce(self.shards[shard].k, reaped.buried)
        return reaped.more

    async def _announce(self, keys: Keys, ids: list[str]) -> None:
        """Wakes `Job.result` waiters of jobs that reap dead-lettered (Lua cannot name the keys)."""
        assert self._client is not None
        ttl_ms = max(1, round(self.settings.result_ttl * 1000))
        async with self._client.pipeline(transaction=False) as pipe:
            for job_id in ids:
                pipe.rpush(keys.done(job_id), 0)
                pipe.pexpire(keys.done(job_id), ttl_ms)
            await pipe.execute()

    # -- shutdown --------------------------------------------------------------------------

    async def _shutdown(self, flusher: asyncio.Task[None], maintenance: asyncio.Task[None]) -> None:
        await self._let_running_finish()
        for task in self._running.values():
            task.cancel()
        await asyncio.gather(*self._running.values(), return_exceptions=True)
        maintenance.cancel()
        await asyncio.gather(maintenance, return_exceptions=True)
        self._closing = True
        self._flush_wanted.set()
        try:
            # A hard stop still sends outcomes already in hand (else those jobs run twice),
            # but gives Redis only a moment.
            await asyncio.wait_for(flusher, 1.0 if self._hard else 10.0)
            unfinished: dict[int, list[tuple[str, int]]] = defaultdict(list)
            for shard, job in self._held.values():
                unfinished[shard].append((job.id, job.token))
            if unfinished and not self._hard:
                assert self._client is not None
                n = 0
                for shard, owned in unfinished.items():
                    n += await self.shards[shard].handback(owned).arun(self._client)
                log.info("handed %d unfinished jobs back to the queue", n)
        except (TimeoutError, *_TRANSIENT) as exc:
            log.warning(
                "could not settle every job at shutdown (%s); they return when leases expire", exc
            )

    async def _let_running_finish(self) -> None:
        """Waits up to the grace period for running jobs; a hard stop cuts the wait short."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.shutdown_grace
        if self._running and not self._hard:
            log.info("waiting up to %.0f s for %d running jobs",
                     self.settings.shutdown_grace, len(self._running))  # fmt: skip
        while True:
            self._slot_free.clear()  # set by every finishing job and by stop(hard=True)
            remaining = deadline - loop.time()
            if not self._running or self._hard or remaining <= 0:
                return
            try:
                await asyncio.wait_for(self._slot_free.wait(), remaining)
            except TimeoutError:
                return

    async def _sleep_unless_stopping(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)

    async def _deregister(self) -> None:
        assert self._client is not None
        try:
            async with self._client.pipeline(transaction=False) as pipe:
                pipe.zrem(self.app.keys.workers, self.id)
                pipe.hdel(self.app.keys.workerinfo, self.id)
                await pipe.execute()
        except _TRANSIENT:
            pass


def run_worker(app: App, *, concurrency: int | None = None) -> Worker:
    """Run a worker in this process until SIGTERM/SIGINT; returns it (for its counters)."""
    worker = Worker(app, concurrency=concurrency)

    async def main() -> None:
        worker.install_signal_handlers()
        await worker.run()

    asyncio.run(main())
    return worker
