"""`tune_gc` in the test's own process, its settings restored after."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from drumbeat.worker.main import tune_gc


@pytest.fixture
def restored_gc() -> Iterator[None]:
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


@pytest.mark.usefixtures("restored_gc")
def test_a_higher_threshold_the_app_set_is_kept() -> None:
    gc.set_threshold(50_000, 20, 30)
    tune_gc()
    assert gc.get_threshold() == (50_000, 20, 30)


@pytest.mark.usefixtures("restored_gc")
def test_the_default_threshold_is_raised_and_the_older_generations_kept() -> None:
    gc.set_threshold(700, 20, 30)
    tune_gc()
    assert gc.get_threshold() == (10_000, 20, 30)
    assert gc.get_freeze_count() > 0
