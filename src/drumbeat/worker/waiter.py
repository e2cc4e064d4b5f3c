"""An idle worker's wait for work, with its next claim already sent.

An idle worker blocks in ``BZPOPMIN`` on `wake`; when a job is enqueued, the pop returns and the
worker sends its claim: one more round trip, plus an event-loop wakeup, before the job starts.
`Waiter` sends the claim right behind the pop on a connection of its own. Redis keeps the claim
in the connection's input until the pop returns (a marker, or nil at its timeout or on
``CLIENT UNBLOCK``) and runs it at once, so the claim costs no round trip of its own.
"""

from __future__ import annotations

import asyncio
from typing import Any

import redis.asyncio as aredis
from redis.exceptions import NoScriptError, ResponseError

from drumbeat.scripts import Call


class Waiter:
    """One wait at a time; the connection is redis-py's (URL options, TLS and auth apply)."""

    def __init__(self, client: aredis.Redis, wake_keys: list[str], idle_block: float) -> None:
        self._client = client
        # The client's socket timeout is above idle_block, so a pop is never cut short by it.
        self._conn = client.connection_pool.make_connection()  # type: ignore[no-untyped-call]
        self._pop = ("BZPOPMIN", *wake_keys, idle_block)
        self._id: int | None = None
        self._id_known = asyncio.Event()

    async def block_then(self, call: Call[Any]) -> Any:
        """Waits, then returns ``call``'s raw reply (None: Redis had lost the script, so it did
        not run). An error reply to the pop itself raises `ResponseError`."""
        conn = self._conn
        commands = [("CLIENT", "ID"), self._pop, call.command()]
        try:
            await conn.send_packed_command(conn.pack_commands(commands), check_health=False)
            self._id = int(await conn.read_response())
            self._id_known.set()
            await conn.read_response()  # the marker, or nil
            try:
                return await conn.read_response()
            except NoScriptError:
                return None
        except BaseException:
            # Whatever is left unread would be taken for the next wait's replies.
            await conn.disconnect(nowait=True)
            raise
        finally:
            self._id = None
            self._id_known.clear()

    async def unblock(self, waiting: asyncio.Future[Any]) -> None:
        """Ends the pending wait early. Its claim still runs and its reply is read (a claim
        whose reply were dropped would hold its jobs until their leases expire); if Redis
        refuses ``CLIENT UNBLOCK`` (an ACL), the connection is dropped instead."""
        known = asyncio.ensure_future(self._id_known.wait())
        await asyncio.wait({known, waiting}, timeout=5, return_when="FIRST_COMPLETED")
        known.cancel()
        if waiting.done():
            return
        try:
            if self._id is None:
                raise ResponseError("no client id")
            await self._client.execute_command("CLIENT", "UNBLOCK", self._id)  # type: ignore[no-untyped-call]
        except ResponseError:
            waiting.cancel()
        await asyncio.wait({waiting})

    async def aclose(self) -> None:
        await self._conn.disconnect()
