"""Periodic schedules on a Redis Cluster of 1, 2 and 3 masters: runs/s and Redis CPU per run,
per master, so the step to more machines is a calculation.

    python -m bench.cluster_periodic [--masters 1,2,3] [--n 20000] [--interval 5]
                                     [--workers 2] [--concurrency 100] [--duration 30]

For each master count M it starts M ``redis-server --cluster-enabled yes`` nodes on this machine
(no replicas; the 16,384 slots split into M equal ranges with ``CLUSTER ADDSLOTSRANGE``, then
``CLUSTER MEET``: ``redis-cli --cluster create`` refuses fewer than 3 masters), picks a namespace
whose ``4 * M`` schedule shards land 4 on each master, registers ``--n`` schedules every
``--interval`` s (``schedule_many``), and runs ``drumbeat worker
bench.periodic_peers.drumbeat_app:app --processes W --concurrency C`` on the
``redis+cluster://`` URL. After a warm-up of two intervals it measures ``--duration`` seconds:
per master, the runs its shards started (from each shard's `lateness` hash, whose cumulative
bins count every run a claim starts) and its Redis CPU (``INFO`` used_cpu_user + sys); lateness
p50/p99 from the same bins over the window.

Everything runs on one machine: the masters, the workers and this harness share its cores, so
the delivered runs/s is this machine's, not the cluster's. The figure that carries to real
machines is Redis CPU per run on each master: a master with a core of its own carries about
1,000,000 / (µs per run) runs/s.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from redis.cluster import ClusterNode, RedisCluster
from tests.cluster.small import SmallCluster

import drumbeat
from drumbeat.keys import Keys
from drumbeat.protocol import bin_percentile_ms

from . import _cluster
from ._cluster import commandstats, cpu_seconds
from ._redis import find_server_binary
from .machine import cpu_model

TASK = "bench.periodic.noop"
APP = "bench.periodic_peers.drumbeat_app:app"
SHARDS_PER_MASTER = 4
RESULTS = Path(__file__).resolve().parent / "results"


def even_namespace(cluster: SmallCluster, shards: int) -> str:
    """A namespace whose schedule shards land evenly on the masters (a stable search: the same
    names on every run)."""
    return _cluster.even_namespace(
        cluster.master_of,
        len(cluster.nodes),
        shards,
        # One shard: the schedules live with the jobs (no shard number in the tag).
        lambda ns, i: (Keys(ns) if shards == 1 else Keys(ns, i)).due,
    )


def _lateness_bins(client: RedisCluster, keys: Sequence[Keys]) -> list[dict[int, int]]:
    """Per shard: bin -> runs counted since the start (the `c<bin>` fields)."""
    out = []
    for k in keys:
        fields = client.hgetall(k.lateness)
        named = {_text(f): int(v) for f, v in fields.items()}
        out.append(
            {int(f[1:]): n for f, n in named.items() if f.startswith("c") and f[1:].isdigit()}
        )
    return out


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _async_noop(i: int) -> None:
    """Registration only needs the task's name; the workers register the real one."""


