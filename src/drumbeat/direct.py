"""The producer's hot path: a connection per thread (`Direct`), or per thread and master on a
Redis Cluster (`ClusterDirect`), each a redis-py connection whose socket is then driven by hand.

`connections.Connections.direct` gives one; `App` sends single calls through it (an enqueue, the
call producers make most), and falls back to the client when it fails.
"""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
import struct
import threading
import time
import weakref
from typing import Any, cast

import hiredis
import redis
from redis import Redis
from redis._parsers import BaseParser
from redis.cluster import ClusterNode, RedisCluster

try:  # redis-py < 6 keeps the cluster's error replies (MOVED, ASK, TRYAGAIN...) in its own parser
    from redis.cluster import ClusterParser as _ErrorClasses  # type: ignore[attr-defined]
except ImportError:  # from 6 on, every parser knows them
    _ErrorClasses = BaseParser


class _Wire:
    """A connected redis-py connection whose socket is then driven by hand: one command out,
    one reply in, parsed by hiredis.

    redis-py opens it (URL options, TLS, auth, the database, the client's timeouts), so every
    setting applies; what is dropped is per-call overhead on a path that is mostly overhead: an
    enqueue's own Redis work is a few tens of µs. Its packing (a generator over every argument),
    its reply wrapper and, above all, Python's socket timeout, which makes every send and
    receive a ``poll`` then the call. The timeout is the kernel's instead (``SO_RCVTIMEO`` and
    ``SO_SNDTIMEO`` on a blocking socket), so it costs nothing per call (except over TLS: see
    `__init__`). Measured per enqueue (producer CPU, AMD EPYC): 57 µs through the connection,
    27 µs on the bare socket.
    """

    __slots__ = ("_reader", "_sock", "conn")

    def __init__(self, conn: redis.Connection) -> None:
        conn.connect()  # type: ignore[no-untyped-call]
        self.conn = conn
        # redis-py keeps the socket it opened in `_sock` (every version drumbeat supports).
        sock = conn._sock
        if sock is None:  # connect() raises when it fails; this is only for the type checker
            raise redis.ConnectionError("redis-py opened no socket")
        timeout = conn.socket_timeout
        # Not over TLS: a blocking `ssl.SSLSocket` retries a read the kernel timed out (OpenSSL
        # wants more data), so it would wait forever. It keeps Python's timeout, which raises.
        if timeout and not isinstance(sock, ssl.SSLSocket):
            whole = int(timeout)
            timeval = struct.pack("ll", whole, int((timeout - whole) * 1_000_000))
            sock.settimeout(None)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeval)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeval)
        self._sock: socket.socket = sock
        self._reader: hiredis.Reader = hiredis.Reader(replyError=_ErrorClasses.parse_error)

    def call(self, *args: Any) -> Any:
        """Sends one command and returns its reply; an error reply raises (the connection stays
        in step); a lost connection or a timeout raises `redis.ConnectionError` or
        `redis.TimeoutError`, and the connection must then be dropped."""
        reader, sock = self._reader, self._sock
        try:
            sock.sendall(hiredis.pack_command(args))
            reply = reader.gets()
            while reply is False:
                data = sock.recv(65536)
                if not data:
                    raise redis.ConnectionError("Redis closed the connection")
                reader.feed(data)
                reply = reader.gets()
        except (TimeoutError, BlockingIOError) as exc:  # the kernel's timeout: EAGAIN
            waited = self.conn.socket_timeout
            raise redis.TimeoutError(f"no reply from Redis in {waited} s") from exc
        except OSError as exc:
            raise redis.ConnectionError(f"lost the connection to Redis: {exc}") from exc
        # An error reply, as redis-py's parser classes it (LOADING, say, is a ConnectionError).
        if isinstance(reply, Exception):
            raise reply
        return reply

    def close(self) -> None:
        with contextlib.suppress(Exception):  # at interpreter exit, say: nothing to report
            self.conn.disconnect()  # type: ignore[no-untyped-call]


class _Held:
    """A thread's connection, as its thread-local value: freed by reference counting when the
    thread ends, and closing the connection then. (A redis-py connection sits in reference
    cycles; left to the garbage collector, its socket may be finalized before it, unclosed.)"""

    __slots__ = ("_live", "wire")

    def __init__(self, wire: _Wire, live: set[_Wire]) -> None:
        self.wire, self._live = wire, live
        live.add(wire)

    def __del__(self) -> None:
        self._live.discard(self.wire)
        self.wire.close()


