"""The ``drumbeat`` command: run workers, enqueue jobs, inspect queues, dead letters and
schedules, and manage the embedded Redis.

Commands that work on an app take it as ``MODULE:APP`` (like uvicorn): the module is imported
with the current directory on ``sys.path``, and ``MODULE`` alone means ``MODULE:app``
(`loading`). This module holds the root command and ``enqueue``, ``cancel`` and ``status``;
each other command has its own module (`worker`, `dashboard`, `embedded`, `dead`, `queues`,
`schedules`), and `errors` says how any of them fails.
"""

from __future__ import annotations

import json
import logging
from typing import Annotated, Any

import typer
from rich.markup import escape

from drumbeat import admin, scale_signal
from drumbeat.app import App
from drumbeat.cli import shapes
from drumbeat.cli.errors import USAGE_ERROR, CliError, err, fail, reported
from drumbeat.cli.loading import AppArg, load_app, opened
from drumbeat.cli.shapes import json_option
from drumbeat.cli.tables import (
    WideOpt,
    console,
    print_table,
    schedule_table,
    status_tables,
    supervisors_table,
)
from drumbeat.cli.tasks import resolve_task
from drumbeat.job import cancel_call
from drumbeat.task import MAX_PRIORITY, MIN_PRIORITY, Options, Prepared

# Beside the command's own names, the helpers its command modules take from here.
__all__ = [
    "USAGE_ERROR",
    "AppArg",
    "CliError",
    "WideOpt",
    "cli",
    "json_option",
    "load_app",
    "main",
    "redis_now_ms",
    "schedule_table",
    "status_tables",
]

log = logging.getLogger("drumbeat.cli")

