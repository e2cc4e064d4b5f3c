"""Connections: the Redis URL, every client drumbeat opens (each with explicit timeouts), and the
checks made on a server before it is trusted with jobs. Used by `App`, `Job` and the worker.

redis-py's defaults changed under us: before 8.0 a client waited for a reply forever, from 8.0 it
gives up after 5 s, which breaks any blocking command told to wait longer. So no client here
relies on a default: each says how long it connects, how long it waits for a reply, and clients
that send blocking commands wait longer than the longest block they are given. Options in the
URL's query string (``?socket_timeout=...``) override these, as redis-py lets them, except the
read timeout of clients for blocking commands, which a shorter one would cut short.

A ``redis+cluster://host:port[,host:port...]`` URL names a Redis Cluster: any reachable nodes,
the rest are discovered; ``rediss+cluster://`` is the same over TLS to every node, with the TLS
options of a ``rediss://`` URL. Its clients are redis-py's cluster clients (they route each
command by its keys' slot and follow MOVED); `node_client` opens a plain client to one node, for the
worker's hand-driven connections (`Link`, `Waiter`), which must reach the slot's owner, and the
producer's hot path keeps a `Direct` per master (`ClusterDirect`, both in `drumbeat.direct`).

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
import contextlib
import logging
import ssl
import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import parse_qsl, unquote, urlencode

import redis
import redis.asyncio as redis_async
import redis.asyncio.cluster as redis_async_cluster
from redis import Redis
from redis.cluster import ClusterNode, RedisCluster

from . import sentinel, which_redis
from .direct import ClusterDirect, Direct

# redis-py < 6 keeps the cluster's error replies (MOVED, ASK, TRYAGAIN...) in its asyncio cluster
# client's parser (a plain client's raises a bare ResponseError); from 6 on, every parser knows
# them.
try:
    from redis.asyncio.cluster import ClusterParser as _AsyncClusterParser  # type: ignore[attr-defined]
except ImportError:
    _AsyncClusterParser = None

log = logging.getLogger("drumbeat")

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


class EvictionPolicyWarning(UserWarning):
    """Redis may evict keys under memory pressure, which silently loses jobs."""


def _options(socket_timeout: float, connect_timeout: float = CONNECT_TIMEOUT) -> dict[str, Any]:
    # No health_check_interval: a PING before reuse would wait out the same read timeout on a
    # half-open connection, and on one the server closed the command fails before reaching it.
    return {"socket_connect_timeout": connect_timeout, "socket_timeout": socket_timeout}


def sync_client(url: str, *, socket_timeout: float = COMMAND_TIMEOUT) -> Redis:
    """A synchronous client for ordinary (non-blocking) commands."""
    if is_cluster(url):
        return _sync_cluster(url, _options(socket_timeout))
    if sentinel.is_sentinel(url):
        return sentinel.sync_client(url, _options(socket_timeout))
    return Redis.from_url(url, **_options(socket_timeout))


def async_client(
    url: str, *, socket_timeout: float = COMMAND_TIMEOUT, **options: Any
) -> redis_async.Redis:
    """An asyncio client for ordinary commands; ``options`` go to redis-py as they are."""
    if is_cluster(url):
        return _async_cluster(url, _options(socket_timeout) | options)
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
        return _sync_cluster(url, _options(HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT))
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


# -- Redis Cluster -------------------------------------------------------------------------------

CLUSTER_SCHEME = "redis+cluster"
TLS_CLUSTER_SCHEME = "rediss+cluster"


def is_cluster(url: str) -> bool:
    """Whether ``url`` names a Redis Cluster (``redis+cluster://``, ``rediss+cluster://``)."""
    return url.partition("://")[0].lower() in (CLUSTER_SCHEME, TLS_CLUSTER_SCHEME)


def cluster_nodes(url: str) -> tuple[list[tuple[str, int]], dict[str, Any]]:
    """The startup nodes of a ``redis+cluster://[user:password@]host:port[,host:port...]
    [?option=value...]`` URL, and the connection options (credentials, query options) that
    every node's connections take. ``rediss+cluster://`` connects to every node over TLS, its
    query string taking the TLS options of a ``rediss://`` URL (``ssl_ca_certs``...).

    Raises:
        ValueError: the URL names no node, a node without a port, or a database (a cluster
            has only database 0).
    """
    scheme, _, rest = url.partition("://")
    if scheme.lower() not in (CLUSTER_SCHEME, TLS_CLUSTER_SCHEME):
        raise ValueError(f"{url!r} is not a {CLUSTER_SCHEME}:// or {TLS_CLUSTER_SCHEME}:// URL")
    tls = scheme.lower() == TLS_CLUSTER_SCHEME
    rest, _, query = rest.partition("?")
    userinfo, _, hosts = rest.rpartition("@")
    hosts, _, path = hosts.partition("/")
    if path.strip("/") not in ("", "0"):
        raise ValueError(
            f"Redis Cluster URL {url!r} names database {path!r}; a cluster has only database 0 "
            f"(expected {CLUSTER_SCHEME}://host:port[,host:port...])"
        )
    nodes: list[tuple[str, int]] = []
    for item in filter(None, hosts.split(",")):
        host, _, port = item.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(
                f"Redis Cluster URL {url!r} names node {item!r}; expected host:port "
                f"(e.g. {CLUSTER_SCHEME}://10.0.0.1:7000,10.0.0.2:7000)"
            )
        nodes.append((host.strip("[]"), int(port)))
    if not nodes:
        raise ValueError(
            f"Redis Cluster URL {url!r} names no node; expected "
            f"{CLUSTER_SCHEME}://host:port[,host:port...]"
        )
    # redis-py's own URL parsing gives the query options their types (socket_timeout=2.5).
    user, _, password = userinfo.partition(":")
    auth = f"{user}:{password}@" if userinfo else ""
    base = "rediss" if tls else "redis"
    options = dict(redis.connection.parse_url(f"{base}://{auth}{item}?{query}"))  # type: ignore[no-untyped-call]
    for name in ("host", "port", "db", "path", "connection_class"):
        options.pop(name, None)
    if tls:  # the cluster clients and `node_client` take TLS as a flag, not a connection class
        options["ssl"] = True
    if userinfo:
        options["username"], options["password"] = unquote(user) or None, unquote(password)
    return nodes, options


def _sync_cluster(url: str, options: dict[str, Any]) -> Redis:
    nodes, from_url = cluster_nodes(url)
    try:  # the synchronous cluster client connects at once
        made = RedisCluster(
            startup_nodes=[ClusterNode(host, port) for host, port in nodes],  # type: ignore[no-untyped-call]
            **(options | from_url),
        )
    except redis.exceptions.RedisClusterException as exc:
        explained = _cluster_explained(exc, tls=bool(from_url.get("ssl")))
        if explained is exc:
            raise
        raise explained from exc
    # The cluster client answers the commands drumbeat sends (routing each by its keys' slot),
    # so callers keep one type; the few that need a node's connection pool (`Direct`, `Link`,
    # `Waiter`) check `is_cluster` first.
    return cast(Redis, made)


class _AsyncCluster(redis_async_cluster.RedisCluster):
    """redis-py's asyncio cluster client, closed whatever state it is in."""

    async def aclose(self) -> None:
        await super().aclose()
        # redis-py 5.1 (the lower bound) closes nothing while a refresh is pending: its
        # error paths close the nodes and ask for one, and drumbeat's per-master routing
        # (`worker.routing`) refreshes the slot map through `nodes_manager`, which leaves it
        # asked for. The nodes connected since would stay open. A closed node closes at once.
        await self.nodes_manager.aclose()
        await self.nodes_manager.aclose("startup_nodes")


def _async_cluster(url: str, options: dict[str, Any]) -> redis_async.Redis:
    nodes, from_url = cluster_nodes(url)
    made = _AsyncCluster(
        startup_nodes=[redis_async_cluster.ClusterNode(host, port) for host, port in nodes],
        **(options | from_url),
    )
    return cast(redis_async.Redis, made)


class _ClusterPipeline:
    """A cluster client's pipeline for reads that start with ``TIME``: a cluster pipeline
    refuses ``TIME`` (no key to route by), so it is read apart, just before the rest, and its
    reply put back in its place. Not a transaction: the shards it reads may be on several
    masters, and a snapshot across masters does not exist."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._pipe = client.pipeline(transaction=False)
        self._time_at: list[int] = []

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self._pipe.reset()

    def time(self) -> Any:
        self._time_at.append(len(self._pipe.command_stack))
        return self

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        times = [self._client.time() for _ in self._time_at]
        raw = list(self._pipe.execute(raise_on_error=raise_on_error))
        for at, now in zip(self._time_at, times, strict=True):
            raw.insert(at, now)
        return raw

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pipe, name)


def _cluster_explained(
    exc: redis.exceptions.RedisClusterException, *, tls: bool
) -> redis.exceptions.RedisClusterException:
    """``exc`` (no node could be reached), saying what the URL must give when the cause was a
    refused login or a TLS handshake, which redis-py's message leaves to guess; the same type
    and start of message, so callers that wait out an unreachable cluster still do."""
    chain: list[BaseException] = []
    cause: BaseException | None = exc
    while cause is not None and len(chain) < 10:
        chain.append(cause)
        cause = cause.__cause__ or cause.__context__
    if any(isinstance(e, redis.AuthenticationError) for e in chain):
        hint = (
            "a node refused the login; expected the name and password of an enabled ACL user "
            "in the URL (user:password@ before the first host)"
        )
    # The asyncio client keeps only the text of the TLS error ("[SSL: ...]"), not the error.
    elif tls and any(
        isinstance(e, ssl.SSLError | ConnectionResetError) or "[SSL" in str(e) for e in chain
    ):
        hint = (
            "a node closed the TLS connection: a node that requires client certificates "
            "(tls-auth-clients yes) does so to one that presents none, or one its CA did not "
            "sign. Expected ssl_certfile= and ssl_keyfile= (the client certificate and key) and "
            "ssl_ca_certs= (the CA that signed the nodes' certificates) in the URL's query string"
        )
    elif not tls and any(isinstance(e, ConnectionResetError) for e in chain):
        hint = (
            "a node closed the connection at once, as a node that speaks only TLS does to a "
            f"plain one; for such a cluster, expected a {TLS_CLUSTER_SCHEME}:// URL with its TLS "
            "options (ssl_ca_certs=...)"
        )
    else:
        return exc
    return type(exc)(f"{exc}; {hint}")


def pipeline(client: Redis, *, transaction: bool) -> Any:
    """``client.pipeline(transaction=...)``; on a Redis Cluster, one that may also read
    ``TIME`` and is never a transaction (`_ClusterPipeline`)."""
    if isinstance(client, RedisCluster):
        return _ClusterPipeline(client)
    return client.pipeline(transaction=transaction)


def node_client(
    url: str, host: str, port: int, *, socket_timeout: float = COMMAND_TIMEOUT
) -> redis_async.Redis:
    """A plain asyncio client to one node of the cluster ``url`` names (its credentials and
    options), for connections driven by hand that must reach the owner of a slot."""
    _, from_url = cluster_nodes(url)
    made = redis_async.Redis(host=host, port=port, **(_options(socket_timeout) | from_url))
    if _AsyncClusterParser is not None:
        # redis-py < 6: so that its connections (and a `Link`'s, made from the same options)
        # raise MovedError, AskError, TryAgainError..., which the worker follows or waits out,
        # and not a bare ResponseError, which it takes for a script's error.
        made.connection_pool.connection_kwargs["parser_class"] = _AsyncClusterParser
    return made


# -- server checks -------------------------------------------------------------------------------


def check_server(client: Redis, stacklevel: int = 1) -> None:
    """Warns when the server's configuration could silently lose jobs.

    Args:
        stacklevel: which frame the warning names: 1 is the caller of this function, 2 its
            caller, and so on.
    """
    # Managed Redis services often disable CONFIG; then there is nothing to check.
    with contextlib.suppress(redis.ResponseError), _explained(client):
        if isinstance(client, RedisCluster):  # every master, not the one CONFIG GET goes to
            by_node = client.config_get("maxmemory-policy", target_nodes=RedisCluster.PRIMARIES)
            for config in _per_node(by_node):
                _warn_if_evicting(config, stacklevel + 1)
            return
        _warn_if_evicting(client.config_get("maxmemory-policy"), stacklevel + 1)


async def acheck_server(client: redis_async.Redis, stacklevel: int = 1) -> None:
    """`check_server` for asyncio clients."""
    with contextlib.suppress(redis.ResponseError), _explained(client):
        if isinstance(client, redis_async_cluster.RedisCluster):
            primaries = redis_async_cluster.RedisCluster.PRIMARIES
            by_node = await client.config_get("maxmemory-policy", target_nodes=primaries)
            for config in _per_node(by_node):
                _warn_if_evicting(config, stacklevel + 1)
            return
        _warn_if_evicting(await client.config_get("maxmemory-policy"), stacklevel + 1)


def _per_node(replies: dict[Any, Any]) -> list[dict[Any, Any]]:
    """Each master's reply to a command sent to every master. redis-py returns a dict by node
    name, except from a cluster of one master, where it returns that master's reply itself."""
    if replies and all(isinstance(v, dict) for v in replies.values()):
        return list(replies.values())
    return [replies]


@contextlib.contextmanager
def _explained(client: Redis | redis_async.Redis) -> Iterator[None]:
    """Raises a refused login, or a TLS connection the server closed, with what the URL must
    give instead (the first command on a client is where a bad URL shows); the same type, so
    callers that retry connection errors still do."""
    try:
        yield
    except redis.exceptions.RedisClusterException as exc:
        kwargs = getattr(getattr(client, "nodes_manager", None), "connection_kwargs", {})
        # The sync client keeps ``ssl=True``; the asyncio one turns it into a connection class.
        tls = bool(kwargs.get("ssl")) or issubclass(
            kwargs.get("connection_class", object), (redis.SSLConnection, redis_async.SSLConnection)
        )
        explained = _cluster_explained(exc, tls=tls)
        if explained is exc:
            raise
        raise explained from exc
    except redis.AuthenticationError as exc:
        if getattr(client, "connection_pool", None) is None:  # a cluster: which node is unknown
            raise
        where, kwargs = _where(client)
        user = kwargs.get("username") or "default"
        raise type(exc)(
            f"Redis at {where} refused the login of user {user!r} ({exc}); expected the name "
            "and password of an enabled ACL user in the URL (user:password@ before the host)"
        ) from exc
    except redis.ConnectionError as exc:
        pool = getattr(client, "connection_pool", None)
        tls = pool is not None and issubclass(
            pool.connection_class, (redis.SSLConnection, redis_async.SSLConnection)
        )
        cause: BaseException | None = exc
        while cause is not None and not isinstance(cause, ssl.SSLError | ConnectionResetError):
            cause = cause.__cause__ or cause.__context__
        if not tls or cause is None:
            raise
        where, _ = _where(client)
        raise type(exc)(
            f"the TLS connection to Redis at {where} failed ({exc}); a server that requires "
            "client certificates (tls-auth-clients yes) closes connections that present none, "
            "or one its CA did not sign. Expected ssl_certfile= and ssl_keyfile= (the client "
            "certificate and key) and ssl_ca_certs= (the CA that signed the server's "
            "certificate) in the URL's query string"
        ) from exc


def _where(client: Redis | redis_async.Redis) -> tuple[str, dict[str, Any]]:
    pool = getattr(client, "connection_pool", None)
    kwargs: dict[str, Any] = dict(getattr(pool, "connection_kwargs", {}))
    service = getattr(pool, "service_name", None)  # a sentinel-managed pool
    where = f"the master {service!r}" if service else f"{kwargs.get('host')}:{kwargs.get('port')}"
    return where, kwargs


def _warn_if_evicting(config: dict[Any, Any], stacklevel: int) -> None:
    policy = config.get("maxmemory-policy") or config.get(b"maxmemory-policy")
    if isinstance(policy, bytes):
        policy = policy.decode()
    if policy and policy != "noeviction":
        log.warning("Redis maxmemory-policy is %r: jobs can be evicted; use noeviction", policy)
        warnings.warn(
            f"Redis maxmemory-policy is {policy!r}: under memory pressure Redis will evict keys "
            "and silently lose jobs. Set `maxmemory-policy noeviction` for drumbeat's Redis.",
            EvictionPolicyWarning,
            stacklevel=stacklevel + 1,
        )


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
