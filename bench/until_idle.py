"""What one `drumbeat.testing.run_until_idle` call costs apart from the work it runs: a worker's
start (server check, registration by the heartbeat's first beat), the idle check, and its stop
(hand-back, deregistration), timed over many calls with one no-op job each, and with nothing
queued.

    python -m bench.until_idle [--calls 50] [--repeat 3]

Starts a private redis-server. Prints the command, the CPU and the load average, then for each
repetition the median, least and most ms a call took. Compare two trees by running it with
``PYTHONPATH=<tree>/src``, alternated (bench/README.md, issue 32).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from collections.abc import Sequence

import drumbeat
from drumbeat.testing import run_until_idle

from ._redis import RedisServer
from .machine import cpu_model


async def noop() -> None:
    """The job: nothing, so a call's time is what it costs apart from its jobs."""


def _calls(app: drumbeat.App, calls: int, queued: bool) -> list[float]:
    """Seconds each of ``calls`` calls took, one no-op job queued before each if ``queued``."""
    took: list[float] = []
    for _ in range(calls):
        if queued:
            app.enqueue("noop")
        started = time.perf_counter()
        ran = run_until_idle(app)
        took.append(time.perf_counter() - started)
        if ran != int(queued):
            raise RuntimeError(f"run_until_idle ran {ran} jobs, expected {int(queued)}")
    return took


def _line(what: str, took: list[float]) -> str:
    ms = sorted(t * 1000 for t in took)
    return (f"  {what:<14} median {statistics.median(ms):6.1f} ms   least {ms[0]:6.1f}   "
            f"most {ms[-1]:6.1f}")  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.until_idle", description=__doc__)
    parser.add_argument("--calls", type=int, default=50, help="calls per repetition")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    print("$ python -m bench.until_idle " + " ".join(sys.argv[1:] if argv is None else argv))
    print(f"drumbeat from {os.path.dirname(drumbeat.__file__)}; CPU {cpu_model()}, "
          f"{os.cpu_count()} cores; load {os.getloadavg()[0]:.2f} at start")  # fmt: skip
    with RedisServer() as server:
        for rep in range(1, args.repeat + 1):
            app = drumbeat.App(server.url, namespace=f"ui-{uuid.uuid4().hex[:8]}")
            app.task(name="noop")(noop)
            try:
                _calls(app, 2, queued=True)  # warm: scripts loaded, modules imported
                print(f"repetition {rep}:")
                print(_line("one no-op job", _calls(app, args.calls, queued=True)))
                print(_line("nothing queued", _calls(app, args.calls, queued=False)))
            finally:
                app.close()
    print(f"load {os.getloadavg()[0]:.2f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
