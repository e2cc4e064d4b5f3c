"""Where Redis's CPU goes, per script: a profile of a live Redis, or one script in isolation.

    python -m bench.redis_cpu attach REDIS_URL [--seconds 3]
    python -m bench.redis_cpu harness [--n 100000] [--due 16384] [--batch 100] [--rounds 6]
                                    [--promote 500] [--callgrind] [--callgrind-keep DIR]
                                    [--whole-buckets]
    python -m bench.redis_cpu idle [--n 100000] [--calls 200] [--callgrind]

``attach`` samples a running Redis (e.g. the private one of a `bench.periodic` run, found with
``ps``) with ``SLOWLOG`` at a 0 µs threshold for a few seconds, then prints, per script (its sha
mapped to a name through `drumbeat.scripts.SHAS`) and per command: calls, µs per call (Redis's
own timing), words per call (the slow log keeps 32) and share of the sampled time. Redis 7.0
logs a script's inner commands too, and recording them slows the script: use it for the mix of
calls and their relative weight, not for absolute times. The settings are restored after.

``idle`` claims ``--calls`` times with nothing due (``--n`` schedules a day away) and prints
what one claim costs Redis (CPU, or instructions with ``--callgrind``): the fixed part of every
claim, which a claim carrying few runs pays for each of them.

``harness`` starts a private redis-server, registers ``--n`` schedules (``App.schedule_many``),
makes ``--due`` of them due now and the rest a day later (wheel scores and bucket markers
rewritten; at the defaults about one due run per bucket, as in a 100,000-schedule run, where a
claim reaches a bucket when one of its schedules comes due), then in each round claims them
all as a worker does (`claim` with the buckets the last reply named as upcoming, `promote_runs`
for the buckets it reported), ``--batch`` at a time, and settles them (`finish_runs`,
``--batch`` per call) with their next run due at once. It prints Redis CPU (INFO used_cpu) per
run, claiming and settling apart, and the commands each phase ran per run (INFO commandstats:
evalsha's µs include its inner commands; what evalsha costs beyond them is Lua and the calls'
conversions). Rounds after the first are measured (the first warms Redis up); medians over
rounds. CPU time still varies with what else runs on the machine: compare branches
alternately, with the same arguments. ``--due 100`` is the light regime (each claim's runs go
straight from their buckets to the worker); the default is a backlog (most runs pass through
`ready`). ``--callgrind`` runs the redis-server under ``valgrind --tool=callgrind``,
instrumented only while a measured phase runs, and prints instructions per run instead: they
do not vary with the machine's load (about 50 times slower; use fewer schedules and rounds,
e.g. ``--n 20000 --due 100 --rounds 20`` and ``--n 20000 --due 3000 --rounds 4``).
``--callgrind-keep DIR`` keeps the last round's dumps, for ``callgrind_annotate --inclusive=yes
DIR/claim.callgrind``: where the instructions go inside Redis (Lua, commands, replies).
``--whole-buckets`` makes every schedule of a bucket due with it (about ``--n`` / 16,384 per
bucket), as in a run where the schedules of a bucket fall due together; by default most due
runs have a bucket of their own.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import redis

from bench._redis import RedisServer, find_server_binary

NAMESPACE = "cpu"
TASK = "bench.redis_cpu.noop"


def _names() -> dict[str, str]:
    from drumbeat.scripts import SHAS

    return {sha: name for name, sha in SHAS.items()}


def _cpu(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def _commandstats(client: redis.Redis) -> dict[str, tuple[int, int]]:
    return {
        name.removeprefix("cmdstat_"): (int(v["calls"]), int(v["usec"]))
        for name, v in client.info("commandstats").items()
    }


def _delta(
    after: dict[str, tuple[int, int]], before: dict[str, tuple[int, int]]
) -> dict[str, tuple[int, int]]:
    out = {}
    for name, (calls, usec) in after.items():
        c0, u0 = before.get(name, (0, 0))
        if calls > c0:
            out[name] = (calls - c0, usec - u0)
    return out


# -- attach ------------------------------------------------------------------------------------


def attach(url: str, seconds: float) -> int:
    names = _names()
    client = redis.Redis.from_url(url)
    old = client.config_get("slowlog-*")
    per: dict[str, list[int]] = defaultdict(list)
    nargs: dict[str, list[int]] = defaultdict(list)
    try:
        client.config_set("slowlog-max-len", 100_000)
        client.config_set("slowlog-log-slower-than", 0)
        client.slowlog_reset()
        cpu0 = _cpu(client)
        t0 = time.monotonic()
        deadline = t0 + seconds
        while time.monotonic() < deadline:
            time.sleep(0.2)
            for entry in client.slowlog_get(100_000):
                cmd = entry["command"]
                words = cmd.split() if isinstance(cmd, bytes) else str(cmd).split()
                head = words[0].decode().lower() if isinstance(words[0], bytes) else words[0]
                if head.lower() in ("evalsha", "eval") and len(words) > 1:
                    sha = words[1].decode() if isinstance(words[1], bytes) else words[1]
                    head = names.get(sha, sha[:10])
                per[head].append(int(entry["duration"]))
                nargs[head].append(len(words))
            client.slowlog_reset()
        cpu = _cpu(client) - cpu0
        wall = time.monotonic() - t0
    finally:
        for key, value in old.items():
            client.config_set(key, value)
        client.close()
    total = sum(sum(v) for v in per.values())
    print(f"sampled {wall:.1f} s: Redis CPU {cpu:.2f} s, commands' own time {total / 1e6:.2f} s")
    print("| command or script | calls | µs/call (median) | µs/call (mean) | words/call | share |")
    print("|---|---:|---:|---:|---:|---:|")
    for head, durations in sorted(per.items(), key=lambda kv: -sum(kv[1])):
        print(
            f"| {head} | {len(durations)} | {statistics.median(durations):.0f} | "
            f"{statistics.fmean(durations):.1f} | {statistics.fmean(nargs[head]):.0f} | "
            f"{100 * sum(durations) / max(total, 1):.1f} % |"
        )
    return 0


# -- harness -----------------------------------------------------------------------------------


async def _noop(i: int) -> None:
    """Registration needs the task's name only."""


