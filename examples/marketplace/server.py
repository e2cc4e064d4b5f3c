"""The fake marketplace: a real HTTP server on loopback (Starlette under uvicorn, in a thread of
the demo's process) where listings appear over time at random prices.

- ``GET /search?keyword=K&max_price=P``: the newest 100 listings of ``K`` at ``P`` or less;
  answers 429 once it has served ``SEARCH_BUDGET`` searches in the last second (a sliding
  1-s window, as a real marketplace's API gateway would).
- ``POST /orders`` ``{"user_id", "item_id", "token"}``: records an order; a second order of the
  same item by the same user is recorded too, and counted and reported as a duplicate.
- ``GET /orders/{user_id}/{item_id}``: the user's order of that item, or 404 (what a client
  that lost track of an order asks before ordering again).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import threading
import time
from collections import defaultdict, deque
from collections.abc import AsyncIterator
from dataclasses import dataclass

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from .catalog import KEYWORDS, LISTING_PRICES, Listing

#: Searches a second the marketplace serves; the rest get 429.
SEARCH_BUDGET = 200
#: Listings a search returns at most, newest first.
PAGE = 100
#: How long an order takes to confirm after it is recorded: long enough for two of one user's
#: orders to overlap.
ORDER_SECONDS = 0.02


@dataclass(frozen=True, slots=True)
class Stats:
    """The marketplace's counters at one moment."""

    listings: int
    searches: int
    searches_last_s: int
    """Searches served in the last second (the sliding window the budget applies to)."""
    peak_searches_1s: int
    """The most searches served in any 1-s window so far."""
    throttled: int
    """Searches answered 429."""
    orders: int
    duplicates: int
    """Orders of an item its user had ordered already."""
    peak_user_orders: int
    """The most orders of one user in flight at once."""


class Market:
    """The marketplace's state; handlers run on the server's loop, readers in other threads,
    so every access holds the lock (briefly: no awaiting under it)."""

    def __init__(self, listing_rate: float, seed: int = 11) -> None:
        self.listing_rate = listing_rate
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._listings: list[Listing] = []
        self._by_keyword: defaultdict[str, list[Listing]] = defaultdict(list)
        self._ids: dict[str, Listing] = {}
        self._window: deque[float] = deque()
        self._searches = self._peak = self._throttled = 0
        self._orders: dict[tuple[int, str], int] = {}
        self._order_count = self._duplicates = 0
        self._in_flight: defaultdict[int, int] = defaultdict(int)
        self._peak_user = 0
        self.publishing = threading.Event()

    # -- listings ------------------------------------------------------------------------------

    def publish(self) -> Listing:
        with self._lock:
            n = len(self._listings) + 1
            item = Listing(
                id=f"m{n:06d}",
                keyword=self._rng.choice(KEYWORDS),
                price=self._rng.randrange(*LISTING_PRICES, 10),
                listed_ms=int(time.time() * 1000),
            )
            self._listings.append(item)
            self._by_keyword[item.keyword].append(item)
            self._ids[item.id] = item
            return item

    async def produce(self) -> None:
        """Publishes listings at ``listing_rate`` a second on average (Poisson arrivals) while
        `publishing` is set."""
        while True:
            await asyncio.sleep(self._rng.expovariate(self.listing_rate))
            if self.publishing.is_set():
                self.publish()

    def listings(self) -> list[Listing]:
        with self._lock:
            return list(self._listings)

    # -- search --------------------------------------------------------------------------------

    def search(self, keyword: str, max_price: int) -> list[Listing] | None:
        """The newest matching listings, or None when the budget of this second is spent."""
        now = time.monotonic()
        with self._lock:
            while self._window and self._window[0] <= now - 1.0:
                self._window.popleft()
            if len(self._window) >= SEARCH_BUDGET:
                self._throttled += 1
                return None
            self._window.append(now)
            self._searches += 1
            self._peak = max(self._peak, len(self._window))
            found = [x for x in reversed(self._by_keyword[keyword]) if x.price <= max_price]
            return found[:PAGE]

    # -- orders --------------------------------------------------------------------------------

    def known(self, item_id: str) -> bool:
        with self._lock:
            return item_id in self._ids

    def begin_order(self, user_id: int, item_id: str) -> bool:
        """Records the order as it arrives; True if the user had ordered this item already."""
        with self._lock:
            self._in_flight[user_id] += 1
            self._peak_user = max(self._peak_user, self._in_flight[user_id])
            self._order_count += 1
            key = (user_id, item_id)
            self._orders[key] = self._orders.get(key, 0) + 1
            duplicate = self._orders[key] > 1
            self._duplicates += duplicate
            return duplicate

    def end_order(self, user_id: int) -> None:
        with self._lock:
            self._in_flight[user_id] -= 1

    def ordered(self, user_id: int, item_id: str) -> int:
        with self._lock:
            return self._orders.get((user_id, item_id), 0)

    def orders(self) -> dict[tuple[int, str], int]:
        with self._lock:
            return dict(self._orders)

    def stats(self) -> Stats:
        now = time.monotonic()
        with self._lock:
            last_s = sum(1 for t in self._window if t > now - 1.0)
            return Stats(
                listings=len(self._listings),
                searches=self._searches,
                searches_last_s=last_s,
                peak_searches_1s=self._peak,
                throttled=self._throttled,
                orders=self._order_count,
                duplicates=self._duplicates,
                peak_user_orders=self._peak_user,
            )


