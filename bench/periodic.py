"""Periodic lateness, side by side: N schedules every few seconds with a no-op task, per system.

    python -m bench.periodic [--quick] [--systems a,b] [--n 1000,10000,100000,1000000@60]
                             [--interval 5] [--duration 60] [--repeat N] [--workers 1]
                             [--concurrency 20] [--out bench/results] [--note TEXT]
    python -m bench.periodic --render A.json B.json ...   # one report from results files

For each system and N (``N@S`` sets that case's interval), on a fresh private redis-server:
register N schedules (phases spread evenly over one interval), start the system's processes,
leave one interval of warm-up, then measure for ``--duration`` seconds: runs/s achieved against
the ideal N/interval, duplicate runs (two runs for one due time), lateness (start - due)
p50/p99/max, CPU seconds of every process of the system and of Redis, and Redis memory per
schedule. Runs are recorded in the processes that run them and read from files at the end
(`bench.periodic_peers._common`); how a run is matched to its due time depends on what the
system tells (`match_runs`). Every run is bounded: a system that cannot keep up reports what it
achieved, and its processes are stopped (then killed) a grace period after the window.

Each system is a module of `bench.periodic_peers`; drumbeat and the naive design run in this
venv, the other peers in the peers' venv (`bench.peers_env`). ``--quick`` (drumbeat and naive,
1,000 schedules, a 20 s window) needs nothing else and takes about a minute. The 1,000,000
case runs only for systems whose `PeerSpec.max_n` allows it, unless ``--systems`` names them.
Writes ``periodic-<UTC time>.md``, ``.json`` and (`bench.charts`, with matplotlib here or in
the peers' venv) ``.png`` to ``--out``; ``--quick`` runs are named ``periodic-quick-*``. Exit
status 1 if a run failed (a process crashed, or no run started at all).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import math
import os
import platform
import queue
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from array import array
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import IO, Any

from ._redis import RedisServer
from .core import _git_revision
from .machine import cpu_model
from .periodic_peers import MODULES, spec
from .periodic_peers._common import PeerSpec, phase, read_runs

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
DEFAULT_CASES = "1000,10000,100000,1000000@60"
QUICK_SYSTEMS = ("drumbeat", "naive")
GRACE = 2.0
"""Seconds after the window before the processes are told to stop (recorders flush every 0.5 s)."""
STOP_TIMEOUT = 10.0
"""Seconds a process gets to exit after SIGTERM before its process group is killed."""
REGISTER_TIMEOUT = 900.0
TOLERANCE = 0.02
"""Seconds a run may start before its nominal due time and still be matched to it (clock
rounding: the systems matched this way never fire early on purpose)."""


@dataclass(frozen=True, slots=True)
class Case:
    n: int
    interval: float

    @property
    def label(self) -> str:
        return f"{self.n:,} every {self.interval:g} s"


@dataclass(frozen=True, slots=True)
class Config:
    systems: tuple[str, ...]
    cases: tuple[Case, ...]
    duration: float = 60.0
    repeat: int = 1
    workers: int = 1
    concurrency: int = 20
    quick: bool = False
    note: str = ""
    processes: int = 0
    """drumbeat only: each worker role is a supervisor of this many processes (0: the worker
    runs in the role's process)."""
    autoscale: str = ""
    """drumbeat only: ``MIN:MAX``, each worker role a supervisor that autoscales."""
    task_sleep: float = 0.0
    """drumbeat only: seconds the task awaits after recording its start (a monitor's I/O)."""
    cold: float = 0.0
    """Seconds between the end of registration and the start of the system's processes: with
    at least one interval, every schedule is due when they start (a deploy onto a filled
    Redis)."""
    limited: bool = False
    """drumbeat only: every schedule ``concurrency_limit=1, limit_by="i"`` (its argument), and
    every tenth routed to another queue its workers serve too."""
    squeeze: float = 0.0
    """Seconds at the start of the window during which busy-looping processes (`hogs` per
    CPU) take their share of the machine (capacity taken away, then given back): `recovery_s`
    says when lateness came back down."""
    hogs: int = 1
    """Busy-looping processes per CPU while squeezed: 1 takes about half the machine from a
    busy system; more push it past its capacity."""

    def drumbeat_flags(self) -> list[str]:
        flags = ["--processes", str(self.processes)] if self.processes else []
        flags += ["--autoscale", self.autoscale] if self.autoscale else []
        flags += ["--limited"] if self.limited else []
        return flags + (["--task-sleep", f"{self.task_sleep:g}"] if self.task_sleep else [])


@dataclass(slots=True)
class Outcome:
    """One repetition of one system at one case."""

    system: str
    case: Case
    repetition: int
    metrics: dict[str, float] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    skipped: str = ""


class RunFailed(RuntimeError):
    """The system could not be set up or run at all for this case; reported, the bench goes on."""


# -- processes ---------------------------------------------------------------------------------


class Proc:
    """One process of a system under test, in its own process group, speaking JSON lines."""

    def __init__(self, label: str, argv: Sequence[str], env: Mapping[str, str]) -> None:
        self.label = label
        self.argv = list(argv)
        self._stderr: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115 (closed in `close`)
        self.proc = subprocess.Popen(
            self.argv, cwd=REPO, env=dict(env), stdout=subprocess.PIPE, stderr=self._stderr,
            text=True, start_new_session=True,
        )  # fmt: skip
        self.pid = self.proc.pid
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:  # read everything, so the child never blocks on stdout
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    self.events.put(json.loads(line))
        self.events.put({"event": "exited"})

    def wait_event(self, name: str, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RunFailed(f"{self.label}: no {name!r} within {timeout:.0f} s")
            try:
                event = self.events.get(timeout=left)
            except queue.Empty:
                continue
            if event.get("event") == name:
                return event
            if event.get("event") == "exited":
                code = self.proc.wait()
                raise RunFailed(f"{self.label} exited with {code} before {name!r}\n{self.tail()}")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def terminate(self) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)

    def kill_group(self) -> None:
        """SIGKILL whatever is left of this process's group (its own children included)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)

    def tail(self, lines: int = 15) -> str:
        self._stderr.seek(0)
        text = self._stderr.read().decode(errors="replace").splitlines()[-lines:]
        return "\n".join(f"    {x}" for x in text) if text else "    (stderr empty)"

    def close(self) -> None:
        self._stderr.close()


def stop_all(procs: Sequence[Proc]) -> list[str]:
    """SIGTERM all, wait, then kill the groups; returns notes on processes that had to be killed."""
    notes: list[str] = []
    for p in procs:
        p.terminate()
    deadline = time.monotonic() + STOP_TIMEOUT
    for p in procs:
        try:
            p.proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            notes.append(f"{p.label} did not exit within {STOP_TIMEOUT:g} s of SIGTERM: killed")
        p.kill_group()
    return notes


# -- /proc accounting --------------------------------------------------------------------------

_TICK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def group_usage(pgids: Mapping[int, str]) -> dict[str, tuple[float, int]]:
    """CPU seconds (user + system, reaped children included) and RSS bytes of every live process
    in the given process groups, summed per label."""
    found: dict[str, tuple[float, int]] = {label: (0.0, 0) for label in pgids.values()}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                text = f.read()
        except OSError:
            continue
        rest = text[text.rindex(")") + 2 :].split()
        label = pgids.get(int(rest[2]))
        if label is None:
            continue
        cpu = sum(int(x) for x in rest[11:15]) / _TICK
        rss = int(rest[21]) * _PAGE
        c, r = found[label]
        found[label] = (c + cpu, r + rss)
    return found


def group_counts(pgids: Mapping[int, str]) -> dict[str, int]:
    """Live processes in the given process groups, per label (a supervisor's workers included)."""
    found = dict.fromkeys(pgids.values(), 0)
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                text = f.read()
        except OSError:
            continue
        rest = text[text.rindex(")") + 2 :].split()
        label = pgids.get(int(rest[2]))
        if label is not None and rest[0] != "Z":
            found[label] += 1
    return found


# -- one run -----------------------------------------------------------------------------------


def peers_python() -> Path:
    """The peers' venv interpreter (created by `bench.peers_env` on first use)."""
    from .peers_env import peers_python as find

    return Path(find())


def python_for(s: PeerSpec) -> str:
    return sys.executable if s.venv == "main" else str(peers_python())


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if "PYTHONPATH" in env else "")
    env.pop("VIRTUAL_ENV", None)
    return env


def _redis_counters(client: Any) -> tuple[float, int, dict[str, tuple[int, int]]]:
    """Redis's CPU seconds (user + system), commands run so far (inside scripts too), and
    (calls, usec) per command (`INFO commandstats`; EVALSHA's usec includes its inner calls)."""
    cpu = client.info("cpu")
    stats = {
        name.removeprefix("cmdstat_"): (int(v["calls"]), int(v["usec"]))
        for name, v in client.info("commandstats").items()
    }
    commands = sum(calls for calls, _ in stats.values())
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]), commands, stats


