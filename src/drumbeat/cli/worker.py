"""`drumbeat worker`: one worker in this process, or several under a supervisor."""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from enum import StrEnum
from typing import Annotated

import typer
from rich.logging import RichHandler

from drumbeat.autoscale import Autoscaler
from drumbeat.cli import cli
from drumbeat.cli.errors import USAGE_ERROR, err, fail
from drumbeat.cli.loading import AppArg, opened
from drumbeat.names import check_name
from drumbeat.supervisor import Supervisor
from drumbeat.which_redis import announce
from drumbeat.worker import run_worker
from drumbeat.worker.idle import run_burst
from drumbeat.worker.recycling import Budget

log = logging.getLogger("drumbeat.cli")

#: The most worker processes one supervisor runs.
MAX_PROCESSES = 256


class LogLevel(StrEnum):
    debug = "debug"
    info = "info"
    warning = "warning"
    error = "error"
    critical = "critical"


@cli.command()
def worker(
    app_spec: AppArg,
    *,
    concurrency: Annotated[
        int | None,
        typer.Option(
            "--concurrency", "-c", min=1, help="Jobs run at once (default: the app's settings)."
        ),
    ] = None,
    log_level: Annotated[
        LogLevel, typer.Option("--log-level", "-l", case_sensitive=False, help="Logging level.")
    ] = LogLevel.info,
    max_jobs: Annotated[
        int | None,
        typer.Option("--max-jobs", min=1, help="Recycle a worker process after this many jobs."),
    ] = None,
    max_memory: Annotated[
        float | None,
        typer.Option(
            "--max-memory", min=1, help="Recycle a worker process past this resident size (MiB)."
        ),
    ] = None,
    processes: Annotated[
        int | None,
        typer.Option(
            "--processes",
            "-p",
            min=1,
            max=MAX_PROCESSES,
            help="Run this many worker processes under a supervisor that restarts any that "
            "dies (default: one worker, in this process).",
        ),
    ] = None,
    queues: Annotated[
        str | None,
        typer.Option(
            "--queues",
            "-q",
            metavar="Q1,Q2",
            help="Claim only from these queues (comma-separated; default: every queue the "
            "app's tasks name). Highest priority across them first, then enqueue order.",
        ),
    ] = None,
    autoscale: Annotated[
        str | None,
        typer.Option(
            "--autoscale",
            metavar="MIN:MAX",
            help="Like --processes, but between MIN and MAX processes, sized every "
            "scale_interval on the backlog, the schedule lag and the busy slots in Redis; one "
            "process retires (finishing its jobs) after scale_down_after seconds of spare "
            "capacity.",
        ),
    ] = None,
    burst: Annotated[
        bool,
        typer.Option(
            "--burst",
            help="Exit (status 0) once nothing is ready, running or parked and no delayed job "
            "or retry is due within --burst-wait; schedules are not waited for. One process "
            "only (not with --processes or --autoscale).",
        ),
    ] = False,
    burst_wait: Annotated[
        float,
        typer.Option(
            "--burst-wait",
            min=0,
            metavar="SECONDS",
            help="With --burst, also wait for delayed jobs and retries due within this long.",
        ),
    ] = 0.0,
) -> None:
    """Run a worker for the app's tasks until SIGTERM or SIGINT (with --burst, until idle).

    The first signal lets running jobs finish (up to the app's shutdown_grace) and hands the
    rest back to the queue; a second one stops at once. With --processes, a supervisor passes
    both on to its workers. A worker past --max-jobs or --max-memory stops claiming, finishes
    its jobs and exits; under a supervisor its successor starts first. With --autoscale, a
    process retired on a scale-down finishes its jobs first. SIGHUP to a supervisor restarts
    its workers one at a time.
    """
    served = None if queues is None else _queues(queues)
    bounds = None if autoscale is None else _bounds(autoscale, processes)
    if bounds is None and processes is not None:
        bounds = (processes, processes)
    if burst and bounds is not None:
        # Each process would see the others' jobs running and wait for them: no one of them
        # knows when the pool as a whole is idle.
        raise fail("--burst runs one worker process; it does not go with --processes or "
                    "--autoscale", USAGE_ERROR)  # fmt: skip
    code, ran = 0, False
    try:
        with opened(app_spec) as app:
            _setup_logging(log_level)
            # First, so a machine missing DRUMBEAT_REDIS_URL shows it before anything else.
            announce(app.connections)
            if bounds is not None:
                argv = ["-m", "drumbeat", "worker", app_spec, "--log-level", log_level.value]
                if concurrency is not None:
                    argv += ["--concurrency", str(concurrency)]
                if max_jobs is not None:
                    argv += ["--max-jobs", str(max_jobs)]
                if max_memory is not None:
                    argv += ["--max-memory", str(max_memory)]
                if served is not None:
                    argv += ["--queues", ",".join(served)]
                lo, hi = bounds
                s = app.settings
                scaler = Autoscaler(
                    app, minimum=lo, maximum=hi, concurrency=concurrency or s.concurrency,
                    queues=served,
                )  # fmt: skip
                supervisor = Supervisor(
                    argv, lo, s.shutdown_grace, hang_timeout=s.hang_timeout, maximum=hi,
                    scaler=scaler, ready_wait=s.ready_wait,
                )  # fmt: skip
                raise typer.Exit(supervisor.run())
            ran = True
            if burst:
                run_burst(app, wait=burst_wait, concurrency=concurrency,
                          budget=Budget(max_jobs, max_memory), queues=served)  # fmt: skip
                return
            run_worker(
                app, concurrency=concurrency, budget=Budget(max_jobs, max_memory), queues=served
            )
    except typer.Exit as exc:
        code = exc.exit_code
        raise
    finally:
        if ran:
            _exit_if_threads_linger(code)


