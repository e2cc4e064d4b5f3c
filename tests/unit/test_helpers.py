"""The test suite's own waiting helpers: they return what they waited for, or fail clearly."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from tests.helpers import wait_for, wait_for_async, wait_for_event


def test_wait_for_returns_the_value_that_satisfied_it() -> None:
    counter = itertools.count()
    assert wait_for(lambda: next(counter), lambda n: n >= 3, message="count to 3") == 3


def test_wait_for_fails_with_the_message_and_the_last_value() -> None:
    with pytest.raises(AssertionError, match=r"the queue should drain .*last seen: 7"):
        wait_for(lambda: 7, lambda n: n == 0, message="the queue should drain", timeout=0.05)


async def test_wait_for_async_takes_plain_and_coroutine_functions() -> None:
    seen: list[int] = []

    async def grows() -> list[int]:
        seen.append(1)
        return seen

    assert len(await wait_for_async(grows, lambda s: len(s) >= 2, message="grow")) == 2
    assert await wait_for_async(lambda: "x", message="plain") == "x"
    with pytest.raises(AssertionError, match=r"never .*last seen: None"):
        await wait_for_async(lambda: None, message="never", timeout=0.05)


async def test_wait_for_event_fails_with_the_message() -> None:
    with pytest.raises(AssertionError, match="the gate should open"):
        await wait_for_event(asyncio.Event(), message="the gate should open", timeout=0.05)
