"""A supervisor with worker processes and a CLI command on a URL of any scheme, for the
Sentinel and TLS tests: the URL must reach each child through ``DRUMBEAT_REDIS_URL``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import drumbeat

ROOT = Path(__file__).resolve().parent.parent
APP = "tests.apps.ha_app:app"


def check_processes_on(url: str) -> None:
    """Two worker processes under a supervisor run jobs, `drumbeat status` reads the queue, and
    SIGTERM stops them cleanly."""
    namespace = "p" + uuid.uuid4().hex[:12]
    env = {**os.environ, "DRUMBEAT_REDIS_URL": url, "DRUMBEAT_NAMESPACE": namespace,
           "PYTHONPATH": str(ROOT)}  # fmt: skip
    sup = subprocess.Popen(
        [sys.executable, "-m", "drumbeat", "worker", APP, "--processes", "2",
         "--concurrency", "2"], cwd=ROOT, env=env,
    )  # fmt: skip
    app = drumbeat.App(url, namespace=namespace)
    try:
        jobs = [app.enqueue("pid") for _ in range(20)]
        pids = {job.result(timeout=30) for job in jobs}
        assert sup.pid not in pids and pids, f"worker processes ran the jobs: {pids}"
        status = subprocess.run(
            [sys.executable, "-m", "drumbeat", "status", APP], cwd=ROOT, env=env,
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert status.returncode == 0, status.stdout + status.stderr
        assert "ready" in status.stdout, status.stdout
        sup.send_signal(signal.SIGTERM)
        assert sup.wait(30) == 0
    finally:
        app.close()
        if sup.poll() is None:
            sup.kill()
            sup.wait(10)
