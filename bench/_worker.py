"""A drumbeat worker process for the benchmark (see `bench.adapter` for its stdout protocol).

``python -m bench._worker --url URL --namespace NS --concurrency C``; stops on SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

import drumbeat

from .adapter import cpu_seconds, emit, peak_rss_kb
from .drumbeat_system import Sink, register


async def main(url: str, namespace: str, concurrency: int) -> None:
    app = drumbeat.App(url, namespace=namespace)
    sink = Sink()
    register(app, sink)
    worker = drumbeat.Worker(app, concurrency=concurrency)
    worker.install_signal_handlers()
    cpu0 = cpu_seconds()
    emit("started", t=time.time(), pid=os.getpid())
    await worker.run()
    cpu = cpu_seconds() - cpu0
    await app.aclose()
    emit(
        "report",
        count=sink.count,
        latencies=sink.latencies,
        peak_rss_kb=peak_rss_kb(),
        cpu_s=cpu,
        extra={"processed": worker.processed, "failed": worker.failed, "worker_id": worker.id},
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--concurrency", type=int, default=10)
    args = parser.parse_args()
    asyncio.run(main(args.url, args.namespace, args.concurrency))
