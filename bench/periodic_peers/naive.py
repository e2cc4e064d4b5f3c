"""The naive Redis design drumbeat replaces: one sorted set of schedule ids by next run time.

Each of 20 worker threads reads the head with ``ZRANGE 0 0 WITHSCORES``; if it is due, claims it
with a Lua script (``ZREM``, then ``HSET`` into a running hash, returning the definition), runs
it, re-adds it with now + interval and removes it from the running hash (one ``MULTI``); a thread
that finds nothing due sleeps 100 ms, one that loses a claim to another thread reads the head
again at once. The due time of a run is the score it was claimed at.

    python -m bench.periodic_peers.naive {register,worker} --url URL --n N --interval S ...
"""

from __future__ import annotations

import json
import signal
import threading
import time
from types import FrameType

from ._common import Args, PeerSpec, Recorder, emit_registered, emit_started, first_due, parse_args

SPEC = PeerSpec(
    name="naive",
    module="naive",
    venv="main",
    roles=("worker",),
    register=True,
    schedules_in_redis=True,
    due_match="sequence",
    due="re-added at its end + interval: the k-th run is matched to its k-th nominal due time "
    "(drift counts as lateness); the score it was claimed at is exposed, and lateness against "
    "it is shown apart",
    settings="one process, 20 threads, idle sleep 100 ms; definitions in a hash (JSON)",
    packages=("redis", "hiredis"),
    max_n=1_000_000,
    startup_seconds=3.0,
    seconds_per_schedule=10e-6,
)

SCHEDULE = "naive:schedule"
RUNNING = "naive:running"
TASKS = "naive:tasks"
THREADS = 20
IDLE_SLEEP = 0.1
BATCH = 10_000

CLAIM = """
if redis.call('ZREM', KEYS[1], ARGV[1]) == 1 then
    redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
    return redis.call('HGET', KEYS[3], ARGV[1])
end
return false
"""


def register(args: Args) -> None:
    import redis

    r = redis.Redis.from_url(args.url)
    t0 = time.perf_counter()
    for lo in range(0, args.n, BATCH):
        hi = min(lo + BATCH, args.n)
        with r.pipeline(transaction=False) as pipe:
            pipe.hset(
                TASKS,
                mapping={
                    str(i): json.dumps({"task": "noop", "args": [i], "every": args.interval})
                    for i in range(lo, hi)
                },
            )
            pipe.zadd(SCHEDULE, {str(i): first_due(args, i) for i in range(lo, hi)})
            pipe.execute()
    emit_registered(time.perf_counter() - t0)


def worker(args: Args) -> None:
    import redis

    client = redis.Redis.from_url(args.url, max_connections=THREADS + 2)
    claim = client.register_script(CLAIM)
    recorder = Recorder(args.runs_dir, args.role)
    stop = threading.Event()

    def noop(i: int, due: float) -> None:
        recorder.record(i, due, time.time())

    def loop(tag: str) -> None:
        while not stop.is_set():
            head: list[tuple[bytes, float]] = client.zrange(SCHEDULE, 0, 0, withscores=True)  # type: ignore[assignment]
            if not head or head[0][1] > time.time():
                stop.wait(IDLE_SLEEP)
                continue
            member, due = head[0]
            definition = claim(keys=[SCHEDULE, RUNNING, TASKS], args=[member, tag])
            if definition is None:
                continue  # another thread claimed it first
            spec = json.loads(definition)
            noop(int(spec["args"][0]), due)
            with client.pipeline(transaction=True) as pipe:
                pipe.zadd(SCHEDULE, {member: time.time() + float(spec["every"])})
                pipe.hdel(RUNNING, member)
                pipe.execute()

    def on_term(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_term)
    client.ping()
    claim.sha = client.script_load(CLAIM)
    threads = [
        threading.Thread(target=loop, args=(f"t{k}",), name=f"naive-{k}") for k in range(THREADS)
    ]
    emit_started(threads=THREADS)
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    recorder.flush()


def main() -> None:
    args = parse_args(("register", "worker"))
    {"register": register, "worker": worker}[args.role](args)


if __name__ == "__main__":
    main()
