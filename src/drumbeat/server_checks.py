"""The checks made on a Redis server before it is trusted with jobs: a ``maxmemory-policy`` that
may evict keys (and so silently lose jobs) is warned about, loudly; a refused login or a closed
TLS connection on the first command is raised saying what the URL must give instead.
"""

from __future__ import annotations

import contextlib
import logging
import ssl
import warnings
from collections.abc import Iterator
from typing import Any

import redis
import redis.asyncio as redis_async
import redis.asyncio.cluster as redis_async_cluster
from redis import Redis
from redis.cluster import RedisCluster

from .cluster import explain_unreachable

__all__ = ["EvictionPolicyWarning", "acheck_server", "check_server"]

log = logging.getLogger("drumbeat")


class EvictionPolicyWarning(UserWarning):
    """Redis may evict keys under memory pressure, which silently loses jobs."""


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
        explained = explain_unreachable(exc, tls=tls)
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
