"""What a benchmark scenario needs from a queue system (`System`), and the worker subprocess
protocol every system's worker speaks, so scenarios stay the same from one system to the next.

A system is one module (``bench.drumbeat_system``, ``bench.peers.<name>``) with a class that
implements `System` (the producer side, run in the harness) and a function
``worker_main(url, options)`` (the worker side, run as ``python -m bench._worker MODULE ...``).

A worker subprocess writes JSON lines to the stdout it was given (its library's own output goes
to stderr, see `protocol_stdout`): ``{"event": "started", ...}`` just before it starts claiming,
``{"event": "high_done"}`` once it has started every high-priority job of the priority scenario,
and ``{"event": "report", ...}`` after a SIGTERM made it stop. Every system's tasks do the same
bookkeeping through `SINK`, in-process (no Redis round trips per job), reported only at the end.
"""

from __future__ import annotations

import asyncio
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from typing import IO, Any, Protocol, TypeVar

T = TypeVar("T")

HIGH_JOBS_ENV = "BENCH_HIGH_JOBS"
"""How many high-priority jobs a worker waits for before it says ``high_done``."""
MARKS_URL_ENV = "BENCH_MARKS_URL"
"""The Redis a worker pushes its long jobs' start and end marks to (`MARKS_KEY`)."""
SINK_DIR_ENV = "BENCH_SINK_DIR"
"""A directory where every process that runs jobs writes what its `Sink` counted
(``<pid>.json``, rewritten within `SINK_FLUSH` s of a change): how the harness counts the jobs
of a pool whose processes it did not start itself (a supervisor's, a prefork master's)."""
SINK_FLUSH = 0.05
MARKS_KEY = "bench:long-marks"
"""A list of ``start``/``end``, one per long job's start and end, so the harness can tell when
every slot is busy and when the long jobs are done whatever the system (two pushes per long
job; the times themselves come in the worker's report)."""


class ScenarioFailed(RuntimeError):
    """The system under test misbehaved (jobs lost, worker crashed or hung); the run goes on."""


class NotSupported(Exception):
    """The system has no such feature (bulk enqueue, priorities): reported, not a failure."""


@dataclass(slots=True)
class WorkerReport:
    started_at: float
    """Wall-clock time (``time.time()``) at which the worker started claiming."""
    count: int
    """Jobs the worker's tasks ran, counted in-process."""
    first_at: float | None
    """Wall-clock time the first job started, if any ran."""
    latencies: list[float]
    """Seconds from enqueue to start, one per stamped job."""
    high_starts: list[float]
    """Wall-clock start times of the high-priority jobs."""
    low_before_high_done: int
    """Low-priority jobs this worker had started when the last high one started (-1: never)."""
    peak_rss_kb: int
    """``VmHWM`` of the worker process, read by itself just before it exits."""
    cpu_s: float
    """CPU time (user + system) the worker used from starting to claim until it stopped."""
    extra: dict[str, Any] = field(default_factory=dict)
    stderr: str = ""
    long_starts: list[float] = field(default_factory=list)
    """Wall-clock start times of the long jobs (the urgent-behind-long scenario)."""
    long_ends: list[float] = field(default_factory=list)
    """Wall-clock end times of the long jobs."""


class System(Protocol):
    """A queue system under test, on the Redis it was given. One module per system.

    Producer calls run in the harness process and do whole loops (one call for 20,000
    enqueues), so an async system runs them in its own event loop without a per-job hop.
    """

    name: str
    url: str
    settings: str
    """The worker settings used (process model, concurrency, prefetch), for the report."""
    bulk: str | None
    """How `enqueue_bulk` enqueues (``None``: the system has no bulk enqueue)."""
    priority: str | None
    """How high and low priority are expressed (``None``: the system has no priorities)."""
    urgent_long: str | None
    """How the system runs urgent jobs behind long ones, as its users would (``None``: it
    cannot; `urgent_long_workers` then raises `NotSupported`)."""

    def version(self) -> str:
        """The system's version and the client library versions it runs on."""

    def reset(self) -> None:
        """Start over with an empty queue; the previous one's data may be dropped."""

    def enqueue_one_by_one(self, n: int) -> None:
        """Enqueue ``n`` no-op jobs, one call (one round trip) each."""

    def enqueue_bulk(self, n: int) -> None:
        """Enqueue ``n`` no-op jobs with the system's bulk API; `NotSupported` if none."""

    def fill(self, n: int) -> None:
        """Queue ``n`` no-op jobs the fastest way the system has (untimed)."""

    def fill_low(self, n: int) -> None:
        """`fill` with low-priority jobs, for the priority scenario."""

    def produce_stamped(self, rate: float, n: int) -> float:
        """Send ``n`` jobs at ``rate`` per second, each carrying ``time.time()`` at its send, which
        the worker records minus its own start time; returns the seconds sending took."""

    def enqueue_high(self, n: int) -> float:
        """Enqueue ``n`` high-priority jobs one by one; returns ``time.time()`` just before the
        first. `NotSupported` if the system has no priorities."""

    def fill_long(self, n: int, units: int, unit_s: float) -> None:
        """Queue ``n`` long low-priority jobs of ``units`` sleeps of ``unit_s`` each (a
        checkpoint after each unit where the system has them); each calls `Sink.long_start`
        and `Sink.long_end`."""

    def produce_urgent(self, rate: float, n: int) -> float:
        """`produce_stamped` with urgent jobs: the way the system gets them ahead of the long
        ones (a higher priority, or a queue of their own)."""

    def urgent_long_workers(self) -> tuple[list[list[str]], int]:
        """The worker processes of the urgent-behind-long scenario (4 slots in all, as few
        processes as the system allows) and how many long jobs they run at once (4, or fewer
        when a slot is kept for the urgent queue). `NotSupported` if the system cannot."""

    def outstanding(self) -> int:
        """Jobs enqueued and not yet finished (queued, reserved or running)."""

    def worker_argv(self, priority: bool = False) -> list[str]:
        """The command line of one worker process (its natural settings, see `settings`);
        ``priority``: for the priority scenario (a system whose priorities are separate queues
        then listens to both)."""

    def close(self) -> None: ...