def _used_memory(client: Any) -> int:
    return int(client.info("memory")["used_memory"])


def _sleep_until(
    t: float, procs: Sequence[Proc], outcome: Outcome, tick: Callable[[], object] | None = None
) -> None:
    """Sleep until wall-clock ``t``, noting any process that dies meanwhile; ``tick`` is called
    every half second."""
    dead = {p.label for p in procs if not p.alive()}
    while True:
        left = t - time.time()
        if left <= 0:
            return
        time.sleep(min(left, 0.5))
        if tick is not None:
            tick()
        for p in procs:
            if p.label not in dead and not p.alive():
                dead.add(p.label)
                outcome.errors.append(
                    f"{p.label} exited with {p.proc.returncode} during the run\n{p.tail()}"
                )


def _squeeze(t: float, procs: Sequence[Proc], outcome: Outcome, per_cpu: int = 1) -> None:
    """Until wall-clock ``t`` (not at all for 0), ``per_cpu`` processes per CPU spin (nice 0,
    as the system's own processes: one per CPU takes about half the machine from a busy
    system)."""
    if not t:
        return
    n = (os.cpu_count() or 1) * per_cpu
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        _sleep_until(t, procs, outcome)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


@dataclass(slots=True)
class Trial:
    """One repetition of one system at one case, while it runs: its Redis, processes, times."""

    spec: PeerSpec
    case: Case
    cfg: Config
    out: Outcome
    url: str
    client: Any
    runs_dir: Path
    anchor: float
    procs: list[Proc] = field(default_factory=list)

    @property
    def python(self) -> str:
        return python_for(self.spec)

    def argv(self, role: str) -> list[str]:
        c = self.case
        return [self.python, "-m", f"bench.periodic_peers.{self.spec.module}", role,
                "--url", self.url, "--n", str(c.n), "--interval", f"{c.interval:g}",
                "--anchor", f"{self.anchor:.0f}", "--runs-dir", str(self.runs_dir),
                "--concurrency", str(self.cfg.concurrency),
                *(self.cfg.drumbeat_flags() if self.spec.name == "drumbeat" else [])]  # fmt: skip

    def register(self) -> None:
        """The ``register`` step: write the N schedules, wait for it to exit, note memory."""
        reg = Proc(f"{self.spec.name} register", self.argv("register"), _env())
        self.procs.append(reg)
        event = reg.wait_event("registered", REGISTER_TIMEOUT)
        reg.proc.wait(60)
        self.out.metrics["register_s"] = float(event["seconds"])
        self.out.metrics["memory_registered"] = _used_memory(self.client)

    def start(self) -> list[Proc]:
        """Starts every long-running process and waits until each has reported it started."""
        s, m = self.spec, self.out.metrics
        live: list[Proc] = []
        for role in s.roles:
            for k in range(self.cfg.workers if role == "worker" else 1):
                label = f"{s.name} {role}" + (f" {k + 1}" if self.cfg.workers > 1 else "")
                live.append(Proc(label, self.argv(role), _env()))
        self.procs += live
        for p in live:
            event = p.wait_event("started", 120 + self.case.n * s.seconds_per_schedule * 4)
            if "register_s" in event:  # the schedules were registered by the process itself
                m["register_s"] = float(event["register_s"])
        return live

    def run(self) -> tuple[float, float]:
        """Registers, starts, measures the window, stops; returns the window."""
        s, case, out, m = self.spec, self.case, self.out, self.out.metrics
        memory0 = _used_memory(self.client)
        # A cold start registers first whatever the system's habit (drumbeat's worker starts
        # first, as a deploy's would, then the schedules are registered).
        before = s.register and (not s.register_after_start or self.cfg.cold > 0)
        if before:
            self.register()
            time.sleep(self.cfg.cold)
        t_start = time.time()
        live = self.start()
        if s.register and not before:
            memory0 = _used_memory(self.client)
            self.register()
        t_ready = time.time()
        m["startup_s"] = t_ready - t_start
        m["memory_ready"] = _used_memory(self.client)
        if s.schedules_in_redis:
            registered = m.get("memory_registered", m["memory_ready"])
            m["memory_per_schedule"] = (registered - memory0) / case.n
        if t_ready > self.anchor and not s.own_phases:
            out.notes.append(
                f"ready {t_ready - self.anchor:.1f} s after the first runs were due "
                f"(registration and startup took longer than the {s.lead(case.n):.0f} s "
                "allowed); the warm-up interval absorbs part of the backlog"
            )
        first = t_ready if s.own_phases else max(self.anchor, t_ready)
        window0 = first + case.interval  # one interval of warm-up
        window1 = window0 + self.cfg.duration
        pgids = {p.pid: p.label.split()[1] for p in live}
        _sleep_until(window0, live, out)
        usage0, redis0 = group_usage(pgids), _redis_counters(self.client)
        counts: list[dict[str, int]] = []
        squeeze_end = window0 + self.cfg.squeeze if self.cfg.squeeze else 0.0
        _squeeze(squeeze_end, live, out, self.cfg.hogs)
        _sleep_until(window1, live, out, lambda: counts.append(group_counts(pgids)))
        for role in dict.fromkeys(pgids.values()):
            seen = [c[role] for c in counts]
            if seen:  # a supervisor's pool: how many processes it ran in the window
                m[f"procs_{role}_max"] = max(seen)
                m[f"procs_{role}_mean"] = statistics.fmean(seen)
        usage1, redis1 = group_usage(pgids), _redis_counters(self.client)
        died = {p.label.split()[1] for p in live if not p.alive()}  # its CPU time went with it
        m["memory_end"] = _used_memory(self.client)
        m["load_1m_end"] = os.getloadavg()[0]
        _sleep_until(window1 + GRACE, live, out)
        out.notes += stop_all(live)
        for role, (cpu1, rss1) in usage1.items():
            if role in died:
                continue
            m[f"cpu_{role}_s"] = cpu1 - usage0.get(role, (0.0, 0))[0]
            m[f"rss_{role}_mib"] = rss1 / 2**20
        m["redis_cpu_s"] = redis1[0] - redis0[0]
        m["redis_commands"] = redis1[1] - redis0[1]
        for name, (calls1, usec1) in redis1[2].items():
            calls0, usec0 = redis0[2].get(name, (0, 0))
            if calls1 > calls0:  # per command in the window, for the breakdown per run
                m[f"cmd_calls_{name}"] = calls1 - calls0
                m[f"cmd_usec_{name}"] = usec1 - usec0
        return window0, window1


