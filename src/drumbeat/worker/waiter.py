"""An idle worker's wait for work, with its next claim already sent.

An idle worker blocks in ``BZPOPMIN`` on `wake`; when a job is enqueued, the pop returns and the
worker sends its claim: one more round trip, plus an event-loop wakeup, before the job starts.
`Waiter` sends the claim right behind the pop on a connection of its own. Redis keeps the claim
in the connection's input until the pop returns (a marker, or nil at its timeout or on
``CLIENT UNBLOCK``) and runs it at once, so the claim costs no round trip of its own.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import redis.asyncio as aredis
from redis.exceptions import NoScriptError, ResponseError, TimeoutError

from drumbeat.scripts import Call


class PopRefused(ResponseError):
    """Redis refused the pop (an error reply: ASK while the slot migrates, say); the claim
    behind it ran or was refused in its turn, and ``claim`` is its raw reply (None: refused)."""

    def __init__(self, refused: ResponseError, claim: Any) -> None:
        super().__init__(*refused.args)
        self.refused = refused
        self.claim = claim


class Waiter:
    """One wait at a time; the connection is redis-py's (URL options, TLS and auth apply)."""

    def __init__(self, client: aredis.Redis, wake_keys: list[str], idle_block: float) -> None:
        self._client = client
        pool = client.connection_pool
        # No socket timeout on the connection: with one, redis-py wraps every write in
        # `asyncio.wait_for` (a task and a timer). Reads are given the client's timeout, which
        # is above idle_block, so a pop is never cut short by it.
        self._timeout: float = pool.connection_kwargs.get("socket_timeout") or 30.0
        self._conn = pool.connection_class(**{**pool.connection_kwargs, "socket_timeout": None})
        self._pop = ("BZPOPMIN", *wake_keys, idle_block)
        self._id: int | None = None
        self._id_known = asyncio.Event()
        self._waiting = False

    async def block_then(self, call: Call[Any]) -> Any:
        """Waits, then returns ``call``'s raw reply (None: Redis had lost the script, so it did
        not run). An error reply to the pop itself raises `ResponseError`."""
        conn = self._conn
        commands: list[tuple[Any, ...]] = [("CLIENT", "ID"), self._pop, call.command()]
        self._waiting = True
        try:
            if not conn.is_connected:  # through `connect`: see `Link.send`
                await conn.connect()  # type: ignore[no-untyped-call]
            await conn.send_packed_command(conn.pack_commands(commands), check_health=False)
            self._id = int(await self._read())
            self._id_known.set()
            try:
                await self._read(nil=True)  # the marker, or nil
            except ResponseError as refused:
                # Its claim is read all the same: one that ran took jobs, which must start
                # (dropped, they would wait for their leases to expire).
                try:
                    claim = await self._read()
                except ResponseError:
                    claim = None
                raise PopRefused(refused, claim) from refused
            try:
                return await self._read()
            except NoScriptError:
                return None
        except BaseException:
            # Whatever is left unread would be taken for the next wait's replies.
            await conn.disconnect(nowait=True)
            raise
        finally:
            self._waiting = False
            self._id = None
            self._id_known.clear()

    async def _read(self, nil: bool = False) -> Any:
        started = time.monotonic()
        reply = await self._conn.read_response(timeout=self._timeout)
        # An explicit timeout reads as None too; only the pop may answer nil, and in time.
        if reply is None and (not nil or time.monotonic() - started >= self._timeout):
            raise TimeoutError(f"no reply from Redis in {self._timeout} s")
        return reply

    async def unblock(self) -> None:
        """Ends the wait in progress early, if any: `block_then` then returns as at the pop's
        timeout. Its claim still runs and its reply is read (a claim whose reply were dropped
        would hold its jobs until their leases expire); if Redis refuses ``CLIENT UNBLOCK``
        (an ACL), the connection is dropped instead, and `block_then` raises."""
        if not self._waiting:
            return
        try:
            await asyncio.wait_for(self._id_known.wait(), 5)
        except TimeoutError:
            await self._conn.disconnect(nowait=True)
            return
        try:
            if self._id is None:
                return  # the wait ended meanwhile
            await self._client.execute_command("CLIENT", "UNBLOCK", self._id)  # type: ignore[no-untyped-call]
        except ResponseError:
            await self._conn.disconnect(nowait=True)

    async def aclose(self) -> None:
        await self._conn.disconnect()
