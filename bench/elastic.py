"""Elastic pool: a step from idle to a backlog of short jobs and back to idle, per scaling policy.

    python -m bench.elastic [--policies autoscale,fixed-min,fixed-max,original] [--repeat 3]
                            [--jobs 5000] [--job-ms 50] [--min 1] [--max 4] [--concurrency 10]
                            [--scale-down-after 5] [--out bench/results] [--note TEXT]

For each policy and repetition, on one private redis-server (flushed between runs): a
supervisor starts (``drumbeat worker bench.elastic_app:app`` with ``--autoscale MIN:MAX``,
``--processes MIN`` or ``--processes MAX``; or, for the original design's rule, the same
`drumbeat.supervisor.Supervisor` with `OriginalRule` as its scaler, so only the policy
differs); once MIN workers are registered and idle, ``--jobs`` jobs (each awaits ``--job-ms``
and counts itself) are enqueued at once. Every ``--sample`` seconds the harness counts the
supervisor's child processes (/proc), the workers registered in Redis and the backlog, until the
backlog has drained and the pool is back at MIN, or the pool had ``scale_down_after x (MAX -
MIN) + 10`` s after the drain to get there. Reported, median (min-max) over the repetitions:
time to full capacity (MAX workers registered), drain time (step to nothing queued or running),
time back to MIN (step to MIN processes left), and process-seconds over a common window. Writes
``elastic-<UTC stamp>.md``, ``.json`` and (`bench.charts`) ``.png`` to ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import json
import math
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from drumbeat.config import Settings

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
APP = "bench.elastic_app:app"
POLICIES = ("autoscale", "fixed-min", "fixed-max", "original")
DOWN_SLACK = 10.0
"""Seconds past ``scale_down_after x (MAX - MIN)`` a pool gets after the drain to be at MIN."""
START_TIMEOUT = 90.0
DEFAULT_SCALE_DOWN_AFTER = next(
    f.default for f in dataclasses.fields(Settings) if f.name == "scale_down_after"
)
"""`Settings.scale_down_after`'s default, for the report."""


@dataclass(frozen=True, slots=True)
class Config:
    policies: tuple[str, ...] = POLICIES
    repeat: int = 3
    jobs: int = 5_000
    job_ms: float = 50.0
    minimum: int = 1
    maximum: int = 4
    concurrency: int = 10
    scale_down_after: float = 5.0
    sample: float = 0.2
    idle_before: float = 2.0
    """Seconds the idle pool is watched before the step."""
    note: str = ""

    @property
    def down_window(self) -> float:
        return self.scale_down_after * (self.maximum - self.minimum) + DOWN_SLACK


def describe(policy: str, cfg: Config) -> str:
    """The policy as its users would run it."""
    lo, hi = cfg.minimum, cfg.maximum
    base = f"drumbeat worker {APP} --concurrency {cfg.concurrency}"
    return {
        "autoscale": f"`{base} --autoscale {lo}:{hi}`",
        "fixed-min": f"`{base} --processes {lo}`",
        "fixed-max": f"`{base} --processes {hi}`",
        "original": f"the original design's rule, target = max({lo}, min({hi}, ready // 50 + 1)), "
        "up only, every scale_interval: `Supervisor(..., scaler=OriginalRule)` in "
        "`python -m bench.elastic --supervise-original` (the same supervisor, only the "
        "policy differs)",
    }[policy]


def pool_argv(policy: str, cfg: Config) -> list[str]:
    lo, hi, c = cfg.minimum, cfg.maximum, str(cfg.concurrency)
    cli = [sys.executable, "-m", "drumbeat", "worker", APP, "--concurrency", c]
    if policy == "autoscale":
        return [*cli, "--autoscale", f"{lo}:{hi}"]
    if policy == "fixed-min":
        return [*cli, "--processes", str(lo)]
    if policy == "fixed-max":
        return [*cli, "--processes", str(hi)]
    if policy == "original":
        return [
            sys.executable,
            "-m",
            "bench.elastic",
            "--supervise-original",
            "--min",
            str(lo),
            "--max",
            str(hi),
            "--concurrency",
            c,
        ]
    raise ValueError(f"unknown policy {policy!r}; expected one of {', '.join(POLICIES)}")