def routes(market: Market) -> Starlette:
    """The marketplace's HTTP API over ``market``."""

    async def search(request: Request) -> JSONResponse:
        try:
            keyword = request.query_params["keyword"]
            max_price = int(request.query_params["max_price"])
        except (KeyError, ValueError):
            return JSONResponse({"error": "expected ?keyword=<word>&max_price=<yen>"}, 400)
        found = market.search(keyword, max_price)
        if found is None:
            return JSONResponse({"error": f"over {SEARCH_BUDGET} searches/s"}, 429)
        items = [{"id": x.id, "price": x.price, "listed_ms": x.listed_ms} for x in found]
        return JSONResponse({"items": items})

    async def place(request: Request) -> JSONResponse:
        body = await request.json()
        try:
            user_id, item_id = int(body["user_id"]), str(body["item_id"])
        except (KeyError, TypeError, ValueError):
            return JSONResponse({"error": 'expected {"user_id": int, "item_id": str}'}, 400)
        if not market.known(item_id):
            return JSONResponse({"error": f"no listing {item_id!r}"}, 404)
        duplicate = market.begin_order(user_id, item_id)
        try:
            await asyncio.sleep(ORDER_SECONDS)
        finally:
            market.end_order(user_id)
        return JSONResponse({"ordered": item_id, "duplicate": duplicate}, 201)

    async def lookup(request: Request) -> JSONResponse:
        user_id, item_id = int(request.path_params["user_id"]), request.path_params["item_id"]
        n = market.ordered(user_id, item_id)
        if not n:
            return JSONResponse({"error": "no such order"}, 404)
        return JSONResponse({"ordered": item_id, "times": n})

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        producer = asyncio.get_running_loop().create_task(market.produce())
        try:
            yield
        finally:
            producer.cancel()

    return Starlette(
        routes=[
            Route("/search", search),
            Route("/orders", place, methods=["POST"]),
            Route("/orders/{user_id:int}/{item_id}", lookup),
        ],
        lifespan=lifespan,
    )


class Server:
    """The marketplace served on 127.0.0.1 at a free port, in a thread of this process."""

    def __init__(self, market: Market) -> None:
        self.market = market
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        config = uvicorn.Config(
            routes(market), log_level="warning", access_log=False, lifespan="on"
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._serve, name="marketplace", daemon=True)

    def _serve(self) -> None:
        asyncio.run(self._server.serve(sockets=[self._sock]))

    def start(self, timeout: float = 10.0) -> None:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the marketplace did not start on {self.url} in {timeout} s")
            time.sleep(0.02)

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(10)
        self._sock.close()