def one_case(masters: int, args: argparse.Namespace) -> dict[str, object]:
    cluster = SmallCluster(find_server_binary(), masters)
    cluster.start()
    shards = args.shards_per_master * masters
    ns = even_namespace(cluster, shards)
    runs_dir = Path(tempfile.mkdtemp(prefix="drumbeat-bench-runs-"))
    env = {
        **os.environ,
        "DRUMBEAT_REDIS_URL": cluster.url,
        "DRUMBEAT_NAMESPACE": ns,
        "DRUMBEAT_SCHEDULE_SHARDS": str(shards),
        "BENCH_PERIODIC_RUNS_DIR": str(runs_dir),
    }
    worker = subprocess.Popen(
        [sys.executable, "-m", "drumbeat", "worker", APP, "--processes", str(args.workers),
         "--concurrency", str(args.concurrency), "--log-level", "warning"],
        env=env, start_new_session=True,
    )  # fmt: skip
    app = drumbeat.App(cluster.url, namespace=ns, schedule_shards=shards)
    try:
        app.task(name=TASK)(_async_noop)
        t0 = time.perf_counter()
        for lo in range(0, args.n, 10_000):
            app.schedule_many(
                drumbeat.Schedule(f"s{i}", TASK, every=args.interval, args=(i,))
                for i in range(lo, min(lo + 10_000, args.n))
            )
        registered = time.perf_counter() - t0
        time.sleep(2 * args.interval)  # every schedule's first run came due, the pool warmed up
        # One shard: the schedules live with the jobs (no shard number in the tag).
        keys = [Keys(ns)] if shards == 1 else [Keys(ns, i) for i in range(shards)]
        owner = [cluster.master_of(k.due) for k in keys]
        client = RedisCluster(
            startup_nodes=[ClusterNode("127.0.0.1", n.port) for n in cluster.nodes]  # type: ignore[no-untyped-call]
        )
        bins0, cpu0, w0 = _lateness_bins(client, keys), cpu_seconds(cluster.nodes), time.monotonic()
        stats0 = commandstats(cluster.nodes)
        time.sleep(args.duration)
        bins1, cpu1, w1 = _lateness_bins(client, keys), cpu_seconds(cluster.nodes), time.monotonic()
        stats1 = commandstats(cluster.nodes)
        client.close()
    finally:
        app.close()
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(60)
        cluster.stop()
    window = w1 - w0
    runs_per_master = [0] * masters
    merged: dict[int, int] = {}
    for shard, (b0, b1) in enumerate(zip(bins0, bins1, strict=True)):
        for b, n in b1.items():
            d = n - b0.get(b, 0)
            if d:
                runs_per_master[owner[shard]] += d
                merged[b] = merged.get(b, 0) + d
    cpu = [c1 - c0 for c0, c1 in zip(cpu0, cpu1, strict=True)]
    runs = max(1, sum(runs_per_master))
    commands = _cluster.costliest(stats0, stats1, runs)
    return {
        "masters": masters,
        "shards": shards,
        "namespace": ns,
        "registered_s": registered,
        "window_s": window,
        "expected_per_s": args.n / args.interval,
        "runs_per_s": sum(runs_per_master) / window,
        "per_master_runs_per_s": [r / window for r in runs_per_master],
        "per_master_cpu_pct": [100 * c / window for c in cpu],
        "per_master_us_per_run": [
            1e6 * c / r if r else float("nan") for c, r in zip(cpu, runs_per_master, strict=True)
        ],
        "p50_ms": bin_percentile_ms(merged, 0.5) if merged else float("nan"),
        "p99_ms": bin_percentile_ms(merged, 0.99) if merged else float("nan"),
        "commands": commands,
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--masters", default="1,2,3")
    p.add_argument("--n", type=int, default=20_000)
    p.add_argument("--interval", type=float, default=5.0)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=100)
    p.add_argument("--duration", type=float, default=30.0)
    p.add_argument("--shards-per-master", type=int, default=SHARDS_PER_MASTER)
    args = p.parse_args(argv)
    command = " ".join(["python -m bench.cluster_periodic", *(argv or sys.argv[1:])])
    load = os.getloadavg()
    lines = [
        "# Periodic schedules on a Redis Cluster of 1 to N masters (bench.cluster_periodic)",
        "",
        f"- command: `{command}`",
        f"- CPU: {cpu_model()}, {os.cpu_count()} cores (masters, workers and harness all on it); "
        f"load average at start {load[0]:.2f}",
        f"- {args.n:,} schedules every {args.interval:g} s ({args.n / args.interval:,.0f} runs/s "
        f"due), {args.workers} worker processes x {args.concurrency} slots "
        f"(`drumbeat worker --processes`), {args.shards_per_master} schedule shards per master, "
        f"measured over {args.duration:g} s after a warm-up of {2 * args.interval:g} s",
        "",
        "| masters | runs/s delivered (due) | runs/s per master | Redis CPU per master | "
        "Redis CPU per run, per master | lateness p50 / p99 |",
        "|---:|---:|---|---|---|---:|",
    ]
    notes: list[str] = []
    for m in (int(x) for x in args.masters.split(",")):
        r = one_case(m, args)
        per = ", ".join(f"{x:,.0f}" for x in r["per_master_runs_per_s"])  # type: ignore[attr-defined]
        pct = ", ".join(f"{x:.0f} %" for x in r["per_master_cpu_pct"])  # type: ignore[attr-defined]
        us = ", ".join(f"{x:.1f} µs" for x in r["per_master_us_per_run"])  # type: ignore[attr-defined]
        row = (f"| {m} | {r['runs_per_s']:,.0f} ({r['expected_per_s']:,.0f}) | {per} | {pct} | "
               f"{us} | {r['p50_ms']:.0f} / {r['p99_ms']:.0f} ms |")  # fmt: skip
        print(row, flush=True)
        lines.append(row)
        top = "; ".join(
            f"{name} {calls:.2f} calls, {us:.1f} µs" for name, calls, us in r["commands"]
        )  # type: ignore[attr-defined]
        notes.append(f"- {m} masters, per run, the costliest commands (every master): {top}")
    load = os.getloadavg()
    lines += ["", *notes, f"- load average at end {load[0]:.2f}"]
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"cluster-periodic-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}.md"
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"written: {out.relative_to(RESULTS.parent.parent)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