# -- the original design's rule, as a scaler of drumbeat's supervisor ---------------------------


class OriginalRule:
    """``target = max(MIN, min(MAX, queue_length // 50 + 1))``, up only (the monitoring service
    grew its pool this way and never shrank it). Like `drumbeat.autoscale.Autoscaler`, a thread
    of its own looks at Redis every ``scale_interval``, so `decide` never blocks."""

    PER_PROCESS = 50

    def __init__(self, app: Any, minimum: int, maximum: int, interval: float) -> None:
        self.app, self.minimum, self.maximum, self.interval = app, minimum, maximum, interval
        self.wanted = minimum
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def target(cls, queue_length: int, minimum: int, maximum: int) -> int:
        return max(minimum, min(maximum, queue_length // cls.PER_PROCESS + 1))

    def decide(self, live: int, desired: int, retiring: int) -> int:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="original-rule", daemon=True)
            self._thread.start()
        return self.wanted

    def _run(self) -> None:
        from drumbeat.autoscale import read_signal

        while not self._stop.is_set():
            with contextlib.suppress(Exception):  # Redis away: keep the pool as it is
                ready = read_signal(self.app).ready
                self.wanted = max(self.wanted, self.target(ready, self.minimum, self.maximum))
            self._stop.wait(self.interval)

    def close(self) -> None:
        self._stop.set()


def supervise_original(minimum: int, maximum: int, concurrency: int) -> int:
    """What ``drumbeat worker APP --autoscale MIN:MAX`` does (`drumbeat.cli.worker`), with
    `OriginalRule` instead of `drumbeat.autoscale.Autoscaler`."""
    import logging

    import drumbeat
    from drumbeat.supervisor import Supervisor

    logging.basicConfig(level="INFO", format="%(asctime)s %(name)s %(message)s")
    app = drumbeat.App()
    s = app.settings
    argv = [
        "-m",
        "drumbeat",
        "worker",
        APP,
        "--log-level",
        "info",
        "--concurrency",
        str(concurrency),
    ]
    scaler = OriginalRule(app, minimum, maximum, s.scale_interval)
    sup = Supervisor(
        argv, minimum, s.shutdown_grace, hang_timeout=s.hang_timeout, maximum=maximum, scaler=scaler
    )
    try:
        return sup.run()
    finally:
        app.close()


# -- one run -----------------------------------------------------------------------------------


def children(pid: int) -> int:
    """Live child processes of ``pid`` (the supervisor's workers, retiring ones included)."""
    found = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                text = f.read()
        except OSError:
            continue
        rest = text[text.rindex(")") + 2 :].split()
        if int(rest[1]) == pid and rest[0] != "Z":
            found += 1
    return found


@dataclass(slots=True)
class Sample:
    t: float
    """Seconds since the step (negative: before it)."""
    processes: int
    """The supervisor's live children."""
    registered: int
    """Workers registered (beating) in Redis."""
    backlog: int
    """Jobs ready plus due and not yet promoted."""
    running: int


@dataclass(slots=True)
class RunResult:
    policy: str
    repetition: int
    samples: list[Sample] = field(default_factory=list)
    done: int = 0
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


class Pool:
    """The supervisor under test, in its own process group; killed on exit whatever happens."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str]) -> None:
        self._stderr: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115 (closed in __exit__)
        self.proc = subprocess.Popen(
            list(argv),
            cwd=REPO,
            env=dict(env),
            stdout=self._stderr,
            stderr=self._stderr,
            start_new_session=True,
        )

    def scaling(self) -> list[str]:
        """The supervisor's log lines on scaling (why it grew or shrank), as written."""
        self._stderr.seek(0)
        text = self._stderr.read().decode(errors="replace").splitlines()
        return [" ".join(x.split()) for x in text if "scaling" in x][:12]

    def tail(self, lines: int = 15) -> str:
        self._stderr.seek(0)
        text = self._stderr.read().decode(errors="replace").splitlines()[-lines:]
        return "\n".join(text) or "(no output)"

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(40)
        except subprocess.TimeoutExpired:
            return None

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self._stderr.close()


def run_one(policy: str, cfg: Config, url: str, repetition: int) -> RunResult:
    import drumbeat

    from .elastic_app import DONE_KEY, JOB_SECONDS_ENV, TASK

    out = RunResult(policy, repetition)
    namespace = f"elastic{repetition}{policy.replace('-', '')}"
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "DRUMBEAT_REDIS_URL": url,
        "DRUMBEAT_NAMESPACE": namespace,
        "DRUMBEAT_SCALE_DOWN_AFTER": f"{cfg.scale_down_after:g}",
        JOB_SECONDS_ENV: f"{cfg.job_ms / 1000:g}",
        "COLUMNS": "400",  # the supervisor's log lines unwrapped, for `Pool.scaling`
    }
    env.pop("VIRTUAL_ENV", None)
    app = drumbeat.App(url, namespace=namespace)
    app.redis.flushdb()

    async def _stub(i: int) -> None:
        """The producer knows the task by name; the workers run the real one."""

    task = app.task(name=TASK)(_stub)
    try:
        with Pool(pool_argv(policy, cfg), env) as pool:
            watch = Watch(app, pool, cfg, out)
            if watch.idle():
                watch.step(lambda: app.enqueue_many(task.prepare(i) for i in range(cfg.jobs)))
            out.done = int(app.redis.get(DONE_KEY) or 0)
            out.notes += [f"supervisor: {x}" for x in pool.scaling()]
            code = pool.stop()
            if code != 0:
                out.errors.append(f"the supervisor exited with {code} on SIGTERM\n{pool.tail()}")
    finally:
        app.close()
    if out.done != cfg.jobs and not out.errors:
        out.errors.append(f"{out.done} jobs counted themselves; {cfg.jobs} were enqueued")
    return out