class Base:
    """What most adapters share: an admin client on the same Redis, `reset` by ``FLUSHDB``,
    and `fill` by the bulk API if there is one, else one by one."""

    name = ""
    settings = ""
    bulk: str | None = None
    priority: str | None = None
    urgent_long: str | None = None

    def __init__(self, url: str) -> None:
        import redis

        self.url = url
        self.admin = redis.Redis.from_url(url, socket_connect_timeout=5)

    def reset(self) -> None:
        self.admin.flushdb()

    def enqueue_one_by_one(self, n: int) -> None:
        raise NotImplementedError

    def enqueue_bulk(self, n: int) -> None:
        raise NotSupported("no bulk enqueue")

    def fill(self, n: int) -> None:
        if self.bulk is None:
            self.enqueue_one_by_one(n)
        else:
            self.enqueue_bulk(n)

    def fill_low(self, n: int) -> None:
        self.fill(n)

    def enqueue_high(self, n: int) -> float:
        raise NotSupported("no priorities")

    def fill_long(self, n: int, units: int, unit_s: float) -> None:
        raise NotSupported("no urgent-behind-long setup")

    def produce_urgent(self, rate: float, n: int) -> float:
        raise NotSupported("no urgent-behind-long setup")

    def urgent_long_workers(self) -> tuple[list[list[str]], int]:
        raise NotSupported("no urgent-behind-long setup")

    def close(self) -> None:
        self.admin.close()


def versions(*dists: str) -> str:
    """``"a 1.0, b 2.1"`` for the installed distributions."""
    found = []
    for name in dists:
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            found.append(f"{name} (not installed)")
    return ", ".join(found)


def worker_command(module: str, url: str, **options: Any) -> list[str]:
    """``python -m bench._worker MODULE --url URL --options JSON``."""
    return [sys.executable, "-m", "bench._worker", module, "--url", url,
            "--options", json.dumps(options)]  # fmt: skip


def paced(rate: float, n: int, send: Callable[[float], object]) -> float:
    """Call ``send(time.time())`` ``n`` times at ``rate`` per second; returns the seconds taken."""
    t0 = time.perf_counter()
    for i in range(n):
        delay = t0 + i / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        send(time.time())
    return time.perf_counter() - t0


async def apaced(rate: float, n: int, send: Callable[[float], Awaitable[object]]) -> float:
    """`paced` for async producers."""
    t0 = time.perf_counter()
    for i in range(n):
        delay = t0 + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        await send(time.time())
    return time.perf_counter() - t0


