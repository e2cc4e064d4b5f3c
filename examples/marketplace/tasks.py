"""The monitoring service's tasks: a monitor run per user and keyword every few seconds, a
shared search per keyword, and urgent orders placed exactly once per (user, item).

A monitor run reads its keyword's last search (at most `catalog.FRESH` s old while monitors
of the keyword run) and asks for a fresh one when it is older: monitors of one keyword share
their searches, so the marketplace sees at most one search per keyword per `FRESH` seconds
however many users watch it. Matches the user has not ordered yet are enqueued as urgent
orders with a dedup key per (user, item), so the runs that see a match while its order waits
or runs add no second job; the order task fences its side effect with the claim's token
(`ledger`), so a re-run never orders twice.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import httpx

import drumbeat

from . import ledger
from .catalog import FRESH, SEARCH_CEILING

app = drumbeat.App(namespace=ledger.NAMESPACE)
# httpx logs every request at INFO: hundreds of lines a second in the workers' log.
logging.getLogger("httpx").setLevel(logging.WARNING)

# The marketplace's search budget, shared by every worker process; one order at a time per
# user. (Searches also stay under the budget by construction, one per keyword per FRESH s, so
# the limiter rarely has to hold one back at the default sizes.)
app.limiter("marketplace", rate="200/s")  # server.SEARCH_BUDGET
LIMITS: dict[str, dict[str, Any]] = {
    "search": {"limiter": "marketplace"},
    "place_order": {"concurrency_limit": 1, "limit_by": "user_id"},
}


@app.resource("marketplace", close=lambda client: client.aclose())
async def marketplace() -> httpx.AsyncClient:
    """One HTTP client (and connection pool) per worker process."""
    url = os.environ.get("MARKETPLACE_URL")
    if not url:
        raise RuntimeError("MARKETPLACE_URL is not set; expected the fake marketplace's base URL")
    # A small pool kept alive: past max_keepalive_connections httpx closes each extra
    # connection after its request, and a connect per request costs more than the wait.
    limits = httpx.Limits(max_connections=8, max_keepalive_connections=8)
    return httpx.AsyncClient(base_url=url, timeout=5.0, limits=limits)


@app.task(name="marketplace.search", priority=5, result_ttl=0, **LIMITS["search"])
async def search(keyword: str, max_price: int) -> int:
    """Search the marketplace for ``keyword`` and keep the result for the keyword's monitors;
    returns the listings found (-1: searched less than FRESH s ago, nothing done)."""
    r = await app.aredis()
    started = await ledger.gate(r, keyword, round(FRESH * 1000))
    if not started:
        return -1
    client = await marketplace.aget()
    resp = await client.get("/search", params={"keyword": keyword, "max_price": max_price})
    if resp.status_code == 429:
        raise drumbeat.Retry(delay=FRESH)
    resp.raise_for_status()
    items = [(str(x["id"]), int(x["price"])) for x in resp.json()["items"]]
    await ledger.write_cache(r, keyword, started, items)
    return len(items)


@app.task(name="marketplace.monitor", result_ttl=0)
async def monitor(user_id: int, keyword: str, max_price: int) -> int:
    """One run of a user's monitor: orders what its keyword's last search found at
    ``max_price`` or less and the user has not ordered; returns how many it enqueued."""
    r = await app.aredis()
    age_ms, new = await ledger.match(r, keyword, max_price, user_id)
    if age_ms >= FRESH * 1000:
        await search.options(key=f"search:{keyword}").aenqueue(keyword, SEARCH_CEILING)
    if not new:
        return 0
    await app.aenqueue_many(
        place_order.options(key=f"order:{user_id}:{item}").prepare(user_id, item) for item in new
    )
    return len(new)


@app.task(name="marketplace.place_order", priority=9, retries=3, backoff=0.1, result_ttl=0,
          **LIMITS["place_order"])  # fmt: skip
async def place_order(user_id: int, item_id: str) -> str:
    """Order ``item_id`` for ``user_id`` unless it is ordered already; returns what it did."""
    token = drumbeat.current_job().token
    r = await app.aredis()
    state = await ledger.begin(r, user_id, item_id, token)
    if state in ("done", "stale"):
        return state
    client = await marketplace.aget()
    if state == "unsure":
        # An earlier claim began this order and never recorded its end: it may have gone
        # through (a crash after the request, a timeout whose request landed). Ask first.
        found = await client.get(f"/orders/{user_id}/{item_id}")
        if found.status_code == 200:
            await ledger.finish(r, user_id, item_id, token)
            return "found"
    resp = await client.post(
        "/orders", json={"user_id": user_id, "item_id": item_id, "token": token}
    )
    resp.raise_for_status()
    await ledger.finish(r, user_id, item_id, token)
    return "ordered"
