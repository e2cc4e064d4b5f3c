"""The demo's own records in Redis: which orders are placed (fenced by the claim's token, so a
re-run never orders twice), the search cache per keyword and the gate that spaces searches.

The order ledger is a hash ``"<user>:<item>" -> "<state>:<token>"``: ``p`` while a claim of the
order job is placing it (the outcome unknown until it finishes), ``d`` once placed. A claim
writes ``p`` only with a token larger than the one held (drumbeat's fencing tokens grow with
every claim), so a run whose lease was taken over learns it is stale instead of ordering; a
claim that finds an unfinished ``p`` of an earlier one (a crash, a timeout, a retry after an
error) asks the marketplace whether that order went through before placing it again.

A keyword's last search is a sorted set (item by price) and its start time (Redis ms) in the
``cached`` hash; a monitor run reads both, and the ledger, in one script call.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import redis.asyncio as redis_async
from redis.exceptions import NoScriptError

#: The app's namespace; DRUMBEAT_NAMESPACE gives a run one of its own (the tests do).
NAMESPACE = os.environ.get("DRUMBEAT_NAMESPACE") or "marketplace"
PREFIX = f"demo:{{{NAMESPACE}}}"
LEDGER = f"{PREFIX}:ledger"
MATCHED = f"{PREFIX}:matched"
SEARCHED = f"{PREFIX}:searched"
CACHED = f"{PREFIX}:cached"

Begin = Literal["go", "unsure", "done", "stale"]

# KEYS[1] ledger (hash); ARGV[1] "<user>:<item>", ARGV[2] the claim's fencing token.
# Returns go (no earlier attempt), unsure (an earlier claim began and did not finish: its
# order may exist), done (placed already), stale (a later claim holds it).
_BEGIN = """
local held = redis.call('HGET', KEYS[1], ARGV[1])
if held then
  if string.sub(held, 1, 1) == 'd' then return 'done' end
  if tonumber(string.sub(held, 3)) >= tonumber(ARGV[2]) then return 'stale' end
end
redis.call('HSET', KEYS[1], ARGV[1], 'p:' .. ARGV[2])
if held then return 'unsure' end
return 'go'
"""

# KEYS[1] ledger (hash); ARGV[1] "<user>:<item>", ARGV[2] token. Marks the order placed if this
# claim still holds it; returns 1, else 0 (a later claim took it over and will check).
_FINISH = """
if redis.call('HGET', KEYS[1], ARGV[1]) == 'p:' .. ARGV[2] then
  redis.call('HSET', KEYS[1], ARGV[1], 'd:' .. ARGV[2])
  return 1
end
return 0
"""

# KEYS[1] last search start per keyword (hash); ARGV[1] keyword, ARGV[2] freshness ms.
# Returns the Redis time (ms) the caller may search at, or 0 if a search of this keyword
# started less than ARGV[2] ms ago: searches of one keyword are spaced by the Redis clock.
_GATE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local last = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
if now - last < tonumber(ARGV[2]) then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], now)
return now
"""


# KEYS[1] the keyword's listings (zset item -> price), KEYS[2] cached (hash keyword -> ms the
# search started), KEYS[3] ledger, KEYS[4] matched (set); ARGV[1] keyword, ARGV[2] max price,
# ARGV[3] user id. Returns the cache's age in ms (Redis clock; huge when never searched), then
# each item at the max price or less not yet placed for the user (added to matched).
_MATCH = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local at = tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0')
local out = {now - at}
for _, item in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[2])) do
  local field = ARGV[3] .. ':' .. item
  local state = redis.call('HGET', KEYS[3], field)
  if not state or string.sub(state, 1, 1) ~= 'd' then
    out[#out + 1] = item
    redis.call('SADD', KEYS[4], field)
  end
end
return out
"""


@dataclass(frozen=True, slots=True)
class Lua:
    source: str

    @property
    def sha(self) -> str:
        return hashlib.sha1(self.source.encode()).hexdigest()

    async def __call__(self, r: redis_async.Redis, keys: Sequence[str], args: Sequence[Any]) -> Any:
        try:
            return await r.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:  # a Redis that has not seen it yet: EVAL loads it
            return await r.eval(self.source, len(keys), *keys, *args)


BEGIN, FINISH, GATE, MATCH = Lua(_BEGIN), Lua(_FINISH), Lua(_GATE), Lua(_MATCH)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def cache_key(keyword: str) -> str:
    return f"{PREFIX}:listings:{keyword}"


def order_field(user_id: int, item_id: str) -> str:
    return f"{user_id}:{item_id}"


async def begin(r: redis_async.Redis, user_id: int, item_id: str, token: int) -> Begin:
    state = _text(await BEGIN(r, [LEDGER], [order_field(user_id, item_id), token]))
    if state not in ("go", "unsure", "done", "stale"):
        raise RuntimeError(f"the ledger answered {state!r}; expected go, unsure, done or stale")
    return state  # type: ignore[return-value]  # one of Begin's values, checked just above


async def finish(r: redis_async.Redis, user_id: int, item_id: str, token: int) -> bool:
    return bool(int(await FINISH(r, [LEDGER], [order_field(user_id, item_id), token])))


async def gate(r: redis_async.Redis, keyword: str, fresh_ms: int) -> int:
    """The Redis time (ms) to search ``keyword`` at, or 0: it was searched < fresh_ms ago."""
    return int(await GATE(r, [SEARCHED], [keyword, fresh_ms]))


async def match(
    r: redis_async.Redis, keyword: str, max_price: int, user_id: int
) -> tuple[int, list[str]]:
    """The age (ms) of the keyword's last search, and its items at ``max_price`` or less that
    are not placed for the user (each recorded as a match)."""
    reply = await MATCH(
        r, [cache_key(keyword), CACHED, LEDGER, MATCHED], [keyword, max_price, user_id]
    )
    return int(reply[0]), [_text(i) for i in reply[1:]]


async def write_cache(
    r: redis_async.Redis, keyword: str, at_ms: int, items: Sequence[tuple[str, int]]
) -> None:
    """Replaces the keyword's last search, atomically."""
    key = cache_key(keyword)
    async with r.pipeline(transaction=True) as pipe:
        pipe.delete(key)
        if items:
            pipe.zadd(key, {item: price for item, price in items})
        pipe.hset(CACHED, keyword, at_ms)
        await pipe.execute()
