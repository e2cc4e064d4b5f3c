"""Routing on a Redis Cluster: which master owns each shard's slot, and a `Link` per master.

A connection driven by hand (`Link`) talks to one server, but on a cluster a script call must
reach the master that owns its keys' slot (every key of one call shares it: the shard's hash
tag). `Nodes` asks the cluster client where a key lives and keeps a plain client per master;
`Routed` sends each call on its master's `Link` and returns the replies in the order sent. A
MOVED reply or a lost connection (a failover, a finished resharding) marks the map stale: the
next send asks the cluster again, after the caller's backoff (`retrying.is_transient`).

An ASK reply (the slot is migrating, and the old owner lacks one of the call's keys) is
followed once: ``ASKING`` then the call, on one connection to the node it names, and the map
is left as it is (the slot is still the old owner's). Redis runs a call of several keys on the
importing node only if every key is there already; otherwise it answers ``TRYAGAIN``, which the
caller waits out like any transient error, until the migration ends and the old owner answers
MOVED. Most scripts name a key that exists only when needed (a result, a dedup entry, the
signals channel), so most calls during a migration wait; following ASK spares the wait to
those whose keys have all moved.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from typing import Any, cast

import redis
import redis.asyncio as aredis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import NoScriptError

from drumbeat import connections
from drumbeat.script_sources import SOURCES
from drumbeat.scripts import Call

from .link import Link

Address = tuple[str, int]


class Nodes:
    """The masters of the cluster ``url`` names, as the cluster client ``cluster`` sees them.

    Args:
        socket_timeout: the read timeout of the clients made for each master.
    """

    def __init__(self, url: str, cluster: aredis.Redis, socket_timeout: float) -> None:
        self._url = url
        # `connections.async_client` types its cluster client as a plain one (see there).
        self._cluster = cast(RedisCluster, cluster)
        self._timeout = socket_timeout
        self._clients: dict[Address, aredis.Redis] = {}
        self.stale = True
        """Whether the slot map must be asked for again before the next lookup."""
        self._initialized = False
        # One refresh at a time: the claim and settle paths share these nodes, and two
        # refreshes of redis-py's slot map at once can break it (see address_of).
        self._refreshing = asyncio.Lock()

    async def address_of(self, key: str) -> Address:
        """The master that owns ``key``'s slot."""
        if self.stale:
            async with self._refreshing:
                if self.stale:  # else another task refreshed it while this one waited
                    await self._refresh()
        node = self._cluster.get_node_from_key(key)
        if node is None:  # typed Optional for replicas; a master lookup raises instead
            raise redis.exceptions.SlotNotCoveredError(f"no master serves the slot of {key!r}")
        return node.host, int(node.port)

    async def _refresh(self) -> None:
        if not self._initialized:
            await self._cluster.initialize()
            self._initialized = True
        else:
            try:
                await self._cluster.nodes_manager.initialize()
            except RuntimeError as exc:
                # redis-py 5.x iterates its startup nodes while another refresh (its own, on a
                # command's connection error) changes them ("dictionary changed size during
                # iteration"; seen in CI with every node down): as transient as the outage.
                raise redis.ConnectionError(
                    f"asking the cluster for its slot map failed ({exc}); will ask again"
                ) from exc
        self.stale = False

    async def client_of(self, key: str, *, fresh: bool = False) -> aredis.Redis:
        """A plain client to the master that owns ``key``'s slot (``fresh``: asking the cluster
        first, as a caller whose last try failed must)."""
        self.stale = self.stale or fresh
        return self.client(await self.address_of(key))

    def client(self, address: Address) -> aredis.Redis:
        made = self._clients.get(address)
        if made is None:
            made = connections.node_client(self._url, *address, socket_timeout=self._timeout)
            self._clients[address] = made
        return made

    async def aclose(self) -> None:
        for made in self._clients.values():
            await made.aclose()
        self._clients.clear()


