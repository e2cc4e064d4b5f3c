"""``drumbeat schedules``: list, show, pause, resume, remove and run periodic schedules.

Relative times ("in 3.2s", "overdue 1.1s", "4.0s ago") are computed against the Redis
server's clock (``TIME``), as the schedules' own times are, never against this machine's.
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from rich.console import RenderableType
from rich.markup import escape
from rich.table import Table

from drumbeat.app import App
from drumbeat.cli import redis_now_ms, shapes
from drumbeat.cli.errors import CliError, err
from drumbeat.cli.loading import AppArg, opened
from drumbeat.cli.shapes import json_option
from drumbeat.cli.tables import (
    ERROR_WIDTH,
    WideOpt,
    console,
    fixed,
    flexible,
    fmt_duration,
    fmt_ms,
    listing,
    one_line,
    print_table,
)
from drumbeat.schedule import Cadence
from drumbeat.schedules import ScheduleInfo

__all__ = ["cadence_text", "schedule_state", "schedules_cli"]

schedules_cli = typer.Typer(
    help="List, inspect, pause, resume, remove and run periodic schedules.",
    no_args_is_help=True,
)

ScheduleIdsArg = Annotated[
    list[str],
    typer.Argument(metavar="ID...", help="Schedule ids.", show_default=False),
]


# -- formatting --------------------------------------------------------------------------------


def _seconds(value: float) -> str:
    """A cadence length as written: ``5s``, ``1.5s``, ``90s``, ``5m``, ``2h``, ``1d``."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if value >= size and value % size == 0:
            return f"{int(value // size)}{unit}"
    return f"{value:g}s"


def cadence_text(cadence: Cadence) -> str:
    """``every 5s``, ``cron 0 9 * * * Asia/Tokyo``, plus ``delay``/``grace``/``jitter`` if set."""
    if cadence.cron is not None:
        parts = [f"cron {cadence.cron} {cadence.tz}"]
    else:
        parts = [f"every {_seconds(cadence.every or 0)}"]
    if cadence.mode == "delay":
        parts.append("delay")
    if cadence.grace is not None:
        parts.append(f"grace {_seconds(cadence.grace)}")
    if cadence.jitter:
        parts.append(f"jitter {_seconds(cadence.jitter)}")
    return ", ".join(parts)


def schedule_state(info: ScheduleInfo) -> str:
    """``paused``; ``running`` (a run is queued or in flight); else ``scheduled``."""
    if info.paused:
        return "paused"
    return "running" if info.next_due_ms is None else "scheduled"


def _styled_state(info: ScheduleInfo) -> str:
    state = schedule_state(info)
    return {"paused": "[yellow]paused[/]", "running": "[cyan]running[/]"}.get(state, state)


def _next_due(info: ScheduleInfo, now_ms: int) -> str:
    if info.next_due_ms is None:
        return "-"
    wait = (info.next_due_ms - now_ms) / 1000
    return f"in {fmt_duration(wait)}" if wait >= 0 else f"[red]overdue {fmt_duration(-wait)}[/]"


def _ago(ms: int | None, now_ms: int) -> str:
    return "-" if ms is None else f"{fmt_duration((now_ms - ms) / 1000)} ago"


def _took(ms: int | None) -> str:
    return "-" if ms is None else fmt_ms(ms)


def _late(ms: int | None) -> str:
    return "-" if ms is None else f"{fmt_ms(ms)} after its due time"


def _utc(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=repr)


def _unique(infos: Iterator[ScheduleInfo], seen: set[str]) -> Iterator[ScheduleInfo]:
    # HSCAN may return an entry twice (while Redis rehashes the hash); list it once.
    for info in infos:
        if info.id not in seen:
            seen.add(info.id)
            yield info


# -- ls / show ---------------------------------------------------------------------------------


SCHEDULE_SHAPE = (
    '{"id", "task", "args", "kwargs", "cadence": {"every", "cron", "tz", "mode", "grace", '
    '"jitter"}, "priority", "state", "next_due_ms", "next_due_at", "last_run_ms", "last_run_at", '
    '"last_duration_ms", "last_lateness_ms", "runs", "failures", "misfires", "last_error", '
    '"generation"}'
)