def run_one(s: PeerSpec, case: Case, cfg: Config, repetition: int) -> Outcome:
    out = Outcome(s.name, case, repetition)
    out.metrics["load_1m_start"] = os.getloadavg()[0]
    runs_dir = Path(tempfile.mkdtemp(prefix=f"drumbeat-periodic-{s.module}-"))
    anchor = float(math.ceil(time.time() + s.lead(case.n)))
    trial: Trial | None = None
    try:
        with RedisServer() as server, server.client() as client:
            trial = Trial(s, case, cfg, out, server.url, client, runs_dir, anchor)
            window = trial.run()
        analyse(out, s, runs_dir, anchor=anchor, window=window, squeeze=cfg.squeeze)
    except RunFailed as exc:
        out.errors.append(str(exc))
    finally:
        for p in trial.procs if trial else []:
            if p.alive():
                p.kill_group()
            p.close()
        shutil.rmtree(runs_dir, ignore_errors=True)
    return out


# -- analysis ----------------------------------------------------------------------------------


@dataclass(slots=True)
class Matched:
    """Runs matched to their due times: one entry per counted run (duplicates left out)."""

    schedule: array[int] = field(default_factory=lambda: array("q"))
    start: array[float] = field(default_factory=lambda: array("d"))
    late: array[float] = field(default_factory=lambda: array("d"))
    """Start minus the nominal due time (see `match_runs`)."""
    late_own: array[float] = field(default_factory=lambda: array("d"))
    """Start minus the due time the system itself gave the run (NaN where not exposed)."""
    duplicates: int = 0
    unknown: int = 0


def match_runs(
    runs: array[float], *, n: int, interval: float, first: Callable[[int], float], mode: str
) -> Matched:
    """Matches every recorded run (schedule, due or NaN, start) to the due time it was for.

    ``mode`` (`PeerSpec.due_match`): ``exposed``, the due time the system gave the run;
    ``grid``, the latest slot ``first(i) + k * interval`` at or before the start (systems on a
    fixed grid that may skip slots); ``sequence``, the k-th run of a schedule is for its k-th
    slot (systems that re-base each next run on the previous one: they never skip a run, and
    their drift behind the grid is lateness); ``first-run``, as ``sequence`` but from the
    schedule's own phase, that of its earliest run on a grid counted from its first run
    (systems that pick every schedule's phase themselves and do not tell it). A
    duplicate is a further run for a due time already run: the same exposed due time, the same
    grid slot, or (``sequence``/``first-run`` without exposed due times) a run less than half an
    interval after the previous one.
    """
    out = Matched()
    by_schedule: dict[int, list[tuple[float, float]]] = {}
    for k in range(0, len(runs), 3):
        sid = int(runs[k])
        if 0 <= sid < n:
            by_schedule.setdefault(sid, []).append((runs[k + 2], runs[k + 1]))
        else:
            out.unknown += 1
    tolerance = min(TOLERANCE, 0.05 * interval)
    for sid, found in by_schedule.items():
        found.sort()
        f = found[0][0] if mode == "first-run" else first(sid)
        mine = len(out.late)
        seen: set[int] = set()
        previous = -math.inf
        for start, due in found:
            exposed = not math.isnan(due)
            if mode == "exposed" and not exposed:
                out.unknown += 1
                continue
            slot = f + math.floor((start - f + tolerance) / interval) * interval
            # a schedule's own phase is only known to within a tick (Taskiq sends on whole
            # seconds, so its first run can start a little after a later run's phase): its
            # runs are told apart by the half-interval rule alone
            key = len(seen) if mode == "first-run" else round((due if exposed else slot) * 1000)
            if key in seen or (
                mode in ("sequence", "first-run")
                and not exposed
                and start - previous < interval / 2
            ):
                out.duplicates += 1
                continue
            seen.add(key)
            if mode == "exposed":
                nominal = due
            elif mode == "grid":
                nominal = slot
            else:
                nominal = f + (len(seen) - 1) * interval
            previous = start
            out.schedule.append(sid)
            out.start.append(start)
            out.late.append(start - nominal)
            out.late_own.append(start - due if exposed else math.nan)
        if mode == "first-run" and len(out.late) > mine:
            # the schedule's phase is that of its earliest run relative to the k * interval
            # grid, so lateness is never negative and the first run's own delay is not the base
            base = min(out.late[mine:])
            for k in range(mine, len(out.late)):
                out.late[k] -= base
    return out