class Routed:
    """`Link`'s interface over a `Link` per master. Use from one coroutine at a time."""

    def __init__(self, nodes: Nodes) -> None:
        self.nodes = nodes
        self._links: dict[Address, Link] = {}
        self._order: deque[tuple[Link, Call[Any]]] = deque()

    @property
    def unread(self) -> int:
        """Replies sent for and not yet returned by `next`."""
        return len(self._order)

    async def send(self, calls: Sequence[Call[Any]]) -> None:
        """Sends each call to its master, one write per master.

        If a write fails after another master's went out, the calls of that one may run
        although this raises (the caller sends the whole batch again: the scripts' fencing
        tokens refuse a second settle of the same claim, and a second claim takes nothing the
        first took)."""
        # A caller that stopped reading leaves replies unread; each `Link` starts clean on its
        # next send (see `Link.send`), and the order of the old ones is of no use.
        self._order.clear()
        groups: dict[Address, list[Call[Any]]] = {}
        order: list[tuple[Address, Call[Any]]] = []
        for call in calls:
            address = await self.nodes.address_of(call.keys[0])
            groups.setdefault(address, []).append(call)
            order.append((address, call))
        try:
            for address, group in groups.items():
                await self._link(address).send(group)
        except BaseException:
            self.nodes.stale = True
            raise
        self._order.extend((self._links[address], call) for address, call in order)

    async def next(self) -> tuple[Call[Any], Any]:
        """The next call sent and its parsed reply, as `Link.next`; a MOVED reply (the slot
        moved: the call did not run) or a lost connection also marks the map stale, and an ASK
        reply is followed (see the module docstring)."""
        link, call = self._order.popleft()
        try:
            return await link.next()
        except redis.exceptions.MovedError:
            self.nodes.stale = True
            raise
        except redis.exceptions.AskError as exc:
            ask = exc
        except redis.ResponseError:
            raise
        except BaseException:
            # That link forgot its unread calls; the others' replies can no longer be matched.
            self.nodes.stale = True
            self._order.clear()
            raise
        return call, call.parse(await self._asked(call, ask))

    async def _asked(self, call: Call[Any], ask: redis.exceptions.AskError) -> Any:
        """The raw reply of ``call`` sent where ``ask`` points, after ``ASKING`` (which holds
        for the next command on that connection only: both go in one pipeline, on one of the
        node's client's connections, not on its `Link`, whose replies may be unread). Its
        error reply raises: ``TRYAGAIN`` (some keys have not moved yet) or, if the migration
        ended meanwhile, MOVED or ASK again, which are not followed (a MOVED marks the map
        stale)."""
        client = self.nodes.client((ask.host, ask.port))
        command = call.command()
        for attempt in range(2):
            async with client.pipeline(transaction=False) as pipe:
                pipe.execute_command("ASKING")
                pipe.execute_command(*command)
                _, reply = await pipe.execute(raise_on_error=False)
            if not isinstance(reply, NoScriptError) or attempt:
                break
            # The importing node has not seen this script yet.
            _evalsha, _sha, *rest = command
            command = ("EVAL", SOURCES[call.name], *rest)
        if isinstance(reply, redis.exceptions.MovedError):
            self.nodes.stale = True
        if isinstance(reply, Exception):
            raise reply
        return reply

    async def run(self, calls: Sequence[Call[Any]]) -> list[Any]:
        """As `Link.run`: the parsed replies, or the first error reply once all are read."""
        await self.send(calls)
        results: list[Any] = []
        error: redis.ResponseError | None = None
        for _ in calls:
            try:
                results.append((await self.next())[1])
            except redis.ResponseError as exc:
                error = error or exc
                results.append(None)
        if error is not None:
            raise error
        return results

    def _link(self, address: Address) -> Link:
        link = self._links.get(address)
        if link is None:
            link = self._links[address] = Link(self.nodes.client(address))
        return link

    async def aclose(self) -> None:
        for link in self._links.values():
            await link.aclose()
        self._links.clear()