@schedules_cli.command("ls")
def schedules_ls(
    app_spec: AppArg,
    prefix: Annotated[
        str, typer.Option("--prefix", "-p", help="Only schedules whose id starts with this.")
    ] = "",
    limit: Annotated[
        int, typer.Option("--limit", "-n", min=1, help="Most schedules to list (by id).")
    ] = 100,
    wide: WideOpt = False,
    as_json: Annotated[
        bool,
        json_option(
            '{"now_ms", "now_at", "total": schedules matched, "schedules": [schedule, ...]}, '
            f"by id, where a schedule is {SCHEDULE_SHAPE}"
        ),
    ] = False,
) -> None:
    """List schedules by id: cadence, state and next due; --wide adds the task, the priority,
    the last run, its duration and lateness (how long after its due time it started), the run,
    failure and misfire counts and the last error.

    State is paused, running (a run is queued or in flight) or scheduled. Times are relative to
    the Redis server's clock.
    """
    seen: set[str] = set()
    with opened(app_spec) as app:
        now_ms = redis_now_ms(app)
        shown = heapq.nsmallest(limit, _unique(app.schedules(prefix), seen), key=lambda i: i.id)
    total = len(seen)
    if as_json:
        listed = [shapes.schedule_json(info, schedule_state(info)) for info in shown]
        shapes.emit({**shapes.timestamp("now", now_ms), "total": total, "schedules": listed})
        return
    out = console()
    if not shown:
        out.print("no schedules" + (f" with ids starting {escape(repr(prefix))}" if prefix else ""))
        return
    title = "Schedules" + (f" (first {len(shown)} of {total} by id)" if total > len(shown) else "")
    table = _ls_table(title, wide)
    for info in shown:
        cells: list[RenderableType] = [escape(info.id)]
        if wide:
            cells.append(one_line(info.task))
        cells.append(one_line(cadence_text(info.cadence)))
        if wide:
            cells.append(str(info.priority))
        cells += [_styled_state(info), _next_due(info, now_ms)]
        if wide:
            cells += [
                _ago(info.last_run_ms, now_ms),
                _took(info.last_duration_ms),
                _took(info.last_lateness_ms),
                str(info.runs),
                str(info.failures),
                str(info.misfires),
                one_line(info.last_error or "-"),
            ]
        table.add_row(*cells)
    print_table(table, wide=wide)
    if total > len(shown):
        more = total - len(shown)
        out.print(
            f"{more} more schedule{'s' if more != 1 else ''} matched; raise --limit to see them"
        )


def _ls_table(title: str, wide: bool) -> Table:
    table = listing(title)
    fixed(table, "id")
    if wide:
        flexible(table, "task")
    flexible(table, "cadence")
    if wide:
        fixed(table, "priority", justify="right")
    fixed(table, "state")
    fixed(table, "next due", justify="right")
    if wide:
        for header in ("last run", "last duration", "last lateness", "runs", "failures",
                       "misfires"):  # fmt: skip
            fixed(table, header, justify="right")
        flexible(table, "last error", max_width=ERROR_WIDTH)
    return table


