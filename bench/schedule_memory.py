"""Where a schedule's bytes go in Redis: drumbeat's layout (the time slots), as registered and
with a long-running schedule's totals, beside layouts it replaced or could have used.

    .venv/bin/python -m bench.schedule_memory [--n 1000000]

Each row starts from an empty private redis-server and reports ``used_memory`` after minus
before, over N, with ``MEMORY USAGE ... SAMPLES 0`` (every element counted) of sample keys.
The typical monitor is the issue's example: ``app.schedule("monitor:u<i>:switch",
check_listing, every=5, args=("switch", 30000))``. The drumbeat rows register through
``App.schedule_many``; the others are synthetic (raw Redis commands, records of the stated
size): what Redis would hold in that layout.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import redis

from bench._redis import RedisServer
from drumbeat import App, Schedule, Settings
from drumbeat.keys import Keys, bucket_of

Measure = Callable[[str, redis.Redis], tuple[int, str]]
_BATCH = 5000
_DUE = 1_796_047_534_706


def _ids(n: int) -> list[str]:
    return [f"monitor:u{i}:switch" for i in range(n)]


def _measure(
    client: redis.Redis,
    fill: Callable[[], None],
    keys: Sequence[str] | Callable[[], Sequence[str]],
) -> tuple[int, str]:
    """Redis' used memory after ``fill`` minus before, and ``keys`` sampled (a callable: named
    after the fill)."""
    before = int(client.info("memory")["used_memory"])
    fill()
    after = int(client.info("memory")["used_memory"])
    parts = []
    for key in keys() if callable(keys) else keys:
        usage = client.memory_usage(key, samples=0) or 0
        encoding = client.object("encoding", key)
        parts.append(f"`{key.split('}:', 1)[-1]}` {usage:,} B ({encoding.decode()})")
    return after - before, ", ".join(parts)


def slots_layout(url: str, n: int, after_runs: bool) -> tuple[int, str]:
    """What `App.schedule_many` stores in the time slots; optionally with the totals a
    long-running schedule has."""
    app = App(url, settings=Settings(namespace="mem"))

    @app.task(name="monitor.check_listing")
    def check_listing(keyword: str, price: int) -> None: ...

    client: redis.Redis = app.redis
    keys = Keys("mem")

    def fill() -> None:
        ids = _ids(n)
        for i in range(0, n, _BATCH):
            app.schedule_many(
                [Schedule(s, check_listing, every=5, args=("switch", 30000))
                 for s in ids[i : i + _BATCH]]
            )  # fmt: skip
        if after_runs:  # runs 123456, last start 4998 ms before the next slot, took 3 ms
            slots = [int(ms) for ms in client.zrange(keys.slots, 0, -1)]
            for i in range(0, len(slots), _BATCH):
                with client.pipeline(transaction=False) as pipe:
                    for ms in slots[i : i + _BATCH]:
                        pipe.lrange(keys.slot(ms), 0, -1)
                    lists: list[Any] = pipe.execute()
                with client.pipeline(transaction=False) as pipe:
                    for ms, entries in zip(slots[i : i + _BATCH], lists, strict=True):
                        pipe.delete(keys.slot(ms))
                        pipe.rpush(keys.slot(ms), *(_ran(e) for e in entries))
                    pipe.execute()

    def sampled() -> list[str]:
        first: bytes = client.zrange(keys.slots, 0, 0)[0]
        return [keys.slots, keys.where, keys.slot(int(first))]

    try:
        return _measure(client, fill, sampled)
    finally:
        app.close()


def _ran(entry: bytes) -> bytes:
    """An entry with the totals of a schedule that has run a while."""
    sid, _, record = entry.partition(b"|")
    f = record.split(b"|", 10)
    f[3], f[6], f[7] = b"123456", b"-4998", b"3"
    return sid + b"|" + b"|".join(f)


def big_layout(client: redis.Redis, n: int, record_bytes: int) -> tuple[int, str]:
    """drumbeat's first layout: `s:<id>` in one big `due` zset, one big `schedules` hash."""
    due, schedules, value = (
        "drumbeat:{mem}:due",
        "drumbeat:{mem}:schedules",
        os.urandom(record_bytes),
    )

    def fill() -> None:
        pipe = client.pipeline(transaction=False)
        for i, schedule_id in enumerate(_ids(n)):
            pipe.zadd(due, {"s:" + schedule_id: _DUE + i})
            pipe.hset(schedules, schedule_id, value)
            if i % _BATCH == _BATCH - 1:
                pipe.execute()
        pipe.execute()

    return _measure(client, fill, [due, schedules])


def buckets_layout(client: redis.Redis, n: int, record_bytes: int) -> tuple[int, str]:
    """One big `due` zset, records in 16,384 small hashes (the timing wheel's records): the zset
    alone costs ~118 B a schedule."""
    due, value = "drumbeat:{mem}:due", os.urandom(record_bytes)

    def fill() -> None:
        pipe = client.pipeline(transaction=False)
        for i, schedule_id in enumerate(_ids(n)):
            pipe.zadd(due, {"s:" + schedule_id: _DUE + i})
            bucket = f"drumbeat:{{mem}}:schedules:{bucket_of(schedule_id)}"
            pipe.hset(bucket, schedule_id, value)
            if i % _BATCH == _BATCH - 1:
                pipe.execute()
        pipe.execute()

    return _measure(
        client, fill, [due, f"drumbeat:{{mem}}:schedules:{bucket_of('monitor:u0:switch')}"]
    )


def _synthetic(
    layout: Callable[[redis.Redis, int, int], tuple[int, str]], n: int, size: int
) -> Measure:
    return lambda _url, client: layout(client, n, size)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    n = parser.parse_args(argv).n
    rows: list[tuple[str, float, str]] = []

    def run(label: str, measure: Measure) -> None:
        with RedisServer() as server, server.client() as client:
            total, detail = measure(server.url, client)
            rows.append((label, total / n, detail))
            print(f"{label}: {total / n:.1f} B/schedule ({detail})", flush=True)

    run("drumbeat time slots, as registered", lambda url, _c: slots_layout(url, n, False))
    run("drumbeat time slots, totals filled in", lambda url, _c: slots_layout(url, n, True))
    run("first layout: big zset + big hash, 111 B record", _synthetic(big_layout, n, 111))
    run("big zset + small hashes, 53 B record", _synthetic(buckets_layout, n, 53))
    with RedisServer() as server:
        version = server.info()["version"]
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    lines = [
        "# Redis memory per schedule",
        "",
        f"- command: `cd {os.getcwd()} && {sys.executable} -m bench.schedule_memory --n {n}`",
        f"- Redis {version}; {n:,} typical monitors; {stamp}",
        "",
        "| layout | B per schedule | sample keys (MEMORY USAGE, encoding) |",
        "|---|---:|---|",
        *(f"| {label} | {per:.0f} | {detail} |" for label, per, detail in rows),
    ]
    out = Path(__file__).parent / "results" / f"schedule-memory-{stamp}.md"
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines) + f"\n\nwritten to {out}")


if __name__ == "__main__":
    main()