def _queues(spec: str) -> list[str]:
    """The queues of --queues, checked."""
    names = [q.strip() for q in spec.split(",") if q.strip()]
    if not names:
        raise fail(f"--queues expects queue names separated by commas, got {spec!r}",
                    USAGE_ERROR)  # fmt: skip
    for name in names:
        try:
            check_name(name, "queue name")
        except ValueError as exc:
            raise fail(f"--queues: {exc}", USAGE_ERROR) from None
    return names


def _bounds(spec: str, processes: int | None) -> tuple[int, int]:
    """``MIN:MAX`` of --autoscale, checked."""
    if processes is not None:
        raise fail("--autoscale and --processes exclude each other (--processes N is a fixed "
                    "pool, --autoscale N:N the same)", USAGE_ERROR)  # fmt: skip
    lo, sep, hi = spec.partition(":")
    if not (sep and lo.isdigit() and hi.isdigit()):
        raise fail(f"--autoscale expects MIN:MAX (e.g. 1:8), got {spec!r}", USAGE_ERROR)
    low, high = int(lo), int(hi)
    if not 1 <= low <= high <= MAX_PROCESSES:
        raise fail(f"--autoscale expects 1 <= MIN <= MAX <= {MAX_PROCESSES}, got {spec!r}",
                    USAGE_ERROR)  # fmt: skip
    return low, high


def _setup_logging(level: LogLevel) -> None:
    """Rich log lines on stderr, unless logging was configured already (then it is kept)."""
    handler = RichHandler(console=err(), show_path=False, rich_tracebacks=True)
    logging.basicConfig(
        level=level.upper(),
        format="%(message)s",
        datefmt="[%X]",
        handlers=[handler],
    )


def _exit_if_threads_linger(code: int, wait: float = 1.0) -> None:
    """Exit without joining threads that still run a sync task (one that ignored its timeout
    or the shutdown): the interpreter would otherwise wait for them at exit, maybe forever."""
    deadline = time.monotonic() + wait
    others = [
        t for t in threading.enumerate() if t is not threading.current_thread() and not t.daemon
    ]
    for thread in others:  # idle pool threads exit on their own within moments
        thread.join(max(0.0, deadline - time.monotonic()))
    lingering = [t.name for t in others if t.is_alive()]
    if not lingering:
        return
    log.warning(
        "%d task thread(s) still running (%s); exiting without waiting for them",
        len(lingering),
        ", ".join(lingering),
    )
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