@schedules_cli.command("show")
def schedules_show(
    app_spec: AppArg,
    schedule_id: Annotated[
        str, typer.Argument(metavar="ID", help="The schedule's id.", show_default=False)
    ],
    as_json: Annotated[bool, json_option(SCHEDULE_SHAPE)] = False,
) -> None:
    """Show every field of one schedule, with its arguments as JSON and its full last error."""
    with opened(app_spec) as app:
        info = app.get_schedule(schedule_id)
        if info is None:
            raise CliError(f"no schedule with id {schedule_id!r}")
        now_ms = redis_now_ms(app)
        home = app.scheduler.home_of(app.redis, schedule_id)
        shards = len(app.scheduler.apart)
    if as_json:
        shapes.emit(shapes.schedule_json(info, schedule_state(info)))
        return
    c = info.cadence
    table = Table(title=f"Schedule {escape(info.id)}", title_justify="left", show_header=False)
    table.add_column("field", no_wrap=True)
    table.add_column("value", overflow="fold")
    table.add_row("id", escape(info.id))
    table.add_row("task", escape(info.task))
    table.add_row("args", escape(_json(info.args)))
    table.add_row("kwargs", escape(_json(info.kwargs)))
    table.add_row("cadence", escape(cadence_text(c)))
    if c.cron is not None:
        table.add_row("cron", escape(c.cron))
        table.add_row("time zone", escape(c.tz))
    else:
        table.add_row("every", f"{c.every:g}s")
        table.add_row("mode", "delay (after each run ends)" if c.mode == "delay" else "rate")
    table.add_row("grace", "-" if c.grace is None else f"{c.grace:g}s")
    table.add_row("jitter", f"{c.jitter:g}s" if c.jitter else "-")
    table.add_row("priority", str(info.priority))
    table.add_row("state", _styled_state(info))
    due = (
        "-" if info.next_due_ms is None else f"{_utc(info.next_due_ms)} ({_next_due(info, now_ms)})"
    )
    table.add_row("next due", due)
    last = (
        "-"
        if info.last_run_ms is None
        else f"{_utc(info.last_run_ms)} ({_ago(info.last_run_ms, now_ms)})"
    )
    table.add_row("last run", last)
    table.add_row("last duration", _took(info.last_duration_ms))
    table.add_row("last lateness", _late(info.last_lateness_ms))
    table.add_row("runs", str(info.runs))
    table.add_row("failures", str(info.failures))
    table.add_row("misfires", str(info.misfires))
    table.add_row("generation", str(info.generation))
    if shards > 1:
        # A limited or routed schedule lives with the jobs (see `ScheduleStore`).
        where = "jobs' shard" if home in (None, app.scheduler.jobs_shard) else f"{home} of {shards}"
        table.add_row("shard", where)
    table.add_row("last error", "-" if info.last_error is None else escape(info.last_error))
    console().print(table)


# -- pause / resume / rm / run-now -------------------------------------------------------------


def _distinct(ids: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(ids))


def _act(
    app: App,
    ids: list[str],
    action: Callable[..., int],
    done: str,
    unchanged: str,
) -> None:
    """Run ``action(*ids)`` on the ids that exist; report what it did and what it skipped."""
    found = _existing(app, ids)
    n = action(*found) if found else 0
    _report(n, ids, found, done, unchanged)


def _existing(app: App, ids: list[str]) -> list[str]:
    """The ids of ``ids`` that name a schedule, in order."""
    return [i for i in ids if app.get_schedule(i) is not None]  # a few ids typed on a command line


def _report(n: int, ids: list[str], found: list[str], done: str, unchanged: str) -> None:
    console().print(f"{done} {n} schedule{'s' if n != 1 else ''}")
    missing = [i for i in ids if i not in found]
    if missing:
        err().print(
            f"[yellow]note:[/] no schedule with id {', '.join(escape(repr(i)) for i in missing)}",
            soft_wrap=True,
        )
    if n < len(found):
        err().print(f"[yellow]note:[/] {len(found) - n} {unchanged}", soft_wrap=True)


@schedules_cli.command("pause")
def schedules_pause(app_spec: AppArg, ids: ScheduleIdsArg) -> None:
    """Pause schedules: no new runs until resumed (a run in flight finishes)."""
    with opened(app_spec) as app:
        _act(app, _distinct(ids), app.pause, "paused", "already paused")


@schedules_cli.command("resume")
def schedules_resume(app_spec: AppArg, ids: ScheduleIdsArg) -> None:
    """Resume paused schedules at their next slot from now (missed slots are not caught up)."""
    with opened(app_spec) as app:
        _act(app, _distinct(ids), app.resume, "resumed", "not paused")


@schedules_cli.command("run-now")
def schedules_run_now(app_spec: AppArg, ids: ScheduleIdsArg) -> None:
    """Queue one extra run of each schedule now; their cadence is kept.

    A schedule that has a run queued or in flight already gets no second one.
    """
    with opened(app_spec) as app:
        _act(app, _distinct(ids), app.run_now, "queued a run of", "already queued or running")


@schedules_cli.command("rm")
def schedules_rm(
    app_spec: AppArg,
    ids: ScheduleIdsArg,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
) -> None:
    """Remove schedules for good (asks first unless --yes); a run in flight still finishes."""
    targets = _distinct(ids)
    with opened(app_spec) as app:
        found = _existing(app, targets)
        if found and not yes:
            typer.confirm(f"Remove {len(found)} schedule(s) for good?", abort=True)
        n = app.unschedule(*found) if found else 0
    _report(n, targets, found, "removed", "were removed meanwhile")
