"""Where ``schedule_store="slots"`` keeps each schedule: plain ones as time slots, limited ones
and those routed to another queue in the wheel (the time slots cannot keep them yet; the worker
claims from both). An upsert sends each schedule to its store, and a schedule the other store
keeps (its kind changed, or the wheel kept it from before the setting) leaves that store first.
The changes by id (`App.pause` and the others) go to both stores, and the reads read both
(`slot_reads`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .scheduler import Schedule, adrive, drive

if TYPE_CHECKING:
    from .app import App


def upsert(app: App, items: list[Schedule]) -> list[int]:
    """`schedule_many` with schedule_store "slots": plain schedules into the time slots,
    limited and routed ones into the wheel (the time slots cannot keep them yet). A
    schedule the other store keeps leaves it first (answered 2, updated): re-registering
    the wheel's schedules moves them."""
    s, now = app.scheduler, app._now_ms()
    split = s.slot_split(items, now)
    plain = [x.id for x, p in zip(items, split.places, strict=True) if p is not None]
    wheel = s.read(app.redis, plain) if plain else {}
    queues = app.known_queues() if wheel or split.kept else []  # read once, when needed
    if wheel:
        app._run(s.unschedules(list(wheel), queues))
    codes = s.slot_upsert(app.redis, split)
    kept = [items[i] for i in split.kept]
    held: set[str] = set()
    if kept:
        ids = [x.id for x in kept]
        flags = next(drive(app.redis, s.slot_held(ids)))
        held = {i for i, f in zip(ids, flags, strict=True) if f}
        if held:
            s.slot_each(held, lambda c, chunk: c.remove(app.redis, chunk))
        upserts = s.upserts(kept, now, queues)
        if upserts.moves:
            app._run(upserts.moves)
        for i, code in zip(split.kept, upserts.in_order(app._run(upserts.calls)), strict=True):
            codes[i] = code
    moved = wheel.keys() | held
    return [2 if x.id in moved else c or 0 for x, c in zip(items, codes, strict=True)]


async def aupsert(app: App, items: list[Schedule]) -> list[int]:
    """`upsert` for async callers."""
    s, client, now = app.scheduler, await app.aredis(), await app._anow_ms()
    split = s.slot_split(items, now)
    plain = [x.id for x, p in zip(items, split.places, strict=True) if p is not None]
    wheel = await s.aread(client, plain) if plain else {}
    queues = await app.aknown_queues() if wheel or split.kept else []  # read once, when needed
    if wheel:
        await app._arun(s.unschedules(list(wheel), queues))
    codes = await s.aslot_upsert(client, split)
    kept = [items[i] for i in split.kept]
    held: set[str] = set()
    if kept:
        ids = [x.id for x in kept]
        (flags,) = await adrive(client, s.slot_held(ids))
        held = {i for i, f in zip(ids, flags, strict=True) if f}
        if held:
            await s.aslot_each(held, lambda c, chunk: c.aremove(client, chunk))
        upserts = s.upserts(kept, now, queues)
        if upserts.moves:
            await app._arun(upserts.moves)
        done = upserts.in_order(await app._arun(upserts.calls))
        for i, code in zip(split.kept, done, strict=True):
            codes[i] = code
    moved = wheel.keys() | held
    return [2 if x.id in moved else c or 0 for x, c in zip(items, codes, strict=True)]