def _register(
    url: str, n: int, *, namespace: str = NAMESPACE, task: str = TASK, every: float = 5
) -> Any:
    """Schedules s0..s<n - 1> of an async no-op task; returns the app."""
    import drumbeat

    app = drumbeat.App(url, namespace=namespace)
    app.task(name=task)(_noop)
    for lo in range(0, n, 10_000):
        app.schedule_many(
            drumbeat.Schedule(f"s{i}", task, every=every, args=(i,))
            for i in range(lo, min(lo + 10_000, n))
        )
    return app


def _make_due(
    client: redis.Redis, keys: Any, n: int, due: int, at_ms: int, *, whole: bool = False
) -> int:
    """Schedules s0..s<due - 1> due at ``at_ms``, every other one a day later (none comes due
    while the harness runs), each bucket's marker at its earliest. ``whole``: instead, every
    schedule of the buckets of s0, s1, ... until at least ``due`` are due, as when the
    schedules of a bucket fall due together. Returns how many are due."""
    from drumbeat.keys import bucket_of

    later = at_ms + 86_400_000
    first: dict[int, int] = {}
    buckets = [bucket_of(f"s{i}") for i in range(n)]
    chosen: set[int] = set()
    if whole:
        members = Counter(buckets)
        count = 0
        for b in buckets:
            if count >= due:
                break
            if b not in chosen:
                chosen.add(b)
                count += members[b]
    pipe = client.pipeline(transaction=False)
    made = 0
    for i in range(n):
        b = buckets[i]
        is_due = b in chosen if whole else i < due
        made += is_due
        score = at_ms if is_due else later
        pipe.zadd(keys.wheel(b), {f"s{i}": score})
        first[b] = min(first.get(b, score), score)
        if len(pipe) >= 10_000:
            pipe.execute()
    pipe.delete(keys.due)
    for b, score in first.items():
        pipe.zadd(keys.due, {f"w:{b}": score})
    pipe.execute()
    return made