class Loop:
    """A private event loop for an async system's producer calls."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()

    def run(self, coro: Awaitable[T]) -> T:
        return self.loop.run_until_complete(coro)

    def close(self) -> None:
        self.loop.close()


# -- parent side ---------------------------------------------------------------------------------


class WorkerProcess:
    """A worker subprocess speaking the protocol above. ``wait_started`` before using it (the
    constructor only spawns it, so several can start at once)."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> None:
        self.argv = list(argv)
        # A file, not a pipe: a chatty worker must never block on a full pipe. Closed by `_reap`.
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115
        self._stderr_text: str | None = None
        self._lines: list[dict[str, Any]] = []
        self.proc = subprocess.Popen(
            self.argv, stdout=subprocess.PIPE, stderr=self._stderr, env=env, text=True
        )
        self.pid = self.proc.pid
        self.started_at = 0.0

    def wait_started(self, timeout: float = 60) -> WorkerProcess:
        started = self.wait_event("started", timeout)
        if started.get("event") != "started":
            self.kill()
            raise ScenarioFailed(f"worker did not start: {started!r}\n{self.stderr_tail()}")
        self.pid = int(started["pid"])
        self.started_at = float(started["t"])
        return self

    def wait_event(self, name: str, timeout: float) -> dict[str, Any]:
        """The next protocol line named ``name`` (or ``timeout``/``exited``); others are kept."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return {"event": "timeout"}
            ready, _, _ = select.select([self.proc.stdout], [], [], min(left, 0.5))
            if ready:
                line = self.proc.stdout.readline()
                if not line:
                    return {"event": "exited", "returncode": self.proc.wait()}
                event = _parse(line)
                if event is None:
                    continue
                if event.get("event") == name:
                    return event
                self._lines.append(event)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = 20) -> WorkerReport:
        """SIGTERM (graceful stop), then the worker's report. A worker still running
        ``timeout`` s later gets SIGUSR2, on which `Started` reports and exits at once; the
        report then says ``forced``."""
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
        forced = False
        try:
            out, _ = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            forced = True
            self.proc.send_signal(signal.SIGUSR2)
            try:
                out, _ = self.proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
                raise ScenarioFailed(
                    f"worker {self.proc.pid} did not exit within {timeout} s of SIGTERM nor "
                    f"report on SIGUSR2 (killed)\n{self.stderr_tail()}"
                ) from None
        self._reap()
        events = [*self._lines, *filter(None, map(_parse, out.splitlines()))]
        reports = [e for e in events if e.get("event") == "report"]
        if not reports:
            raise ScenarioFailed(
                f"worker {self.proc.pid} exited with {self.proc.returncode} without a report\n"
                f"{self.stderr_tail()}"
            )
        r = reports[-1]
        return WorkerReport(
            started_at=self.started_at,
            count=int(r["count"]),
            first_at=None if r.get("first_at") is None else float(r["first_at"]),
            latencies=[float(x) for x in r.get("latencies", [])],
            high_starts=[float(x) for x in r.get("high_starts", [])],
            low_before_high_done=int(r.get("low_before_high_done", -1)),
            peak_rss_kb=int(r["peak_rss_kb"]),
            cpu_s=float(r["cpu_s"]),
            extra={**r.get("extra", {}), **({"forced": True} if forced else {})},
            stderr=self.stderr_text(),
            long_starts=[float(x) for x in r.get("long_starts", [])],
            long_ends=[float(x) for x in r.get("long_ends", [])],
        )

    def kill(self) -> None:
        if self.alive():
            self.proc.kill()
            self.proc.wait()
        self._reap()

    def _reap(self) -> None:
        """Keep what the exited worker wrote to stderr, and close the file."""
        if self._stderr_text is None:
            self._stderr_text = self.stderr_text()
            self._stderr.close()

    def stderr_text(self) -> str:
        if self._stderr_text is not None:
            return self._stderr_text
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace")

    def stderr_tail(self, lines: int = 20) -> str:
        tail = self.stderr_text().splitlines()[-lines:]
        return "worker stderr:\n" + "\n".join(tail) if tail else "(worker stderr empty)"


def _parse(line: str) -> dict[str, Any] | None:
    if not line.startswith("{"):
        return None
    try:
        value = json.loads(line)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


# -- worker side ---------------------------------------------------------------------------------


class Sink:
    """What every system's tasks record, in-process: the same bookkeeping for all of them. Thread
    safe, for systems that run tasks in threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0
        self.low = 0
        self.first_at: float | None = None
        self.latencies: list[float] = []
        self.high_starts: list[float] = []
        self.low_before_high_done = -1
        self.high_target = int(os.environ.get(HIGH_JOBS_ENV, "100"))
        self.long_starts: list[float] = []
        self.long_ends: list[float] = []
        self._marks: Any = None
        self._dir = os.environ.get(SINK_DIR_ENV) or None
        self._flushing = False

    def _forked(self) -> None:
        """In a forked child: count from zero, with a lock nobody holds, and flush anew."""
        self.__init__()  # type: ignore[misc]

    def _flush_soon(self) -> None:
        """Starts this process's flushing thread (under the lock, on its first job)."""
        if self._dir is None or self._flushing:
            return
        self._flushing = True
        threading.Thread(target=self._flush_loop, name="bench-sink", daemon=True).start()

    def _flush_loop(self) -> None:
        assert self._dir is not None
        path = os.path.join(self._dir, f"{os.getpid()}.json")
        written = -1
        while True:
            with self._lock:
                count, first_at = self.count, self.first_at
            if count != written:
                with open(path + ".tmp", "w") as f:
                    json.dump({"pid": os.getpid(), "count": count, "first_at": first_at}, f)
                os.replace(path + ".tmp", path)
                written = count
            time.sleep(SINK_FLUSH)

    def noop(self) -> None:
        """A no-op (low-priority) job started."""
        with self._lock:
            if self.first_at is None:
                self.first_at = time.time()
            self.count += 1
            self.low += 1
            if not self._flushing:
                self._flush_soon()

    def stamped(self, sent_at: float) -> None:
        """A job stamped with its send time started."""
        now = time.time()
        with self._lock:
            self.latencies.append(now - sent_at)
            self.count += 1

    def high(self) -> None:
        """A high-priority job started."""
        now = time.time()
        with self._lock:
            self.high_starts.append(now)
            self.count += 1
            if len(self.high_starts) == self.high_target:
                self.low_before_high_done = self.low
                emit("high_done")

    def long_start(self) -> None:
        """A long job started (each attempt; the scenario has no retries)."""
        now = time.time()
        with self._lock:
            self.long_starts.append(now)
            if self.first_at is None:
                self.first_at = now
            self.count += 1
        self._mark("start")

    def long_end(self) -> None:
        """A long job finished its last unit."""
        now = time.time()
        with self._lock:
            self.long_ends.append(now)
        self._mark("end")

    def _mark(self, kind: str) -> None:
        import redis

        with self._lock:
            if self._marks is None:
                self._marks = redis.Redis.from_url(os.environ[MARKS_URL_ENV])
            client = self._marks
        client.rpush(MARKS_KEY, kind)  # redis-py's pool is thread safe


