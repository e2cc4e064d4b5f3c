"""drumbeat's pytest plugin on its own: a small app's tests (tests/plugin/sample) run by a
pytest of their own in a directory of their own, with no conftest of this project's, against
the plugin's private redis-server."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

SAMPLE = Path(__file__).parent / "sample"


def test_the_plugin_alone_tests_a_small_app_end_to_end(tmp_path: Path) -> None:
    shutil.copy(SAMPLE / "shop.py", tmp_path / "shop.py")
    shutil.copy(SAMPLE / "check_shop.py", tmp_path / "test_shop.py")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DRUMBEAT_", "PYTEST_"))}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:asyncio",
         "--rootdir", str(tmp_path),
         "-W", "error", "-q", "test_shop.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "4 passed" in proc.stdout, proc.stdout
