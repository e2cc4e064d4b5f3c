"""Payload codecs: JSON or msgpack, with a size limit. Never pickle: payloads are data, not code."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import msgpack

from .errors import PayloadTooLarge, SerializationError


class Codec(Protocol):
    name: str

    def dumps(self, value: Any) -> bytes: ...

    def loads(self, data: bytes) -> Any: ...


_json_decode = json.JSONDecoder().decode
# One encoder for every call: `json.dumps` with any option set builds a new one each time.
_json_encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode


class JsonCodec:
    name = "json"

    def dumps(self, value: Any) -> bytes:
        return _json_encode(value).encode()

    def loads(self, data: bytes) -> Any:
        # Records are UTF-8 (dumps writes them so); json.loads(bytes) would sniff the encoding.
        return _json_decode(data.decode() if isinstance(data, bytes) else data)


class MsgpackCodec:
    name = "msgpack"

    def dumps(self, value: Any) -> bytes:
        return msgpack.packb(value, use_bin_type=True)  # type: ignore[no-any-return]

    def loads(self, data: bytes) -> Any:
        return msgpack.unpackb(data, raw=False, strict_map_key=False)


CODECS: dict[str, Codec] = {"json": JsonCodec(), "msgpack": MsgpackCodec()}


def encode_call(codec: Codec, args: Sequence[Any], kwargs: Mapping[str, Any], limit: int) -> bytes:
    """Encode a task's arguments, naming the first argument the codec rejects."""
    try:
        data = codec.dumps([list(args), dict(kwargs)])
    except (TypeError, ValueError, OverflowError) as exc:
        raise SerializationError(_which_argument(codec, args, kwargs, exc)) from exc
    check_size(data, limit, "arguments")
    return data


def encode_value(codec: Codec, value: Any, limit: int, what: str) -> bytes:
    try:
        data = codec.dumps(value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise SerializationError(
            f"{what} of type {type(value).__name__} cannot be encoded as {codec.name}: {exc}"
        ) from exc
    check_size(data, limit, what)
    return data


def check_size(data: bytes, limit: int, what: str) -> None:
    if len(data) > limit:
        raise PayloadTooLarge(
            f"{what} encode to {len(data):,} bytes, over the limit of {limit:,} bytes "
            "(Settings.max_payload_bytes); pass a reference (an id, a URL) instead of the data"
        )


def _which_argument(
    codec: Codec, args: Sequence[Any], kwargs: Mapping[str, Any], exc: Exception
) -> str:
    named: list[tuple[str, Any]] = [(f"positional argument {i}", a) for i, a in enumerate(args)]
    named += [(f"keyword argument {k!r}", v) for k, v in kwargs.items()]
    for label, value in named:
        try:
            codec.dumps(value)
        except (TypeError, ValueError, OverflowError) as inner:
            return (
                f"{label} of type {type(value).__name__} cannot be encoded as {codec.name}: "
                f"{inner}; pass JSON-like data (str, int, float, bool, None, list, dict)"
            )
    return f"arguments cannot be encoded as {codec.name}: {exc}"
