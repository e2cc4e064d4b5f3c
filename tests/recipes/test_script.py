"""examples/recipes/script.py: a plain script enqueues a job and waits for its result, which a
``drumbeat worker`` process runs."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def worker(recipe_env: dict[str, str]) -> Iterator[subprocess.Popen[bytes]]:
    argv = [sys.executable, "-m", "drumbeat", "worker", "examples.recipes.script:app"]
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    yield proc
    proc.terminate()
    assert proc.wait(30) == 0


@pytest.mark.process
def test_the_script_prints_the_result_a_worker_computed(
    worker: subprocess.Popen[bytes],
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "examples.recipes.script", "6", "7"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert (done.returncode, done.stdout, done.stderr) == (0, "6 x 7 = 42\n", "")
