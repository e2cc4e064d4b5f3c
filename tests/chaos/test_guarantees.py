"""What `docs/guarantees.md` promises, under the faults it names: Redis killed -9 and restarted
with its AOF, Redis stalled past a lease, a lossy and slow network, fuzzed records written
straight into Redis, and many jobs through (no key grows with their number). Each test runs a
redis-server of its own.

`DRUMBEAT_CHAOS_SCALE` multiplies the sizes (`make test-chaos` runs them at 20: 10,000 fuzzed
records, 200,000 jobs through); the suite runs them at 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import subprocess
import threading
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import drumbeat
from drumbeat.worker.tally import DURATION_BUCKETS, OUTCOMES
from tests.conftest import RedisServer, running_worker, server_binary

from .conftest import CHAOS_SETTINGS, open_app, until, warnings_about

pytestmark = pytest.mark.chaos

SCALE = max(1, int(os.environ.get("DRUMBEAT_CHAOS_SCALE", "1")))


def _kill_9(server: RedisServer) -> None:
    assert server.proc is not None
    server.proc.kill()
    server.proc.wait(10)


# -- Redis killed -9 and restarted with its AOF ---------------------------------------------------


async def test_no_acknowledged_job_is_lost_when_redis_is_killed_mid_drain(
    make_server: Any, worker_log: pytest.LogCaptureFixture
) -> None:
    # appendfsync always: an enqueue that returned is on disk (the promise is conditional on it:
    # with everysec, the last second of acknowledged writes may go).
    server: RedisServer = make_server("--appendonly", "yes", "--appendfsync", "always")
    runs: Counter[int] = Counter()
    acked: list[tuple[int, drumbeat.Job[int]]] = []
    refused = 0
    stop = threading.Event()
    async with open_app(server) as app:

        @app.task(name="chaos.double")
        async def double(n: int) -> int:
            runs[n] += 1
            await asyncio.sleep(0.002)
            return 2 * n

        def produce() -> None:
            nonlocal refused
            n = 0
            while not stop.is_set():
                try:
                    acked.append((n, double.enqueue(n)))
                except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError):
                    refused += 1  # not acknowledged: the producer knows it must send it again
                    time.sleep(0.01)
                n += 1

        producer = threading.Thread(target=produce)
        async with running_worker(app, concurrency=8):
            producer.start()
            try:
                await until(lambda: len(runs) > 200, "jobs to flow before the kill")
                _kill_9(server)
                await asyncio.sleep(0.5)  # jobs settle against a dead server meanwhile
                server.spawn()
                await asyncio.to_thread(server.wait_ready)
                await until(lambda: len(acked) > 400 + len(runs) // 2, "enqueues after restart")
            finally:
                stop.set()
                producer.join()
            await app.aclose()  # its connections died with the server
            for n, job in acked:
                assert await job.aresult(timeout=30) == 2 * n, job.id
    assert {n for n, _ in acked} <= set(runs), "an acknowledged job never ran"
    assert refused > 0 or len(acked) > 0
    assert warnings_about(worker_log, "onnect"), "the worker should have seen the server go"


async def test_schedules_keep_running_after_redis_is_killed_and_restarted(
    make_server: Any,
) -> None:
    server: RedisServer = make_server("--appendonly", "yes", "--appendfsync", "always")
    ran: list[tuple[str, float]] = []
    async with open_app(server) as app:

        @app.task(name="chaos.tick")
        async def tick() -> None:
            ran.append((drumbeat.current_job().job_id, time.monotonic()))

        for i in range(20):
            app.schedule(f"tick-{i}", tick, every=1.0)
        async with running_worker(app, concurrency=8):
            await until(lambda: len({j for j, _ in ran}) == 20, "every schedule to run once")
            _kill_9(server)
            killed = time.monotonic()
            await asyncio.sleep(1.5)  # runs come due while Redis is down
            server.spawn()
            await asyncio.to_thread(server.wait_ready)
            await until(
                lambda: len({j for j, t in ran if t > killed + 1.5}) == 20,
                "every schedule to run again after the restart",
            )
            await app.aclose()


# -- Redis stalled past a lease -----------------------------------------------------------------


def _debug_allowed() -> list[str]:
    """The argument Redis 7 needs to accept DEBUG (6.2 accepts it always, and knows no such
    option)."""
    version = [server_binary(), "--version"]
    out = subprocess.run(version, check=True, capture_output=True, text=True).stdout
    major = int(out.split("v=")[1].split(".")[0])
    return ["--enable-debug-command", "yes"] if major >= 7 else []


async def test_a_redis_stall_longer_than_a_lease_loses_no_job(make_server: Any) -> None:
    server: RedisServer = make_server(*_debug_allowed())
    admin = redis.Redis.from_url(server.url, socket_timeout=30)
    async with open_app(server) as chaos_app:
        try:
            await _stall_past_a_lease(chaos_app, admin)
        finally:
            admin.close()


async def _stall_past_a_lease(chaos_app: drumbeat.App, admin: redis.Redis) -> None:
    runs: Counter[int] = Counter()

    @chaos_app.task(name="chaos.slow")
    async def slow(n: int) -> int:
        runs[n] += 1
        await asyncio.sleep(0.05)
        return n

    jobs = await chaos_app.aenqueue_many([slow.prepare(i) for i in range(200)])
    async with running_worker(chaos_app, concurrency=8):
        await until(lambda: len(runs) > 20, "jobs to flow before the stall")
        lease = chaos_app.settings.lease
        # DEBUG SLEEP blocks Redis itself: every lease lapses meanwhile.
        await asyncio.to_thread(admin.execute_command, "DEBUG", "SLEEP", lease + 1.0)
        for i, job in enumerate(jobs):
            assert await job.aresult(timeout=30) == i
    assert set(runs) == set(range(200))
    assert admin.zcard(chaos_app.keys.dead) == 0


# -- a slow and lossy network -------------------------------------------------------------------


class LossyProxy:
    """A TCP proxy on loopback in a thread of its own: each chunk is delayed by `delay` s, and
    every `cut_every` s one random connection is cut (as a flaky network or a NAT would)."""

    def __init__(self, target_port: int, delay: float = 0.003, cut_every: float = 0.25) -> None:
        self.target_port, self.delay, self.cut_every = target_port, delay, cut_every
        self.port = 0
        self.cuts = 0
        self._conns: list[asyncio.StreamWriter] = []
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def __enter__(self) -> LossyProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        self._cutter = asyncio.create_task(self._cut())

    async def _close(self) -> None:
        self._cutter.cancel()
        self._server.close()
        for w in self._conns:
            w.close()
        await self._server.wait_closed()

    async def _cut(self) -> None:
        while True:
            await asyncio.sleep(self.cut_every)
            if self._conns:
                random.choice(self._conns).close()
                self.cuts += 1

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        self._conns += [writer, up_w]

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    await asyncio.sleep(self.delay)
                    dst.write(data)
                    await dst.drain()
            except (OSError, asyncio.CancelledError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pipe(reader, up_w), pipe(up_r, writer))
        for w in (writer, up_w):
            if w in self._conns:
                self._conns.remove(w)


@contextlib.asynccontextmanager
async def _app_at(url: str) -> AsyncIterator[drumbeat.App]:
    app = drumbeat.App(url, namespace="c" + uuid.uuid4().hex[:8], **CHAOS_SETTINGS)
    try:
        yield app
    finally:
        await app.aclose()


async def test_a_slow_network_that_cuts_connections_loses_no_job(
    own_server: RedisServer, admin: redis.Redis, worker_log: pytest.LogCaptureFixture
) -> None:
    runs: Counter[int] = Counter()
    with LossyProxy(own_server.port) as proxy:
        url = f"redis://127.0.0.1:{proxy.port}/0"
        async with _app_at(url) as app:

            @app.task(name="chaos.echo")
            async def echo(n: int) -> int:
                runs[n] += 1
                return n

            # The producer talks to Redis directly: the faults are the worker's.
            direct = drumbeat.App(own_server.url, namespace=app.keys.namespace)
            try:
                jobs = direct.enqueue_many([echo.prepare(i) for i in range(300)])
                async with running_worker(app, concurrency=8):
                    await until(lambda: len(runs) == 300, "every job to run", timeout=60)
                for i, job in enumerate(jobs):
                    assert job.result(timeout=30) == i
            finally:
                direct.close()
    assert proxy.cuts > 0, "the proxy never cut a connection: the test proved nothing"
    assert admin.zcard(f"drumbeat:{{{app.keys.namespace}}}:dead") == 0


# -- fuzzed records straight into Redis -----------------------------------------------------------

_json_like = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=50),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner),
    max_leaves=20,
)
_records = st.one_of(
    st.binary(max_size=200),  # not a record at all
    _json_like.map(lambda v: json.dumps(v).encode()),  # JSON, not a job
    st.builds(lambda t, c: json.dumps({"t": t, "c": c}).encode(), _json_like, _json_like),
    # The right task with wrong arguments: the task fails (its error is the dead letter's).
    st.builds(
        lambda a, k: json.dumps({"t": "chaos.strict", "c": [a, k]}).encode(),
        st.lists(_json_like, max_size=3),
        st.dictionaries(st.text(max_size=5), _json_like),
    ),
    st.just(b'{"t": "chaos.strict", "c": [[' + b"[" * 5000 + b"]" * 5000 + b"], {}]}"),
    # A well-formed job of a task no worker knows: handed back (to `due`) until
    # unknown_task_grace passes, then dead-lettered.
    st.builds(
        lambda t: json.dumps({"t": t, "c": [[], {}]}).encode(), st.text(min_size=1, max_size=9)
    ),
    st.builds(
        lambda n: b'{"t": "chaos.strict", "c": [["' + b"x" * n + b'"], {}]}',
        st.sampled_from([0, 1000, 600_000]),
    ),  # 600 KB: past max_payload_bytes
)
_states = st.one_of(st.none(), st.binary(max_size=40), st.just(b"0|0|0|1"))


async def test_fuzzed_records_are_dead_lettered_and_cost_no_other_job(
    own_server: RedisServer, admin: redis.Redis
) -> None:
    async with open_app(own_server, unknown_task_grace=0) as app:
        await _fuzzed_records_are_dead_lettered_and_cost_no_other_job(app, admin)


async def _fuzzed_records_are_dead_lettered_and_cost_no_other_job(
    chaos_app: drumbeat.App, admin: redis.Redis
) -> None:
    count = 500 * SCALE
    done: list[int] = []

    @chaos_app.task(name="chaos.strict")
    async def strict(n: int) -> int:
        if not isinstance(n, int):
            raise TypeError(f"expected an int, got {type(n).__name__}")
        done.append(n)
        return n

    rows: list[tuple[bytes, bytes | None]] = []

    @settings(max_examples=count, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(_records, _states)
    def collect(record: bytes, state: bytes | None) -> None:
        rows.append((record, state))

    collect()
    keys = chaos_app.keys
    with admin.pipeline(transaction=False) as pipe:
        for i, (record, state) in enumerate(rows):
            pipe.hset(keys.jobs, f"fuzz{i}", record)
            if state is not None:
                pipe.hset(keys.state, f"fuzz{i}", state)
            pipe.zadd(keys.ready, {f"fuzz{i}": i})
        pipe.execute()
    good = await chaos_app.aenqueue_many([strict.prepare(i) for i in range(50)])
    async with running_worker(chaos_app, concurrency=16) as worker:
        for i, job in enumerate(good):
            assert await job.aresult(timeout=60) == i
        await until(lambda: admin.zcard(keys.ready) + admin.zcard(keys.due) == 0
                    and worker.table.running == 0,
                    "every fuzzed record to be taken", timeout=120)  # fmt: skip
    fuzzed = {f"fuzz{i}" for i in range(len(rows))}
    dead = {m.decode() for m in admin.zrange(keys.dead, 0, -1)}
    finished = {k.decode() for k in admin.hkeys(keys.results)} & fuzzed
    lost = {i: rows[int(i[4:])] for i in sorted(fuzzed - dead - finished)}
    assert not lost, f"fuzzed records neither dead-lettered nor finished: {lost}"
    errors = admin.hmget(keys.errors, sorted(dead & fuzzed))
    assert all(e for e in errors), "every dead letter should say why"
    assert len(rows) == count
    reasons = Counter(e.decode().split('"error":')[1][:25] for e in errors)
    assert len(reasons) >= 3, f"the fuzz should reach several failure paths, reached {reasons}"


# -- many jobs through: nothing grows with their number -------------------------------------------


def _unexpiring(r: redis.Redis, namespace: str) -> dict[str, int]:
    """Each key of the namespace without an expiry, with its size (members, fields, length)."""
    sizes = {}
    for key in r.scan_iter(match=f"drumbeat:{{{namespace}}}*", count=1000):
        if r.ttl(key) != -1:
            continue
        kind = r.type(key).decode()
        size = {"hash": r.hlen, "zset": r.zcard, "set": r.scard, "list": r.llen}.get(kind)
        sizes[key.decode()] = int(size(key)) if size else 1
    return sizes


async def test_many_jobs_through_leave_no_key_that_grows_with_them(
    own_server: RedisServer, admin: redis.Redis
) -> None:
    per_round = 5_000 * SCALE
    async with open_app(own_server, result_ttl=0.5, batch_limit=500) as app:

        @app.task(name="chaos.noop")
        async def noop(n: int) -> int:
            return n

        namespace = app.keys.namespace
        async with running_worker(app, concurrency=50) as worker:
            sizes: list[dict[str, int]] = []
            for _ in range(2):
                jobs = await app.aenqueue_many([noop.prepare(i) for i in range(per_round)])
                assert await jobs[-1].aresult(timeout=60) == per_round - 1
                await until(lambda: admin.zcard(f"drumbeat:{{{namespace}}}:expires") == 0,
                            "finished jobs' outcomes to be swept", timeout=60)  # fmt: skip
                sizes.append(_unexpiring(admin, namespace))
            assert worker.processed >= 2 * per_round
    first, second = sizes
    # The metrics hash gains a field for each duration bucket a run first lands in: bounded
    # by the buckets (and outcomes) per task, whatever the number of jobs.
    metrics = second.pop(app.keys.metrics, 0)
    assert metrics <= len(DURATION_BUCKETS) + 1 + len(OUTCOMES) + 1, metrics
    grown = {k: (first.get(k, 0), n) for k, n in second.items() if n > first.get(k, 0)}
    assert not grown, f"keys without expiry grew with the jobs through (before, after): {grown}"
    big = {k: n for k, n in second.items() if n > 100}
    assert not big, f"keys without expiry hold per-job entries after {2 * per_round} jobs: {big}"
