"""What a benchmark scenario needs from a queue system (`System`), and the worker subprocess
protocol every system's worker speaks, so scenarios stay the same from one system to the next.

A worker subprocess writes JSON lines to stdout: ``{"event": "started", ...}`` just before it
starts claiming, and ``{"event": "report", ...}`` after a SIGTERM made it stop. It counts the jobs
it ran in-process (no Redis round trips per job) and reports them only at the end.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol


class ScenarioFailed(RuntimeError):
    """The system under test misbehaved (jobs lost, worker crashed or hung); the run goes on."""


@dataclass(slots=True)
class WorkerReport:
    started_at: float
    """Wall-clock time (``time.time()``) at which the worker started claiming."""
    count: int
    """Jobs the worker's tasks ran, counted in-process."""
    latencies: list[float]
    """Seconds from enqueue to start, one per stamped job."""
    peak_rss_kb: int
    """``VmHWM`` of the worker process, read by itself just before it exits."""
    cpu_s: float
    """CPU time (user + system) the worker used from starting to claim until it stopped."""
    extra: dict[str, Any] = field(default_factory=dict)
    stderr: str = ""


class System(Protocol):
    """A queue system under test, on the Redis it was given. One module per system."""

    name: str

    def version(self) -> str: ...

    def reset(self) -> None:
        """Start over with an empty queue; the previous one's data may be dropped."""

    def enqueue_one(self, i: int) -> None:
        """Enqueue one no-op job, in its own round trip."""

    def enqueue_bulk(self, n: int) -> None:
        """Enqueue ``n`` no-op jobs the fastest way the system offers."""

    def enqueue_stamped(self, sent_at: float) -> None:
        """Enqueue one job that records ``time.time() - sent_at`` when it starts."""

    def outstanding(self) -> int:
        """Jobs enqueued and not yet acknowledged (queued, scheduled or running)."""

    def server_cpu_seconds(self) -> float | None:
        """CPU seconds the broker has used so far, if it can tell."""

    def server_commands(self) -> int | None:
        """Commands the broker has processed so far (inside scripts too), if it can tell."""

    def server_memory(self) -> int | None:
        """Bytes of memory the broker's data set uses now, if it can tell."""

    def start_worker(self, concurrency: int) -> WorkerProcess:
        """One worker process running the no-op and stamped tasks, already claiming."""

    def close(self) -> None: ...


# -- parent side ---------------------------------------------------------------------------------


class WorkerProcess:
    """A worker subprocess speaking the protocol above; constructed once it has started."""

    def __init__(
        self, argv: Sequence[str], env: Mapping[str, str] | None = None, start_timeout: float = 60
    ) -> None:
        self.argv = list(argv)
        # A file, not a pipe: a chatty worker must never block on a full pipe. Closed by `_reap`.
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115
        self._stderr_text: str | None = None
        self.proc = subprocess.Popen(
            self.argv, stdout=subprocess.PIPE, stderr=self._stderr, env=env, text=True
        )
        started = self._read_event(start_timeout)
        if started.get("event") != "started":
            self.kill()
            raise ScenarioFailed(f"worker did not start: {started!r}\n{self.stderr_tail()}")
        self.pid = int(started["pid"])
        self.started_at = float(started["t"])

    def _read_event(self, timeout: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return {"event": "timeout"}
            ready, _, _ = select.select([self.proc.stdout], [], [], min(left, 0.5))
            if ready:
                line = self.proc.stdout.readline()
                if not line:
                    return {"event": "exited", "returncode": self.proc.wait()}
                return dict(json.loads(line))

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = 60) -> WorkerReport:
        """SIGTERM (graceful stop), then the worker's report."""
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
        try:
            out, _ = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise ScenarioFailed(
                f"worker {self.proc.pid} did not exit within {timeout} s of SIGTERM "
                f"(killed)\n{self.stderr_tail()}"
            ) from None
        self._reap()
        reports = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        reports = [r for r in reports if r.get("event") == "report"]
        if not reports:
            raise ScenarioFailed(
                f"worker {self.proc.pid} exited with {self.proc.returncode} without a report\n"
                f"{self.stderr_tail()}"
            )
        r = reports[-1]
        return WorkerReport(
            started_at=self.started_at,
            count=int(r["count"]),
            latencies=[float(x) for x in r.get("latencies", [])],
            peak_rss_kb=int(r["peak_rss_kb"]),
            cpu_s=float(r["cpu_s"]),
            extra=dict(r.get("extra", {})),
            stderr=self.stderr_text(),
        )

    def kill(self) -> None:
        if self.alive():
            self.proc.kill()
            self.proc.wait()
        self._reap()

    def _reap(self) -> None:
        """Keep what the exited worker wrote to stderr, and close the file."""
        if self._stderr_text is None:
            self._stderr_text = self.stderr_text()
            self._stderr.close()

    def stderr_text(self) -> str:
        if self._stderr_text is not None:
            return self._stderr_text
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace")

    def stderr_tail(self, lines: int = 20) -> str:
        tail = self.stderr_text().splitlines()[-lines:]
        return "worker stderr:\n" + "\n".join(tail) if tail else "(worker stderr empty)"


# -- worker side ---------------------------------------------------------------------------------


def peak_rss_kb() -> int:
    """This process's peak resident set size (``VmHWM``), in KiB; 0 where /proc is missing."""
    try:
        with open(f"/proc/{os.getpid()}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def emit(event: str, **fields: Any) -> None:
    """Write one protocol line to stdout."""
    sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()


def cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system