cli = typer.Typer(
    name="drumbeat",
    help="drumbeat: a Redis-backed priority job queue.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)


def main() -> None:
    """Entry point of the ``drumbeat`` console script."""
    cli()


def redis_now_ms(app: App) -> int:
    """The Redis server's clock, which every stored time is relative to, in epoch ms."""
    sec, usec = app.redis.time()
    return int(sec) * 1000 + int(usec) // 1000


# -- enqueue -----------------------------------------------------------------------------------


def _parse_json(raw: str, what: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise CliError(f"{what} is not valid JSON ({exc}): {raw!r}", USAGE_ERROR) from None


def _call_arguments(
    args_json: str | None, kwargs_json: str | None
) -> tuple[list[Any], dict[str, Any]]:
    args: Any = [] if args_json is None else _parse_json(args_json, "ARGS_JSON")
    if not isinstance(args, list):
        args = [args]
    kwargs: Any = {} if kwargs_json is None else _parse_json(kwargs_json, "--kwargs")
    if not isinstance(kwargs, dict):
        raise CliError(
            f"--kwargs must be a JSON object, got {type(kwargs).__name__}: {kwargs_json!r}",
            USAGE_ERROR,
        )
    return args, kwargs


@cli.command()
def enqueue(
    app_spec: AppArg,
    task: Annotated[
        str,
        typer.Argument(
            metavar="TASK",
            help="The task's registered name, or its short name (build for tasks.build) when "
            "no other task has it.",
            show_default=False,
        ),
    ],
    args_json: Annotated[
        str | None,
        typer.Argument(
            metavar="ARGS_JSON",
            help="Positional arguments as a JSON list, e.g. '[1, \"two\"]'; any other JSON value "
            "is the single argument.",
            show_default=False,
        ),
    ] = None,
    *,
    kwargs_json: Annotated[
        str | None,
        typer.Option(
            "--kwargs",
            metavar="JSON",
            help="Keyword arguments as a JSON object, e.g. '{\"n\": 3}'.",
        ),
    ] = None,
    priority: Annotated[
        int | None,
        typer.Option(
            "--priority",
            "-p",
            min=MIN_PRIORITY,
            max=MAX_PRIORITY,
            help="0..9, higher runs first (default: the task's own, else 0).",
        ),
    ] = None,
    delay: Annotated[
        float, typer.Option("--delay", "-d", min=0, help="Seconds to wait before it may run.")
    ] = 0.0,
    key: Annotated[
        str | None,
        typer.Option("--key", "-k", help="Dedup key: no second job while one with it is live."),
    ] = None,
    unique_for: Annotated[
        float | None,
        typer.Option(
            "--unique-for",
            metavar="SECONDS",
            min=0,
            help="With --key: the key stays taken this long from now, even after the job ended "
            "(default: the task's unique_for, else only while the job lives).",
        ),
    ] = None,
    unregistered: Annotated[
        bool,
        typer.Option(
            "--unregistered",
            help="TASK is not registered in this app: enqueue it under that exact name, for "
            "workers whose app registers it.",
        ),
    ] = False,
) -> None:
    """Enqueue a job and print its id.

    A TASK the app does not register is refused (exit 2) with the names it may have meant,
    since no worker of this app could run it; --unregistered enqueues it all the same.
    """
    with reported():
        args, kwargs = _call_arguments(args_json, kwargs_json)
    with opened(app_spec) as app:
        if unregistered and task not in app.tasks:
            options = Options(priority=priority or 0, delay=delay, key=key, unique_for=unique_for)
            job = app.enqueue_many([Prepared(task, args, kwargs, options)])[0]
        else:
            registered = resolve_task(app, task)
            bound = registered.options(
                priority=priority, delay=delay, key=key, unique_for=unique_for
            )
            job = bound.enqueue(*args, **kwargs)
    typer.echo(job.id)
    if not job.created:
        err().print(
            f"[yellow]note:[/] a job with key {escape(repr(key))} is already queued or running, "
            "or its unique_for window is open; that is its id, and nothing new was enqueued",
            soft_wrap=True,
        )


@cli.command()
def cancel(app_spec: AppArg, job_id: Annotated[str, typer.Argument(help="The job's id.")]) -> None:
    """Cancel a job: a queued or delayed one is removed at once; a running one stops at its next
    checkpoint (an async task at once). A cancelled job is never retried. Exits 1 when there
    was nothing to cancel (the job finished, is dead, or does not exist)."""
    with opened(app_spec) as app:
        found = cancel_call(app, job_id, app.known_queues()).run(app.redis)
    if found == 1:
        typer.echo(f"cancelled {job_id}")
    elif found == 2:
        typer.echo(f"cancel requested: {job_id} is running and stops at its next checkpoint")
    else:
        raise fail(f"nothing to cancel: job {job_id} is not queued, delayed or running", 1)


# -- status ------------------------------------------------------------------------------------


@cli.command()
def status(
    app_spec: AppArg,
    limit: Annotated[
        int, typer.Option("--limit", "-n", min=0, help="Most running jobs to list.")
    ] = 50,
    wide: WideOpt = False,
    as_json: Annotated[
        bool,
        json_option(
            '{"namespace", "now_ms", "now_at", "queue": {"ready", "ready_by_priority": [10 '
            'counts, index = priority], "delayed", "parked", "waiting", "running", "dead"}, '
            '"queues": '
            '[{"name", "ready", "ready_by_priority", "delayed", "parked", "paused"}], "running": '
            '[{"id", "worker", "claimed_ms", "claimed_at", "lease_deadline_ms", '
            '"lease_deadline_at"}], '
            '"workers": [{"id", "host", "pid", "concurrency", "running", "processed", '
            '"started_ms", "started_at", "heartbeat_ms", "heartbeat_at"}], "silent_workers", '
            '"schedules": {"total", "shards", "runs_last_minute", "lateness_p50_ms", '
            '"lateness_p99_ms", "lateness_max_ms"}, "supervisors": [{"id", "host", "pid", '
            '"live", "desired", "min", "max", "concurrency", "slots", "needed", "reason", '
            '"reason_ms", "reason_at", ...}], "autoscale": {"ready", "due_unclaimed", '
            '"schedule_lag_ms", "running", "slots", "slots_needed", "processes_needed", ...}}'
        ),
    ] = False,
) -> None:
    """Show queue depth per priority, delayed, parked (waiting for a limit), running and dead
    jobs, live workers, the supervisors (processes live/desired and why they last scaled), and
    the schedules with how late their runs started over the last minute."""
    with opened(app_spec) as app:
        stats = admin.queue_stats(app, running_limit=limit)
        schedules = admin.schedule_stats(app)
        signal = scale_signal.read_signal(app)
        namespace = app.settings.namespace
        concurrency = app.settings.concurrency
    if as_json:
        shapes.emit(shapes.status_json(namespace, stats, schedules, signal, concurrency))
        return
    console().print(f"namespace [bold]{escape(namespace)}[/]")
    tables = status_tables(stats, wide=wide)
    if signal.supervisors:
        tables.append(supervisors_table(signal, wide=wide))
    for table in [*tables, schedule_table(schedules, signal)]:
        print_table(table, wide=wide)


# -- the other commands ------------------------------------------------------------------------

# Imported last: `worker`, `dashboard` and `embedded` register their commands on `cli` above.
from drumbeat.cli import dashboard as _dashboard_command  # noqa: E402, F401
from drumbeat.cli import embedded as _embedded_command  # noqa: E402, F401
from drumbeat.cli import worker as _worker_command  # noqa: E402, F401
from drumbeat.cli.batches import batches_cli  # noqa: E402
from drumbeat.cli.dead import dead_cli  # noqa: E402
from drumbeat.cli.queues import queues_cli  # noqa: E402
from drumbeat.cli.schedules import schedules_cli  # noqa: E402

cli.add_typer(batches_cli, name="batches")
cli.add_typer(dead_cli, name="dead")
cli.add_typer(queues_cli, name="queues")
cli.add_typer(schedules_cli, name="schedules")
