"""What a Redis Cluster failover loses (issue 15): a producer enqueues one job at a time as fast
as it can, a worker process runs them, and the master that holds the jobs is killed with
SIGKILL mid-stream; a replica takes over and both carry on. Each job records its run in a
separate redis-server (not part of the cluster, so the record survives the kill). Counts, per
round: jobs acknowledged to the producer that never ran (lost), jobs that ran twice, and how
long before the kill the lost ones were acknowledged (Redis replicates asynchronously: what the
master acknowledged but had not yet sent to its replica is gone).

    python -m bench.failover [--rounds 5] [--before 2] [--after 3]

3 masters + 3 replicas on this machine (the test suite's cluster: ``--cluster-node-timeout
2000``, no persistence), one producer thread, one worker process (concurrency 20).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import redis
from redis.exceptions import RedisClusterException
from tests.cluster.conftest import ClusterServer

import drumbeat
from bench._redis import RedisServer
from bench.machine import cpu_model

REPO = Path(__file__).resolve().parent.parent
APP = "bench.failover_app:app"
TASK = "bench.failover_app.note"


class Producer(threading.Thread):
    """Enqueues job 0, 1, 2... one at a time until stopped; notes when each was acknowledged."""

    def __init__(self, app: drumbeat.App) -> None:
        super().__init__()
        self.app = app
        self.acked: list[tuple[int, float]] = []  # (job number, when its enqueue returned)
        self.refused = 0
        self.stop = threading.Event()

    def run(self) -> None:
        n = 0
        while not self.stop.is_set():
            try:
                self.app.enqueue(TASK, n)
            except (redis.RedisError, RedisClusterException, OSError, drumbeat.DrumbeatError):
                self.refused += 1  # not acknowledged: its producer would retry it
                time.sleep(0.05)
                continue
            self.acked.append((n, time.time()))
            n += 1


def _ran(log: redis.Redis, want: set[int], timeout: float = 120) -> list[int]:
    """The job numbers that ran, once every one of ``want`` did (or ``timeout`` passed)."""
    deadline = time.monotonic() + timeout
    while True:
        ran = [int(x) for x in log.lrange("ran", 0, -1)]
        if want <= set(ran) or time.monotonic() > deadline:
            return ran
        time.sleep(0.5)


def one_round(before: float, after: float) -> dict[str, float]:
    server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    assert server and cli, "needs redis-server and redis-cli (Debian: redis-server redis-tools)"
    cluster = ClusterServer(server, cli)
    namespace = "f" + uuid.uuid4().hex[:10]
    with RedisServer() as log:
        cluster.start()
        env = {**os.environ, "DRUMBEAT_REDIS_URL": cluster.url, "DRUMBEAT_NAMESPACE": namespace,
               "BENCH_LOG_URL": log.url, "PYTHONPATH": str(REPO)}  # fmt: skip
        worker = subprocess.Popen(
            [sys.executable, "-m", "drumbeat", "worker", APP, "--concurrency", "20"],
            env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        app = drumbeat.App(cluster.url, namespace=namespace)
        producer = Producer(app)
        try:
            producer.start()
            time.sleep(before)
            master = cluster.node_of(app.keys.jobs)
            killed_at = time.time()
            master.kill()
            deadline = time.monotonic() + 60
            while cluster.node_of(app.keys.jobs) is master:  # the failover (node timeout 2 s)
                assert time.monotonic() < deadline, "no replica took over"
                time.sleep(0.1)
            time.sleep(after)
            producer.stop.set()
            producer.join(60)
            ran = _ran(log.client(), {n for n, _ in producer.acked})
        finally:
            producer.stop.set()
            worker.terminate()
            worker.wait(30)
            app.close()
            cluster.stop()
    seen = set(ran)
    lost = [(n, t) for n, t in producer.acked if n not in seen]
    return {
        "acked": len(producer.acked),
        "lost": len(lost),
        "twice": len(ran) - len(seen),
        "refused": producer.refused,
        "lost_before_kill_ms": max(((killed_at - t) * 1000 for _, t in lost), default=0.0),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--before", type=float, default=2.0, help="s of jobs before the kill")
    parser.add_argument("--after", type=float, default=3.0, help="s of jobs after the failover")
    args = parser.parse_args()
    print(f"command: python -m bench.failover --rounds {args.rounds} --before {args.before:g} "
          f"--after {args.after:g}")  # fmt: skip
    print(f"cpu: {cpu_model()}, {os.cpu_count()} cores; load average {os.getloadavg()[0]:.2f}")
    rows = []
    for i in range(args.rounds):
        r = one_round(args.before, args.after)
        rows.append(r)
        print(f"round {i + 1}: {r['acked']:,} acknowledged, {r['lost']} lost, "
              f"{r['twice']} ran twice, {r['refused']} enqueues refused during the failover; "
              f"the oldest lost one acknowledged {r['lost_before_kill_ms']:.1f} ms before the "
              "kill", flush=True)  # fmt: skip
    lost = [r["lost"] for r in rows]
    print(
        f"lost per round: median {statistics.median(lost):g}, max {max(lost):g}; ran twice: "
        f"max {max(r['twice'] for r in rows):g}; load average {os.getloadavg()[0]:.2f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