class Direct:
    """A connection per thread, kept for the thread's next call instead of checked out of the
    pool for each one: the path of a single enqueue, the call producers make most.

    Through the client, a call also pays for the pool checkout (a lock and a readiness poll of
    the socket), the retry wrapper and the observability hooks: together more than Redis' own
    work on an enqueue; `_Wire` drops the connection's own per-call costs too. The connection
    is redis-py's, made from the client's pool settings (URL options, TLS, auth, the client's
    timeouts). One that fails is dropped; the caller then runs the call through the client,
    whose retry policy applies. A thread's connection closes when the thread ends (`_Held`),
    and one inherited across a fork is never used: the child opens its own.
    """

    def __init__(self, client: Redis) -> None:
        self._pool = client.connection_pool
        self._local = threading.local()
        self._live: set[_Wire] = set()
        # An App dropped without close(): its connections close when it is collected. The
        # collector runs such callbacks before any finalizer, so it closes them before their
        # sockets would be finalized unclosed (and warn).
        weakref.finalize(self, _close_all, self._live)

    def execute(self, *args: Any) -> Any:
        """Sends one command and returns its reply; an error reply raises (the connection stays
        in step), any other failure drops the connection and raises."""
        held: _Held | None = getattr(self._local, "held", None)
        if held is None or held.wire.conn.pid != os.getpid():
            conn = self._pool.connection_class(**self._pool.connection_kwargs)
            try:
                wire = _Wire(conn)
            except BaseException:
                conn.disconnect()
                raise
            held = self._local.held = _Held(wire, self._live)
        try:
            return held.wire.call(*args)
        except redis.ReadOnlyError as exc:
            # The server was made a replica (a failover): as redis-py's sentinel-managed
            # connections do, drop it, so the next connection asks where the master is now.
            held.wire.close()
            self._local.held = None
            raise redis.ConnectionError(
                f"Redis answered {exc}: the server is now a replica (a failover?); expected the "
                "master, so the connection is dropped and the next one asks where it is"
            ) from exc
        except redis.ResponseError:
            raise
        except BaseException:
            # Closed now, not when `held` is freed: the traceback being raised refers to it.
            held.wire.close()
            self._local.held = None
            raise

    def close(self) -> None:
        """Closes every thread's connection (each reconnects on its next call)."""
        _close_all(self._live)


def _close_all(live: set[_Wire]) -> None:
    for wire in list(live):
        if wire.conn.pid == os.getpid():  # an inherited socket is the parent's to close
            wire.close()


class ClusterDirect:
    """What `Connections.direct` gives on a Redis Cluster: a `Direct` per master, each call sent
    to the master that owns its keys' slot, as the cluster client's slot map says.

    A MOVED reply (the slot has a new owner: a failover, a finished migration) updates that map
    as the cluster client would and sends the call again to the new owner; an ASK reply (the
    slot is migrating and the call's keys are not on the old owner) sends ``ASKING`` then the
    call to the node it names, on the same connection, leaving the map as it is. A lost
    connection raises, as from a `Direct`: the caller then goes through the cluster client,
    which asks the cluster where the slot went (its slot map is this one's).

    ``TRYAGAIN`` is what a script gets while its slot migrates: Redis runs a call of several
    keys on the importing node only if every key is there already, and on the old owner only if
    none has left, which an enqueue's keys (some created only when needed) seldom are. The
    migration ends by itself (``redis-cli --cluster reshard`` moves a slot's keys, then gives
    the slot away), so the call waits for it, up to `MIGRATION_WAIT` seconds: the cluster
    client's own TRYAGAIN retries (16 tries) last under half a second. Calls name their keys as
    ``EVALSHA`` does (``sha, numkeys, key...``).
    """

    MAX_REDIRECTS = 5
    """More MOVED or ASK replies than this in a row and the call goes through the client."""

    MIGRATION_WAIT = 30.0  # connections.COMMAND_TIMEOUT: what any other call would wait
    """Seconds a call waits out ``TRYAGAIN`` replies (its slot migrating) before it raises."""

    def __init__(self, client: Redis) -> None:
        self._client = cast(RedisCluster, client)
        self._directs: dict[str, Direct] = {}
        self._lock = threading.Lock()

    def execute(self, *args: Any) -> Any:
        """Sends one command whose first key is ``args[3]`` and returns its reply."""
        deadline = time.monotonic() + self.MIGRATION_WAIT
        pause = 0.01
        while True:
            try:
                return self._redirected(args)
            except redis.exceptions.TryAgainError:
                if time.monotonic() + pause > deadline:
                    raise
            time.sleep(pause)
            pause = min(pause * 2, 0.2)

    def _redirected(self, args: tuple[Any, ...]) -> Any:
        """Sends the call to its slot's owner, following MOVED and ASK replies."""
        client = self._client
        node = self._owner(args[3])
        asking = False
        for _ in range(self.MAX_REDIRECTS):
            direct = self._direct(node)
            try:
                if asking:
                    direct.execute("ASKING")
                return direct.execute(*args)
            except redis.exceptions.MovedError as moved:
                manager: Any = client.nodes_manager
                if hasattr(manager, "move_slot"):
                    manager.move_slot(moved)
                else:  # redis-py < 6: the map takes it at its next lookup by slot
                    manager.update_moved_exception(moved)
                    manager.get_node_from_slot(moved.slot_id)
                node, asking = self._owner(args[3]), False
            except redis.exceptions.AskError as ask:
                node = client.get_node(host=ask.host, port=ask.port)  # type: ignore[no-untyped-call]
                if node is None:  # a node the slot map does not know yet
                    break
                asking = True
        return client.execute_command(*args)  # type: ignore[no-untyped-call]

    def _owner(self, key: Any) -> ClusterNode:
        node: ClusterNode = self._client.get_node_from_key(key)  # type: ignore[no-untyped-call]
        return node

    def _direct(self, node: ClusterNode) -> Direct:
        direct = self._directs.get(node.name)
        if direct is None:
            with self._lock:
                direct = self._directs.get(node.name)
                if direct is None:
                    made = self._client.get_redis_connection(node)
                    direct = self._directs[node.name] = Direct(made)
        return direct

    def close(self) -> None:
        """Closes every thread's connection to every node."""
        for direct in list(self._directs.values()):
            direct.close()
