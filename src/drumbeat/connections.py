"""Connections: the Redis URL and every client drumbeat opens, each with explicit timeouts; the
server is checked (`drumbeat.server_checks`) before it is trusted with jobs. Used by `App`, `Job`
and the worker.

redis-py's defaults changed under us: before 8.0 a client waited for a reply forever, from 8.0 it
gives up after 5 s, which breaks any blocking command told to wait longer. So no client here
relies on a default: each says how long it connects, how long it waits for a reply, and clients
that send blocking commands wait longer than the longest block they are given. Options in the
URL's query string (``?socket_timeout=...``) override these, as redis-py lets them, except the
read timeout of clients for blocking commands, which a shorter one would cut short.

A ``redis+cluster://host:port[,host:port...]`` URL names a Redis Cluster (`drumbeat.cluster`):
its clients are redis-py's cluster clients, which route each command by its keys' slot and follow
MOVED; `node_client` opens a plain client to one node, for the worker's hand-driven connections
(`Link`, `Waiter`), which must reach the slot's owner.

A ``redis[s]+sentinel://[user:password@]host:port[,host:port...]/service[/db][?option=value...]``
URL names a master through its sentinels (`drumbeat.sentinel`): every client here, and every
connection made from a client's pool (`direct.Direct`, the worker's `Link` and `Waiter`), asks the
sentinels for the current master when it connects, so after a failover it reconnects to the
new one. ``rediss://`` URLs take redis-py's TLS options (``ssl_ca_certs``, ``ssl_certfile``,
``ssl_keyfile``, ``ssl_cert_reqs``...) in their query string, and ``user:password@`` logs in as
an ACL user; both apply to every connection, the producer's bare socket (`direct._Wire`)
included.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode

import redis.asyncio as redis_async
from redis import Redis
from redis.cluster import RedisCluster

from . import cluster, sentinel, which_redis
from .cluster import is_cluster
from .direct import ClusterDirect, Direct
from .server_checks import acheck_server, check_server

# `is_cluster`, `check_server` and `acheck_server` are used here and imported from here by the
# worker; their homes are `drumbeat.cluster` and `drumbeat.server_checks`.
__all__ = [
    "BLOCK_MARGIN",
    "COMMAND_TIMEOUT",
    "CONNECT_TIMEOUT",
    "HEARTBEAT_TIMEOUT",
    "MAX_BLOCK",
    "Connections",
    "acheck_server",
    "async_blocking_client",
    "async_client",
    "blocking_client",
    "check_server",
    "heartbeat_client",
    "is_cluster",
    "node_client",
    "pipeline",
    "sync_client",
    "worker_client",
]

CONNECT_TIMEOUT = 5.0
"""Seconds to open a connection; a server that takes longer counts as unreachable."""

COMMAND_TIMEOUT = 30.0
"""Seconds to wait for the reply to an ordinary command or script. Generous on purpose: it is
there to surface a dead connection, not a slow server, and a timeout on a script that did run
leaves the caller unsure whether it ran (an enqueue, say)."""

BLOCK_MARGIN = 10.0
"""Seconds by which a blocking command's read timeout exceeds its block time: Redis ends the
wait on time, but its reply still has to reach a loaded machine."""

MAX_BLOCK = 60.0
"""The longest block a command sent on a `blocking_client` may ask for."""

HEARTBEAT_TIMEOUT = 5.0
"""Connect and read timeout of the lease heartbeat: it renews every lease/3 and must notice a
dead connection before the leases it renews run out."""


def _options(socket_timeout: float, connect_timeout: float = CONNECT_TIMEOUT) -> dict[str, Any]:
    # No health_check_interval: a PING before reuse would wait out the same read timeout on a
    # half-open connection, and on one the server closed the command fails before reaching it.
    return {"socket_connect_timeout": connect_timeout, "socket_timeout": socket_timeout}


def sync_client(url: str, *, socket_timeout: float = COMMAND_TIMEOUT) -> Redis:
    """A synchronous client for ordinary (non-blocking) commands."""
    if is_cluster(url):
        return cluster.sync_client(url, _options(socket_timeout))
    if sentinel.is_sentinel(url):
        return sentinel.sync_client(url, _options(socket_timeout))
    return Redis.from_url(url, **_options(socket_timeout))


def async_client(
    url: str, *, socket_timeout: float = COMMAND_TIMEOUT, **options: Any
) -> redis_async.Redis:
    """An asyncio client for ordinary commands; ``options`` go to redis-py as they are."""
    if is_cluster(url):
        return cluster.async_client(url, _options(socket_timeout) | options)
    if sentinel.is_sentinel(url):
        return sentinel.async_client(url, _options(socket_timeout) | options)
    return redis_async.Redis.from_url(url, **(_options(socket_timeout) | options))


def blocking_client(url: str) -> Redis:
    """A synchronous client for blocking commands of up to `MAX_BLOCK` seconds (its own pool,
    so a long wait never holds a connection that ordinary commands queue for)."""
    return sync_client(_for_blocking(url), socket_timeout=MAX_BLOCK + BLOCK_MARGIN)


def async_blocking_client(url: str) -> redis_async.Redis:
    """`blocking_client` for asyncio callers."""
    return async_client(_for_blocking(url), socket_timeout=MAX_BLOCK + BLOCK_MARGIN)


def worker_client(url: str, idle_block: float) -> redis_async.Redis:
    """A worker's asyncio client: its idle wait blocks for up to ``idle_block`` seconds, and its
    scripts are short, so the read timeout is the block time plus `BLOCK_MARGIN`."""
    return async_client(_for_blocking(url), socket_timeout=idle_block + BLOCK_MARGIN)


def heartbeat_client(url: str) -> Redis:
    """The lease heartbeat thread's own synchronous client (see `HEARTBEAT_TIMEOUT`)."""
    if is_cluster(url):
        return cluster.sync_client(url, _options(HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT))
    if sentinel.is_sentinel(url):
        return sentinel.sync_client(url, _options(HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT))
    return Redis.from_url(url, **_options(HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT))


