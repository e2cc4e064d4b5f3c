"""The ``drumbeat`` command: run workers, enqueue jobs, inspect queues, dead letters and
schedules, and manage the embedded Redis.

Commands that work on an app take it as ``MODULE:APP`` (like uvicorn): the module is imported
with the current directory on ``sys.path``, and ``MODULE`` alone means ``MODULE:app``.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import sys
from collections.abc import Iterator
from typing import Annotated, Any

import redis
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from drumbeat import admin, embedded, scale_signal
from drumbeat.app import App
from drumbeat.cli import shapes
from drumbeat.cli.tables import (
    console,
    fmt_count,
    print_table,
    schedule_table,
    status_tables,
    supervisors_table,
)
from drumbeat.cli.tasks import UnknownTaskName, resolve_task
from drumbeat.errors import DrumbeatError, InvalidJob
from drumbeat.job import cancel_call
from drumbeat.task import MAX_PRIORITY, MIN_PRIORITY, Options, Prepared

__all__ = ["CliError", "cli", "load_app", "main", "schedule_table", "status_tables"]

log = logging.getLogger("drumbeat.cli")

cli = typer.Typer(
    name="drumbeat",
    help="drumbeat: a Redis-backed priority job queue.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)
USAGE_ERROR = 2  # what click uses for bad arguments

AppArg = Annotated[
    str,
    typer.Argument(
        metavar="MODULE:APP",
        help="Where the drumbeat.App lives, e.g. myproject.jobs:app"
        " (MODULE alone means MODULE:app).",
        show_default=False,
    ),
]

WideOpt = Annotated[
    bool,
    typer.Option(
        "--wide",
        "-w",
        help="Every column, each cell in full on one line (wider than 80 columns, maybe than "
        "the terminal: pipe into less -S).",
    ),
]


def json_option(shape: str) -> Any:
    """A ``--json`` flag whose help gives the shape printed (docs/cli.md has every field)."""
    return typer.Option(
        "--json",
        help=f"Print JSON for scripts instead of tables: {shape}. Times are given as epoch ms "
        "(*_ms) and as ISO 8601 UTC (*_at); see docs/cli.md.",
    )


def main() -> None:
    """Entry point of the ``drumbeat`` console script."""
    cli()


# -- errors and output -------------------------------------------------------------------------


class CliError(Exception):
    """A failure the CLI reports as one line, exiting with ``code``."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


def _out() -> Console:
    return console()


def _err() -> Console:
    return Console(stderr=True, highlight=False)


def _fail(message: str, code: int) -> typer.Exit:
    _err().print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)
    return typer.Exit(code)


@contextlib.contextmanager
def _errors() -> Iterator[None]:
    """Turns the errors a user can cause or fix into one red line and an exit code."""
    try:
        yield
    except CliError as exc:
        raise _fail(exc.message, exc.code) from None
    except UnknownTaskName as exc:
        raise _fail(str(exc), USAGE_ERROR) from None
    except InvalidJob as exc:  # a bad argument to enqueue: a usage error
        raise _fail(str(exc), USAGE_ERROR) from None
    except DrumbeatError as exc:
        raise _fail(str(exc), 1) from None
    except redis.ConnectionError as exc:
        raise _fail(f"cannot connect to Redis: {exc}", 1) from None
    except redis.RedisError as exc:
        raise _fail(f"Redis error: {exc}", 1) from None
    except redis.exceptions.RedisClusterException as exc:  # not a RedisError; says what failed
        raise _fail(str(exc), 1) from None
    except ValueError as exc:
        raise _fail(str(exc), 1) from None


@contextlib.contextmanager
def _opened(spec: str) -> Iterator[App]:
    """The app named by ``spec``, with its connections closed afterwards."""
    with _errors():
        app = load_app(spec)
        try:
            yield app
        finally:
            app.close()


def redis_now_ms(app: App) -> int:
    """The Redis server's clock, which every stored time is relative to, in epoch ms."""
    sec, usec = app.redis.time()
    return int(sec) * 1000 + int(usec) // 1000


# -- loading the app ---------------------------------------------------------------------------


def load_app(spec: str) -> App:
    """Import ``MODULE:APP`` (or ``MODULE``, meaning ``MODULE:app``) and return the App.

    The current directory goes first on ``sys.path``, so a module next to where the command
    runs is found, as with uvicorn. ``APP`` may be a dotted attribute path.

    Raises:
        CliError: if the module cannot be imported or the attribute is not a `drumbeat.App`.
    """
    module_name, sep, attr = spec.partition(":")
    attr = attr if sep else "app"
    if not module_name or not attr:
        raise CliError(f"expected MODULE:APP (e.g. myproject.jobs:app), got {spec!r}", USAGE_ERROR)
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if module_name == missing or module_name.startswith(missing + "."):
            raise CliError(
                f"cannot import {module_name!r}: no module named {missing!r} (run drumbeat from "
                "the directory that holds it, or add that directory to PYTHONPATH)",
                USAGE_ERROR,
            ) from None
        raise CliError(f"importing {module_name!r} failed: {type(exc).__name__}: {exc}") from None
    except Exception as exc:
        raise CliError(f"importing {module_name!r} failed: {type(exc).__name__}: {exc}") from None
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            hint = "" if sep else f" (name it as {module_name}:NAME)"
            raise CliError(
                f"module {module_name!r} has no attribute {attr!r}{hint}", USAGE_ERROR
            ) from None
    if not isinstance(obj, App):
        raise CliError(
            f"{module_name}:{attr} is a {type(obj).__name__}, not a drumbeat.App", USAGE_ERROR
        )
    return obj


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
    with _errors():
        args, kwargs = _call_arguments(args_json, kwargs_json)
    with _opened(app_spec) as app:
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
        _err().print(
            f"[yellow]note:[/] a job with key {escape(repr(key))} is already queued or running, "
            "or its unique_for window is open; that is its id, and nothing new was enqueued",
            soft_wrap=True,
        )


