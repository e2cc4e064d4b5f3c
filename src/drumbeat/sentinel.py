"""Redis Sentinel: the ``redis+sentinel://`` URL and clients that reach the current master through
the sentinels (redis-py's `SentinelConnectionPool`), so a failover is followed by reconnecting.

The URL, in the form users of redis-py, Celery and Kombu know from their sentinel settings::

    redis[s]+sentinel://[user:password@]host:port[,host:port...]/service[/db][?option=value...]

The hosts are sentinels (any of them; the first that answers names the master); ``service`` is
the master's name in their configuration (``sentinel monitor <service> ...``). The credentials,
the database (``/service/2`` or ``?db=2``) and the query options are those of the master's
connections, as in a ``redis://`` URL; ``sentinel_username`` and ``sentinel_password`` are the
sentinels' own, when they require auth (``requirepass`` in sentinel.conf). ``rediss+sentinel://``
talks TLS to the sentinels and to the master, both with the TLS options of the query string
(``ssl_ca_certs``, ``ssl_certfile``... as in a ``rediss://`` URL).

redis-py counts a sentinel that refuses the login or the TLS handshake as unreachable, and
reports only that no master was found; here such a refusal raises an error naming the sentinel
and what the URL must give (`_why`).
"""

from __future__ import annotations

import asyncio
import ssl
import threading
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import parse_qsl, unquote, urlencode

import redis
import redis.asyncio as redis_async
import redis.asyncio.sentinel as async_sentinel
import redis.sentinel as sync_sentinel
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry

SCHEME = "redis+sentinel"
TLS_SCHEME = "rediss+sentinel"
EXAMPLE = f"{SCHEME}://10.0.0.1:26379,10.0.0.2:26379/mymaster"
FORM = "redis[s]+sentinel://[user:password@]host:port[,host:port...]/service[/db]"


def is_sentinel(url: str) -> bool:
    """Whether ``url`` names a master through its sentinels (``redis+sentinel://``, or
    ``rediss+sentinel://`` over TLS)."""
    return url.partition("://")[0].lower() in (SCHEME, TLS_SCHEME)


@dataclass(frozen=True, slots=True)
class SentinelUrl:
    """What a ``redis+sentinel://`` URL names."""

    sentinels: list[tuple[str, int]]
    service: str
    options: dict[str, Any]
    """Options of the master's connections: credentials, database, query options."""
    sentinel_options: dict[str, Any]
    """Options of the connections to the sentinels (their own credentials)."""


def parse(url: str) -> SentinelUrl:
    """The parts of a ``redis+sentinel://`` URL (see the module docstring).

    Raises:
        ValueError: not such a URL, or one that names no sentinel, a sentinel without a port,
            no service name, or a database that is not a number (or two different ones).
    """
    scheme, _, rest = url.partition("://")
    if not is_sentinel(url):
        raise ValueError(f"{url!r} is not a {SCHEME}:// URL (expected {FORM})")
    tls = scheme.lower() == TLS_SCHEME
    rest, _, query = rest.partition("?")
    userinfo, _, hosts = rest.rpartition("@")
    hosts, _, path = hosts.partition("/")
    sentinels: list[tuple[str, int]] = []
    for item in filter(None, hosts.split(",")):
        host, _, port = item.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(
                f"Redis Sentinel URL {url!r} names sentinel {item!r}; expected host:port "
                f"(e.g. {EXAMPLE})"
            )
        sentinels.append((host.strip("[]"), int(port)))
    if not sentinels:
        raise ValueError(f"Redis Sentinel URL {url!r} names no sentinel; expected {FORM}")
    service, _, db = path.strip("/").partition("/")
    if not service:
        raise ValueError(
            f"Redis Sentinel URL {url!r} names no service (the master's name in the sentinels' "
            f"configuration); expected {FORM}, e.g. {EXAMPLE}"
        )
    pairs = parse_qsl(query, keep_blank_values=True)
    mine = {"sentinel_username", "sentinel_password"}
    sentinel_options = {
        name.removeprefix("sentinel_"): value for name, value in pairs if name in mine
    }
    kept = urlencode([(name, value) for name, value in pairs if name not in mine])
    # redis-py's own URL parsing gives the query options their types (socket_timeout=2.5).
    first, at = sentinels[0]
    try:
        base = "rediss" if tls else "redis"
        options: dict[str, Any] = dict(redis.connection.parse_url(f"{base}://{first}:{at}?{kept}"))  # type: ignore[no-untyped-call, unused-ignore]
    except ValueError as exc:
        raise ValueError(f"Redis Sentinel URL {url!r}: {exc}") from None
    for name in ("host", "port", "path", "connection_class"):
        options.pop(name, None)
    if tls:  # the sentinels' certificates are taken to be the master's, as one CA signs both
        options["ssl"] = True
        sentinel_options |= {k: v for k, v in options.items() if k.startswith("ssl")}
    if db:
        if not db.isdigit() or ("db" in options and options["db"] != int(db)):
            raise ValueError(
                f"Redis Sentinel URL {url!r} names database {db!r}"
                + (f" and db={options['db']}" if "db" in options else "")
                + f"; expected one database number, e.g. {SCHEME}://host:26379/mymaster/0"
            )
        options["db"] = int(db)
    if userinfo:
        user, _, password = userinfo.partition(":")
        options["username"], options["password"] = unquote(user) or None, unquote(password)
    return SentinelUrl(sentinels, unquote(service), options, sentinel_options)