@dataclass(slots=True)
class Watch:
    """Samples one pool: idle first, then from the step until it is back at MIN."""

    app: Any
    pool: Pool
    cfg: Config
    out: RunResult

    def look(self, t: float) -> Sample:
        from drumbeat.autoscale import read_signal

        sig = read_signal(self.app)
        pid = self.pool.proc.pid
        return Sample(round(t, 3), children(pid), sig.workers, sig.backlog, sig.running)

    def idle(self) -> bool:
        """Waits for MIN registered workers, then samples the idle pool; False if it failed."""
        cfg, out = self.cfg, self.out
        deadline = time.monotonic() + START_TIMEOUT
        while (s := self.look(0.0)).registered < cfg.minimum:
            if self.pool.proc.poll() is not None or time.monotonic() > deadline:
                out.errors.append(
                    f"{s.registered} of {cfg.minimum} workers registered within "
                    f"{START_TIMEOUT:g} s\n{self.pool.tail()}"
                )
                return False
            time.sleep(cfg.sample)
        step = time.monotonic() + cfg.idle_before
        while (now := time.monotonic()) < step:
            out.samples.append(self.look(now - step))
            time.sleep(cfg.sample)
        return True

    def step(self, enqueue: Callable[[], object]) -> None:
        """Enqueues the jobs, then samples until the pool is back at MIN after the drain, or
        `Config.down_window` after it, or a failure."""
        cfg, out = self.cfg, self.out
        t0 = time.monotonic()
        enqueue()
        drained_at: float | None = None
        bound = t0 + 60 + 4 * cfg.jobs * cfg.job_ms / 1000 / cfg.concurrency
        while True:
            tick = time.monotonic()
            s = self.look(tick - t0)
            out.samples.append(s)
            if drained_at is None and s.backlog == 0 and s.running == 0:
                drained_at = s.t
            if drained_at is not None and (
                s.processes <= cfg.minimum or s.t - drained_at >= cfg.down_window
            ):
                return
            if self.pool.proc.poll() is not None:
                code = self.pool.proc.returncode
                out.errors.append(f"the supervisor exited with {code}\n{self.pool.tail()}")
                return
            if drained_at is None and tick > bound:
                out.errors.append(f"{s.backlog + s.running} jobs left after {tick - t0:.0f} s")
                return
            time.sleep(max(0.0, tick + cfg.sample - time.monotonic()))


# -- summary -----------------------------------------------------------------------------------