def _for_blocking(url: str) -> str:
    """The URL without its ``socket_timeout`` option, which redis-py would let override the
    longer read timeout that a client for blocking commands needs."""
    base, _, query = url.partition("?")
    options = parse_qsl(query, keep_blank_values=True)
    if not any(name == "socket_timeout" for name, _ in options):
        return url
    kept = urlencode([(name, value) for name, value in options if name != "socket_timeout"])
    return f"{base}?{kept}" if kept else base


def pipeline(client: Redis, *, transaction: bool) -> Any:
    """``client.pipeline(transaction=...)``; on a Redis Cluster, one that may also read
    ``TIME`` and is never a transaction (`cluster.ClusterPipeline`)."""
    if isinstance(client, RedisCluster):
        return cluster.ClusterPipeline(client)
    return client.pipeline(transaction=transaction)


def node_client(
    url: str, host: str, port: int, *, socket_timeout: float = COMMAND_TIMEOUT
) -> redis_async.Redis:
    """A plain asyncio client to one node of the cluster ``url`` names (`cluster.node_client`),
    for connections driven by hand that must reach the owner of a slot."""
    return cluster.node_client(url, host, port, _options(socket_timeout))


# -- an App's clients ----------------------------------------------------------------------------


@dataclass(slots=True)
class _LoopClients:
    loop: asyncio.AbstractEventLoop
    commands: redis_async.Redis
    blocking: redis_async.Redis | None = None


class Connections:
    """The clients of one `App`, each created on first use; the server is checked once, when the
    first client for commands connects.

    Args:
        url: the Redis URL; None starts (or reuses) the embedded Redis when first needed.
        embedded: `Settings.embedded`; False makes a missing ``url`` an error instead.
    """

    def __init__(self, url: str | None, *, embedded: bool = True) -> None:
        self.given = url
        """The URL as given; None: the embedded Redis (`which_redis.fallback`)."""
        self._url = url
        self._embedded = embedded
        self._lock = threading.RLock()  # threads may ask for a client at once: one is made
        self._redis: Redis | None = None
        self._direct: Direct | ClusterDirect | None = None
        self._blocking: Redis | None = None
        self._async: _LoopClients | None = None

    @property
    def url(self) -> str:
        """The Redis URL in use; resolving it starts the embedded Redis if none was given."""
        return self.resolve()

    def resolve(self, *, warn: bool = True) -> str:
        """`url`; ``warn=False`` leaves an unattended process's warning about the embedded Redis
        to the caller (`which_redis.announce`, which names the Redis first)."""
        if self._url is None:
            self._url = which_redis.fallback(allowed=self._embedded, warn=warn)
        return self._url

    @property
    def redis(self) -> Redis:
        """The synchronous client for ordinary commands."""
        if self._redis is None:
            with self._lock:
                if self._redis is None:
                    made = sync_client(self.url)
                    check_server(made, stacklevel=3)  # the caller of `App.redis`
                    self._redis = made
        return self._redis

    @property
    def direct(self) -> Direct | ClusterDirect:
        """Per-thread connections for single calls on the producer's hot path (`Direct`)."""
        if self._direct is None:
            with self._lock:
                if self._direct is None:
                    made = self.redis
                    self._direct = ClusterDirect(made) if is_cluster(self.url) else Direct(made)
        return self._direct

    @property
    def blocking(self) -> Redis:
        """The synchronous client for blocking commands of up to `MAX_BLOCK` seconds."""
        if self._blocking is None:
            self._blocking = blocking_client(self.url)
        return self._blocking

    async def aredis(self) -> redis_async.Redis:
        """The asyncio client for ordinary commands, one per event loop."""
        return (await self._of_loop()).commands

    async def ablocking(self) -> redis_async.Redis:
        """The asyncio client for blocking commands of up to `MAX_BLOCK` seconds."""
        clients = await self._of_loop()
        if clients.blocking is None:
            clients.blocking = async_blocking_client(self.url)
        return clients.blocking

    async def _of_loop(self) -> _LoopClients:
        # A client's connections belong to the loop that opened them, so each loop gets its own.
        loop = asyncio.get_running_loop()
        if self._async is None or self._async.loop is not loop:
            # Starting the embedded Redis blocks for a while: not on the event loop.
            url = self._url
            if url is None:
                url = await asyncio.to_thread(lambda: self.url)
            made = async_client(url)
            await acheck_server(made, stacklevel=4)
            self._async = _LoopClients(loop, made)
        return self._async

    def close(self) -> None:
        """Close the synchronous clients (they reconnect if used again)."""
        if self._direct is not None:
            self._direct.close()
        for made in (self._redis, self._blocking):
            if made is not None:
                made.close()
        self._redis = self._blocking = None
        self._direct = None

    async def aclose(self) -> None:
        """Close every client."""
        if self._async is not None:
            for made in (self._async.commands, self._async.blocking):
                if made is not None:
                    await made.aclose()
            self._async = None
        self.close()
