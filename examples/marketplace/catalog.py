"""What the demo's world is made of, shared by the marketplace, the tasks and the checks: the
keywords, the users' monitors, and what counts as a match."""

from __future__ import annotations

import random
from dataclasses import dataclass

#: Every listing and every monitor names one of these.
KEYWORDS: tuple[str, ...] = (
    "switch", "ps5", "kindle", "airpods", "ipad", "gameboy", "walkman", "leica", "fujifilm",
    "thinkpad", "macbook", "ricoh", "pentax", "rolex", "seiko", "casio", "lego", "gundam",
    "pokemon", "yugioh", "vinyl", "turntable", "synth", "ukulele", "guitar", "bicycle",
    "helmet", "tent", "stove", "kettle", "ramen", "matcha", "kimono", "yukata", "sneakers",
    "jacket", "backpack", "watch", "lens", "drone",
)  # fmt: skip

#: Listing prices (yen) are uniform in this range; monitors' maxima in the one below.
LISTING_PRICES = (500, 30_000)
MONITOR_PRICES = (1_000, 12_000)
#: What a search asks for: every monitor's maximum is at most this.
SEARCH_CEILING = MONITOR_PRICES[1]

#: Seconds between two runs of one monitor.
EVERY = 5.0
#: A search of a keyword is reused for this long: searches of one keyword start at least FRESH
#: seconds apart (by the Redis clock), so the marketplace sees at most about len(KEYWORDS) /
#: FRESH = 40 searches a second whatever the number of monitors (a request delayed on its way
#: can put a second search of a keyword in one 1-s window: 80 at worst, under the 200/s budget).
#: A monitor runs every 5 s, so a result up to a second old is fresh enough for it.
FRESH = 1.0


@dataclass(frozen=True, slots=True)
class Monitor:
    """One user's saved search: order anything listed under ``keyword`` at ``max_price`` or less."""

    user_id: int
    keyword: str
    max_price: int

    @property
    def id(self) -> str:
        return f"monitor:u{self.user_id}:{self.keyword}"


@dataclass(frozen=True, slots=True)
class Listing:
    id: str
    keyword: str
    price: int
    listed_ms: int


def monitors(n: int, seed: int = 7) -> list[Monitor]:
    """``n`` monitors of about ``n / 2`` users (a user watches one to a few keywords, never the
    same one twice), the same ones for the same ``n`` and ``seed``."""
    rng = random.Random(seed)
    users = max(1, n // 2)
    taken: set[tuple[int, str]] = set()
    out: list[Monitor] = []
    while len(out) < n:
        user = len(out) + 1 if len(out) < users else rng.randint(1, users)
        keyword = rng.choice(KEYWORDS)
        if (user, keyword) in taken:
            continue
        taken.add((user, keyword))
        out.append(Monitor(user, keyword, rng.randrange(*MONITOR_PRICES, 100)))
    return out


def matches(monitor: Monitor, listing: Listing) -> bool:
    """A match: the listing's keyword is the monitor's, at the monitor's maximum or less."""
    return listing.keyword == monitor.keyword and listing.price <= monitor.max_price


def expected_orders(all_monitors: list[Monitor], listings: list[Listing]) -> set[tuple[int, str]]:
    """Every (user, item) that must be ordered exactly once: each listing matched by any of
    the user's monitors (an item two of a user's monitors match is still one order)."""
    by_keyword: dict[str, list[Monitor]] = {}
    for m in all_monitors:
        by_keyword.setdefault(m.keyword, []).append(m)
    return {
        (m.user_id, item.id)
        for item in listings
        for m in by_keyword.get(item.keyword, ())
        if matches(m, item)
    }
