"""bench/limits.py's rate workload under Dramatiq's WindowRateLimiter, Huey's rate_limit and
Celery's per-worker rate_limit (see limits_peers_apps.py): N jobs enqueued up front, 2 worker
processes x 20 threads; achieved rate, most starts in any 1-s window, Redis commands per job on
the broker. Runs in a venv with the peers (not drumbeat's):

    /path/to/peers/python -m bench.limits_peers [--jobs 10000] [--rate 500]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

from bench._redis import RedisServer
from bench.limits import REPO, rate_figures


def _commands(client: object) -> int:
    stats = client.info("commandstats")  # type: ignore[attr-defined]
    return sum(int(v["calls"]) for v in stats.values())


def _enqueue(apps: object, peer: str, i: int) -> None:
    hit = apps.hit  # type: ignore[attr-defined]
    if peer == "dramatiq":
        hit.send(i)
    elif peer == "celery":
        hit.delay(i)
    else:
        hit(i)


def _worker_argv(peer: str) -> list[list[str]]:
    """Two worker processes of 20 threads each, the peer's own way."""
    if peer == "dramatiq":
        return [[sys.executable, "-m", "dramatiq", "bench.limits_peers_apps",
                 "--processes", "2", "--threads", "20"]]  # fmt: skip
    if peer == "celery":
        # Two worker nodes (Celery's rate_limit holds per node).
        return [[sys.executable, "-m", "celery", "-A", "bench.limits_peers_apps:celery_app",
                 "worker", "--pool", "threads", "-c", "20", "-n", f"w{n}@%h",
                 "--without-gossip", "--without-mingle", "--without-heartbeat",
                 "-l", "WARNING"] for n in (1, 2)]  # fmt: skip
    consumer = [sys.executable, "-m", "huey.bin.huey_consumer", "bench.limits_peers_apps.huey",
                "-w", "20", "-k", "thread", "-q"]  # fmt: skip
    return [consumer, consumer]


def run(peer: str, args: argparse.Namespace) -> str:
    with RedisServer() as broker, RedisServer() as log:
        env = {**os.environ, "BENCH_PEER": peer, "BENCH_BROKER_URL": broker.url,
               "BENCH_LOG_URL": log.url, "BENCH_RATE": str(args.rate),
               "PYTHONPATH": str(REPO)}  # fmt: skip
        os.environ.update(env)
        import importlib

        apps = importlib.import_module("bench.limits_peers_apps")
        bclient, lclient = broker.client(), log.client()
        before = _commands(bclient)
        for i in range(args.jobs):
            _enqueue(apps, peer, i)
        argv = _worker_argv(peer)
        procs = [subprocess.Popen(a, env=env, cwd=REPO, start_new_session=True,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                 for a in argv]  # fmt: skip
        deadline = time.monotonic() + args.timeout
        try:
            while lclient.llen("starts") < args.jobs:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            commands = _commands(bclient) - before
        finally:
            for p in procs:
                os.killpg(p.pid, signal.SIGTERM)
            for p in procs:
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
        starts = [float(x) for x in lclient.lrange("starts", 0, -1)]
        bclient.close()
        lclient.close()
    if len(starts) < args.jobs:
        return f"{peer}: only {len(starts)} of {args.jobs} started within {args.timeout} s"
    span, rate, worst = rate_figures(starts)
    return (f"{peer}: {rate:.1f} starts/s over {span:.2f} s; most starts in a 1-s window: "
            f"{worst}; Redis commands/job (broker): {commands / args.jobs:.1f}")  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("peer", choices=["dramatiq", "huey", "celery"])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--rate", type=int, default=500)
    parser.add_argument("--timeout", type=float, default=240)
    args = parser.parse_args(argv)
    load = os.getloadavg()
    print(f"{args.jobs:,} jobs at {args.rate}/s, 2 processes x 20 threads; load before "
          f"{load[0]:.2f}; " + run(args.peer, args), flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