def _why(sentinel: redis.Redis | redis_async.Redis, exc: redis.RedisError) -> Exception | None:
    """What the URL must give, when ``exc`` (from a sentinel) comes from the URL: a refused
    login, or a TLS handshake the sentinel closed (no client certificate, or one its CA did not
    sign); None for other failures (a sentinel down, say)."""
    kwargs = sentinel.connection_pool.connection_kwargs
    where = f"the sentinel at {kwargs.get('host')}:{kwargs.get('port')}"
    if isinstance(exc, redis.AuthenticationError):
        given = "no password" if kwargs.get("password") is None else "the password given"
        return redis.AuthenticationError(
            f"{where} refused {given} ({exc}); expected the sentinels' own password as "
            "sentinel_password= (and their ACL user as sentinel_username=) in the URL's query "
            f"string, e.g. {EXAMPLE}?sentinel_password=..."
        )
    # The TLS error is the connection error's cause or context, or only its text ("[SSL: ...]");
    # or, as often, a reset: the server closed the connection before its alert was read.
    tls = issubclass(
        sentinel.connection_pool.connection_class, (redis.SSLConnection, redis_async.SSLConnection)
    )
    cause: BaseException | None = exc
    while cause is not None and not (
        isinstance(cause, ssl.SSLError | ConnectionResetError) or "[SSL" in str(cause)
    ):
        cause = cause.__cause__ or cause.__context__
    if tls and isinstance(exc, redis.ConnectionError) and cause is not None:
        return redis.ConnectionError(
            f"the TLS connection to {where} failed ({cause}); a sentinel that requires client "
            "certificates (tls-auth-clients yes) closes connections that present none, or one "
            "its CA did not sign. Expected ssl_certfile= and ssl_keyfile= (the client "
            "certificate and key) and ssl_ca_certs= (the CA that signed the sentinels' "
            f"certificates) in the {TLS_SCHEME}:// URL's query string"
        )
    return None


