"""`make demo` (``python -m examples.marketplace``): the marketplace monitor, end to end.

Starts the fake marketplace (server.py) on loopback, a supervisor with autoscaled worker
processes (``drumbeat worker examples.marketplace:app --autoscale 1:4``), registers the users'
monitors with ``schedule_many`` and shows the figures live: first ``--warmup`` seconds of
monitor runs alone (the pool scales to the load and opens its connections; reported apart),
then ``--seconds`` with listings appearing, which stop `SETTLE` seconds before the end so that
every match has had two monitor runs to be ordered. Then it prints a summary, and exits 0 only
if every check of the summary passed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.live import Live
from rich.table import Table

import drumbeat
from drumbeat.autoscale import read_signal

from . import catalog, ledger, view
from .server import SEARCH_BUDGET, Market, Server
from .tasks import LIMITS, app, monitor, search

ROOT = Path(__file__).resolve().parents[2]
#: Listings stop this long before the end: two monitor intervals and a margin.
SETTLE = 2 * catalog.EVERY + 2.0
LATENESS_P99_MS = 200.0


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m examples.marketplace", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--monitors", type=int, default=2000, help="user monitors (default 2000)")
    p.add_argument("--seconds", type=float, default=60.0, help="how long to run (default 60)")
    p.add_argument("--warmup", type=float, default=2 * catalog.EVERY,
                   help="seconds of monitor runs before the measured ones (default 10): the "
                   "pool scales to the load and opens its connections; shown apart")  # fmt: skip
    p.add_argument("--listings-per-s", type=float, default=3.0, help="new listings a second")
    p.add_argument("--autoscale", default="1:4", help="worker processes MIN:MAX (default 1:4)")
    p.add_argument("--concurrency", type=int, default=50, help="slots per worker process")
    p.add_argument("--max-p99-ms", type=float, default=LATENESS_P99_MS,
                   help="the run lateness p99 to stay under (default 200, the original "
                   "system's figure)")  # fmt: skip
    p.add_argument("--report", type=Path, help="also write the summary's checks here, as JSON")
    args = p.parse_args(argv)
    if args.monitors < 1:
        p.error(f"--monitors must be at least 1, got {args.monitors}")
    if args.seconds < SETTLE + catalog.EVERY:
        p.error(f"--seconds must be at least {SETTLE + catalog.EVERY:.0f} (listings stop "
                f"{SETTLE:.0f} s before the end), got {args.seconds:g}")  # fmt: skip
    return args


def _reset_namespace() -> None:
    """Drops what an earlier run left: drumbeat's keys of this namespace and the demo's."""
    r = app.redis
    for pattern in (f"drumbeat:{{{ledger.NAMESPACE}*", f"{ledger.PREFIX}:*"):
        for key in r.scan_iter(match=pattern, count=1000):
            r.delete(key)


def _start_workers(args: argparse.Namespace, url: str, log: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "drumbeat", "worker", "examples.marketplace:app",
           "--autoscale", args.autoscale, "--concurrency", str(args.concurrency),
           "--log-level", "info"]  # fmt: skip
    env = {**os.environ, "MARKETPLACE_URL": url, "DRUMBEAT_REDIS_URL": app.url,
           "DRUMBEAT_NAMESPACE": ledger.NAMESPACE, "PYTHONPATH": str(ROOT)}  # fmt: skip
    # A session of its own: a terminal's Ctrl-C reaches this process alone, which stops the
    # supervisor with one SIGTERM (a second signal would stop its workers at once).
    with log.open("wb") as out:
        return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip


def _wait_for_workers(workers: subprocess.Popen[bytes], log: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while read_signal(app).workers < 1:
        if workers.poll() is not None:
            raise SystemExit(f"the workers exited with code {workers.returncode} before "
                             f"starting; their log:\n{log.read_text()[-3000:]}")  # fmt: skip
        if time.monotonic() > deadline:
            raise SystemExit(f"no worker registered within {timeout} s; log in {log}")
        time.sleep(0.1)


def _first_searches(timeout: float = 60) -> None:
    """Searches every keyword once before the monitors start, so their first runs find
    results rather than all asking for searches in the same second."""
    app.enqueue_many(search.prepare(k, catalog.SEARCH_CEILING) for k in catalog.KEYWORDS)
    deadline = time.monotonic() + timeout
    while app.redis.hlen(ledger.CACHED) < len(catalog.KEYWORDS):
        if time.monotonic() > deadline:
            raise SystemExit(f"the first searches did not finish within {timeout} s")
        time.sleep(0.05)


def _watch(
    console: Console, market: Market, workers: subprocess.Popen[bytes], warmup: float,
    seconds: float,
) -> tuple[view.Snapshot, float]:  # fmt: skip
    """Shows the figures live: ``warmup`` seconds of monitor runs alone, then ``seconds`` with
    listings appearing (they stop `SETTLE` s before the end). Returns the snapshot taken as
    the warm-up ended and the seconds measured after it."""
    start = time.monotonic()
    before = now = mark = view.snapshot(app, market, start)
    t0: float | None = None
    with Live(console=console, refresh_per_second=4, transient=False) as live:
        while (t0 is None or time.monotonic() - t0 < seconds) and workers.poll() is None:
            if t0 is None and time.monotonic() - start >= warmup:
                t0, mark = time.monotonic(), now
                market.publishing.set()
            if t0 is not None and time.monotonic() - t0 >= seconds - SETTLE:
                market.publishing.clear()
            time.sleep(1.0)
            before, now = now, view.snapshot(app, market, time.monotonic())
            phase = (f"warming up {time.monotonic() - start:3.0f} / {warmup:.0f} s" if t0 is None
                     else f"{time.monotonic() - t0:4.0f} / {seconds:.0f} s")  # fmt: skip
            live.update(view.live(now, before, phase))
    console.print()
    if workers.poll() is not None:
        console.print(f"[red]the workers exited early (exit code {workers.returncode})[/]")
    return mark, 0.0 if t0 is None else time.monotonic() - t0


def _stop(workers: subprocess.Popen[bytes]) -> int:
    workers.send_signal(signal.SIGTERM)
    try:
        return workers.wait(60)
    except subprocess.TimeoutExpired:
        workers.kill()
        return workers.wait(10)


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    value: str
    ok: bool


def _checks(
    mark: view.Snapshot, last: view.Snapshot, monitors: list[catalog.Monitor], market: Market,
    elapsed: float, *, worker_code: int, max_p99_ms: float, warmup: float,
) -> list[Check]:  # fmt: skip
    expected = catalog.expected_orders(monitors, market.listings())
    placed = set(market.orders())
    missed, unasked = expected - placed, placed - expected
    m = last.market
    warm, late = view.run_lateness(mark.bins), view.run_lateness(last.bins, since=mark.bins)
    # Every monitor has at least floor(elapsed / EVERY) slots in the measured time; its last
    # one may still have been queued when the workers stopped.
    due = len(monitors) * max(0, math.floor(elapsed / catalog.EVERY) - 1)
    one_per_user = "concurrency_limit" in LIMITS["place_order"]
    return [
        Check(
            f"warm-up ({warmup:.0f} s): runs, lateness p50 / p99 / max",
            f"{warm.runs:,}: {view.ms(warm.p50_ms)} / {view.ms(warm.p99_ms)} / "
            f"{view.ms(warm.max_bin_ms)}",
            True,
        ),
        Check("monitor runs started (at least)", f"{late.runs:,} ({due:,})", late.runs >= due),
        Check(
            "run lateness p50 / p99 / max (drumbeat)",
            f"{view.ms(late.p50_ms)} / {view.ms(late.p99_ms)} / {view.ms(late.max_bin_ms)}",
            late.p99_ms is not None and late.p99_ms < max_p99_ms,
        ),
        Check(
            "searches / peak in any 1 s (budget)",
            f"{m.searches:,} / {m.peak_searches_1s} ({SEARCH_BUDGET})",
            m.peak_searches_1s <= SEARCH_BUDGET,
        ),
        Check("searches answered 429", str(m.throttled), m.throttled == 0),
        Check(
            "listings / matching (user, item) pairs", f"{m.listings:,} / {len(expected):,}", True
        ),
        Check("orders placed", f"{m.orders:,}", True),
        Check("missed matches (matched, never ordered)", str(len(missed)), not missed),
        Check("orders nobody's monitor matched", str(len(unasked)), not unasked),
        Check("duplicate orders", str(m.duplicates), m.duplicates == 0),
        Check(
            "most orders of one user in flight at once",
            f"{m.peak_user_orders}" + ("" if one_per_user else " (no per-user limit yet)"),
            m.peak_user_orders <= 1 or not one_per_user,
        ),
        Check("workers stopped cleanly (exit code)", str(worker_code), worker_code == 0),
        Check(
            "CPU of the worker processes (with start-up), per run",
            _cpu_per_run(warm.runs + late.runs),
            True,
        ),
    ]


def _cpu_per_run(runs: int) -> str:
    # The supervisor waited for its workers and we for it: their CPU time is counted here.
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = usage.ru_utime + usage.ru_stime
    return f"{cpu:.1f} s, {1000 * cpu / max(1, runs):.2f} ms"


def _summary(checks: list[Check]) -> Table:
    table = Table(title="Summary")
    table.add_column("check")
    table.add_column("value", justify="right")
    table.add_column("", justify="center")
    for c in checks:
        table.add_row(c.name, c.value, "[green]ok[/]" if c.ok else "[bold red]FAIL[/]")
    return table


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    console = Console()
    console.print(f"[bold]drumbeat marketplace monitor[/] on Redis at [cyan]{app.url}[/]"
                  f" (namespace {ledger.NAMESPACE!r})")  # fmt: skip
    _reset_namespace()
    market = Market(args.listings_per_s)
    server = Server(market)
    server.start()
    logs = Path(tempfile.mkdtemp(prefix="drumbeat-marketplace-"))
    workers = _start_workers(args, server.url, logs / "workers.log")
    worker_code = -1
    try:
        _wait_for_workers(workers, logs / "workers.log")
        _first_searches()
        monitors = catalog.monitors(args.monitors)
        t0 = time.monotonic()
        app.schedule_many(
            drumbeat.Schedule(m.id, monitor, every=catalog.EVERY,
                              args=(m.user_id, m.keyword, m.max_price))
            for m in monitors
        )  # fmt: skip
        console.print(f"marketplace at [cyan]{server.url}[/]; {len(monitors):,} monitors of "
                      f"{len({m.user_id for m in monitors}):,} users registered in "
                      f"{1000 * (time.monotonic() - t0):.0f} ms; workers' log: {logs}")  # fmt: skip
        mark, elapsed = _watch(console, market, workers, args.warmup, args.seconds)
    except KeyboardInterrupt:
        console.print("\n[yellow]interrupted: stopping the workers[/]")
        return 130
    finally:
        market.publishing.clear()
        worker_code = _stop(workers)
    last = view.snapshot(app, market, time.monotonic())
    server.stop()
    checks = _checks(
        mark,
        last,
        monitors,
        market,
        elapsed,
        worker_code=worker_code,
        max_p99_ms=args.max_p99_ms,
        warmup=args.warmup,
    )
    if args.report:
        args.report.write_text(json.dumps([dataclasses.asdict(c) for c in checks], indent=1))
    console.print(_summary(checks))
    passed = all(c.ok for c in checks)
    log = logs / "workers.log"
    failed = f"[bold red]some checks failed[/] (workers' log: {log})"
    console.print("[bold green]all checks passed[/]" if passed else failed)
    app.close()
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
