"""A tiny app, as a user of drumbeat would write it: `create_app` makes it on any Redis."""

from __future__ import annotations

from typing import Any

import drumbeat

ORDERS: dict[int, str] = {}


def create_app(**settings: Any) -> drumbeat.App:
    """The shop's App (``settings`` go to `drumbeat.App`: its URL, namespace, ...)."""
    app = drumbeat.App(**settings)

    @app.task(name="shop.charge", retries=1, backoff=0.2)
    def charge(order: int, amount: int) -> str:
        # The payment provider fails the first try of every order (a retry must follow).
        if drumbeat.current_job().attempt == 1:
            raise ConnectionError("provider unavailable")
        return f"charged {amount}"

    @app.task(name="shop.ship")
    async def ship(order: int) -> str:
        ORDERS[order] = "shipped"
        return "shipped"

    return app
