"""What every periodic-scenario peer shares: its description for the harness (`PeerSpec`), its
command line, the schedule phases, and the in-process run recorder.

Stdlib only: the harness imports this in drumbeat's venv, the peers' processes in theirs.

A peer's process is ``python -m bench.periodic_peers.<module> ROLE --url ... --n ... --interval
... --anchor ... --runs-dir ...``. Schedule ``i`` (0 <= i < n) is due at ``anchor + phase(i) +
k * interval`` for whole ``k``: phases spread the schedules evenly over one interval, as
schedules added at different times would be, instead of all firing at once. A ``register`` role
(if the peer has one) writes the schedules and exits; every other role prints
``{"event": "started", ...}`` on stdout once it is running, then runs until SIGTERM.

Each run of a schedule is recorded in the process that runs it, as three doubles (schedule
index, due time or NaN where the system does not tell it, start time) appended to an in-memory
array that a thread writes to ``RUNS_DIR/<role>-<pid>.runs`` every half second; nothing about a
run goes to Redis or over a pipe, so the bookkeeping costs next to nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import threading
import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REBASED = (
    "not exposed; each next run is re-based on when the previous one was sent, so the k-th run "
    "of a schedule is matched to its k-th nominal due time (drift counts as lateness)"
)
"""`PeerSpec.due` of the systems matched by ``sequence``."""
FLUSH_SECONDS = 0.5

#: What `drumbeat`'s pool role tells the worker processes of `drumbeat_app` (set in their
#: environment before the app module is imported): where runs are recorded, the task's sleep.
RUNS_DIR_ENV = "BENCH_PERIODIC_RUNS_DIR"
SLEEP_ENV = "BENCH_PERIODIC_SLEEP"
"""How often a recording process writes its runs to its file."""
NAN = math.nan


@dataclass(frozen=True, slots=True)
class PeerSpec:
    """How the harness drives one system; every field is plain data."""

    name: str
    module: str
    """``bench.periodic_peers.<module>``."""
    venv: str
    """``"main"`` (drumbeat's own venv) or ``"peers"`` (`bench.peers_env`)."""
    roles: tuple[str, ...]
    """Long-running processes, started in this order (a role named ``worker`` is started
    ``--workers`` times)."""
    register: bool
    """Whether a ``register`` step writes the schedules to Redis (and exits)."""
    schedules_in_redis: bool
    """False where the schedules live only in a process (Redis memory per schedule is then
    not applicable)."""
    due_match: str
    """How a run is matched to its due time: ``exposed`` (the system tells it), ``grid`` or
    ``sequence`` (see `bench.periodic.match_runs`)."""
    due: str
    """How the due time of a run is known, for the report."""
    settings: str
    """The system's settings in this benchmark, for the report."""
    packages: tuple[str, ...] = ()
    """Distributions whose versions the report shows."""
    register_after_start: bool = False
    """Register while the roles run (as on a live system) instead of before starting them."""
    own_phases: bool = False
    """The system picks each schedule's phase itself (the anchor is unused; the due time of
    every run must then be exposed)."""
    phase_step: float = 0.0
    """Granularity of the phases the system can express (0: any; 1.0: whole seconds)."""
    max_n: int = 100_000
    """The largest N this system is run with (the 1,000,000 case only where it holds it)."""
    startup_seconds: float = 3.0
    seconds_per_schedule: float = 0.0
    """Rough registration plus startup cost, to set the first due time after both."""
    interval_divides_minute: bool = False
    """Cron-style systems can only express intervals that divide a minute (or whole minutes)."""
    notes: tuple[str, ...] = field(default_factory=tuple)

    def lead(self, n: int) -> float:
        """Seconds from now to put the first due time after registration and startup."""
        return self.startup_seconds + n * self.seconds_per_schedule


def phase(i: int, n: int, interval: float, step: float = 0.0) -> float:
    """Offset of schedule ``i``'s due times within an interval."""
    x = interval * i / n
    return math.floor(x / step) * step if step else x


def first_due(args: Args, i: int, step: float = 0.0) -> float:
    return args.anchor + phase(i, args.n, args.interval, step)


def cron_seconds(args: Args, i: int) -> list[int]:
    """The seconds of each minute at which schedule ``i`` is due, for cron-style systems
    (intervals that divide a minute, or whole minutes; phases in whole seconds)."""
    whole = math.floor(first_due(args, i))
    step = round(args.interval)
    return [s for s in range(60) if (s - whole) % step == 0] if step < 60 else [whole % 60]


# -- command line ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Args:
    role: str
    url: str
    n: int
    interval: float
    anchor: float
    """Wall-clock time (whole seconds) of the first due time of schedule 0."""
    runs_dir: Path
    concurrency: int


def parse_args(roles: Sequence[str], argv: Sequence[str] | None = None) -> Args:
    p = argparse.ArgumentParser()
    p.add_argument("role", choices=list(roles))
    p.add_argument("--url", required=True)
    p.add_argument("--n", type=int, required=True)
    p.add_argument("--interval", type=float, required=True)
    p.add_argument("--anchor", type=float, required=True)
    p.add_argument("--runs-dir", type=Path, required=True)
    p.add_argument("--concurrency", type=int, default=20)
    a = p.parse_args(argv)
    return Args(a.role, a.url, a.n, a.interval, a.anchor, a.runs_dir, a.concurrency)


def emit(event: str, **fields: Any) -> None:
    """One protocol line on the process's real stdout (flushed), even where the system under
    test has replaced ``sys.stdout`` (Celery sends it to its log)."""
    out = sys.__stdout__ or sys.stdout
    line = json.dumps({"event": event, "t": time.time(), "pid": os.getpid(), **fields})
    out.write(line + "\n")
    out.flush()


def emit_started(**fields: Any) -> None:
    emit("started", **fields)


def emit_registered(seconds: float, **fields: Any) -> None:
    emit("registered", seconds=seconds, **fields)


# -- recording -------------------------------------------------------------------------------


class Recorder:
    """Records runs in whichever process calls `record` (each forked child gets its own file).

    ``record`` is one ``array.extend`` of three floats: atomic under the GIL, so any number of
    threads may call it; a daemon thread appends what is new to the file every `FLUSH_SECONDS`.
    """

    def __init__(self, runs_dir: Path, role: str) -> None:
        self.runs_dir = runs_dir
        self.role = role
        self._pid = -1
        self._runs = array("d")
        self._missed = array("d")
        self._counters: dict[str, int] = {}
        self._counter_fns: list[Callable[[], dict[str, int]]] = []
        self._lock = threading.Lock()

    def _this_process(self) -> None:
        if self._pid == os.getpid():
            return
        with self._lock:
            if self._pid == os.getpid():
                return
            self._pid = os.getpid()
            self._runs = array("d")  # a forked child drops what its parent had recorded
            self._missed = array("d")
            threading.Thread(target=self._flush_loop, name="recorder", daemon=True).start()

    def record(self, schedule: float, due: float, start: float) -> None:
        """One run of schedule ``schedule``, due at ``due`` (NaN: unknown), started at ``start``."""
        if self._pid != os.getpid():
            self._this_process()
        self._runs.extend((schedule, due, start))

    def record_missed(self, schedule: float, due: float) -> None:
        """A run the system itself decided to skip (e.g. an APScheduler misfire)."""
        if self._pid != os.getpid():
            self._this_process()
        self._missed.extend((schedule, due))

    def counters(self, fn: Callable[[], dict[str, int]]) -> None:
        """A function whose counters are written beside the runs (at every flush)."""
        self._this_process()
        self._counter_fns.append(fn)

    def path(self, suffix: str) -> Path:
        return self.runs_dir / f"{self.role}-{os.getpid()}.{suffix}"

    def _flush_loop(self) -> None:
        while True:
            time.sleep(FLUSH_SECONDS)
            self.flush()

    def flush(self) -> None:
        if self._pid != os.getpid():
            return
        with self._lock:
            _append(self._runs, 3, self.path("runs"))
            _append(self._missed, 2, self.path("missed"))
            if self._counter_fns:
                counters: dict[str, int] = {}
                for fn in self._counter_fns:
                    counters.update(fn())
                tmp = self.path("counters.tmp")
                tmp.write_text(json.dumps(counters))
                tmp.replace(self.path("counters"))


def _append(buf: array[float], width: int, path: Path) -> None:
    n = len(buf)
    n -= n % width
    if not n:
        return
    chunk = buf[:n]  # copying and deleting a slice are each atomic under the GIL, and other
    del buf[:n]  # threads only ever append, so nothing recorded meanwhile is lost
    with open(path, "ab") as f:
        chunk.tofile(f)


_recorder: Recorder | None = None


def use_recorder(args: Args) -> Recorder:
    """The process-wide recorder of this role (for tasks that the system imports by name)."""
    global _recorder  # noqa: PLW0603
    _recorder = Recorder(args.runs_dir, args.role)
    return _recorder


def record_run(i: int) -> None:
    """A no-op task that records its run, importable by name (``bench.periodic_peers._common.
    record_run``) by systems that look their tasks up by module path (RQ)."""
    assert _recorder is not None, "use_recorder() first"
    _recorder.record(i, NAN, time.time())


def read_runs(runs_dir: Path) -> tuple[array[float], array[float], dict[str, int]]:
    """Everything the processes of one run recorded: runs, missed runs and summed counters."""
    runs, missed = array("d"), array("d")
    counters: dict[str, int] = {}
    for path in sorted(runs_dir.iterdir()):
        if path.suffix == ".runs":
            _read_into(runs, path, 3)
        elif path.suffix == ".missed":
            _read_into(missed, path, 2)
        elif path.suffix == ".counters":
            for k, v in json.loads(path.read_text()).items():
                counters[k] = counters.get(k, 0) + int(v)
    return runs, missed, counters


def _read_into(buf: array[float], path: Path, width: int) -> None:
    data = path.read_bytes()
    record = width * buf.itemsize
    buf.frombytes(data[: len(data) - len(data) % record])  # a process killed mid-write
