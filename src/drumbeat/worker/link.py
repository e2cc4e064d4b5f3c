"""A worker's own connection for its hot path: script calls sent together in one write, replies
read one by one, in order.

Through the client, a call pays for the retry wrapper, the connection pool, the observability
hooks and, above all, an `asyncio.wait_for` around every write (a task and a timer) whenever a
socket timeout is set. A `Link` keeps redis-py's connection (URL options, TLS, auth, hiredis)
and drops the rest; in a drain of no-op jobs by one worker that took 19,000 jobs/s to 25,000.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

import redis.asyncio as aredis
from hiredis import pack_command
from redis.exceptions import NoScriptError, ResponseError, TimeoutError

from drumbeat.script_sources import SOURCES
from drumbeat.scripts import Call


def pack(conn: Any, commands: Sequence[tuple[Any, ...]]) -> bytes | list[bytes]:
    """``commands`` in the Redis protocol, as ``conn.pack_commands`` packs them (the same bytes).
    hiredis packs each in C: redis-py's packer encodes every argument in Python first (4 µs per
    run of a settle and a claim against 1 µs with a loop here), and that loop took 12 µs for an
    acquisition of limits (25 arguments) against hiredis' 3.6. Anything hiredis does not take as
    redis-py would (a bool, which redis-py refuses; a memoryview; a connection with another
    encoding) goes to redis-py."""
    encoder = conn.encoder
    if encoder.encoding == "utf-8" and encoder.encoding_errors == "strict":
        try:
            return b"".join([pack_command(command) for command in commands])
        except TypeError:
            pass
    return conn.pack_commands(commands)  # type: ignore[no-any-return]


class Link:
    """Use from one coroutine at a time: `send` calls, then `next` once per call."""

    def __init__(self, client: aredis.Redis) -> None:
        pool = client.connection_pool
        # With a socket timeout, redis-py wraps every write in `asyncio.wait_for`: a task and a
        # timer per call, more than the rest of the call. So the connection has none, and reads
        # get the client's timeout explicitly. (A write waits only when the socket buffer is
        # full, and requests here are small.)
        self._timeout: float = pool.connection_kwargs.get("socket_timeout") or 30.0
        self._conn = pool.connection_class(**{**pool.connection_kwargs, "socket_timeout": None})
        self._unread: deque[Call[Any]] = deque()
        # Replies read ahead of their turn (after a NOSCRIPT, see `next`): call, raw reply or
        # the error it raised.
        self._early: deque[tuple[Call[Any], Any]] = deque()

    @property
    def unread(self) -> int:
        """Replies sent for and not yet returned by `next`."""
        return len(self._unread) + len(self._early)

    async def send(self, calls: Sequence[Call[Any]]) -> None:
        conn = self._conn
        if self._unread or self._early:
            # A caller stopped reading (a reply it could not parse): its replies would be taken
            # for these calls'. A new connection is the only clean state.
            self._unread.clear()
            self._early.clear()
            await conn.disconnect(nowait=True)
        try:
            if not conn.is_connected:
                # Through `connect`, which a sentinel-managed connection overrides to ask the
                # sentinels where the master is now; a send would reconnect to the last address.
                await conn.connect()  # type: ignore[no-untyped-call]
            await conn.send_packed_command(
                pack(conn, [call.command() for call in calls]), check_health=False
            )
        except BaseException:
            await conn.disconnect(nowait=True)
            raise
        self._unread.extend(calls)

    async def next(self) -> tuple[Call[Any], Any]:
        """The next call sent and its parsed reply. An error reply raises, with the connection
        still in step; a lost connection raises and forgets the rest."""
        if self._early:
            call, raw = self._early.popleft()
        else:
            call = self._unread.popleft()
            raw = await self._read()
        if isinstance(raw, NoScriptError):
            # Redis lost its scripts (a restart, a failover). EVAL must wait until every reply
            # sent before it has been read, or its reply would be taken for theirs.
            while self._unread:
                self._early.append((self._unread.popleft(), await self._read()))
            raw = await self._eval(call)
        if isinstance(raw, Exception):
            raise raw
        return call, call.parse(raw)

    async def run(self, calls: Sequence[Call[Any]]) -> list[Any]:
        """Sends ``calls`` and returns their parsed replies; if any is an error, raises the
        first one once every reply has been read (so the connection stays usable)."""
        await self.send(calls)
        results: list[Any] = []
        error: ResponseError | None = None
        for _ in calls:
            try:
                results.append((await self.next())[1])
            except ResponseError as exc:
                error = error or exc
                results.append(None)
        if error is not None:
            raise error
        return results

    async def _read(self) -> Any:
        try:
            reply = await self._conn.read_response(timeout=self._timeout)
            if reply is None:  # what an explicit timeout returns; no script replies nil
                raise TimeoutError(f"no reply from Redis in {self._timeout} s")
            return reply
        except ResponseError as exc:  # a reply: the stream is in step
            return exc
        except BaseException:
            self._unread.clear()
            self._early.clear()
            await self._conn.disconnect(nowait=True)
            raise

    async def _eval(self, call: Call[Any]) -> Any:
        _evalsha, _sha, *rest = call.command()
        conn = self._conn
        try:
            await conn.send_packed_command(
                conn.pack_command("EVAL", SOURCES[call.name], *rest), check_health=False
            )
        except BaseException:
            await conn.disconnect(nowait=True)
            raise
        return await self._read()

    async def aclose(self) -> None:
        await self._conn.disconnect()
