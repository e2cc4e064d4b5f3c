"""``drumbeat queues pause | resume | ls`` in a subprocess, and the paused state in ``drumbeat
status``, against the session's redis-server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import drumbeat
from tests.integration.test_cli import APP, row

ROOT = Path(__file__).resolve().parents[2]


def drumbeat_cli(redis_url: str, namespace: str, *args: str) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "DRUMBEAT_REDIS_URL": redis_url,
               "DRUMBEAT_TEST_NAMESPACE": namespace, "COLUMNS": "200"}  # fmt: skip
    return subprocess.run(
        [sys.executable, "-m", "drumbeat", *args], cwd=ROOT, env=environ, capture_output=True,
        text=True, timeout=60, check=False,
    )  # fmt: skip


def test_pause_resume_and_ls(redis_url: str, namespace: str) -> None:
    app = drumbeat.App(redis_url, namespace=namespace)
    try:
        app.enqueue("add", 1, 2)
        app.enqueue("urgent")

        done = drumbeat_cli(redis_url, namespace, "queues", "pause", APP, "default")
        assert (done.returncode, done.stdout.strip()) == (0, "paused queue default"), done
        assert app.paused_queues() == ["default"]
        again = drumbeat_cli(redis_url, namespace, "queues", "pause", APP, "default")
        assert "paused already" in again.stdout, again
        other = drumbeat_cli(redis_url, namespace, "queues", "pause", APP, "builds")
        assert other.returncode == 0, other
        assert app.paused_queues() == ["default", "builds"]

        listed = drumbeat_cli(redis_url, namespace, "queues", "ls", APP)
        assert listed.returncode == 0, listed
        # A paused queue no job was sent to is listed too.
        assert row(listed.stdout, "default") == ["default", "2", "0: 2", "0", "0", "paused"]
        assert row(listed.stdout, "builds") == ["builds", "0", "-", "0", "0", "paused"]
        doc = json.loads(drumbeat_cli(redis_url, namespace, "queues", "ls", APP, "--json").stdout)
        assert [(q["name"], q["paused"], q["ready"]) for q in doc["queues"]] == [
            ("default", True, 2), ("builds", True, 0),
        ]  # fmt: skip
        status = json.loads(drumbeat_cli(redis_url, namespace, "status", APP, "--json").stdout)
        assert [q["paused"] for q in status["queues"]] == [True, True]

        done = drumbeat_cli(redis_url, namespace, "queues", "resume", APP, "default")
        assert (done.returncode, done.stdout.strip()) == (0, "resumed queue default"), done
        again = drumbeat_cli(redis_url, namespace, "queues", "resume", APP, "default")
        assert "was not paused" in again.stdout, again
        assert app.paused_queues() == ["builds"]
        listed = drumbeat_cli(redis_url, namespace, "queues", "ls", APP)
        assert row(listed.stdout, "default")[-1] == "active"

        bad = drumbeat_cli(redis_url, namespace, "queues", "pause", APP, "a b")
        assert bad.returncode == 1, bad
        assert "queue name 'a b'" in bad.stdout + bad.stderr
        assert "Traceback" not in bad.stdout + bad.stderr
    finally:
        app.close()
