"""Redis Cluster: the ``redis+cluster://host:port[,host:port...]`` URL (any reachable nodes; the
rest are discovered) and redis-py's cluster clients made from it, which route each command by its
keys' slot and follow MOVED. ``rediss+cluster://`` is the same over TLS to every node, with the
TLS options of a ``rediss://`` URL.

`node_client` opens a plain client to one node, for the worker's hand-driven connections (`Link`,
`Waiter`), which must reach the slot's owner; the producer's hot path keeps a `Direct` per master
(`ClusterDirect`, both in `drumbeat.direct`). `drumbeat.connections` picks these clients for a
cluster URL and gives them its timeouts.
"""

from __future__ import annotations

import ssl
from typing import Any, cast
from urllib.parse import unquote

import redis
import redis.asyncio as redis_async
import redis.asyncio.cluster as redis_async_cluster
from redis import Redis
from redis.cluster import ClusterNode, RedisCluster

# redis-py < 6 keeps the cluster's error replies (MOVED, ASK, TRYAGAIN...) in its asyncio cluster
# client's parser (a plain client's raises a bare ResponseError); from 6 on, every parser knows
# them.
try:
    from redis.asyncio.cluster import ClusterParser as _AsyncClusterParser  # type: ignore[attr-defined]
except ImportError:
    _AsyncClusterParser = None

__all__ = [
    "CLUSTER_SCHEME",
    "TLS_CLUSTER_SCHEME",
    "ClusterPipeline",
    "async_client",
    "cluster_nodes",
    "explain_unreachable",
    "is_cluster",
    "node_client",
    "sync_client",
]

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


def sync_client(url: str, options: dict[str, Any]) -> Redis:
    nodes, from_url = cluster_nodes(url)
    try:  # the synchronous cluster client connects at once
        made = RedisCluster(
            startup_nodes=[ClusterNode(host, port) for host, port in nodes],  # type: ignore[no-untyped-call]
            **(options | from_url),
        )
    except redis.exceptions.RedisClusterException as exc:
        explained = explain_unreachable(exc, tls=bool(from_url.get("ssl")))
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


def async_client(url: str, options: dict[str, Any]) -> redis_async.Redis:
    nodes, from_url = cluster_nodes(url)
    made = _AsyncCluster(
        startup_nodes=[redis_async_cluster.ClusterNode(host, port) for host, port in nodes],
        **(options | from_url),
    )
    return cast(redis_async.Redis, made)


class ClusterPipeline:
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


def explain_unreachable(
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


def node_client(url: str, host: str, port: int, options: dict[str, Any]) -> redis_async.Redis:
    """A plain asyncio client to one node of the cluster ``url`` names (its credentials and
    options over ``options``), for connections driven by hand that must reach the owner of a
    slot."""
    _, from_url = cluster_nodes(url)
    made = redis_async.Redis(host=host, port=port, **(options | from_url))
    if _AsyncClusterParser is not None:
        # redis-py < 6: so that its connections (and a `Link`'s, made from the same options)
        # raise MovedError, AskError, TryAgainError..., which the worker follows or waits out,
        # and not a bare ResponseError, which it takes for a script's error.
        made.connection_pool.connection_kwargs["parser_class"] = _AsyncClusterParser
    return made
