"""Which Redis a process uses is never silent (issue 32, item 6): ``drumbeat worker`` and its
supervisor name their Redis in their first log line, a process no one watches warns when it
falls back to the embedded Redis, and ``DRUMBEAT_EMBEDDED=0`` makes a missing URL an error.

Against the session's redis-server, and embedded redis-servers of their own (`DRUMBEAT_HOME` in
a temporary directory, stopped afterwards).
"""

from __future__ import annotations

import logging
import os
import pty
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import drumbeat
from drumbeat.errors import ConfigurationError
from tests.helpers import wait_for
from tests.integration.test_embedded import _cleanup, _new_home

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.apps.fallback_app:app"
WARNING = "DRUMBEAT_REDIS_URL is not set"


@pytest.fixture
def home(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An embedded Redis home of the test's own, and no Redis URL in the environment."""
    path = _new_home("dbwhich-")
    monkeypatch.setenv("DRUMBEAT_HOME", str(path))
    monkeypatch.delenv("DRUMBEAT_REDIS_URL", raising=False)
    monkeypatch.delenv("DRUMBEAT_EMBEDDED", raising=False)
    try:
        yield path
    finally:
        _cleanup(path)


class _Worker:
    """``drumbeat worker`` in a subprocess not attached to a terminal (stdin from /dev/null,
    output to a pipe), its output lines gathered by a thread as they come."""

    def __init__(self, *args: str, **env: str) -> None:
        environ = {k: v for k, v in os.environ.items()
                   if k not in ("DRUMBEAT_REDIS_URL", "DRUMBEAT_EMBEDDED")}  # fmt: skip
        # Wide lines: rich would wrap a long URL or the warning over several.
        environ |= {"PYTHONUNBUFFERED": "1", "COLUMNS": "1000", **env}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "drumbeat", "worker", APP, "--concurrency", "1", *args],
            cwd=ROOT,
            env=environ,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self.lines.append(raw.decode(errors="replace").rstrip())

    def wait_for_line(self, text: str, count: int = 1) -> None:
        wait_for(lambda: sum(text in line for line in self.lines), lambda n: n >= count,
                 message=f"{count} line(s) with {text!r} in the worker's output",
                 timeout=30)  # fmt: skip

    def finish(self, *, stop: bool = True) -> tuple[int, list[str]]:
        """SIGTERM (unless it exits on its own), then the exit code and every line."""
        try:
            if stop and self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
            code = self.proc.wait(30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self._reader.join(10)
            assert self.proc.stdout is not None
            self.proc.stdout.close()
        return code, self.lines


def _with_password(redis_url: str) -> str:
    # The session server's default user has no password (nopass), so it takes any: the URL
    # logs in as it would in production, and the log must not show the password.
    return redis_url.replace("redis://", "redis://default:s3cret@", 1)


@pytest.mark.process
def test_worker_first_log_line_names_the_redis_given_with_the_password_masked(
    redis_url: str, namespace: str
) -> None:
    url = _with_password(redis_url)
    worker = _Worker(DRUMBEAT_REDIS_URL=url, DRUMBEAT_TEST_NAMESPACE=namespace)
    worker.wait_for_line("started: 1 slots")
    code, lines = worker.finish()
    assert code == 0, lines
    masked = url.replace("s3cret", "***")
    assert f"Redis: {masked}" in lines[0], lines
    assert "embedded" not in lines[0], lines
    assert not any("s3cret" in line for line in lines), lines
    assert not any(WARNING in line for line in lines), lines  # a URL given: nothing to warn


@pytest.mark.process
def test_worker_on_the_embedded_redis_says_so_first_and_warns_off_a_terminal(home: Path) -> None:
    worker = _Worker()
    worker.wait_for_line("started: 1 slots")
    code, lines = worker.finish()
    assert code == 0, lines
    sock = home / "redis.sock"
    first, second = lines[0], lines[1]
    assert "INFO" in first and f"Redis: the embedded Redis at unix://{sock}" in first, lines
    assert f"socket {sock}, data in {home}" in first, lines
    # The loud part: what happened, why it matters, and both ways out.
    assert "WARNING" in second and WARNING in second, lines
    assert "a private Redis on this machine only" in second, lines
    assert "set DRUMBEAT_REDIS_URL" in second and "DRUMBEAT_EMBEDDED=0" in second, lines
    assert sum(WARNING in line for line in lines) == 1, lines


@pytest.mark.process
def test_supervisor_and_its_workers_each_name_the_redis_first(
    redis_url: str, namespace: str
) -> None:
    url = _with_password(redis_url)
    supervisor = _Worker(
        "--processes", "1", DRUMBEAT_REDIS_URL=url, DRUMBEAT_TEST_NAMESPACE=namespace
    )
    supervisor.wait_for_line("started: 1 slots")
    code, lines = supervisor.finish()
    assert code == 0, lines
    named = f"Redis: {url.replace('s3cret', '***')}"
    assert named in lines[0], lines  # the supervisor's first line
    assert "supervising 1 worker processes" in lines[1], lines
    # Its worker's first line comes next from that process: the same Redis, named again.
    assert sum(named in line for line in lines) == 2, lines
    assert not any("s3cret" in line for line in lines), lines


@pytest.mark.process
def test_embedded_0_without_a_url_stops_the_worker_with_a_clear_error(home: Path) -> None:
    worker = _Worker(DRUMBEAT_EMBEDDED="0")
    code, lines = worker.finish(stop=False)
    output = "\n".join(lines)
    assert code == 1, output
    assert "Traceback" not in output
    assert "error:" in output and "DRUMBEAT_REDIS_URL is not set" in output, output
    assert "DRUMBEAT_EMBEDDED=0" in output, output
    assert not (home / "redis.sock").exists()  # no private Redis started


def test_embedded_0_makes_a_missing_url_a_configuration_error(
    home: Path, monkeypatch: pytest.MonkeyPatch, redis_url: str
) -> None:
    monkeypatch.setenv("DRUMBEAT_EMBEDDED", "0")
    app = drumbeat.App()
    assert app.settings.embedded is False
    with pytest.raises(ConfigurationError, match="DRUMBEAT_REDIS_URL is not set"):
        _ = app.url
    assert not (home / "redis.sock").exists()
    given = drumbeat.App(redis_url)  # a URL given: the setting has nothing to refuse
    try:
        assert given.redis.ping()
    finally:
        given.close()


def _fallback_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    caplog.clear()
    app = drumbeat.App()
    try:
        _ = app.url
    finally:
        app.close()
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_the_fallback_warns_off_a_terminal_and_not_on_one(
    home: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="drumbeat")
    with open(os.devnull) as devnull, monkeypatch.context() as patched:
        patched.setattr(sys, "stdin", devnull)
        (warned,) = _fallback_warnings(caplog)
    assert WARNING in warned and f"socket {home / 'redis.sock'}" in warned

    primary, secondary = pty.openpty()
    with open(secondary, "w") as terminal, monkeypatch.context() as patched:
        patched.setattr(sys, "stdin", terminal)
        patched.setattr(sys, "stderr", terminal)
        try:
            assert _fallback_warnings(caplog) == []
        finally:
            os.close(primary)