class Harness:
    def __init__(self, client: redis.Redis, batch: int, promote: int) -> None:
        from drumbeat.keys import Keys
        from drumbeat.scripts import Scripts

        self.client = client
        self.scripts = Scripts(Keys(NAMESPACE))
        self.batch = batch
        self.promote = promote
        self.upcoming: list[int] = []
        self.calls: Counter[str] = Counter()

    def claim_all(self, expected: int) -> list[Any]:
        """Claims until ``expected`` runs are out, as a worker with ``batch`` free slots."""
        s, out = self.scripts, []
        stuck = 0
        while len(out) < expected:
            result = s.claim("w1", self.batch, 60_000, self.promote, self.upcoming).run(self.client)
            self.calls["claim"] += 1
            took = len(result.jobs)
            out += result.jobs
            self.upcoming = result.upcoming
            while result.buckets:
                result = s.promote_runs(result.buckets, "w1", self.batch - took, 60_000).run(
                    self.client
                )
                self.calls["promote_runs"] += 1
                out += result.jobs
                took += len(result.jobs)
                self.upcoming = result.upcoming
            if not result.jobs and not took:
                stuck += 1
                if stuck > 50:  # held buckets come back after BUCKET_HOLD_MS
                    time.sleep(0.05)
                if stuck > 400:
                    raise RuntimeError(f"claimed {len(out)} of {expected} runs, then nothing")
            else:
                stuck = 0
        return out

    def finish_all(self, jobs: Sequence[Any], due_ms: int) -> None:
        s = self.scripts
        for lo in range(0, len(jobs), self.batch):
            items = []
            for job in jobs[lo : lo + self.batch]:
                was, grid, gen, _manual = job.extra.split(":")
                items.append(
                    (job.id, job.token, "ok", 1, int(gen), int(grid) + 5000, due_ms, "", int(was))
                )
            refused = [r for r in s.finish_runs(items).run(self.client) if r != 1]
            assert not refused, f"finish_runs refused {len(refused)} runs; expected none"
            self.calls["finish_runs"] += 1


class Callgrind:
    """A redis-server under callgrind with instrumentation off but for the phases measured:
    ``on()`` before one, ``take()`` after it gives its instructions (dumped, then zeroed)."""

    def __init__(self, keep: Path | None = None) -> None:
        self.keep = keep
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
        self.dir = Path(tempfile.mkdtemp(prefix="drumbeat-callgrind-"))
        self.wrapper = self.dir / "redis-server"
        self.wrapper.write_text(
            "#!/bin/sh\nexec valgrind --tool=callgrind --instr-atstart=no "
            f'--callgrind-out-file={self.dir}/callgrind.out.%p {find_server_binary()} "$@"\n'
        )
        self.wrapper.chmod(0o755)
        self.pid = 0

    def _ctl(self, *args: str) -> None:
        cmd = ["callgrind_control", *args, str(self.pid)]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def on(self) -> None:
        self._ctl("-i", "on")

    def take(self, keep: Path | None = None) -> int:
        """The instructions since ``on()``; the dump is moved to ``keep`` when given (for
        ``callgrind_annotate``), else deleted."""
        self._ctl("-i", "off")
        before = set(self.dir.glob("callgrind.out.*"))
        self._ctl("-d")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for path in set(self.dir.glob("callgrind.out.*")) - before:
                for line in path.read_text().splitlines():
                    if line.startswith("totals:"):  # written last: the dump is complete
                        if keep is None:
                            path.unlink()
                        else:
                            path.replace(keep)
                        return int(line.split()[1])
            time.sleep(0.1)
        raise RuntimeError(f"callgrind wrote no complete dump into {self.dir} within 60 s")

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def idle(n: int, calls: int, *, callgrind: bool) -> int:
    """What one claim costs Redis when nothing is due (``n`` schedules a day away): the fixed
    cost every claim pays before its runs, which a claim carrying few runs (a light load, an
    idle worker woken) pays for each of them."""
    cg = Callgrind() if callgrind else None
    try:
        with RedisServer(binary=str(cg.wrapper) if cg else None) as server, server.client() as r:
            if cg is not None:
                assert server.proc is not None
                cg.pid = server.proc.pid
            app = _register(server.url, n)
            try:
                from drumbeat.keys import Keys

                _make_due(r, Keys(NAMESPACE), n, 0, int(r.time()[0]) * 1000)
                claim = app.scripts.claim("idle-probe", 100, 60_000, 500, upcoming=0)
                for _ in range(20):  # warm up
                    claim.run(r)
                cpu0, st0 = _cpu(r), _commandstats(r)
                if cg is not None:
                    cg.on()
                for _ in range(calls):
                    assert not claim.run(r).jobs, "nothing should be due"
                ir = cg.take() if cg is not None else None
                cpu1, st1 = _cpu(r), _commandstats(r)
            finally:
                app.close()
    finally:
        if cg is not None:
            cg.close()
    print(f"idle claims: {n:,} schedules, none due, {calls} calls")
    if ir is not None:
        print(f"Redis instructions per claim (callgrind): {ir / calls / 1e3:.1f} k")
    calls_of = _delta(st1, st0)
    print(f"Redis CPU per claim: {(cpu1 - cpu0) * 1e6 / calls:.2f} µs; commands per claim: "
          + ", ".join(f"{name} {c / calls:.0f}" for name, (c, _) in sorted(calls_of.items())
                      if name not in ("info", "time") and c))  # fmt: skip
    return 0


