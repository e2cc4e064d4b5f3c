"""Changes by id to the schedules of one shard: upsert, remove, pause, resume and run now, each
one script (slot_schedules, unslot_schedules, pause_slots, resume_slots, run_slots_now).

Scripts may only touch the keys they are passed, and an entry's slot is known only from
`where`, so each call reads `where` (and `paused`) first, passes the slot it names, and sends
again the ids whose entry moved meanwhile (a claim, a settle, the reaper): the script answers
-1 for those. A paused schedule's entry waits in `paused` (`where` says "p"); a schedule whose
run is queued as a job has none (`where` says "q"): a change waits in `pending` for its settle,
as for a run in flight.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import redis
import redis.asyncio as aredis

from drumbeat.keys import Keys
from drumbeat.protocol import FIELD_SEP, PAUSED_AT
from drumbeat.replies import parse_ints
from drumbeat.scripts import Call

#: A call by id is sent again at most this many times when what it read moved meanwhile.
_MOVED_RETRIES = 20

_T = TypeVar("_T")
#: An upsert: (id, priority, grid ms, due ms, task name, the queue its runs go to (empty: the
#: default one), spec).
UpsertItem = tuple[str, int, int, int, str, str, bytes]
#: Builds a call by id for some items from what `SlotChanges._reads` read.
_Make = Callable[[Sequence[_T], Sequence[Any]], Call[list[int]]]


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _bytes(value: bytes | str) -> bytes:
    return value.encode() if isinstance(value, str) else value


class SlotChanges:
    """The changes by id of one shard's schedules kept as time slots."""

    def __init__(self, keys: Keys) -> None:
        self.k = keys

    def _reads(self, pipe: Any, ids: Sequence[str]) -> None:
        """Queues the reads a call by id needs first: `where` and `paused` of each id."""
        pipe.hmget(self.k.where, list(ids))
        pipe.hmget(self.k.paused, list(ids))

    def _at(self, read: Sequence[Any]) -> tuple[list[str], list[str]]:
        """What `_reads` read of `where`, as the scripts take it: per id its text
        (empty: none), and the key of the slot it names (`slots`, never read, when it names
        none: a paused schedule, or none at all)."""
        k, texts, keys = self.k, [], []
        for old in read[0]:
            was = _text(old) if old is not None else ""
            texts.append(was)
            keys.append(k.slot(int(was)) if was.isdigit() else k.slots)
        return texts, keys

    def _upsert_call(self, items: Sequence[UpsertItem], read: Sequence[Any]) -> Call[list[int]]:
        """`slot_schedules` of ``items`` given what `_reads` read."""
        k = self.k
        texts, at_keys = self._at(read)
        keys = [k.slots, k.where, k.pending, k.tasks, k.wake, k.stalled, k.paused, k.queues]
        args: list[str | bytes | int] = [len(items)]
        for (sid, priority, grid, due, task, queue, spec), was, at in zip(
            items, texts, at_keys, strict=True
        ):
            keys += [at, k.slot(due)]
            args += [sid, was, priority, grid, due, task, queue, spec]
        return Call("slot_schedules", keys, args, parse_ints)

    def _by_where(
        self, script: str, keys: list[str], args: list[str | int], ids: Sequence[str],
        read: Sequence[Any],
    ) -> Call[list[int]]:  # fmt: skip
        """``script`` of ``ids`` whose ARGV ends with pairs (id, what `where` gave) and whose
        KEYS with the slot `where` named of each."""
        texts, at_keys = self._at(read)
        args += [len(ids)]
        for sid, was in zip(ids, texts, strict=True):
            args += [sid, was]
        return Call(script, keys + at_keys, args, parse_ints)

    def _remove_call(self, ids: Sequence[str], read: Sequence[Any]) -> Call[list[int]]:
        """`unslot_schedules` of ``ids`` given what `_reads` read."""
        k = self.k
        keys = [k.slots, k.where, k.pending, k.faults, k.stalled, k.paused]
        return self._by_where("unslot_schedules", keys, [], ids, read)

    def _pause_call(self, ids: Sequence[str], read: Sequence[Any]) -> Call[list[int]]:
        """`pause_slots` of ``ids`` given what `_reads` read."""
        k = self.k
        keys = [k.slots, k.where, k.pending, k.paused, k.stalled]
        return self._by_where("pause_slots", keys, [], ids, read)

    def _run_now_call(self, now_ms: int) -> _Make[str]:
        """`run_slots_now` of ids, into the slot of ``now_ms``, given what `_reads` read."""
        k = self.k

        def make(ids: Sequence[str], read: Sequence[Any]) -> Call[list[int]]:
            keys = [k.slots, k.where, k.pending, k.paused, k.stalled, k.wake, k.slot(now_ms)]
            return self._by_where("run_slots_now", keys, [now_ms], ids, read)

        return make

    def _resume_call(self, resumed: Callable[[str, bytes], tuple[int, int, int]]) -> _Make[str]:
        """`resume_slots` of ids given what `_reads` read; ``resumed`` gives the (generation,
        next grid ms, next due ms) of a paused schedule from its record."""
        k = self.k

        def make(ids: Sequence[str], read: Sequence[Any]) -> Call[list[int]]:
            texts, _ = self._at(read)
            keys = [k.slots, k.where, k.pending, k.paused, k.wake]
            args: list[str | int] = [len(ids)]
            for sid, was, entry in zip(ids, texts, read[1], strict=True):
                if was == PAUSED_AT and entry is not None:
                    record = _bytes(entry).partition(FIELD_SEP.encode())[2]
                    gen, grid, due = resumed(sid, record)
                    keys.append(k.slot(due))
                    args += [sid, was, gen, grid, due]
                else:  # not paused, or a pause waiting for its run: nothing to compute
                    keys.append(k.slots)
                    args += [sid, was, "", "", ""]
            return Call("resume_slots", keys, args, parse_ints)

        return make

    def upsert(self, client: redis.Redis, items: Sequence[UpsertItem]) -> list[int]:
        """Items are `UpsertItem`; one 1 created, 2
        updated, 0 unchanged each (see slot_schedules.lua: a schedule whose run is in flight
        is answered 2, as its run's settle compares and applies its definition)."""
        return self._by_id(client, [i[0] for i in items], self._upsert_call, items)

    async def aupsert(self, client: aredis.Redis, items: Sequence[UpsertItem]) -> list[int]:
        """`upsert` for async callers."""
        return await self._aby_id(client, [i[0] for i in items], self._upsert_call, items)

    def remove(self, client: redis.Redis, ids: Sequence[str]) -> int:
        """Removes schedules by id; returns how many there were."""
        return self._by_id(client, ids, self._remove_call, ids).count(1)

    async def aremove(self, client: aredis.Redis, ids: Sequence[str]) -> int:
        """`remove` for async callers."""
        return (await self._aby_id(client, ids, self._remove_call, ids)).count(1)

    def pause(self, client: redis.Redis, ids: Sequence[str]) -> int:
        """Pauses schedules by id (see pause_slots.lua); returns how many it paused."""
        return self._by_id(client, ids, self._pause_call, ids).count(1)

    async def apause(self, client: aredis.Redis, ids: Sequence[str]) -> int:
        """`pause` for async callers."""
        return (await self._aby_id(client, ids, self._pause_call, ids)).count(1)

    def resume(
        self,
        client: redis.Redis,
        ids: Sequence[str],
        resumed: Callable[[str, bytes], tuple[int, int, int]],
    ) -> int:
        """Resumes paused schedules by id (see resume_slots.lua and `_resume_call`); returns
        how many it resumed."""
        return self._by_id(client, ids, self._resume_call(resumed), ids).count(1)

    async def aresume(
        self,
        client: aredis.Redis,
        ids: Sequence[str],
        resumed: Callable[[str, bytes], tuple[int, int, int]],
    ) -> int:
        """`resume` for async callers."""
        return (await self._aby_id(client, ids, self._resume_call(resumed), ids)).count(1)

    def run_now(self, client: redis.Redis, ids: Sequence[str], now_ms: int) -> int:
        """Runs schedules once now, into the slot of ``now_ms`` (see run_slots_now.lua);
        returns how many it queued."""
        return self._by_id(client, ids, self._run_now_call(now_ms), ids).count(1)

    async def arun_now(self, client: aredis.Redis, ids: Sequence[str], now_ms: int) -> int:
        """`run_now` for async callers."""
        return (await self._aby_id(client, ids, self._run_now_call(now_ms), ids)).count(1)

    def _by_id(
        self, client: redis.Redis, ids: Sequence[str], make: _Make[_T], items: Sequence[_T]
    ) -> list[int]:
        """Runs ``make``'s call for ``items`` (of ``ids``) after reading where they are, and
        again for those that moved meanwhile (-1); one code per item."""
        out, todo = [-1] * len(items), list(range(len(items)))
        for _ in range(_MOVED_RETRIES):
            pipe = client.pipeline(transaction=False)
            self._reads(pipe, [ids[i] for i in todo])
            call = make([items[i] for i in todo], pipe.execute())
            todo = _settle_codes(out, todo, call.run(client))
            if not todo:
                return out
        raise RuntimeError(f"schedules kept moving while being changed: {len(todo)} left")

    async def _aby_id(
        self, client: aredis.Redis, ids: Sequence[str], make: _Make[_T], items: Sequence[_T]
    ) -> list[int]:
        """`_by_id` for async callers."""
        out, todo = [-1] * len(items), list(range(len(items)))
        for _ in range(_MOVED_RETRIES):
            async with client.pipeline(transaction=False) as pipe:
                self._reads(pipe, [ids[i] for i in todo])
                read = await pipe.execute()
            call = make([items[i] for i in todo], read)
            todo = _settle_codes(out, todo, await call.arun(client))
            if not todo:
                return out
        raise RuntimeError(f"schedules kept moving while being changed: {len(todo)} left")


def _settle_codes(out: list[int], todo: list[int], got: list[int]) -> list[int]:
    """Writes the codes of the items ``todo`` into ``out``; returns those that moved (-1)."""
    for i, code in zip(todo, got, strict=True):
        out[i] = code
    return [i for i in todo if out[i] == -1]
