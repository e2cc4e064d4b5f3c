"""`worker.link.pack`: the worker's hot path packs its script calls itself; the bytes must be
the ones redis-py's packer makes, or Redis reads another command than the one meant."""

from __future__ import annotations

from typing import Any

import pytest
import redis.asyncio as aredis

from drumbeat.worker.link import pack

COMMANDS: list[tuple[Any, ...]] = [
    ("EVALSHA", "a" * 40, 3, "k1", "k2", "k3", "worker-1", 500, -7, 0),
    ("EVALSHA", "b" * 40, 1, "é→ünïcode", b"\x00\r\n binary \xff", "", b""),
    ("PING",),
    ("SET", "big", "x" * 20_000),  # past redis-py's 6,000-byte chunks
    ("EVALSHA", "c" * 40, 0, 2**62, -(2**62)),
]


def _conn() -> Any:
    return aredis.Connection()  # never connected: packing needs none


def test_packs_the_bytes_redis_py_packs() -> None:
    conn = _conn()
    assert pack(conn, COMMANDS) == b"".join(conn.pack_commands(COMMANDS))
    for command in COMMANDS:
        assert pack(conn, [command]) == b"".join(conn.pack_commands([command]))


@pytest.mark.parametrize("odd", [1.5, memoryview(b"mv")])
def test_other_argument_types_are_left_to_redis_py(odd: Any) -> None:
    conn = _conn()
    commands = [("SET", "k", odd), ("PING",)]
    packed = pack(conn, commands)
    expected = conn.pack_commands(commands)
    assert (b"".join(packed) if isinstance(packed, list) else packed) == b"".join(expected)


def test_a_bool_is_refused_as_redis_py_refuses_it() -> None:
    conn = _conn()
    with pytest.raises(Exception) as expected:
        conn.pack_commands([("SET", "k", True)])
    with pytest.raises(type(expected.value)):
        pack(conn, [("SET", "k", True)])