def harness(
    n: int,
    due: int,
    batch: int,
    rounds: int,
    promote: int,
    *,
    callgrind: bool,
    whole: bool,
    keep: Path | None = None,
) -> int:
    cg = Callgrind(keep) if callgrind or keep else None
    try:
        results = _harness(n, due, batch, rounds, promote, cg=cg, whole=whole)
    finally:
        if cg is not None:
            cg.close()
    _print(results, n, results[0]["runs"], batch, promote)
    return 0


def _harness(
    n: int, due: int, batch: int, rounds: int, promote: int, *, cg: Callgrind | None, whole: bool
) -> list[dict[str, Any]]:
    with RedisServer(binary=str(cg.wrapper) if cg else None) as server, server.client() as client:
        if cg is not None:
            assert server.proc is not None
            cg.pid = server.proc.pid  # the wrapper execs valgrind, which runs redis-server
        app = _register(server.url, n)
        try:
            from drumbeat.keys import Keys

            keys = Keys(NAMESPACE)
            now = int(client.time()[0]) * 1000
            due = _make_due(client, keys, n, due, now - 1000, whole=whole)
            h = Harness(client, batch, promote)
            results: list[dict[str, Any]] = []
            for r in range(rounds):
                row: dict[str, Any] = {}
                count = cg if r > 0 else None  # the first round warms up
                cpu0, st0 = _cpu(client), _commandstats(client)
                if count is not None:
                    count.on()
                jobs = h.claim_all(due)
                if count is not None:
                    row["claim_ir"] = count.take(count.keep and count.keep / "claim.callgrind")
                cpu1, st1 = _cpu(client), _commandstats(client)
                now = int(client.time()[0]) * 1000
                if count is not None:
                    count.on()
                h.finish_all(jobs, now - 1000)
                if count is not None:
                    row["finish_ir"] = count.take(count.keep and count.keep / "settle.callgrind")
                cpu2, st2 = _cpu(client), _commandstats(client)
                row["claim_cpu"], row["finish_cpu"] = cpu1 - cpu0, cpu2 - cpu1
                row["claim_stats"], row["finish_stats"] = _delta(st1, st0), _delta(st2, st1)
                row["runs"] = len(jobs)
                if r > 0:
                    results.append(row)
        finally:
            app.close()
    return results


