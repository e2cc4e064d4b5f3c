"""Rate and concurrency limits under load: accuracy and Redis cost (issue 13).

Rate: N jobs of a task with ``rate_limit`` (default 10,000 at "500/s"), enqueued up front, drained
by P worker processes of S slots (default 2 x 20): achieved rate (jobs / time from the first
start to the last); the most grants in any 1-s window (the starts the limiter granted, Redis
clock, as `Context.granted_ms` gives them: the limit allows rate + burst) beside the most starts
the tasks saw in any 1-s window, and how long after its grant each run started; Redis commands
per job (``INFO commandstats`` of a private redis-server, everything included: enqueue, claims,
acquires, parks, releases, acks, and the commands scripts call), with the commands that cost
the most. Concurrency: M jobs of a task with
``concurrency_limit=C, limit_by="user_id"`` over U users, each run sleeping a few ms: the most
runs of each user at once (must equal C, never exceed it; U x C must fit in the P x S slots, or
the pool cannot load every key to its limit: the default 6 x 5 leaves 10 slots spare).

    python -m bench.limits [--jobs 10000] [--rate 500/s] [--processes 2] [--slots 20]

Another drumbeat can be measured with this bench (its code first on PYTHONPATH, which the
worker processes inherit): ``PYTHONPATH=<tree>/src python -m bench.limits`` from this tree.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench._redis import RedisServer
from bench.machine import cpu_model

REPO = Path(__file__).resolve().parents[1]


def _commands(client: object) -> Counter[str]:
    """Calls per command so far (``cmdstat_evalsha`` -> ``evalsha``)."""
    stats = client.info("commandstats")  # type: ignore[attr-defined]
    return Counter({k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()})


def _source() -> str:
    """Which drumbeat ran: its directory and, in a git checkout, its commit."""
    import drumbeat

    where = Path(drumbeat.__file__).resolve().parent
    try:
        rev = subprocess.run(["git", "-C", str(where), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        rev = "?"
    return f"{where} at {rev}"


def _drain(args: argparse.Namespace, kind: str) -> tuple[list[list[Any]], int, Counter[str]]:
    """Enqueues the jobs of ``kind``, drains them with the worker processes; returns every
    run's (key, start, end, granted start or None), the number of jobs and the Redis commands
    spent, per command."""
    import drumbeat
    from drumbeat.protocol import KEEP_FIELD
    from drumbeat.task import Prepared

    with RedisServer() as server, tempfile.TemporaryDirectory() as out:
        env = {**os.environ, "DRUMBEAT_REDIS_URL": server.url, "DRUMBEAT_NAMESPACE": "bench",
               "DRUMBEAT_CONCURRENCY": str(args.slots), "BENCH_LIMITS_DIR": out,
               "BENCH_LIMITS_RATE": args.rate, "BENCH_LIMITS_PER_USER": str(args.per_user),
               "PYTHONPATH": os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"),
                                                           str(REPO)]))}  # fmt: skip
        app = drumbeat.App(server.url, namespace="bench")
        if kind == "rate":
            calls = [Prepared("bench.limits_app.hit", (i,), {}) for i in range(args.jobs)]
        else:
            calls = [Prepared("bench.limits_app.order", (i % args.users, args.seconds), {})
                     for i in range(args.concurrency_jobs)]  # fmt: skip
        client = server.client()
        before = _commands(client)
        app.enqueue_many(calls)
        code = "import drumbeat; from bench.limits_app import app; drumbeat.run_worker(app)"
        procs = [subprocess.Popen([sys.executable, "-c", code], env=env, cwd=REPO)
                 for _ in range(args.processes)]  # fmt: skip
        try:
            deadline = time.monotonic() + args.timeout
            # Done when no job is left: waiting, parked (a parked job keeps its state) or running
            # (the state hash also keeps a field of its own, KEEP_FIELD, once claimed from).
            while client.hlen(app.keys.state) - client.hexists(app.keys.state, KEEP_FIELD) > 0:
                if time.monotonic() > deadline:
                    raise SystemExit(f"{kind}: jobs left after {args.timeout} s")
                time.sleep(0.2)
            commands = _commands(client)
            commands.subtract(before)
            commands = +commands  # drops the commands not called in between
        finally:
            for p in procs:
                p.send_signal(signal.SIGTERM)
            for p in procs:
                p.wait(60)
            client.close()
            app.close()
        runs = [r for f in Path(out).glob("*.json") for r in json.loads(f.read_text())]
    if len(runs) != len(calls):
        raise SystemExit(f"{kind}: {len(runs)} runs recorded for {len(calls)} jobs")
    return runs, len(calls), commands


def most_in_window(times: Sequence[float], window: float = 1.0) -> int:
    """The most of ``times`` in any window [t, t + window) (the fullest opens at one of them)."""
    times = sorted(times)
    worst, j = 0, 0
    for i, t in enumerate(times):
        while j < len(times) and times[j] < t + window:
            j += 1
        worst = max(worst, j - i)
    return worst


def rate_figures(starts: Sequence[float]) -> tuple[float, float, int]:
    """(seconds from the first start to the last, starts/s over that, the most starts in any
    1-s window [t, t + 1 s) opening at a start)."""
    starts = sorted(starts)
    span = starts[-1] - starts[0]
    return span, (len(starts) - 1) / span, most_in_window(starts)


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def peak_overlap(runs: Sequence[Sequence[Any]]) -> dict[str, int]:
    """Per key, the most runs at once (an end at the same instant as a start comes first)."""
    peaks: dict[str, int] = {}
    for key in {r[0] for r in runs}:
        events = sorted([(r[1], 1) for r in runs if r[0] == key]
                        + [(r[2], -1) for r in runs if r[0] == key])  # fmt: skip
        running = peak = 0
        for _, delta in events:
            running += delta
            peak = max(peak, running)
        peaks[key] = peak
    return peaks


def _per_job(commands: Counter[str], n: int, top: int = 6) -> str:
    """Commands per job in all, script calls (each also calls TIME) and the costliest."""
    parts = ", ".join(f"{name} {calls / n:.1f}" for name, calls in commands.most_common(top))
    scripts = commands["evalsha"] + commands["eval"]
    return f"{commands.total() / n:.1f}, of which script calls {scripts / n:.2f} ({parts})"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--rate", default="500/s")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--slots", type=int, default=20)
    parser.add_argument("--concurrency-jobs", type=int, default=2_000)
    parser.add_argument("--users", type=int, default=6)
    parser.add_argument("--per-user", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=0.01)
    parser.add_argument("--timeout", type=float, default=300)
    args = parser.parse_args(argv)
    if args.users * args.per_user > args.processes * args.slots:
        parser.error(f"--users {args.users} x --per-user {args.per_user} permits exceed the "
                     f"{args.processes} x {args.slots} slots: some user could never reach its "
                     f"limit; use fewer users or more slots")  # fmt: skip
    lines: list[str] = []

    def say(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    load = os.getloadavg()
    say("# Rate and concurrency limits under load (bench.limits)")
    say(f"- command: `{' '.join(['python -m bench.limits', *sys.argv[1:]])}`")
    say(f"CPU: {cpu_model()}, {os.cpu_count()} cores; load average before: "
        f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")  # fmt: skip
    say(f"drumbeat: {_source()}")
    runs, n, commands = _drain(args, "rate")
    if os.environ.get("BENCH_LIMITS_DUMP"):  # every (start, grant), for a closer look
        Path(os.environ["BENCH_LIMITS_DUMP"]).write_text(json.dumps(sorted(r[1:] for r in runs)))
    span, rate, worst = rate_figures([r[1] for r in runs])
    say(f"rate_limit={args.rate!r}, {args.processes} processes x {args.slots} slots, "
          f"{n:,} jobs: {rate:.1f} starts/s over {span:.2f} s (first start to last); most starts "
          f"in a 1-s window: {worst} (as the tasks saw them start); "
          f"Redis commands/job: {_per_job(commands, n)}")  # fmt: skip
    grants = [r[3] for r in runs if len(r) > 3 and r[3] is not None]
    if len(grants) == len(runs):
        late = [(r[1] - r[3]) * 1000 for r in runs]
        say(f"grants (the start the limiter granted each run, Redis clock): most in a 1-s "
            f"window: {most_in_window(grants)}; start - grant: p50 {percentile(late, 0.5):.1f} "
            f"ms, p99 {percentile(late, 0.99):.1f} ms, max {max(late):.1f} ms, "
            f"min {min(late):.1f} ms")  # fmt: skip
    else:
        say(f"grants: {len(grants)} of {len(runs)} runs knew theirs (this drumbeat has no "
            f"Context.granted_ms)")  # fmt: skip
    runs, n, commands = _drain(args, "concurrency")
    peaks = peak_overlap(runs)
    say(f"concurrency_limit={args.per_user} by user_id, {len(peaks)} users, {n:,} jobs of "
          f"{args.seconds * 1000:.0f} ms: most runs of one user at once: {max(peaks.values())} "
          f"(per user: {', '.join(str(peaks[k]) for k in sorted(peaks))}); "
          f"Redis commands/job: {_per_job(commands, n)}")  # fmt: skip
    load = os.getloadavg()
    say(f"load average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out = REPO / "bench" / "results" / f"limits-{stamp}.md"
    out.write_text("\n\n".join(lines) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
