"""A private redis-server for one benchmark run: free port, temp dir, no persistence."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

import redis

_START_TIMEOUT = 10.0


def find_server_binary() -> str:
    """``$DRUMBEAT_REDIS_SERVER``, else ``redis-server`` on PATH, else drumbeat's embedded one."""
    explicit = os.environ.get("DRUMBEAT_REDIS_SERVER")
    if explicit:
        found = shutil.which(explicit)
        if found is None:
            raise RuntimeError(f"DRUMBEAT_REDIS_SERVER={explicit!r} is not an executable")
        return found
    on_path = shutil.which("redis-server")
    if on_path:
        return on_path
    try:
        from drumbeat import embedded
    except ImportError:
        embedded = None  # type: ignore[assignment]
    if embedded is not None and hasattr(embedded, "find_binary"):
        return str(embedded.find_binary())
    raise RuntimeError("no redis-server found: set DRUMBEAT_REDIS_SERVER or put one on PATH")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """``with RedisServer() as server: ... server.url``; stopped and its dir removed on exit."""

    def __init__(self, binary: str | None = None) -> None:
        self.binary = binary or find_server_binary()
        self.dir = Path(tempfile.mkdtemp(prefix="drumbeat-bench-"))
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        for _attempt in range(3):  # another process may take the free port before we bind it
            self.port = _free_port()
            self.proc = subprocess.Popen(
                [self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
                 "--dir", str(self.dir), "--save", "", "--appendonly", "no",
                 "--maxmemory-policy", "noeviction"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            if self._wait_ready():
                return
            self._kill()
        raise RuntimeError(f"{self.binary} did not start (dir {self.dir})")

    def _wait_ready(self) -> bool:
        assert self.proc is not None
        client = redis.Redis.from_url(self.url, socket_connect_timeout=1)
        deadline = time.monotonic() + _START_TIMEOUT
        try:
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    client.ping()
                    return True
                except redis.ConnectionError:
                    time.sleep(0.02)
            return False
        finally:
            client.close()

    def _kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def stop(self) -> None:
        self._kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url, socket_connect_timeout=5)

    def info(self) -> dict[str, str]:
        with self.client() as c:
            server = c.info("server")
        return {"version": str(server["redis_version"]), "binary": self.binary}

    def __enter__(self) -> RedisServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