def _print(results: list[dict[str, Any]], n: int, due: int, batch: int, promote: int) -> None:
    def med(f: Any) -> float:
        return statistics.median(f(r) for r in results)

    print(f"harness: {n:,} schedules, {due:,} due per round, batch {batch}, promote {promote}, "
          f"{len(results)} measured rounds (medians)")  # fmt: skip
    if "claim_ir" in results[0]:
        c_ir = med(lambda r: r["claim_ir"] / r["runs"])
        f_ir = med(lambda r: r["finish_ir"] / r["runs"])
        print(f"Redis instructions per run (callgrind): {(c_ir + f_ir) / 1e3:.1f} k (claiming "
              f"{c_ir / 1e3:.1f} k, settling {f_ir / 1e3:.1f} k); the CPU times below are "
              "valgrind's")  # fmt: skip
    claim = med(lambda r: r["claim_cpu"] * 1e6 / r["runs"])
    finish = med(lambda r: r["finish_cpu"] * 1e6 / r["runs"])
    # The least disturbed round: on a shared machine a busy neighbour (another process on the
    # same core or its cache) inflates CPU time, never deflates it.
    least = min((r["claim_cpu"] + r["finish_cpu"]) * 1e6 / r["runs"] for r in results)
    print(f"Redis CPU per run: {claim + finish:.2f} µs (claiming {claim:.2f}, settling "
          f"{finish:.2f}); least over rounds {least:.2f} µs")  # fmt: skip
    print("| phase | command | calls/run | µs/call | µs/run |")
    print("|---|---|---:|---:|---:|")
    for phase in ("claim", "finish"):
        names = set().union(*(r[f"{phase}_stats"] for r in results))
        rows = []
        for name in names:
            key = f"{phase}_stats"
            calls = med(lambda r, k=key, n=name: r[k].get(n, (0, 0))[0] / r["runs"])
            usec = med(lambda r, k=key, n=name: r[k].get(n, (0, 0))[1] / r["runs"])
            rows.append((usec, name, calls))
        for usec, name, calls in sorted(rows, reverse=True):
            if name in ("info", "time"):
                continue
            per_call = usec / calls if calls else 0.0
            print(f"| {phase} | {name} | {calls:.3f} | {per_call:.2f} | {usec:.2f} |")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.redis_cpu", description=__doc__.split("\n")[0]
    )
    sub = p.add_subparsers(dest="mode", required=True)
    a = sub.add_parser("attach", help="profile a live Redis by script (SLOWLOG)")
    a.add_argument("url")
    a.add_argument("--seconds", type=float, default=3.0)
    h = sub.add_parser("harness", help="claim and settle due runs in isolation")
    h.add_argument("--n", type=int, default=100_000)
    h.add_argument("--due", type=int, default=16_384)
    h.add_argument("--batch", type=int, default=100)
    h.add_argument("--rounds", type=int, default=6)
    h.add_argument(
        "--promote", type=int, default=500, help="due markers a claim steps aside (batch_limit)"
    )
    h.add_argument(
        "--callgrind", action="store_true", help="count Redis's instructions per run (valgrind)"
    )
    h.add_argument(
        "--callgrind-keep",
        type=Path,
        metavar="DIR",
        help="with --callgrind: keep the last round's dumps in DIR (claim.callgrind, "
        "settle.callgrind) for callgrind_annotate --inclusive=yes",
    )
    h.add_argument(
        "--whole-buckets",
        action="store_true",
        help="make whole buckets due (their schedules fall due together), at least --due runs",
    )
    i = sub.add_parser("idle", help="one claim with nothing due: its fixed cost")
    i.add_argument("--n", type=int, default=100_000)
    i.add_argument("--calls", type=int, default=200)
    i.add_argument("--callgrind", action="store_true", help="count Redis's instructions")
    args = p.parse_args(argv)
    if args.mode == "attach":
        return attach(args.url, args.seconds)
    if args.mode == "idle":
        return idle(args.n, args.calls, callgrind=args.callgrind)
    if args.due > args.n or args.batch < 1 or args.rounds < 2:
        p.error("--due must be <= --n, --batch >= 1, --rounds >= 2")
    return harness(
        args.n,
        args.due,
        args.batch,
        args.rounds,
        args.promote,
        callgrind=args.callgrind,
        whole=args.whole_buckets,
        keep=args.callgrind_keep,
    )


if __name__ == "__main__":
    sys.exit(main())
