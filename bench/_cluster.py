"""What the Redis Cluster benches share: the CPU model, each Redis's CPU and command counts, and
the choice of a namespace whose shards land evenly on the masters (`bench.cluster_periodic`,
`bench.cluster_jobs`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import redis


class Server(Protocol):
    """A Redis process the bench started: a cluster node or a plain redis-server."""

    def client(self) -> redis.Redis: ...


def cpu_seconds(servers: Sequence[Server]) -> list[float]:
    """Each server's Redis CPU so far (INFO used_cpu_user + used_cpu_sys)."""
    out = []
    for server in servers:
        with server.client() as c:
            info = c.info("cpu")
        out.append(float(info["used_cpu_user"]) + float(info["used_cpu_sys"]))
    return out


def commandstats(servers: Sequence[Server]) -> dict[str, tuple[int, int]]:
    """Every server's commands so far, summed: name -> (calls, µs)."""
    out: dict[str, tuple[int, int]] = {}
    for server in servers:
        with server.client() as c:
            stats = c.info("commandstats")
        for name, v in stats.items():
            calls, usec = out.get(name, (0, 0))
            out[name] = (calls + int(v["calls"]), usec + int(v["usec"]))
    return out


def costliest(
    before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]], per: int, top: int = 12
) -> list[tuple[str, float, float]]:
    """The commands run between two `commandstats`, per ``per`` items (runs, jobs), costliest
    first: (name, calls, µs)."""
    per = max(1, per)
    rows = sorted(
        ((name.removeprefix("cmdstat_"), (c - before.get(name, (0, 0))[0]) / per,
          (u - before.get(name, (0, 0))[1]) / per) for name, (c, u) in after.items()),
        key=lambda x: -x[2],
    )  # fmt: skip
    return [r for r in rows if r[1] > 0][:top]


def even_namespace(
    master_of: Callable[[str], int],
    masters: int,
    shards: int,
    key_of: Callable[[str, int], str],
    tries: int = 100_000,
) -> str:
    """The first of ``bench0``, ``bench1``, ... whose ``shards`` shards land ``shards //
    masters`` on each master: ``key_of(namespace, i)`` is a key of shard i, ``master_of(key)``
    the index of the master serving it. A stable search: the same name on every run."""
    if shards % masters:
        raise ValueError(f"{shards} shards cannot land evenly on {masters} masters")
    for attempt in range(tries):
        ns = f"bench{attempt}"
        per = [0] * masters
        for i in range(shards):
            per[master_of(key_of(ns, i))] += 1
        if all(p == shards // masters for p in per):
            return ns
    raise RuntimeError(
        f"no namespace of bench0..bench{tries - 1} spreads {shards} shards evenly over "
        f"{masters} masters"
    )
