"""Schedules: the public models (`Schedule`, `ScheduleInfo`) and the store they live in
(`ScheduleStore`, which `App` composes as ``app.scheduler``).

- ``models.py``: the public models and the decoding of a stored record.
- ``store.py``: where each schedule lives (shards), and the schedule API's writes and reads.
- ``methods.py``: the schedule methods of `App` (which inherits them), handing to the store.
- ``slots.py``: the time slots: entries, claims and settles (the worker's lane runs them).
- ``changes.py``: the changes by id (upsert, remove, pause, resume, run now), one script each.
- ``reads.py``: lookups and listings, as plans (``plans.py``) for the sync and async clients.
- ``upgrade.py``: the move of an older version's timing wheel into the time slots.
"""

from .models import Schedule, ScheduleInfo
from .store import ScheduleStore

__all__ = ["Schedule", "ScheduleInfo", "ScheduleStore"]
