"""Where Redis's CPU goes, per script: a profile of a live Redis, or one claim in isolation.

    python -m bench.redis_cpu attach REDIS_URL [--seconds 3]
    python -m bench.redis_cpu idle [--n 100000] [--calls 200] [--callgrind]

``attach`` samples a running Redis (e.g. the private one of a `bench.periodic` run, found with
``ps``) with ``SLOWLOG`` at a 0 µs threshold for a few seconds, then prints, per script (its
sha mapped to a name through `drumbeat.script_sources.SHAS`) and per command: calls, µs per call
(Redis's own timing), words per call (the slow log keeps 32) and share of the sampled time.
Redis 7.0 logs a script's inner commands too, and recording them slows the script: use it for
the mix of calls and their relative weight, not for absolute times. The settings are restored
after.

``idle`` claims jobs ``--calls`` times with nothing due (``--n`` schedules waiting in the time
slots) and prints what one claim costs Redis (CPU, or instructions with ``--callgrind``): the
fixed part of every claim, which a claim carrying few jobs pays for each of them.

(The ``harness`` mode, which claimed and settled the runs of the timing wheel in isolation, went
with the wheel: `git show a3577d4:bench/redis_cpu.py`. The time slots' cost per run is measured
end to end by `bench.periodic`.)
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import redis

from bench._redis import RedisServer, find_server_binary

NAMESPACE = "cpu"
TASK = "bench.redis_cpu.noop"


def _names() -> dict[str, str]:
    from drumbeat.script_sources import SHAS

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

    def off(self) -> None:
        """Pauses counting (``on()`` resumes; ``take()`` ends the phase)."""
        self._ctl("-i", "off")

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
    """What one claim of jobs costs Redis when nothing is due (``n`` schedules waiting in the
    time slots): the fixed cost every claim pays before its jobs, which a claim carrying few
    (a light load, an idle worker woken) pays for each of them."""
    cg = Callgrind() if callgrind else None
    try:
        with RedisServer(binary=str(cg.wrapper) if cg else None) as server, server.client() as r:
            if cg is not None:
                assert server.proc is not None
                cg.pid = server.proc.pid
            app = _register(server.url, n)
            try:
                claim = app.scripts.claim("idle-probe", 100, 60_000, 500)
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


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.redis_cpu", description=__doc__.split("\n")[0]
    )
    sub = p.add_subparsers(dest="mode", required=True)
    a = sub.add_parser("attach", help="profile a live Redis by script (SLOWLOG)")
    a.add_argument("url")
    a.add_argument("--seconds", type=float, default=3.0)
    i = sub.add_parser("idle", help="one claim with nothing due: its fixed cost")
    i.add_argument("--n", type=int, default=100_000)
    i.add_argument("--calls", type=int, default=200)
    i.add_argument("--callgrind", action="store_true", help="count Redis's instructions")
    args = p.parse_args(argv)
    if args.mode == "attach":
        return attach(args.url, args.seconds)
    return idle(args.n, args.calls, callgrind=args.callgrind)


if __name__ == "__main__":
    sys.exit(main())