def analyse(
    out: Outcome,
    s: PeerSpec,
    runs_dir: Path,
    *,
    anchor: float,
    window: tuple[float, float],
    squeeze: float = 0.0,
) -> None:
    """Turns the recorded runs into the metrics (see the module docstring of `bench.periodic`)."""
    runs, missed, counters = read_runs(runs_dir)
    case, (w0, w1) = out.case, window
    n, interval = case.n, case.interval

    def first(sid: int) -> float:
        return anchor + phase(sid, n, interval, s.phase_step)

    matched = match_runs(runs, n=n, interval=interval, first=first, mode=s.due_match)
    inside = [k for k, t in enumerate(matched.start) if w0 <= t < w1]
    lateness = [matched.late[k] for k in inside]
    own = [x for x in (matched.late_own[k] for k in inside) if not math.isnan(x)]
    ran = {matched.schedule[k] for k in inside}
    unknown = matched.unknown
    m = out.metrics
    duration = w1 - w0
    m["ideal_rate"] = n / interval
    m["runs"] = len(lateness)
    m["rate"] = len(lateness) / duration
    m["pct_ideal"] = 100 * m["rate"] / m["ideal_rate"]
    if lateness and m["pct_ideal"] < SHORT_PCT:  # where in the window the runs went missing
        per_second = [0] * math.ceil(duration)
        for k in inside:
            per_second[min(int(matched.start[k] - w0), len(per_second) - 1)] += 1
        out.notes.append(
            f"{m['pct_ideal']:.1f} % of the ideal runs; runs started in each second of the "
            f"window (ideal {n / interval:,.0f}): " + ", ".join(f"{c:,}" for c in per_second)
        )
    m["runs_total"] = len(runs) // 3
    m["duplicates"] = matched.duplicates
    m["starved"] = n - len(ran)
    m["missed"] = sum(1 for k in range(1, len(missed), 2) if w0 <= missed[k] < w1)
    for name, value in counters.items():
        m[f"counter_{name}"] = value
    if unknown:
        out.errors.append(f"{unknown} runs of schedules outside 0..{n - 1} or without a due time")
    cpu = sum(v for k, v in m.items() if k.startswith("cpu_"))
    m["cpu_procs_s"] = cpu
    m["cpu_total_s"] = cpu + m.get("redis_cpu_s", 0.0)
    if not lateness:
        if not runs:  # nothing ran at all: the adapter or the system is broken
            out.errors.append("no run started, in the window or before it")
        else:  # a result: the system fell so far behind that nothing it ran was in the window
            out.notes.append(
                f"no run started in the measured window ({len(runs) // 3} before it): "
                "its lateness counts as beyond the window in the medians"
            )
        return
    m["commands_per_run"] = m.get("redis_commands", 0) / len(lateness)
    if "redis_cpu_s" in m:  # the ceiling of one Redis core: runs/s = 1e6 / this
        m["redis_us_per_run"] = m["redis_cpu_s"] * 1e6 / len(lateness)
    # The system's own processes per run (the bench's recording in the task included): with
    # Redis's, what one run costs the machine.
    m["procs_us_per_run"] = cpu * 1e6 / len(lateness)
    if squeeze:
        starts = [matched.start[k] - w0 for k in inside]
        m.update(recovery(starts, lateness, squeeze, duration))
    for prefix, values in (
        ("late", lateness),
        ("late_own", own if s.due_match != "exposed" else []),
    ):
        if values:
            ordered = sorted(values)
            m[f"{prefix}_p50"] = _percentile(ordered, 50)
            m[f"{prefix}_p99"] = _percentile(ordered, 99)
            m[f"{prefix}_max"] = ordered[-1]
            m[f"{prefix}_min"] = ordered[0]


#: Below this % of the ideal runs, a run's report says how many started in each second.
SHORT_PCT = 99.5

#: Lateness (s) under which a second's runs count as on time again after a squeeze.
RECOVERED_S = 0.1


def recovery(
    starts: Sequence[float], lateness: Sequence[float], squeeze: float, duration: float
) -> dict[str, float]:
    """After capacity was taken away for the window's first ``squeeze`` seconds: the p99
    lateness of the runs that started then, how long after its end lateness came back down
    (``recovery_s``: from then on every second's p99 is at most `RECOVERED_S`; the rest of the
    window when it never did) and the p99 lateness of the runs after that. ``starts`` are
    seconds into the window."""
    seconds = math.ceil(duration)
    per_second: list[list[float]] = [[] for _ in range(seconds)]
    for start, late in zip(starts, lateness, strict=True):
        if 0 <= start < seconds:
            per_second[int(start)].append(late)
    p99 = [_percentile(sorted(v), 99) if v else 0.0 for v in per_second]
    late_since = max((i + 1 for i, x in enumerate(p99) if x > RECOVERED_S), default=0)
    end = math.ceil(squeeze)
    out = {"recovery_s": max(0.0, min(float(seconds), float(late_since)) - squeeze)}
    during = sorted(x for t, x in zip(starts, lateness, strict=True) if t < squeeze)
    after = sorted(x for t, x in zip(starts, lateness, strict=True) if t >= max(end, late_since))
    if during:
        out["late_p99_squeezed"] = _percentile(during, 99)
    if after:
        out["late_p99_recovered"] = _percentile(after, 99)
    return out


def _percentile(ordered: Sequence[float], q: float) -> float:
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


# -- report ------------------------------------------------------------------------------------


def _fmt(v: float | None, digits: int = 0, suffix: str = "") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:,.{digits}f}{suffix}"


def _median(outcomes: Sequence[Outcome], key: str) -> float | None:
    """The median over repetitions; a repetition that ran nothing in the window counts as
    infinitely late, so one lucky repetition cannot stand for two that delivered nothing."""
    ok = [o for o in outcomes if not o.errors]
    values = [o.metrics[key] for o in ok if key in o.metrics]
    if key.startswith("late_") and values:
        values += [math.inf for o in ok if o.metrics.get("runs") == 0]
    if not values:
        values = [o.metrics[key] for o in outcomes if key in o.metrics]
    return statistics.median(values) if values else None


def grouped(outcomes: Sequence[Outcome]) -> Iterator[tuple[str, Case, list[Outcome]]]:
    keys: list[tuple[str, Case]] = []
    for o in outcomes:
        if (o.system, o.case) not in keys:
            keys.append((o.system, o.case))
    for system, case in keys:
        yield system, case, [o for o in outcomes if o.system == system and o.case == case]


