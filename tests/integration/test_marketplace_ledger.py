"""The marketplace demo's records in Redis (examples/marketplace/ledger.py): orders fenced by the
claim's token, the search gate, and a monitor's match against the search cache."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as redis_async
from examples.marketplace import ledger


@pytest.fixture
async def ar(redis_url: str) -> AsyncIterator[redis_async.Redis]:
    client = redis_async.from_url(redis_url)
    yield client
    await client.aclose()


async def test_an_order_is_fenced_by_the_claims_token(ar: redis_async.Redis) -> None:
    user, item = 42, uuid.uuid4().hex
    assert await ledger.begin(ar, user, item, 5) == "go"
    # A claim older than the one holding the order was taken over: it must not order.
    assert await ledger.begin(ar, user, item, 4) == "stale"
    # A later claim finds claim 5's order begun and never finished: it may exist.
    assert await ledger.begin(ar, user, item, 7) == "unsure"
    assert not await ledger.finish(ar, user, item, 5), "claim 5 lost the order to claim 7"
    assert await ledger.finish(ar, user, item, 7)
    assert await ledger.begin(ar, user, item, 9) == "done"


async def test_the_gate_spaces_searches_of_one_keyword(ar: redis_async.Redis) -> None:
    keyword = uuid.uuid4().hex
    first = await ledger.gate(ar, keyword, 60_000)
    assert first > 0, "the first search of a keyword may start"
    assert await ledger.gate(ar, keyword, 60_000) == 0, "a second one within a minute may not"
    assert await ledger.gate(ar, uuid.uuid4().hex, 60_000) > 0, "another keyword may"


async def test_a_match_is_what_the_search_found_under_the_price_and_not_placed(
    ar: redis_async.Redis,
) -> None:
    keyword, user = uuid.uuid4().hex, 7
    age, items = await ledger.match(ar, keyword, 5_000, user)
    assert items == [], f"never searched: nothing to match, got {items}"
    assert age > 10**9, f"never searched: the age should be huge, got {age} ms"
    now = await ledger.gate(ar, keyword, 0)
    await ledger.write_cache(ar, keyword, now, [("cheap", 1_000), ("dear", 9_000), ("ok", 5_000)])
    age, items = await ledger.match(ar, keyword, 5_000, user)
    assert sorted(items) == ["cheap", "ok"], f"items at 5,000 or less, got {items}"
    assert 0 <= age < 60_000, f"searched just now, got an age of {age} ms"
    assert await ledger.begin(ar, user, "cheap", 1) == "go"
    assert await ledger.finish(ar, user, "cheap", 1)
    _, items = await ledger.match(ar, keyword, 5_000, user)
    assert items == ["ok"], f"a placed order is no longer a match, got {items}"
    _, items = await ledger.match(ar, keyword, 5_000, user + 1)
    assert sorted(items) == ["cheap", "ok"], "another user's order changes nothing for this one"
