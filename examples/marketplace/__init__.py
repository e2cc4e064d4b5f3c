"""The marketplace monitor (`make demo`): users' saved searches run every few seconds against a
fake marketplace, and what they find is ordered at once, exactly once per user and item.

catalog.py   the world: keywords, monitors, what a match is
server.py    the fake marketplace (Starlette on loopback): listings, search (429 over 200/s), orders
tasks.py     the app and its tasks: monitor runs, shared searches, urgent fenced orders
ledger.py    the demo's records in Redis: the order ledger, the search cache and its gate
view.py      the live terminal view and the figures it reads from drumbeat and the marketplace
__main__.py  runs it all and checks the outcome (``python -m examples.marketplace --help``)
"""

from .tasks import app

__all__ = ["app"]
