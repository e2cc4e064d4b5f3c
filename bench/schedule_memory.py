"""Where a schedule's bytes go in Redis: today's layout, component by component, beside the
layouts that could bring a typical monitor under 200 B (issue 3's target).

    .venv/bin/python -m bench.schedule_memory [--n 1000000] [--buckets 16384]

Each row starts from an empty private redis-server and reports ``used_memory`` after minus
before, over N, with ``MEMORY USAGE ... SAMPLES 0`` (every element counted) of the big keys.
The typical monitor is the issue's example: ``app.schedule("monitor:u<i>:switch",
check_listing, every=5, args=("switch", 30000))``. The candidate layouts are synthetic (raw
Redis commands, values of the stated size): they measure what Redis would hold, not code that
exists.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import redis

from bench._redis import RedisServer
from drumbeat import App, Schedule, Settings
from drumbeat.keys import Keys
from drumbeat.schedule import split_stored

Row = tuple[str, float, str]
_BATCH = 5000


def _ids(n: int) -> list[str]:
    return [f"monitor:u{i}:switch" for i in range(n)]


def _bucket(schedule_id: str, buckets: int) -> int:
    digest = hashlib.blake2b(schedule_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % buckets


def _measure(client: redis.Redis, fill: Callable[[], None], keys: Sequence[str]) -> tuple[int, str]:
    before = int(client.info("memory")["used_memory"])
    fill()
    after = int(client.info("memory")["used_memory"])
    parts = []
    for key in keys:
        usage = client.memory_usage(key, samples=0) or 0
        encoding = client.object("encoding", key)
        parts.append(f"`{key.split('}:', 1)[-1]}` {usage:,} B ({encoding.decode()})")
    return after - before, ", ".join(parts)


def today(url: str, n: int, after_runs: bool) -> tuple[int, str]:
    """drumbeat as it is: `due` zset + one `schedules` hash per shard."""
    app = App(url, settings=Settings(namespace="mem"))

    @app.task(name="monitor.check_listing")
    def check_listing(keyword: str, price: int) -> None: ...

    client: redis.Redis = app.redis
    keys = Keys("mem")

    def fill() -> None:
        ids = _ids(n)
        for i in range(0, n, _BATCH):
            app.schedule_many(
                [
                    Schedule(s, check_listing, every=5, args=("switch", 30000))
                    for s in ids[i : i + _BATCH]
                ]
            )
        if after_runs:  # totals as they look once every schedule has run a while
            now = int(time.time() * 1000)
            for i in range(0, n, _BATCH):
                chunk = ids[i : i + _BATCH]
                values: list[Any] = client.hmget(keys.schedules, chunk)
                rewritten: dict[Any, Any] = {}
                for schedule_id, value in zip(chunk, values, strict=True):
                    header, spec = split_stored(value)
                    header[4], header[7], header[8] = 123456, now, 3  # runs, last start, last ms
                    rewritten[schedule_id] = (
                        b"|".join(str(h).encode() for h in header) + b"|" + spec
                    )
                client.hset(keys.schedules, mapping=rewritten)

    try:
        return _measure(client, fill, [keys.due, keys.schedules])
    finally:
        app.close()


def buckets_layout(client: redis.Redis, n: int, buckets: int, value_bytes: int) -> tuple[int, str]:
    """Same `due` zset; definitions in `buckets` small hashes (listpack while <= 128 fields)."""
    due, value = "drumbeat:{mem}:due", os.urandom(value_bytes)

    def fill() -> None:
        pipe = client.pipeline(transaction=False)
        for i, schedule_id in enumerate(_ids(n)):
            pipe.zadd(due, {"s:" + schedule_id: 1_796_047_534_706 + i})
            pipe.hset(
                f"drumbeat:{{mem}}:schedules:{_bucket(schedule_id, buckets)}", schedule_id, value
            )
            if i % _BATCH == _BATCH - 1:
                pipe.execute()
        pipe.execute()

    return _measure(client, fill, [due, "drumbeat:{mem}:schedules:0"])


def wheel_layout(client: redis.Redis, n: int, buckets: int, value_bytes: int) -> tuple[int, str]:
    """Due times in `buckets` small zsets plus one top-level entry per bucket (a timing wheel)."""
    top, value = "drumbeat:{mem}:due", os.urandom(value_bytes)

    def fill() -> None:
        pipe = client.pipeline(transaction=False)
        for i, schedule_id in enumerate(_ids(n)):
            b = _bucket(schedule_id, buckets)
            pipe.zadd(f"drumbeat:{{mem}}:sdue:{b}", {schedule_id: 1_796_047_534_706 + i})
            pipe.hset(f"drumbeat:{{mem}}:schedules:{b}", schedule_id, value)
            if i % _BATCH == _BATCH - 1:
                pipe.execute()
        for b in range(buckets):
            pipe.zadd(top, {f"b:{b}": 1_796_047_534_706 + b})
        pipe.execute()

    return _measure(client, fill, [top, "drumbeat:{mem}:sdue:0", "drumbeat:{mem}:schedules:0"])


def _buckets(n: int, buckets: int, size: int) -> Callable[[str, redis.Redis], tuple[int, str]]:
    return lambda _url, client: buckets_layout(client, n, buckets, size)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--buckets", type=int, default=16384)
    args = parser.parse_args(argv)
    n, b = args.n, args.buckets
    rows: list[Row] = []

    def run(label: str, measure: Callable[[str, redis.Redis], tuple[int, str]]) -> None:
        with RedisServer() as server, server.client() as client:
            total, detail = measure(server.url, client)
            rows.append((label, total / n, detail))
            print(f"{label}: {total / n:.1f} B/schedule ({detail})", flush=True)

    run("today, as registered", lambda url, _c: today(url, n, after_runs=False))
    run("today, totals filled in", lambda url, _c: today(url, n, after_runs=True))
    for size in (53, 36, 30):
        run(f"{b} listpack buckets, {size} B record", _buckets(n, b, size))
    run(f"timing wheel of {b} buckets, 36 B record", lambda _u, c: wheel_layout(c, n, b, 36))
    with RedisServer() as server:
        version = server.info()["version"]
    print(f"\ncommand: python -m bench.schedule_memory --n {n} --buckets {b}; Redis {version}\n")
    print("| layout | B per schedule | big keys (MEMORY USAGE, encoding) |\n|---|---:|---|")
    for label, per, detail in rows:
        print(f"| {label} | {per:.0f} | {detail} |")


if __name__ == "__main__":
    main()