def summarize(samples: Sequence[Sample], *, minimum: int, maximum: int) -> dict[str, float | None]:
    """The figures of one run from its samples (taken after the step, ``t >= 0``): the first
    time MAX workers were registered, the first time nothing was queued or running, the first
    time after that the supervisor had MIN processes left (None: not within the run), and the
    most processes seen."""
    after = [s for s in samples if s.t >= 0]
    full = next((s.t for s in after if s.registered >= maximum), None)
    drained = next((s.t for s in after if s.backlog == 0 and s.running == 0), None)
    back = None
    if drained is not None:
        back = next((s.t for s in after if s.t >= drained and s.processes <= minimum), None)
    return {
        "full": full,
        "drained": drained,
        "back_to_min": back,
        "peak": float(max((s.processes for s in after), default=0)),
        "observed": after[-1].t if after else 0.0,
    }


def process_seconds(samples: Sequence[Sample], until: float) -> float:
    """The processes' count integrated from the step to ``until`` (step-wise, each sample's
    count held until the next; the last one held to ``until``)."""
    after = [s for s in samples if s.t >= 0]
    total = 0.0
    for k, s in enumerate(after):
        end = after[k + 1].t if k + 1 < len(after) else until
        end = min(end, until)
        if end > s.t:
            total += s.processes * (end - s.t)
    return total


def _stat(values: Sequence[float | None]) -> dict[str, Any]:
    """Median (min-max) over the runs; a None (it never happened) counts as later than any."""
    ordered = sorted(math.inf if v is None else v for v in values)
    if not ordered:
        return {"median": None, "min": None, "max": None, "never": 0}

    def finite(x: float) -> float | None:
        return None if math.isinf(x) else x

    return {
        "median": finite(statistics.median(ordered)),
        "min": finite(ordered[0]),
        "max": finite(ordered[-1]),
        "never": sum(1 for v in ordered if math.isinf(v)),
    }


def aggregate(runs: Sequence[RunResult], cfg: Config) -> dict[str, dict[str, Any]]:
    """Per policy: each figure's median (min-max) over the good runs, and process-seconds over
    a window common to every policy (from the step to the latest end of any run)."""
    good = [r for r in runs if not r.errors]
    window = max((r.samples[-1].t for r in good if r.samples), default=0.0)
    table: dict[str, dict[str, Any]] = {}
    for policy in dict.fromkeys(r.policy for r in runs):
        mine = [r for r in good if r.policy == policy]
        sums = [summarize(r.samples, minimum=cfg.minimum, maximum=cfg.maximum) for r in mine]
        row: dict[str, Any] = {
            key: _stat([s[key] for s in sums]) for key in ("full", "drained", "back_to_min")
        }
        row["peak"] = _stat([s["peak"] for s in sums])
        row["process_seconds"] = _stat([process_seconds(r.samples, window) for r in mine])
        row["runs"], row["failed"] = (
            len(mine),
            sum(1 for r in runs if r.policy == policy) - len(mine),
        )
        row["window"] = window
        table[policy] = row
    return table


def _cell(stat: Mapping[str, Any], digits: int = 1, never: str = "never") -> str:
    if stat["median"] is None:
        return never if stat.get("never") else "-"
    median = f"{stat['median']:,.{digits}f}"
    high = "never" if stat["max"] is None else f"{stat['max']:,.{digits}f}"
    if stat["min"] == stat["max"] or stat["min"] is None:
        return median
    return f"{median} ({stat['min']:,.{digits}f}-{high})"


