"""What job middleware costs a worker: drain throughput with no middleware, with
`drumbeat.otel` instrumented but no SDK (a no-op tracer provider: what an app that installs
the extra and exports nothing pays), and with the SDK recording every span into its in-memory
exporter, side by side in one run.

    python -m bench.middleware [--jobs 20000] [--repeat 5] [--concurrency 50] [--sync]

Starts a private redis-server. Each repetition runs the three variants back to back (their
order rotated), each on a fresh namespace: ``--jobs`` no-op jobs enqueued (through the
variant's producer middleware, so the recorded variant's jobs carry a ``traceparent``), then
drained by a worker in this process (`drumbeat.testing.arun_until_idle`: its start, the drain,
the idle check and its stop are timed; the same in every variant). Prints the median jobs/s of
each and its cost against no middleware, and the worker's CPU time per job (this process's, so
Redis's is not in it): on a busy host the wall-clock rate moves with the other load, the CPU
time much less.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Sequence

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import drumbeat
import drumbeat.otel
from drumbeat.testing import arun_until_idle

from ._redis import RedisServer
from .machine import cpu_model

VARIANTS = ("off", "otel, no SDK", "otel, in-memory exporter")


def _setup(variant: str, app: drumbeat.App) -> Callable[[], None]:
    """Instruments ``app`` for ``variant``; returns what to close afterwards."""
    if variant == "off":
        return lambda: None
    if variant == "otel, no SDK":
        drumbeat.otel.instrument(app, tracer_provider=trace.NoOpTracerProvider())
        return lambda: None
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    drumbeat.otel.instrument(app, tracer_provider=provider)
    return provider.shutdown


async def _drain(
    url: str, variant: str, jobs: int, concurrency: int, sync: bool
) -> tuple[float, float]:
    """Jobs per second of one drain of ``jobs`` no-op jobs, and the worker's CPU µs per job."""
    app = drumbeat.App(url, namespace=f"mw-{uuid.uuid4().hex[:8]}")
    close = _setup(variant, app)

    if sync:

        @app.task(name="noop")
        def noop_sync(i: int) -> None: ...

        task = noop_sync.prepare
    else:

        @app.task(name="noop")
        async def noop_async(i: int) -> None: ...

        task = noop_async.prepare
    for start in range(0, jobs, 1000):
        await app.aenqueue_many([task(i) for i in range(start, min(jobs, start + 1000))])
    began, cpu = time.perf_counter(), time.process_time()
    ran = await arun_until_idle(app, timeout=600, concurrency=concurrency)
    elapsed, cpu = time.perf_counter() - began, time.process_time() - cpu
    close()
    await (await app.aredis()).flushdb()
    await app.aclose()
    assert ran == jobs, f"{variant}: ran {ran} of {jobs}"
    return jobs / elapsed, 1e6 * cpu / jobs


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.middleware", description=__doc__)
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--concurrency", type=int, default=50)
    p.add_argument("--sync", action="store_true", help="sync tasks (a thread each) not async")
    args = p.parse_args(argv)
    print(f"$ python -m bench.middleware --jobs {args.jobs} --repeat {args.repeat} "
          f"--concurrency {args.concurrency}{' --sync' if args.sync else ''}")  # fmt: skip
    print(f"CPU: {cpu_model()}; Python {sys.version.split()[0]}")
    rates: dict[str, list[float]] = {v: [] for v in VARIANTS}
    cpus: dict[str, list[float]] = {v: [] for v in VARIANTS}
    with RedisServer() as server:
        for rep in range(args.repeat):
            order = VARIANTS[rep % 3 :] + VARIANTS[: rep % 3]  # no variant always first
            for variant in order:
                rate, cpu = asyncio.run(
                    _drain(server.url, variant, args.jobs, args.concurrency, args.sync)
                )
                rates[variant].append(rate)
                cpus[variant].append(cpu)
                print(f"  rep {rep + 1} {variant:<26} {rate:9,.0f} jobs/s {cpu:6.1f} µs CPU/job")
    base, base_cpu = statistics.median(rates["off"]), statistics.median(cpus["off"])
    print(f"median of {args.repeat}: jobs/s (cost against off), worker CPU µs/job (cost):")
    for variant in VARIANTS:
        rate, cpu = statistics.median(rates[variant]), statistics.median(cpus[variant])
        print(f"  {variant:<26} {rate:9,.0f} ({100 * (1 - rate / base):+5.1f} %)"
              f"  {cpu:6.1f} ({100 * (cpu / base_cpu - 1):+5.1f} %)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
