"""The Worker: one process's event loop with N slots. It starts the parts that do the work
(claiming, settling, housekeeping, the heartbeat thread), runs each claimed job, supervises the
parts, and stops them in order.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import signal
import socket
import time
import uuid
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import TYPE_CHECKING, Any

from drumbeat import connections, resources
from drumbeat.config import check_concurrency
from drumbeat.errors import ConfigurationError, WorkerCrashed
from drumbeat.keys import DEFAULT_QUEUE
from drumbeat.names import check_name
from drumbeat.protocol import MAX_PRIORITY, MIN_PRIORITY
from drumbeat.runner import Runner
from drumbeat.schedules.upgrade import move_wheel
from drumbeat.scripts import Scripts

from .checkpoints import Lending
from .claiming import Claimer
from .claims import ClaimTable
from .hooks import Hooks
from .housekeeping import Housekeeper
from .leases import Heartbeat
from .limiting import Gate
from .link import Link
from .liveness import SUPERVISOR_FD, TICK, CpuMeter, Liveness, tell_supervisor
from .recycling import Budget, Recycler
from .retrying import is_transient, supervise, until_done
from .routing import Nodes, Routed
from .running import Runs
from .settling import Settler
from .signals import Signals
from .slotted import SlotLane

if TYPE_CHECKING:
    from drumbeat.app import App

log = logging.getLogger("drumbeat.worker")


def _worker_id() -> str:
    host = re.sub(r"[^A-Za-z0-9_.:@/+=-]", "-", socket.gethostname()) or "host"
    return f"{host}.{os.getpid()}.{uuid.uuid4().hex[:6]}"


class Worker:
    """Runs the tasks of one `App`. ``await worker.run()`` returns after `stop`.

    Args:
        app: the app whose tasks this worker runs.
        concurrency: slots; defaults to `Settings.concurrency`.
        hooks: code to run at the process's and each job's start and end.
        budget: when to retire (`recycling.Budget`: after so many jobs, or past a resident
            memory size); by default never.
        queues: the queues it claims from; by default every queue the app's tasks name.
    """

    def __init__(
        self,
        app: App,
        *,
        concurrency: int | None = None,
        hooks: Hooks | None = None,
        budget: Budget | None = None,
        queues: Sequence[str] | None = None,
    ) -> None:
        self.app = app
        self.queues = served_queues(app, queues)
        self.settings = app.settings
        self.concurrency = concurrency or self.settings.concurrency
        check_concurrency(self.concurrency)
        self.id = _worker_id()
        self.hooks = hooks or Hooks()
        # The app's process hooks run first at the start, last at the stop.
        self.hooks.on_start[:0] = app.startup_hooks
        self.hooks.on_stop.extend(app.shutdown_hooks)
        self.hooks.on_stop.append(app.resources.aclose)  # last: the hooks may still use them
        # The app's job middleware (`App.middleware`) around the hooks given here.
        self.hooks.adopt(app.middlewares)
        self.started_ms = int(time.time() * 1000)
        self.cpu = CpuMeter()
        # Every shard this worker serves: the job shards first (the main one first), then
        # schedule shards if apart.
        self.shards: list[Scripts] = list(app.job_scripts)
        jobs = len(self.shards)
        if app.settings.schedule_shards > 1:
            self.shards += app.scheduler.apart_scripts
        # A sync run paused at a checkpoint keeps its thread while the urgent job it lent its
        # slot to runs in another; lending only ever goes to a strictly higher priority, so a
        # slot nests at most one run per priority level. (Threads start only when needed.)
        levels = MAX_PRIORITY - MIN_PRIORITY + 1
        self.threads = self.concurrency * levels
        self.executor = ThreadPoolExecutor(self.threads, thread_name_prefix="drumbeat-task")
        self.table = ClaimTable(self.concurrency)
        self._stopping = asyncio.Event()
        self._hard = False
        self._retiring = False  # a scale-down: finish every running job, however long
        self._signalled = False
        self._crashed: str | None = None
        self.runner = Runner(app, self.id, self.executor)
        self.settler = Settler(self.shards, self.table, self.settings, self.id, self.queues)
        for shard in self.shards[:jobs]:  # its settles release dependents into what it serves
            # The app's Scripts, which another worker of this process may share: any queue's
            # keys are right to pass, so every worker's queues are kept.
            shard.release_into = tuple(dict.fromkeys((*shard.release_into, *self.queues)))
        self.runs = Runs(self.table, self.runner, self.settler, self.hooks)
        self.claimer = Claimer(
            worker_id=self.id, shards=self.shards, settings=self.settings, table=self.table,
            start=self.runs.start, stopping=self._stopping, queues=self.queues, jobs=jobs,
        )  # fmt: skip
        self.runs.now_ms = self.claimer.now_ms
        self.settler.on_slot_due = self.claimer.slots_due_at
        self.gate = Gate(app, self.shards, self.queues)
        self.gate.check()
        self.runner.gate = self.gate
        self.runs.release = self.gate.release
        self.claimer.release_limits = self.gate.release_call
        self.housekeeper = Housekeeper(
            self.shards, self.settings, self._stopping, app.keys.queues, self.queues, jobs=jobs
        )
        self.lane = self._time_slots(jobs)
        self.budget = budget or Budget()
        self.recycler = Recycler(
            self.budget, lambda: self.processed + self.failed, self.retire, self._stopping,
            handover_wait=self.settings.handover_deadline,
        )  # fmt: skip
        self.lending = Lending(
            worker_id=self.id, shards=self.shards, jobs=jobs, table=self.table,
            settings=self.settings,
            codec=app.codec, start_lent=self.runs.start_lent, stopping=self._stopping,
            queues=self.queues,
        )  # fmt: skip
        self.runs.control = self.lending.control
        self.claimer.on_best = self.lending.seen
        self.claimer.lendable = self.lending.lendable
        self.signals = Signals(
            [k.signals for k in app.job_keys], self._stopping, on_ready=self._heard,
            on_cancel=self.runs.cancel, on_due=self.claimer.due_at,
        )  # fmt: skip
        self.liveness = Liveness(min(TICK, self.settings.hang_timeout / 5), self.wedged)
        self.heartbeat = Heartbeat(
            worker_id=self.id, shards=self.shards, table=self.table,
            client=lambda: connections.heartbeat_client(app.url),
            lease_ms=self.settings.lease_ms, info=self._info,
            on_lost=self._threadsafe(self.runs.lost),
            on_cancel=self._threadsafe(self.runs.cancel),
            liveness=self.liveness, hang_timeout=self.settings.hang_timeout,
            renew=None if self.lane is None else self.lane.renew,
        )  # fmt: skip
        self._loop: asyncio.AbstractEventLoop | None = None

    def _heard(self, priority: int, queue: str = DEFAULT_QUEUE, shard: int = 0) -> None:
        """A job of ``priority`` waits in ``queue`` of ``shard`` (a signal)."""
        self.claimer.jobs_came()
        self.lending.heard(priority, queue, shard)

    def _time_slots(self, jobs: int) -> SlotLane | None:
        """With the default queue served (schedules belong to it), the lane that claims the
        runs of the time slots, wired into the claim loop and housekeeping."""
        if self.queues[0] != DEFAULT_QUEUE:
            return None
        held = [0, *range(jobs, len(self.shards))]
        lane = SlotLane(self.id, [s.k for s in self.shards], self.settings, held)
        self.claimer.lane = lane
        self.housekeeper.reap_slots = lambda client: lane.reap(client, self.claimer.now_ms())
        return lane

    @property
    def processed(self) -> int:
        return self.settler.processed

    @property
    def failed(self) -> int:
        return self.settler.failed

    # -- lifecycle -------------------------------------------------------------------------

    def stop(self, hard: bool = False) -> None:
        """Stop claiming; running jobs get `Settings.shutdown_grace` (none if ``hard``)."""
        self._hard = self._hard or hard
        self._stopping.set()
        self.table.slot_free.set()

    def retire(self) -> None:
        """Stop claiming and finish every running job, without the grace period: nothing is
        handed back (a supervisor scaling down). A SIGTERM/SIGINT meanwhile turns it into a
        graceful stop, whose grace starts then."""
        if self._stopping.is_set():
            return
        log.info("retiring: no more claims; finishing %d running jobs, then exiting",
                 self.table.running)  # fmt: skip
        self._retiring = self.lending.retiring = True
        self.stop()

    def install_signal_handlers(self) -> None:
        """SIGTERM/SIGINT: the first stops gracefully, a second stops at once. SIGUSR1:
        `retire` (the supervisor's scale-down)."""
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self._on_signal, signal.SIGTERM)
        if os.environ.get(SUPERVISOR_FD):
            # Ctrl-C in a terminal reaches the supervisor and its workers alike (one process
            # group); the supervisor passes it on as SIGTERM. Taken here too, it would make
            # that SIGTERM a second signal: a hard stop that hands every job back.
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        else:
            loop.add_signal_handler(signal.SIGINT, self._on_signal, signal.SIGINT)
        loop.add_signal_handler(signal.SIGUSR1, self.retire)

    def _on_signal(self, sig: signal.Signals) -> None:
        first = not self._signalled
        self._signalled = True
        if self._retiring and first:
            log.info("%s while retiring: the running jobs get %.0f s more, then are handed "
                     "back", sig.name, self.settings.shutdown_grace)  # fmt: skip
            self._retiring = self.lending.retiring = False
            self.table.slot_free.set()  # the wait for running jobs takes up the grace now
        elif self._stopping.is_set():
            log.warning(
                "%s again: stopping now; unfinished jobs return when leases expire", sig.name
            )
            self.stop(hard=True)
        else:
            log.info("%s: finishing running jobs (up to %.0f s), then stopping",
                     sig.name, self.settings.shutdown_grace)  # fmt: skip
            self.stop()

    async def run(self) -> None:
        """Claim and run jobs until `stop`; then shut down as `stop` asked.

        Raises:
            WorkerCrashed: a part of the worker kept failing; it stopped (as gracefully as it
                could) so that whatever runs it can start a fresh process.
        """
        self._loop = asyncio.get_running_loop()
        # It ticks from the start (a slow async start hook is no hang) to the very end (nor is
        # finishing the running jobs after a stop).
        pulse = asyncio.create_task(self.liveness.run(), name="drumbeat-liveness")
        try:
            await self._serve()
        finally:
            pulse.cancel()
            await asyncio.gather(pulse, return_exceptions=True)

    async def _serve(self) -> None:
        resources.bind(self.app.resources)  # drumbeat.resource() in its hooks and tasks
        await self.hooks.started()
        url = self.app.url
        client = connections.worker_client(url, self.settings.idle_block)
        # On a Redis Cluster `client` is the cluster client, which routes each command by its
        # keys' slot; the hand-driven connections go to each shard's master (`routing`).
        nodes: Nodes | None = None
        if connections.is_cluster(url):
            timeout = self.settings.idle_block + connections.BLOCK_MARGIN
            nodes = Nodes(url, client, timeout)
        settle_link: Link | Routed = Link(client) if nodes is None else Routed(nodes)
        parts: list[asyncio.Task[None]] = []
        try:
            await until_done("checking the server", lambda: connections.acheck_server(client),
                             self._stopping)  # fmt: skip
            if self.lane is not None:  # what an older version left in the timing wheel
                wheel = partial(move_wheel, self.app.redis, self.app.scheduler.shards)
                await until_done("moving the timing wheel", lambda: asyncio.to_thread(wheel),
                                 self._stopping)  # fmt: skip
            await self.claimer.open(client, None if nodes is None else Routed(nodes))
            self.gate.client, self.gate.link = client, None if nodes is None else Routed(nodes)
            self.lending.open(client)
            self.heartbeat.start()
            # Registered (visible to `drumbeat status` and the reaper) before it claims.
            await asyncio.to_thread(self.heartbeat.beat_once.wait, 5)
            parts = [
                self._supervised("flusher", lambda: self.settler.run(settle_link)),
                self._supervised("housekeeping", lambda: self.housekeeper.run(client)),
                self._supervised(
                    "signals",
                    lambda: self.signals.run(
                        client
                        if nodes is None
                        # Non-sharded pub/sub: any node hears every shard's channel.
                        else lambda: nodes.client_of(self.signals.channels[0], fresh=True)
                    ),
                ),
            ]
            if self.budget.limited:
                parts.append(self._supervised("recycling", self.recycler.run))
            tasks = ", ".join(sorted(self.app.tasks)) or "none"
            log.info("worker %s started: %d slots, queues: %s, tasks: %s", self.id,
                     self.concurrency, ", ".join(self.queues), tasks)  # fmt: skip
            tell_supervisor("ready")  # a rolling restart may stop the worker this one replaces
            await self._supervised("claim loop", self.claimer.run)
        finally:
            await self._shutdown(client, parts)
            await settle_link.aclose()
            await self.gate.aclose()
            if nodes is not None:
                await nodes.aclose()
            await client.aclose()
            await self.hooks.stopped()
            log.info(
                "worker %s stopped: %d processed, %d failed", self.id, self.processed, self.failed
            )
        if self._crashed is not None:
            raise WorkerCrashed(self._crashed)

    def _supervised(
        self, name: str, part: Callable[[], Coroutine[Any, Any, None]]
    ) -> asyncio.Task[None]:
        return asyncio.create_task(supervise(name, part, self._give_up), name=f"drumbeat-{name}")

    def _give_up(self, reason: str) -> None:
        """A part crashed too often: the worker stops, and `run` raises `WorkerCrashed`."""
        self._crashed = self._crashed or reason
        self.stop()

    def wedged(self) -> str | None:
        """Why this worker cannot start anything any more (`Liveness`), or None: every thread
        of its task pool runs a sync call the runner gave up on."""
        if self.runner.abandoned < self.threads:
            return None
        return (f"all {self.threads} threads of its sync task pool still run tasks past their "
                "timeout (or cancelled); no sync job can start until one returns")  # fmt: skip

    def _threadsafe(self, call: Callable[..., None]) -> Callable[..., None]:
        """``call`` for the heartbeat thread: it runs on the worker's loop."""

        def on_loop(*args: Any) -> None:
            if self._loop is not None:
                self._loop.call_soon_threadsafe(call, *args)

        return on_loop

    def _info(self) -> bytes:
        info: dict[str, Any] = {
            "host": socket.gethostname(), "pid": os.getpid(),
            "concurrency": self.concurrency, "running": self.table.running,
            "started_ms": self.started_ms, "processed": self.processed,
        }  # fmt: skip
        cpu = self.cpu.read()
        if cpu is not None:
            info["cpu"] = round(cpu, 3)
        return json.dumps(info).encode()

    # -- shutdown --------------------------------------------------------------------------

    async def _shutdown(self, client: Any, parts: list[asyncio.Task[None]]) -> None:
        """Stops in order; each step runs even if an earlier one failed, so a worker whose
        hand-back failed still stops its heartbeat and deregisters."""
        self._stopping.set()
        steps: list[tuple[str, Callable[[], Coroutine[Any, Any, None]]]] = [
            ("closing the claim loop", self.claimer.close),
            ("finishing running jobs", self._finish_running),
            ("stopping housekeeping", lambda: self._stop_parts(parts[1:])),
            ("settling outcomes in hand", lambda: self._drain(parts[:1])),
            ("handing back unfinished jobs", lambda: self._hand_back(client)),
            ("stopping the heartbeat", lambda: asyncio.to_thread(self.heartbeat.stop)),
            ("deregistering", lambda: self._deregister(client)),
        ]
        for what, step in steps:
            try:
                await step()
            except Exception as exc:
                level = logging.WARNING if is_transient(exc) else logging.ERROR
                log.log(level, "shutdown: %s failed (%s: %s); unfinished jobs return when "
                        "their leases expire", what, type(exc).__name__, exc)  # fmt: skip
        self.executor.shutdown(wait=False, cancel_futures=True)

    async def _finish_running(self) -> None:
        """Waits up to the grace period for running jobs (a hard stop cuts it short; a retiring
        worker waits for all of them), then cancels the rest."""
        loop = asyncio.get_running_loop()
        grace = self.settings.shutdown_grace
        deadline = loop.time() + grace
        if self.table.running and not self._hard and not self._retiring:
            log.info("waiting up to %.0f s for %d running jobs", grace, self.table.running)
        while True:
            self.table.slot_free.clear()  # set by every finishing job and by stop(hard=True)
            if self._retiring:  # no deadline yet; a signal starts the grace from then
                deadline = loop.time() + grace
            remaining = deadline - loop.time()
            if not self.table.running or self._hard or remaining <= 0:
                break
            try:
                await asyncio.wait_for(
                    self.table.slot_free.wait(), None if self._retiring else remaining
                )
            except TimeoutError:
                break
        runs = self.table.runs()
        for task in runs:
            task.cancel()
        await asyncio.gather(*runs, return_exceptions=True)

    async def _stop_parts(self, parts: list[asyncio.Task[None]]) -> None:
        for part in parts:
            part.cancel()
        await asyncio.gather(*parts, return_exceptions=True)

    async def _drain(self, flusher: list[asyncio.Task[None]]) -> None:
        """Lets the flusher send every outcome in hand. A hard stop still sends them (else
        those jobs run twice), but gives Redis only a moment."""
        self.settler.close()
        if flusher:
            await asyncio.wait_for(flusher[0], 1.0 if self._hard else 10.0)

    async def _hand_back(self, client: Any) -> None:
        owned = self.table.owned_by_queue()
        slot_runs = self.table.slot_runs()
        if not (owned or slot_runs) or self._hard:
            return
        n = 0
        for (shard, queue), keys in owned.items():
            n += sum(await self.shards[shard].handback(keys, queue).arun(client))
        if slot_runs and self.lane is not None:
            n += await self.lane.handback(client, slot_runs, self.claimer.now_ms())
        log.info("handed %d unfinished jobs back to the queue", n)

    async def _deregister(self, client: Any) -> None:
        if self.lane is not None and not self._hard:  # else its runs come back by its lease
            await self.lane.deregister(client)
        async with client.pipeline(transaction=False) as pipe:
            pipe.zrem(self.app.keys.workers, self.id)
            pipe.hdel(self.app.keys.workerinfo, self.id)
            await pipe.execute()


def served_queues(app: App, queues: Sequence[str] | None) -> list[str]:
    """The queues a worker serves, checked, each once, the default one first (schedules, which
    belong to it, are claimed with it); by default every queue the app's tasks name."""
    if queues is None:
        return app.queues()
    if isinstance(queues, str) or not queues:
        raise ConfigurationError(f"queues must be a non-empty list of queue names, got {queues!r}")
    try:
        names = [check_name(q, "queue name") for q in dict.fromkeys(queues)]
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None
    return sorted(names, key=lambda q: q != DEFAULT_QUEUE)
