"""Peers of the periodic-scheduling scenario (`bench.periodic`): one module per system, each with
a `SPEC` (`_common.PeerSpec`, plain data, importable without the system installed) and a
``main()`` that runs one of its processes (`python -m bench.periodic_peers.<module> ROLE ...`).
"""

from __future__ import annotations

import importlib

from ._common import PeerSpec

MODULES: dict[str, str] = {
    "drumbeat": "drumbeat",
    "naive": "naive",
    "celery-beat": "celery_beat",
    "redbeat": "redbeat",
    "rq-scheduler": "rq_scheduler",
    "rq-cron": "rq_cron",
    "arq": "arq",
    "saq": "saq",
    "streaq": "streaq",
    "taskiq": "taskiq",
    "apscheduler": "apscheduler",
}
"""``--systems`` names, in report order, to module names."""


def spec(system: str) -> PeerSpec:
    module = importlib.import_module(f"{__name__}.{MODULES[system]}")
    found = module.SPEC
    assert isinstance(found, PeerSpec)
    return found