SINK = Sink()
"""The worker process's sink; a module global so a task module imported twice (as ``__main__``
and by name) still records into one place."""
os.register_at_fork(after_in_child=SINK._forked)


def read_sink(directory: str) -> dict[int, dict[str, Any]]:
    """What each process wrote to a `SINK_DIR_ENV` directory, by pid."""
    found: dict[int, dict[str, Any]] = {}
    for name in os.listdir(directory):
        if name.endswith(".json"):
            try:
                with open(os.path.join(directory, name)) as f:
                    entry = json.load(f)
            except (OSError, ValueError):
                continue  # replaced meanwhile: read again at the next look
            found[int(entry["pid"])] = entry
    return found


_protocol: IO[str] = sys.stdout
_emit_lock = threading.Lock()


def protocol_stdout() -> None:
    """Keep the real stdout for protocol lines and send everything else written to fd 1 (a
    library's banner or logs) to stderr."""
    global _protocol  # noqa: PLW0603
    sys.stdout.flush()
    _protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr


def emit(event: str, **fields: Any) -> None:
    """Write one protocol line."""
    with _emit_lock:
        _protocol.write(json.dumps({"event": event, **fields}) + "\n")
        _protocol.flush()


def peak_rss_kb() -> int:
    """This process's peak resident set size (``VmHWM``), in KiB; 0 where /proc is missing."""
    try:
        with open(f"/proc/{os.getpid()}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


class Started:
    """``started = Started()`` emits the ``started`` line; ``started.report(...)`` the final one
    with what `SINK` recorded and the CPU time used since."""

    def __init__(self) -> None:
        self.cpu0 = cpu_seconds()
        signal.signal(signal.SIGUSR2, self._forced)
        emit("started", t=time.time(), pid=os.getpid())

    def _forced(self, signum: int, frame: object) -> None:
        """The library did not stop on SIGTERM: report what the tasks recorded, and exit. No
        lock is taken: the interrupted code may hold one."""
        line = json.dumps({"event": "report", **self._fields(forced=True)}) + "\n"
        os.write(_protocol.fileno(), line.encode())
        os._exit(0)

    def _fields(self, **extra: Any) -> dict[str, Any]:
        s = SINK
        return {
            "count": s.count,
            "first_at": s.first_at,
            "latencies": list(s.latencies),
            "high_starts": list(s.high_starts),
            "low_before_high_done": s.low_before_high_done,
            "long_starts": list(s.long_starts),
            "long_ends": list(s.long_ends),
            "peak_rss_kb": peak_rss_kb(),
            "cpu_s": cpu_seconds() - self.cpu0,
            "extra": extra,
        }

    def report(self, **extra: Any) -> None:
        with SINK._lock:
            fields = self._fields(**extra)
        emit("report", **fields)


def on_sigterm(callback: Callable[[], object]) -> None:
    """Call ``callback`` (from the main thread) on SIGTERM or SIGINT, for workers whose library
    does not stop on them by itself."""

    def handler(signum: int, frame: object) -> None:
        callback()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