class _SyncSentinels(sync_sentinel.Sentinel):
    """redis-py's `Sentinel`, saying so when the sentinels refuse the login or the TLS
    handshake (redis-py counts either as an unreachable sentinel: "No master found"), and
    asking them for the master one lookup at a time.

    redis-py moves the sentinel that answered to the front of its list by the index it had
    when the lookup began, which another lookup may have changed meanwhile (every connection
    of a client reconnects at once after a failover): the list then names one sentinel twice
    and loses another, never asked again, whose connections are never closed. One at a time
    also spares the others the wait on a dead sentinel: the first lookup moves a live one
    forward."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call, unused-ignore]
        self._lookup = threading.Lock()

    def discover_master(self, service_name: str) -> tuple[str, int]:
        with self._lookup:
            return self._discover_master(service_name)

    def _discover_master(self, service_name: str) -> tuple[str, int]:
        try:
            return cast(tuple[str, int], super().discover_master(service_name))  # type: ignore[no-untyped-call, unused-ignore]
        except sync_sentinel.MasterNotFoundError:
            # Ask the sentinels why (only on this path, so a working setup pays nothing).
            for sentinel in self.sentinels:
                try:
                    sentinel.ping()
                except redis.RedisError as exc:
                    if (why := _why(sentinel, exc)) is not None:
                        raise why from None
            raise


class _AsyncSentinels(async_sentinel.Sentinel):
    """`_SyncSentinels` for asyncio."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call, unused-ignore]
        self._lookup = asyncio.Lock()

    async def discover_master(self, service_name: str) -> tuple[str, int]:
        async with self._lookup:
            return await self._discover_master(service_name)

    async def _discover_master(self, service_name: str) -> tuple[str, int]:
        try:
            return cast(tuple[str, int], await super().discover_master(service_name))
        except async_sentinel.MasterNotFoundError:
            for sentinel in self.sentinels:
                try:
                    await sentinel.ping()
                except redis.RedisError as exc:
                    if (why := _why(sentinel, exc)) is not None:
                        raise why from None
            raise


def _sentinel_kwargs(
    parsed: SentinelUrl, options: dict[str, Any], retry: Retry | AsyncRetry
) -> dict[str, Any]:
    # Asking a sentinel for the master is quick: never the long read timeout of a client for
    # blocking commands, or a dead sentinel would hold up the reconnect to the new master.
    # And one retry at once, not redis-py's default of 3 after a growing backoff (1, 2, 4 s):
    # a sentinel that fails (or refuses the login) is passed over for the next one, and the
    # master's client retries the whole lookup after its own backoff anyway.
    return {
        "socket_connect_timeout": options["socket_connect_timeout"],
        "socket_timeout": min(options["socket_timeout"], options["socket_connect_timeout"]),
        "retry": retry,
    } | parsed.sentinel_options


class _SyncMaster(redis.Redis):
    """A client of the master; closing it closes its connections to the sentinels too."""

    manager: sync_sentinel.Sentinel

    def close(self) -> None:
        try:
            super().close()
        finally:
            for client in self.manager.sentinels:
                client.close()


class _AsyncMaster(redis_async.Redis):
    """`_SyncMaster` for asyncio."""

    manager: async_sentinel.Sentinel

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        try:
            await super().aclose(close_connection_pool)
        finally:
            for client in self.manager.sentinels:
                await client.aclose()


def sync_client(url: str, options: dict[str, Any]) -> redis.Redis:
    """A synchronous client of the master ``url`` names; ``options`` (the caller's timeouts)
    are overridden by the URL's."""
    parsed = parse(url)
    merged = options | parsed.options
    manager = _SyncSentinels(
        parsed.sentinels, sentinel_kwargs=_sentinel_kwargs(parsed, merged, Retry(NoBackoff(), 1))
    )
    pool = sync_sentinel.SentinelConnectionPool(parsed.service, manager, **merged)  # type: ignore[no-untyped-call, unused-ignore]
    made = cast(_SyncMaster, _SyncMaster.from_pool(pool))
    made.manager = manager
    return made


def async_client(url: str, options: dict[str, Any]) -> redis_async.Redis:
    """`sync_client` for asyncio callers."""
    parsed = parse(url)
    merged = options | parsed.options
    manager = _AsyncSentinels(
        parsed.sentinels,
        sentinel_kwargs=_sentinel_kwargs(parsed, merged, AsyncRetry(NoBackoff(), 1)),
    )
    pool = async_sentinel.SentinelConnectionPool(parsed.service, manager, **merged)  # type: ignore[no-untyped-call, unused-ignore]
    made = cast(_AsyncMaster, _AsyncMaster.from_pool(pool))
    made.manager = manager
    return made