def table_lines(table: Mapping[str, Mapping[str, Any]], cfg: Config) -> list[str]:
    window = max((row["window"] for row in table.values()), default=0.0)
    lines = [
        f"| policy | time to full capacity ({cfg.maximum} workers registered), s | backlog "
        f"drained, s | back to MIN ({cfg.minimum} process{'es' if cfg.minimum > 1 else ''}), "
        f"s | most processes | process-seconds over {window:.0f} s | runs |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for policy, row in table.items():
        back = row["back_to_min"]
        failed = f" (**{row['failed']} failed**)" if row["failed"] else ""
        never = f"never (within {cfg.down_window:g} s of the drain)"
        lines.append(
            f"| {policy} | {_cell(row['full'])} | {_cell(row['drained'])} | "
            f"{_cell(back, never=never)} | "
            f"{_cell(row['peak'], 0)} | {_cell(row['process_seconds'], 0)} | "
            f"{row['runs']}{failed} |"
        )
    return lines


# -- report ------------------------------------------------------------------------------------


def _down_note(cfg: Config) -> str:
    if cfg.scale_down_after == DEFAULT_SCALE_DOWN_AFTER:
        return "the default"
    return f"default {DEFAULT_SCALE_DOWN_AFTER:g}; shortened so that a run takes seconds"


def header_lines(info: Mapping[str, Any], cfg: Config) -> list[str]:
    load = " ".join(f"{x:.2f}" for x in info["load_start"])
    end = " ".join(f"{x:.2f}" for x in info.get("load_end", []))
    lines = [
        f"- command: `{info['command']}`",
        f"- machine: {info['cores']} cores (os.cpu_count), {info['cpu']}, {info['platform']}",
        f"- Redis {info['redis']}, private, no persistence; Python {info['python']}; drumbeat "
        f"git {info['git']}",
        f"- load average (1/5/15 min): {load} at start, {end} at end",
        f"- step: {cfg.jobs:,} jobs enqueued at once (one `enqueue_many`), each awaits "
        f"`asyncio.sleep({cfg.job_ms / 1000:g})` then counts itself; MIN {cfg.minimum}, MAX "
        f"{cfg.maximum} processes, `--concurrency {cfg.concurrency}`, "
        f"`DRUMBEAT_SCALE_DOWN_AFTER={cfg.scale_down_after:g}` ({_down_note(cfg)}), "
        f"`scale_interval` 1 s (default); sampled every {cfg.sample:g} s; "
        f"{cfg.repeat} repetition(s), the policies' order rotating; median (min-max)",
        f"- time to full capacity: from the step to the first sample with {cfg.maximum} workers "
        "registered in Redis (started and claiming); backlog drained: to the first sample with "
        "nothing ready, due or running; back to MIN: to the first sample after the drain with "
        f"{cfg.minimum} supervisor child process(es) left (retired ones have exited); a run "
        f"ends there or {cfg.down_window:g} s after the drain; process-seconds: the supervisor's "
        "child processes integrated from the step to the end of the longest run (a run that "
        "ended earlier holds its last count)",
    ]
    if cfg.note:
        lines.append(f"- note: {cfg.note}")
    return lines


def build_report(info: Mapping[str, Any], cfg: Config, runs: Sequence[RunResult]) -> str:
    table = aggregate(runs, cfg)
    body = [
        "# Elastic pool: idle, a step of jobs, idle again",
        "",
        *header_lines(info, cfg),
        "",
        *table_lines(table, cfg),
        "",
        "## Policies",
        "",
    ]
    body += [f"- {p}: {describe(p, cfg)}" for p in table]
    first = {}
    for r in runs:
        first.setdefault(r.policy, r)
    logs = [f"- {r.policy} #{r.repetition}: {n}" for r in first.values() for n in r.notes]
    if logs:
        body += [
            "",
            "## What the supervisors logged on scaling (each policy's first run)",
            "",
            *logs,
        ]
    problems = [f"- {r.policy} #{r.repetition}: {e}" for r in runs for e in r.errors]
    if problems:
        body += ["", "## Problems", "", *problems]
    return "\n".join(body) + "\n"


def machine_info(url_info: Mapping[str, str]) -> dict[str, Any]:
    import platform

    from .core import _git_revision
    from .machine import cpu_model

    return {
        "cores": os.cpu_count(),
        "cpu": cpu_model(),
        "platform": f"{platform.system()} {platform.release()} {platform.machine()}",
        "python": platform.python_version(),
        "redis": url_info["version"],
        "git": _git_revision(),
        "load_start": list(os.getloadavg()),
    }


def write_outputs(
    out: Path, info: Mapping[str, Any], cfg: Config, runs: Sequence[RunResult], md: str
) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    base = out / f"elastic-{stamp}"
    data = {
        "kind": "elastic",
        "title": f"Elastic pool {stamp}: {cfg.jobs:,} jobs of {cfg.job_ms:g} ms, "
        f"MIN {cfg.minimum} MAX {cfg.maximum}, concurrency {cfg.concurrency}",
        "info": dict(info),
        "config": asdict(cfg),
        "table": aggregate(runs, cfg),
        "runs": [asdict(r) for r in runs],
    }
    json_path, md_path = base.with_suffix(".json"), base.with_suffix(".md")
    json_path.write_text(json.dumps(data, indent=1) + "\n")
    from .periodic import chart

    problem = chart(json_path)
    if problem is None:
        md += f"\n![processes over time]({base.name}.png)\n"
    else:
        md += f"\n(no chart: {problem})\n"
    md_path.write_text(md)
    return [md_path, json_path] + ([base.with_suffix(".png")] if problem is None else [])


def command_line() -> str:
    return f"cd {shlex.quote(os.getcwd())} && " + shlex.join(
        [sys.executable, "-m", "bench.elastic", *sys.argv[1:]]
    )


def parse_args(argv: Sequence[str] | None) -> tuple[argparse.Namespace, Config]:
    p = argparse.ArgumentParser(prog="python -m bench.elastic", description=__doc__.split("\n")[0])
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--jobs", type=int, default=5_000)
    p.add_argument("--job-ms", type=float, default=50.0)
    p.add_argument("--min", type=int, default=1, dest="minimum")
    p.add_argument("--max", type=int, default=4, dest="maximum")
    p.add_argument("--concurrency", type=int, default=10)
    p.add_argument("--scale-down-after", type=float, default=5.0)
    p.add_argument("--sample", type=float, default=0.2, help="seconds between samples")
    p.add_argument("--out", type=Path, default=BENCH_DIR / "results")
    p.add_argument("--note", default="")
    p.add_argument("--supervise-original", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    policies = tuple(x.strip() for x in a.policies.split(",") if x.strip())
    unknown = [x for x in policies if x not in POLICIES]
    if unknown:
        p.error(f"unknown policies {unknown}; expected some of {', '.join(POLICIES)}")
    if not 1 <= a.minimum < a.maximum:
        p.error(f"expected 1 <= --min < --max, got {a.minimum} and {a.maximum}")
    if a.repeat < 1 or a.jobs < 1 or a.concurrency < 1:
        p.error("--repeat, --jobs and --concurrency must be >= 1")
    cfg = Config(
        policies,
        a.repeat,
        a.jobs,
        a.job_ms,
        a.minimum,
        a.maximum,
        a.concurrency,
        a.scale_down_after,
        a.sample,
        note=a.note,
    )
    return a, cfg


def _progress(line: str) -> None:
    print(f"  {line}", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    args, cfg = parse_args(argv)
    if args.supervise_original:
        return supervise_original(cfg.minimum, cfg.maximum, cfg.concurrency)
    from ._redis import RedisServer

    command = command_line()
    print(f"$ {command}", file=sys.stderr, flush=True)
    runs: list[RunResult] = []
    with RedisServer() as server:
        info = {**machine_info(server.info()), "command": command}
        for rep in range(cfg.repeat):
            k = rep % len(cfg.policies)
            for policy in (*cfg.policies[k:], *cfg.policies[:k]):
                r = run_one(policy, cfg, server.url, rep + 1)
                runs.append(r)
                s = summarize(r.samples, minimum=cfg.minimum, maximum=cfg.maximum)
                _progress(
                    f"{policy} #{rep + 1}: full {s['full']}, drained {s['drained']}, "
                    f"back to MIN {s['back_to_min']}, done {r.done}"
                    + (f", ERROR {r.errors[0].splitlines()[0]}" if r.errors else "")
                )
    info["load_end"] = list(os.getloadavg())
    order = {p: k for k, p in enumerate(cfg.policies)}
    runs.sort(key=lambda r: (order[r.policy], r.repetition))
    md = build_report(info, cfg, runs)
    print(md)
    paths = write_outputs(args.out, info, cfg, runs, md)
    print("wrote " + ", ".join(str(p) for p in paths), file=sys.stderr)
    return 1 if any(r.errors for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