@cli.command()
def cancel(app_spec: AppArg, job_id: Annotated[str, typer.Argument(help="The job's id.")]) -> None:
    """Cancel a job: a queued or delayed one is removed at once; a running one stops at its next
    checkpoint (an async task at once). A cancelled job is never retried. Exits 1 when there
    was nothing to cancel (the job finished, is dead, or does not exist)."""
    with _opened(app_spec) as app:
        found = cancel_call(app, job_id, app.known_queues()).run(app.redis)
    if found == 1:
        typer.echo(f"cancelled {job_id}")
    elif found == 2:
        typer.echo(f"cancel requested: {job_id} is running and stops at its next checkpoint")
    else:
        raise _fail(f"nothing to cancel: job {job_id} is not queued, delayed or running", 1)


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
    with _opened(app_spec) as app:
        stats = admin.queue_stats(app, running_limit=limit)
        schedules = admin.schedule_stats(app)
        signal = scale_signal.read_signal(app)
        namespace = app.settings.namespace
        concurrency = app.settings.concurrency
    if as_json:
        shapes.emit(shapes.status_json(namespace, stats, schedules, signal, concurrency))
        return
    _out().print(f"namespace [bold]{escape(namespace)}[/]")
    tables = status_tables(stats, wide=wide)
    if signal.supervisors:
        tables.append(supervisors_table(signal, wide=wide))
    for table in [*tables, schedule_table(schedules, signal)]:
        print_table(table, wide=wide)


# -- dashboard ---------------------------------------------------------------------------------


@cli.command("dashboard")
def dashboard_command(
    app_spec: AppArg,
    host: Annotated[
        str,
        typer.Option(
            help="Address to listen on. Beyond loopback the dashboard refuses to start unless "
            "DRUMBEAT_DASHBOARD_TOKEN is set, and then every request must carry that token."
        ),
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port to listen on.")] = 8787,
    read_only: Annotated[
        bool, typer.Option("--read-only", help="Hide and refuse every action (retry, purge).")
    ] = False,
) -> None:
    """Serve the web dashboard (overview, dead letters), its JSON under /api/ and Prometheus
    metrics at /metrics. Needs the extra: pip install 'drumbeat[dashboard]'."""
    with _errors():
        try:
            from drumbeat import dashboard  # noqa: PLC0415 - an optional extra
        except ImportError as exc:
            raise CliError(
                f"the dashboard needs the dashboard extra ({exc.name or exc} is missing): "
                "pip install 'drumbeat[dashboard]'"
            ) from None
        app = load_app(app_spec)
        try:
            dashboard.serve(app, host, port, read_only=read_only, announce=_err().print)
        except dashboard.InsecureBind as exc:
            raise CliError(str(exc), USAGE_ERROR) from None
        finally:
            app.close()


# -- embedded Redis ----------------------------------------------------------------------------


@cli.command("redis")
def redis_command(
    start: Annotated[bool, typer.Option("--start", help="Start it (or reuse it).")] = False,
    stop: Annotated[bool, typer.Option("--stop", help="Shut it down (AOF is fsynced).")] = False,
) -> None:
    """Show the embedded Redis that App() uses when given no URL; --start or --stop it.

    Its data directory is DRUMBEAT_HOME (default ~/.local/share/drumbeat).
    """
    out = _out()
    with _errors():
        if start and stop:
            raise CliError("--start and --stop exclude each other", USAGE_ERROR)
        if start:
            embedded.ensure_running()
        if stop:
            was = embedded.stop()
            out.print("stopped the embedded Redis" if was else "the embedded Redis was not running")
        st = embedded.status()
    table = Table(title="Embedded Redis", title_justify="left", show_header=False)
    table.add_column("field")
    table.add_column("value", overflow="fold")
    state = "[green]running[/]" if st.running else "[yellow]not running[/]"
    table.add_row("state", state)
    table.add_row("url", escape(st.url))
    table.add_row("home", escape(str(st.home)))
    table.add_row("binary", escape(st.binary or "none found"))
    if st.running:
        table.add_row("pid", fmt_count(st.pid))
        table.add_row("version", st.redis_version or "?")
        aof = "?" if st.aof_enabled is None else ("on" if st.aof_enabled else "off")
        table.add_row("aof", aof)
        table.add_row("memory", st.used_memory_human or "?")
        table.add_row("keys", fmt_count(st.keys))
    out.print(table)
    configured = os.environ.get("DRUMBEAT_REDIS_URL")
    if configured:
        out.print(
            f"[yellow]note:[/] DRUMBEAT_REDIS_URL is set, so apps use {escape(configured)} "
            "rather than this server",
            soft_wrap=True,
        )


# -- schedules ---------------------------------------------------------------------------------

# Imported last: these modules use the helpers above (`worker` registers its command).
from drumbeat.cli import worker as _worker_command  # noqa: E402, F401
from drumbeat.cli.dead import dead_cli  # noqa: E402
from drumbeat.cli.queues import queues_cli  # noqa: E402
from drumbeat.cli.schedules import schedules_cli  # noqa: E402

cli.add_typer(dead_cli, name="dead")
cli.add_typer(queues_cli, name="queues")
cli.add_typer(schedules_cli, name="schedules")
