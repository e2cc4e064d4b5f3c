"""The rate-limited task of bench/limits_peers.py for Dramatiq, Huey and Celery, each at its
documented way of limiting: Dramatiq's `WindowRateLimiter` (a message over the limit raises
`RateLimitExceeded`, which the Retries middleware retries after a backoff), Huey's
`rate_limit` (a fixed window; a task over it is retried when the window resets), Celery's task
`rate_limit` (a token bucket per worker node, not shared: each of the 2 workers allows the
rate). Starts are logged to a second Redis (BENCH_LOG_URL), so the broker's command counts are
the peer's own. Import with BENCH_PEER set to "dramatiq", "huey" or "celery"."""

from __future__ import annotations

import os
import time

import redis

BROKER_URL = os.environ["BENCH_BROKER_URL"]
RATE = int(os.environ.get("BENCH_RATE", "500"))
_log = redis.Redis.from_url(os.environ["BENCH_LOG_URL"])


def _started() -> None:
    _log.rpush("starts", repr(time.time()))


if os.environ.get("BENCH_PEER") == "dramatiq":
    import dramatiq
    from dramatiq.brokers.redis import RedisBroker
    from dramatiq.rate_limits import WindowRateLimiter
    from dramatiq.rate_limits.backends import RedisBackend

    broker = RedisBroker(url=BROKER_URL)
    dramatiq.set_broker(broker)
    limiter = WindowRateLimiter(RedisBackend(url=BROKER_URL), "hit", limit=RATE, window=1)

    @dramatiq.actor(max_retries=1_000_000, min_backoff=100, max_backoff=1000)
    def hit(i: int) -> None:
        with limiter.acquire():
            _started()


if os.environ.get("BENCH_PEER") == "huey":
    from huey import RedisHuey

    huey = RedisHuey("bench", url=BROKER_URL)
    limit = huey.rate_limit("hit", RATE, 1)

    @huey.task()
    def hit(i: int) -> None:
        with limit:
            _started()


if os.environ.get("BENCH_PEER") == "celery":
    from celery import Celery

    celery_app = Celery("bench", broker=BROKER_URL)  # its defaults, as its users run it

    @celery_app.task(rate_limit=f"{RATE}/s")
    def hit(i: int) -> None:
        _started()