def table_lines(outcomes: Sequence[Outcome]) -> list[str]:
    lines = [
        "| system | schedules | ideal runs/s | achieved runs/s | % of ideal | duplicates | "
        "lateness p50 | p99 | max | CPU s (system + Redis) | Redis CPU µs/run | "
        "Redis B/schedule | register s | load 1m | runs |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for system, case, group in grouped(outcomes):
        if group[0].skipped:
            lines.append(f"| {system} | {case.label} | not run: {group[0].skipped} ||||||||||||||")
            continue

        def med(key: str, group: list[Outcome] = group) -> float | None:
            return _median(group, key)

        ok = sum(1 for o in group if not o.errors)
        procs, redis_cpu = med("cpu_procs_s"), med("redis_cpu_s")
        cpu = f"{_fmt(med('cpu_total_s'), 1)} ({_fmt(procs, 1)} + {_fmt(redis_cpu, 1)})"
        memory = med("memory_per_schedule")
        lines.append(
            f"| {system} | {case.label} | {_fmt(med('ideal_rate'))} | {_fmt(med('rate'))} | "
            f"{_fmt(med('pct_ideal'), 1)} | {_fmt(med('duplicates'))} | "
            f"{_late(med('late_p50'))} | {_late(med('late_p99'))} | {_late(med('late_max'))} | "
            f"{cpu} | {_fmt(med('redis_us_per_run'), 1)} | "
            f"{_fmt(memory) if memory is not None else 'in process'} | "
            f"{_fmt(med('register_s'), 1)} | {_fmt(med('load_1m_start'), 2)} | "
            f"{ok}/{len(group)}{' **failed**' if ok < len(group) else ''} |"
        )
    return lines


def squeeze_lines(outcomes: Sequence[Outcome]) -> list[str]:
    """Per repetition, lateness while capacity was taken away and how soon it came back down
    (`recovery`); nothing without ``--squeeze``."""
    rows = [o for o in outcomes if "recovery_s" in o.metrics]
    if not rows:
        return []
    lines = [
        "## Capacity taken away, then given back",
        "",
        "| system | schedules | # | % of ideal | duplicates | p99 while squeezed | recovered after "
        "| p99 after |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for o in rows:
        m = o.metrics
        lines.append(
            f"| {o.system} | {o.case.label} | {o.repetition} | {_fmt(m.get('pct_ideal'), 1)} | "
            f"{_fmt(m.get('duplicates'))} | {_late(m.get('late_p99_squeezed'))} | "
            f"{m['recovery_s']:.0f} s | {_late(m.get('late_p99_recovered'))} |"
        )
    return [*lines, ""]


def detail_lines(outcomes: Sequence[Outcome]) -> list[str]:
    """Where the time went: CPU per process kind, Redis commands per run, memory, starvation."""
    lines = [
        "| system | schedules | CPU s by process | processes' CPU µs/run | Redis commands/run | "
        "RSS MiB | "
        "schedules with no run in the window | runs the system skipped | lateness vs the "
        "system's own due time p50 / p99 | startup s | processes in the window, mean / max |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for system, case, group in grouped(outcomes):
        if group[0].skipped:
            continue
        done = [o for o in group if "rate" in o.metrics] or group
        m = done[len(done) // 2].metrics  # the median repetition by position; extra keys vary
        roles = sorted(k[4:-2] for k in m if k.startswith("cpu_") and k.endswith("_s"))
        roles = [r for r in roles if r not in ("procs", "total")]
        cpu = ", ".join(f"{r} {m[f'cpu_{r}_s']:.1f}" for r in roles)
        cpu += f", Redis {m['redis_cpu_s']:.1f}" if "redis_cpu_s" in m else ""
        rss = sum(v for k, v in m.items() if k.startswith("rss_"))
        skipped = m.get("missed", 0) or m.get("counter_missed")
        own = (
            f"{_late(m['late_own_p50'])} / {_late(m['late_own_p99'])}"
            if "late_own_p50" in m
            else "-"
        )
        lines.append(
            f"| {system} | {case.label} | {cpu or '-'} | {_fmt(m.get('procs_us_per_run'), 1)} | "
            f"{_fmt(m.get('commands_per_run'), 1)} | "
            f"{_fmt(rss)} | {_fmt(m.get('starved'))} | {_fmt(skipped) if skipped else '0'} | "
            f"{own} | {_fmt(m.get('startup_s'), 1)} | {_procs(m)} |"
        )
    return lines


def command_lines(outcomes: Sequence[Outcome], top: int = 12) -> list[str]:
    """Where Redis's time went, per run: `INFO commandstats` over the window (median
    repetition). A script's usec (evalsha) includes the commands it runs, which are listed too;
    Redis CPU beyond the commands' usec is reading, parsing and replying."""
    lines: list[str] = []
    for system, case, group in grouped(outcomes):
        done = [o for o in group if o.metrics.get("runs") and "cmd_calls_evalsha" in o.metrics]
        if not done:
            continue
        m = done[len(done) // 2].metrics
        runs = m["runs"]
        names = sorted(
            (k.removeprefix("cmd_usec_") for k in m if k.startswith("cmd_usec_")),
            key=lambda name: -m[f"cmd_usec_{name}"],
        )
        if not lines:
            lines = [
                "| system | schedules | command | calls/run | µs/run | µs/call |",
                "|---|---:|---|---:|---:|---:|",
            ]
        lines.append(
            f"| {system} | {case.label} | Redis CPU (INFO used_cpu) | | "
            f"{_fmt(m.get('redis_us_per_run'), 1)} | |"
        )
        for name in names[:top]:
            calls, usec = m[f"cmd_calls_{name}"], m[f"cmd_usec_{name}"]
            lines.append(
                f"| {system} | {case.label} | {name} | {calls / runs:.2f} | "
                f"{usec / runs:.2f} | {usec / calls:.2f} |"
            )
    return lines


def _procs(m: Mapping[str, float]) -> str:
    """Processes of every role over the window (sampled every 0.5 s), mean / max."""
    roles = sorted(k[6:-4] for k in m if k.startswith("procs_") and k.endswith("_max"))
    if not roles:
        return "-"
    mean = sum(m[f"procs_{r}_mean"] for r in roles)
    return f"{mean:.1f} / {sum(m[f'procs_{r}_max'] for r in roles):.0f}"


def _late(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if math.isinf(seconds):
        return "no run"
    return f"{seconds * 1000:,.0f} ms" if abs(seconds) < 10 else f"{seconds:,.1f} s"


def problem_lines(outcomes: Sequence[Outcome]) -> list[str]:
    lines: list[str] = []
    for o in outcomes:
        for kind, texts in (("error", o.errors), ("note", o.notes)):
            for text in texts:
                first, *rest = text.splitlines()
                lines.append(f"- {o.system}, {o.case.label}, #{o.repetition} {kind}: {first}")
                if rest:
                    lines += ["", "  ```", *(f"  {x}" for x in rest), "  ```", ""]
    return lines


def method_lines(specs: Sequence[PeerSpec], cfg: Config) -> list[str]:
    lines = [
        "- Schedules: schedule i of N is due at A + interval * i / N + k * interval (whole "
        "seconds for systems that only store whole seconds; drumbeat picks phases itself, from a "
        "hash of the id), so due times spread evenly over each interval. A is set after the "
        "expected registration and startup time.",
        f"- Window: {cfg.duration:g} s, starting one interval (warm-up) after the later of A and "
        "the moment every process reported it had started (and, for drumbeat, registration "
        "ended). A run counts when it starts in the window, once per schedule and due time.",
        "- Lateness = start - due, for runs that start in the window. The due time is the one "
        "the system gave the run where it tells it (drumbeat, arq, SAQ); else the nominal one, "
        "first due + k * interval: for APScheduler and streaq, whose triggers keep to that grid "
        "(APScheduler skips the runs it misfires), the latest slot at or before the start "
        f"({TOLERANCE * 1000:g} ms of tolerance for rounding); for systems that re-base each "
        "next run on when the previous one ran or was sent (Celery beat, RedBeat, rq-scheduler, "
        "RQ cron, the naive design), the k-th run of a schedule is matched to its k-th nominal "
        "due time, so their drift behind the grid counts as lateness, as it does against 'every "
        "5 s'; for Taskiq, whose interval schedules all start on the scheduler's first tick and "
        "which does not tell due times, the k-th run is matched to the schedule's first run + "
        "k * interval, and lateness is counted from the schedule's earliest run on that grid. "
        "The naive design's lateness against the score it claimed is in Details.",
        "- Duplicates: further runs of one schedule for a due time that already ran (the same "
        "due time the system gave, the same grid slot, or, re-based without a known due time, a "
        "run less than half an interval after the previous one), over the whole run; not "
        "counted as runs.",
        "- CPU: user + system seconds within the window of every process of the system (their "
        "children included, from /proc) plus Redis (INFO used_cpu_user/sys).",
        "- Redis memory per schedule: used_memory after registering minus before, over N "
        "('in process': the schedules live only in a process's memory).",
        "- Processes in the window: the live processes of the system's process groups (a "
        "supervisor and its workers counted), sampled every 0.5 s.",
        "",
        "| system | settings | due time of a run |",
        "|---|---|---|",
    ]
    lines += [f"| {s.name} | {s.settings} | {s.due} |" for s in specs]
    notes = [f"- {s.name}: {note}" for s in specs for note in s.notes]
    return lines + (["", *notes] if notes else [])


def versions(specs: Sequence[PeerSpec]) -> dict[str, str]:
    """Versions of every system's packages, from the venv it runs in."""
    found: dict[str, str] = {"python": platform.python_version()}
    by_venv: dict[str, list[str]] = {}
    for s in specs:
        by_venv.setdefault(s.venv, []).extend(s.packages)
    code = (
        "import importlib.metadata as m, json, sys\n"
        "def v(d):\n"
        "    try: return m.version(d)\n"
        "    except m.PackageNotFoundError: return 'not installed'\n"
        "print(json.dumps({d: v(d) for d in sys.argv[1:]}))"
    )
    for venv, packages in by_venv.items():
        try:
            python = sys.executable if venv == "main" else str(peers_python())
            out = subprocess.run(
                [python, "-c", code, *sorted(set(packages))],
                capture_output=True, text=True, check=True, timeout=60,
            )  # fmt: skip
        except (OSError, subprocess.SubprocessError, ImportError) as exc:
            found[f"{venv} venv"] = f"unavailable: {exc}"
            continue
        prefix = "" if venv == "main" else "peers: "
        found.update({prefix + k: v for k, v in json.loads(out.stdout).items()})
    return found


def header_lines(info: Mapping[str, Any], cfg: Config) -> list[str]:
    def load(x: Sequence[float]) -> str:
        return " ".join(f"{v:.2f}" for v in x)

    soft = ", ".join(f"{k} {v}" for k, v in info["versions"].items())
    lines = [
        f"- command: `{info.get('command', '?')}`",
        f"- machine: {info['cores']} cores (os.cpu_count), {info['memory_gib']} GiB, "
        f"{info['cpu']}, {info['platform']}",
        f"- software: Redis {info['redis']}, drumbeat git {info['git']}, {soft}",
        f"- load average (1/5/15 min): {load(info['load_start'])} at start, "
        f"{load(info.get('load_end', []))} at end (other work on this machine competes for its "
        "cores: see the load column)",
        f"- settings: window {cfg.duration:g} s after one interval of warm-up, {cfg.repeat} "
        f"repetition(s) (median shown), {cfg.workers} worker process(es) per system, "
        f"concurrency {cfg.concurrency} (drumbeat's worker, arq's max_jobs, SAQ's and streaq's "
        "concurrency, Taskiq's max_async_tasks, APScheduler's threads)"
        + (", --quick" if cfg.quick else ""),
    ]
    if cfg.processes or cfg.autoscale:
        how = f"--autoscale {cfg.autoscale}" if cfg.autoscale else f"--processes {cfg.processes}"
        lines.append(
            f"- drumbeat's worker role: `drumbeat worker APP {how} --concurrency "
            f"{cfg.concurrency}`, a supervisor and its worker processes (each worker process "
            f"has {cfg.concurrency} slots), {cfg.workers} such role process(es)"
        )
    if cfg.task_sleep:
        lines.append(f"- task: records its start, then awaits `asyncio.sleep({cfg.task_sleep:g})` "
                     "(I/O standing in for a monitor's HTTP search)")  # fmt: skip
    if cfg.cold:
        lines.append(f"- cold start: the system's processes start {cfg.cold:g} s after the "
                     "schedules were registered")  # fmt: skip
    if cfg.squeeze:
        per = "one busy-looping process" if cfg.hogs == 1 else f"{cfg.hogs} busy-looping processes"
        lines.append(f"- squeeze: for the window's first {cfg.squeeze:g} s, {per} "
                     "per CPU compete with the system (capacity taken away, then given "
                     f"back); recovery = seconds after it until every second's p99 lateness "
                     f"stays <= {RECOVERED_S * 1000:.0f} ms")  # fmt: skip
    if cfg.limited:
        lines.append("- limited: every schedule `concurrency_limit=1, limit_by=\"i\"`, every "
                     "tenth `queue=\"other\"` (served by the same workers): each run goes "
                     "through its queue as a job")  # fmt: skip
    if cfg.note:
        lines.append(f"- note: {cfg.note}")
    if info.get("sources"):
        lines.append("- rendered from these runs (a later file's runs of a system at an N replace "
                     "an earlier file's):")  # fmt: skip
        lines += [f"  - {source}" for source in info["sources"]]
    return lines


def machine_info() -> dict[str, Any]:
    with open("/proc/meminfo") as f:
        mem_kb = next(int(x.split()[1]) for x in f if x.startswith("MemTotal:"))
    with RedisServer() as server:
        redis_version = server.info()["version"]
    return {
        "cores": os.cpu_count(),
        "memory_gib": round(mem_kb / 2**20, 1),
        "platform": f"{platform.system()} {platform.release()} {platform.machine()}",
        "cpu": cpu_model(),
        "redis": redis_version,
        "git": _git_revision(),
        "load_start": list(os.getloadavg()),
    }


def chart(json_path: Path) -> str | None:
    """Draws the PNG beside the JSON (`bench.charts`), with matplotlib from this venv if it has
    it, else from the peers' venv; None, or why there is no chart."""
    pythons = [sys.executable]
    with contextlib.suppress(ImportError):
        from .peers_env import existing_python

        found = existing_python()
        if found is not None:
            pythons.append(str(found))
    last = ""
    for python in pythons:
        done = subprocess.run(
            [python, "-m", "bench.charts", str(json_path)],
            cwd=REPO, env=_env(), capture_output=True, text=True, check=False, timeout=120,
        )  # fmt: skip
        if done.returncode == 0:
            return None
        last = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "failed"
    return last


def summary_rows(outcomes: Sequence[Outcome]) -> list[dict[str, Any]]:
    keys = ("ideal_rate", "rate", "pct_ideal", "duplicates", "late_p50", "late_p99", "late_max",
            "cpu_total_s", "cpu_procs_s", "redis_cpu_s", "memory_per_schedule", "register_s",
            "starved", "missed", "commands_per_run", "redis_us_per_run",
            "load_1m_start")  # fmt: skip
    rows = []
    for system, case, group in grouped(outcomes):
        row: dict[str, Any] = {"system": system, "n": case.n, "interval": case.interval}
        if group[0].skipped:
            row["skipped"] = group[0].skipped
        else:
            medians = {k: _median(group, k) for k in keys}
            # JSON has no infinity: a lateness beyond the window is stored as null
            row.update({k: None if v == math.inf else v for k, v in medians.items()})
            row["failed"] = sum(1 for o in group if o.errors)
        rows.append(row)
    return rows


def write_outputs(
    out_dir: Path, cfg: Config, info: Mapping[str, Any], outcomes: Sequence[Outcome], md: str
) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    base = out_dir / f"periodic-{'quick-' if cfg.quick else ''}{stamp}"
    data = {
        "title": f"drumbeat periodic benchmark {stamp} ({info['cores']} cores)",
        "info": dict(info),
        "config": asdict(cfg),
        "table": summary_rows(outcomes),
        "outcomes": [
            {
                "system": o.system, "n": o.case.n, "interval": o.case.interval,
                "repetition": o.repetition, "skipped": o.skipped, "metrics": o.metrics,
                "errors": o.errors, "notes": o.notes,
            }
            for o in outcomes
        ],
    }  # fmt: skip
    json_path, md_path, png_path = (base.with_suffix(x) for x in (".json", ".md", ".png"))
    json_path.write_text(json.dumps(data, indent=1) + "\n")
    problem = chart(json_path)
    if problem is None:
        md += f"\n![runs achieved and lateness]({png_path.name})\n"
    else:
        md += f"\n(no chart: {problem})\n"
    md_path.write_text(md)
    return [json_path, md_path] + ([png_path] if problem is None else [])


# -- command line ------------------------------------------------------------------------------


def parse_cases(text: str, interval: float) -> tuple[Case, ...]:
    cases = []
    for item in text.split(","):
        n, _, every = item.strip().replace("_", "").partition("@")
        cases.append(Case(int(n), float(every) if every else interval))
    return tuple(cases)


def parse_args(argv: Sequence[str] | None) -> tuple[argparse.Namespace, Config]:
    p = argparse.ArgumentParser(prog="python -m bench.periodic", description=__doc__.split("\n")[0])
    p.add_argument(
        "--quick", action="store_true", help="drumbeat and naive, 1,000 schedules, 20 s window"
    )
    p.add_argument("--systems", help=f"comma-separated, of: {', '.join(MODULES)} (default all)")
    p.add_argument("--n", help=f"schedule counts, N or N@INTERVAL (default {DEFAULT_CASES})")
    p.add_argument("--interval", type=float, default=5.0, help="seconds (default 5)")
    p.add_argument("--duration", type=float, help="measured window, s (default 60; quick 20)")
    p.add_argument("--repeat", type=int, help="repetitions per system and N (default 3; quick 1)")
    p.add_argument("--workers", type=int, default=1, help="worker processes per system (default 1)")
    p.add_argument(
        "--concurrency",
        type=int,
        default=20,
        help="drumbeat's concurrency, arq's max_jobs, SAQ's and streaq's concurrency, Taskiq's "
        "max_async_tasks, APScheduler's threads (default 20)",
    )
    p.add_argument("--processes", type=int, default=0,
                   help="drumbeat alone: each worker role runs `drumbeat worker APP --processes "
                   "N` (a supervisor and N worker processes)")  # fmt: skip
    p.add_argument("--autoscale", default="", metavar="MIN:MAX",
                   help="drumbeat alone: each worker role runs `drumbeat worker APP --autoscale "
                   "MIN:MAX`")  # fmt: skip
    p.add_argument(
        "--task-sleep",
        type=float,
        default=0.0,
        metavar="S",
        help="drumbeat alone: the task awaits S s once it recorded its start",
    )
    p.add_argument("--limited", action="store_true",
                   help="drumbeat alone: every schedule concurrency_limit=1, limit_by its "
                   "argument, every tenth routed to another queue (its runs go through their "
                   "queue as jobs)")  # fmt: skip
    p.add_argument("--cold", type=float, default=0.0, metavar="S",
                   help="start the system's processes S s after registration ends (with S >= "
                   "the interval, every schedule is due when they start)")  # fmt: skip
    p.add_argument("--squeeze", type=float, default=0.0, metavar="S",
                   help="for the window's first S s, busy-looping processes (--hogs per "
                   "CPU) take their share of the machine; reports when lateness came back "
                   "down")  # fmt: skip
    p.add_argument("--hogs", type=int, default=1, metavar="K",
                   help="busy-looping processes per CPU during --squeeze (default 1; more take "
                   "the system past its capacity)")  # fmt: skip
    p.add_argument("--out", type=Path, default=BENCH_DIR / "results", help="results directory")
    p.add_argument("--note", default="", help="free text recorded with the results")
    p.add_argument("--render", nargs="+", type=Path, metavar="JSON",
                   help="rebuild the report from results files instead of running (a later "
                   "file's runs of a system at an N replace an earlier file's)")  # fmt: skip
    a = p.parse_args(argv)
    if a.render:
        return a, Config((), ())
    systems = tuple(a.systems.split(",")) if a.systems else (
        QUICK_SYSTEMS if a.quick else tuple(MODULES)
    )  # fmt: skip
    unknown = [s for s in systems if s not in MODULES]
    if unknown:
        p.error(f"unknown system(s) {', '.join(unknown)}; known: {', '.join(MODULES)}")
    cases = parse_cases(a.n or ("1000" if a.quick else DEFAULT_CASES), a.interval)
    repeat = a.repeat if a.repeat is not None else (1 if a.quick else 3)
    if repeat < 1 or a.workers < 1 or a.concurrency < 1:
        p.error("--repeat, --workers and --concurrency must be >= 1")
    duration = a.duration or (20.0 if a.quick else 60.0)
    if (a.processes or a.autoscale or a.task_sleep or a.limited) and systems != ("drumbeat",):
        p.error("--processes, --autoscale, --task-sleep and --limited apply to drumbeat alone: add "
                f"--systems drumbeat (got {', '.join(systems)})")  # fmt: skip
    if a.processes and a.autoscale:
        p.error("--processes and --autoscale exclude each other")
    if a.hogs < 1:
        p.error("--hogs must be >= 1")
    cfg = Config(systems, cases, duration, repeat, a.workers, a.concurrency, a.quick, a.note,
                 a.processes, a.autoscale, a.task_sleep, a.cold, a.limited,
                 a.squeeze, a.hogs)  # fmt: skip
    return a, cfg


def command_line() -> str:
    """The command that reproduces this run."""
    return f"cd {shlex.quote(os.getcwd())} && " + shlex.join(
        [sys.executable, "-m", "bench.periodic", *sys.argv[1:]]
    )


def _progress(line: str) -> None:
    print(f"  {line}", file=sys.stderr, flush=True)


def _skip_reason(s: PeerSpec, case: Case, explicit: bool) -> str:
    if case.n > s.max_n and not explicit:
        return f"{s.name} runs with at most {s.max_n:,} schedules unless named in --systems"
    if s.interval_divides_minute and not (
        (case.interval < 60 and 60 % case.interval == 0) or case.interval % 60 == 0
    ):
        return "a cron schedule cannot express this interval"
    return ""


def main(argv: Sequence[str] | None = None) -> int:
    args, cfg = parse_args(argv)
    if args.render:
        return render(args.render, args.out)
    command = command_line()
    print(f"$ {command}", file=sys.stderr, flush=True)
    specs = [spec(name) for name in cfg.systems]
    info = machine_info()
    info["command"] = command
    info["versions"] = versions(specs)
    outcomes: list[Outcome] = []
    for s in specs:
        for case in cfg.cases:
            reason = _skip_reason(s, case, explicit=args.systems is not None)
            if reason:
                outcomes.append(Outcome(s.name, case, 0, skipped=reason))
                continue
            for rep in range(1, cfg.repeat + 1):
                _progress(f"{s.name}, {case.label}, #{rep} ...")
                o = run_one(s, case, cfg, rep)
                outcomes.append(o)
                m = o.metrics
                _progress(
                    f"{s.name}, {case.label}, #{rep}: {_fmt(m.get('rate'))} runs/s of "
                    f"{_fmt(m.get('ideal_rate'))} ({_fmt(m.get('pct_ideal'), 1)} %), "
                    f"p99 {_late(m.get('late_p99'))}, dup {_fmt(m.get('duplicates'))}, CPU "
                    f"{_fmt(m.get('cpu_total_s'), 1)} s "
                    f"({_fmt(m.get('procs_us_per_run'), 1)} µs/run in the processes), "
                    f"load {_fmt(m.get('load_1m_start'), 2)}"
                    + (f", ERROR: {o.errors[0].splitlines()[0]}" if o.errors else "")
                )
    info["load_end"] = list(os.getloadavg())
    return report(args.out, cfg, info, outcomes)


def report(out: Path, cfg: Config, info: Mapping[str, Any], outcomes: Sequence[Outcome]) -> int:
    """Prints and writes the markdown, the JSON and the chart; the exit status."""
    specs = [spec(name) for name in dict.fromkeys(o.system for o in outcomes)]
    body = [
        "# drumbeat periodic benchmark: N schedules, "
        + (f"a task that awaits {cfg.task_sleep:g} s" if cfg.task_sleep else "no-op task"),
        "",
        *header_lines(info, cfg),
        "",
        *table_lines(outcomes),
        "",
        "CPU s: within the measured window. Lateness: start - due, runs started in the window "
        "(how a run's due time is known, per system, under Method).",
        "",
        *squeeze_lines(outcomes),
        "## Details",
        "",
        *detail_lines(outcomes),
        "",
        "## Redis time per run",
        "",
        *(command_lines(outcomes) or ["(no command statistics in these results)"]),
        "",
        "## Method and settings",
        "",
        *method_lines(specs, cfg),
    ]
    problems = problem_lines(outcomes)
    if problems:
        body += ["", "## Problems and notes", "", *problems]
    markdown = "\n".join(body) + "\n"
    print(markdown)
    paths = write_outputs(out, cfg, info, outcomes, markdown)
    print("wrote " + ", ".join(str(p) for p in paths), file=sys.stderr)
    return 1 if any(o.errors for o in outcomes) else 0


def _md_command(json_path: Path) -> str:
    """The command line recorded in the markdown beside a results file (older JSON lacks it)."""
    with contextlib.suppress(OSError):
        for line in json_path.with_suffix(".md").read_text().splitlines():
            if line.startswith("- command: `"):
                return line.removeprefix("- command: `").removesuffix("`")
    return "?"


def _merge_info(
    info: dict[str, Any], more: Mapping[str, Any], outcomes: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """The machine of the first file, every file's package versions, the load at the first
    start and the last end, and drumbeat's git state from the file its rows come from."""
    if not info:
        return {**more, "versions": dict(more.get("versions", {}))}
    info["versions"].update(more.get("versions", {}))
    info["load_end"] = more.get("load_end", info.get("load_end"))
    if any(o["system"] == "drumbeat" and not o["skipped"] for o in outcomes):
        info["git"] = more.get("git", info.get("git"))
    return info


def render(paths: Sequence[Path], out: Path) -> int:
    """Rebuilds one report from results files (``--render``): a later file's runs of a system
    at an N replace an earlier file's, e.g. to combine a full run with a rerun of one peer."""
    runs: dict[tuple[str, int, float], list[Outcome]] = {}
    info: dict[str, Any] = {}
    cfg: Config | None = None
    sources: list[str] = []
    for path in paths:
        data = json.loads(path.read_text())
        info = _merge_info(info, data["info"], data["outcomes"])
        c = data["config"]
        cases = tuple(Case(int(x["n"]), float(x["interval"])) for x in c["cases"])
        this = Config(**{**c, "systems": tuple(c["systems"]), "cases": cases})
        # the header states the most repetitions of any file; the runs column says it per row
        cfg = replace(cfg, repeat=max(cfg.repeat, this.repeat)) if cfg else this
        sources.append(f"`{data['info'].get('command') or _md_command(path)}` ({path.name})")
        fresh: dict[tuple[str, int, float], list[Outcome]] = {}
        for o in data["outcomes"]:
            case = Case(int(o["n"]), float(o["interval"]))
            outcome = Outcome(o["system"], case, int(o["repetition"]), dict(o["metrics"]),
                              list(o["errors"]), list(o["notes"]), o["skipped"])  # fmt: skip
            fresh.setdefault((o["system"], case.n, case.interval), []).append(outcome)
        runs.update(fresh)
    assert cfg is not None
    order = {name: k for k, name in enumerate(MODULES)}
    outcomes = [
        o for key in sorted(runs, key=lambda k: (order.get(k[0], 99), k[1])) for o in runs[key]
    ]
    # the command that rebuilds this report; each run's own command is kept beside its file name
    info["command"], info["sources"] = command_line(), sources
    return report(out, cfg, info, outcomes)


if __name__ == "__main__":
    sys.exit(main())
