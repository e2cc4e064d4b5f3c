"""Rich tables for ``drumbeat status``, one function per table: `status_tables` for the queue,
`schedule_table` for the schedules; the consoles, cells and formats every listing shares.

Listings fit the console (80 columns when stdout is not a terminal): each row is one line;
the columns that can give way (names, errors, cadences) are cut with an ellipsis, widest first,
while ids and states keep their width. ``--wide`` prints every column, each cell on one line in
full (errors up to `ERROR_WIDTH`), however wide that makes the table.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Annotated, Any

import typer
from rich.console import Console, JustifyMethod, RenderableType
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from drumbeat import admin
from drumbeat.scale_signal import Signal
from drumbeat.task import MAX_PRIORITY, MIN_PRIORITY

#: Output width when stdout is not a terminal and ``COLUMNS`` is not set. Rich would otherwise
#: take the width of whatever terminal stdin or stderr is attached to, so ``| less`` or
#: ``> file`` would depend on the window the command happened to run in.
PIPE_WIDTH = 80

#: The widest a ``--wide`` table may grow; its error columns stop at `ERROR_WIDTH` anyway.
WIDE_LIMIT = 1000

#: How much of an error a table shows, even with ``--wide``; the full text is in ``--json``.
ERROR_WIDTH = 60

#: The ``--wide`` option of a command that prints tables.
WideOpt = Annotated[
    bool,
    typer.Option(
        "--wide",
        "-w",
        help="Every column, each cell in full on one line (wider than 80 columns, maybe than "
        "the terminal: pipe into less -S).",
    ),
]


def console(width: int | None = None) -> Console:
    """A console on stdout, made per use (the test runner swaps ``sys.stdout`` per command)."""
    if width is None and not sys.stdout.isatty() and not os.environ.get("COLUMNS", "").isdigit():
        width = PIPE_WIDTH
    return Console(highlight=False, width=width)


def print_table(table: Table, *, wide: bool = False) -> None:
    """Print ``table`` fitted to the console, or (``wide``) as wide as its cells need, which
    may be wider than the terminal."""
    out = console()
    if wide:
        natural = Measurement.get(out, out.options.update_width(WIDE_LIMIT), table).maximum
        out = console(max(out.width, natural))
    else:
        # Rich's last resort for a row that is still too wide once the flexible columns gave
        # way narrows every column alike, states and counts too; a very long id (a schedule's,
        # a worker's host name) gives way itself first.
        for column in table.columns:
            if column.no_wrap and column.max_width is None:
                column.max_width = out.width // 2
    out.print(table)


def listing(title: str) -> Table:
    """An empty listing table; add columns with `fixed` and `flexible`."""
    return Table(title=title, title_justify="left")


def fixed(table: Table, header: str, *, justify: JustifyMethod = "left") -> None:
    """A column that keeps its width: ids, states, counts, short times."""
    table.add_column(header, justify=justify, no_wrap=True)


def flexible(
    table: Table, header: str, *, max_width: int | None = None, justify: JustifyMethod = "left"
) -> None:
    """A column that gives way when the row is too wide: its cells (made by `one_line`) are cut
    with an ellipsis. Rich narrows only columns that may wrap, so the column may; the cells
    themselves never do."""
    table.add_column(_one_line(header), justify=justify, max_width=max_width)


def progress_cell(value: Any) -> Text:
    """The progress a job saved, as JSON on one line (empty when it saved none)."""
    return one_line("" if value is None else json.dumps(value, default=repr))


def one_line(text: str) -> Text:
    """A cell of a `flexible` column: its whitespace collapsed (an error's newlines too), cut
    with an ellipsis rather than wrapped."""
    return _one_line(" ".join(text.split()))


def _one_line(text: str) -> Text:
    return Text(text, no_wrap=True, overflow="ellipsis")


def fmt_duration(seconds: float) -> str:
    """A short human duration: ``0.4s``, ``12s``, ``3m05s``, ``2h01m``, ``3d04h``."""
    sign = "-" if seconds < 0 else ""
    s = abs(seconds)
    if s < 10:
        return f"{sign}{s:.1f}s"
    whole = int(s)
    if whole < 60:
        return f"{sign}{whole}s"
    if whole < 3600:
        return f"{sign}{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{sign}{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{sign}{whole // 86400}d{whole % 86400 // 3600:02d}h"


def fmt_count(value: int | None) -> str:
    return "?" if value is None else str(value)


def fmt_ms(ms: float | None) -> str:
    """A lateness or duration given in ms: ``0.4ms``, ``3ms`` (whole ms), ``840ms``, then as
    `fmt_duration` seconds (``1.2s``)."""
    if ms is None:
        return "-"
    if ms < 10 and not isinstance(ms, int):
        return f"{ms:.1f}ms"
    if ms < 1000:
        return f"{ms:.0f}ms"
    return fmt_duration(ms / 1000)


def summary_table(stats: admin.QueueStats) -> Table:
    """One row per count; a later extension (schedules) adds its rows here."""
    table = Table(title="Queue", title_justify="left", show_header=False)
    table.add_column("what")
    table.add_column("count", justify="right")
    table.add_row("ready", str(stats.ready))
    table.add_row("due later (delayed jobs, next runs)", str(stats.delayed))
    table.add_row("parked (waiting for a limit)", str(stats.parked))
    table.add_row("waiting (for dependencies)", str(stats.waiting))
    table.add_row("running", str(stats.running_total))
    table.add_row("dead letters", str(stats.dead))
    workers = str(len(stats.workers))
    if stats.stale_workers:
        workers += f" (+{stats.stale_workers} silent)"
    table.add_row("workers", workers)
    return table


def priority_table(stats: admin.QueueStats) -> Table:
    """Ready jobs per priority level, highest (first to run) on top; empty levels left out."""
    table = Table(title="Ready by priority", title_justify="left")
    table.add_column("priority", justify="right")
    table.add_column("jobs", justify="right")
    for priority in range(MAX_PRIORITY, MIN_PRIORITY - 1, -1):
        depth = stats.ready_by_priority[priority]
        if depth:
            table.add_row(str(priority), str(depth))
    if not stats.ready:
        table.add_row("-", "0")
    return table


def queues_table(stats: admin.QueueStats) -> Table:
    """Per queue: ready jobs per priority level (highest first; empty levels left out), the
    delayed and the parked ones (waiting for a limit), and whether it is paused."""
    table = Table(title="Queues", title_justify="left")
    table.add_column("queue")
    table.add_column("ready", justify="right")
    table.add_column("by priority (high to low)")
    table.add_column("delayed", justify="right")
    table.add_column("parked", justify="right")
    table.add_column("state")
    for queue in stats.queues:
        levels = [
            f"{p}: {queue.ready_by_priority[p]}"
            for p in range(MAX_PRIORITY, MIN_PRIORITY - 1, -1)
            if queue.ready_by_priority[p]
        ]
        table.add_row(
            escape(queue.name),
            str(queue.ready),
            ", ".join(levels) or "-",
            str(queue.delayed),
            str(queue.parked),
            "[yellow]paused[/]" if queue.paused else "active",
        )
    return table


def running_table(stats: admin.QueueStats, *, wide: bool = False) -> Table:
    """Jobs under a lease, closest to expiry first; ``wide`` adds the progress each saved."""
    title = "Running"
    if stats.running_total > len(stats.running):
        title += f" (showing {len(stats.running)} of {stats.running_total})"
    table = listing(title)
    fixed(table, "job")
    flexible(table, "worker")
    fixed(table, "lease age", justify="right")
    fixed(table, "lease left", justify="right")
    if wide:
        flexible(table, "progress")
    for job in stats.running:
        left = fmt_duration(job.lease_left)
        if job.lease_left < 0:
            left = f"[red]{left} (expired)[/]"
        cells: list[RenderableType] = [
            job.id, one_line(job.worker), fmt_duration(job.lease_age), left
        ]  # fmt: skip
        if wide:
            cells.append(progress_cell(job.progress))
        table.add_row(*cells)
    return table


def workers_table(stats: admin.QueueStats, *, wide: bool = False) -> Table:
    """Live workers, from their heartbeats; ``wide`` adds their host and pid (also part of
    their id)."""
    table = listing("Workers")
    fixed(table, "worker")
    if wide:
        flexible(table, "host")
        fixed(table, "pid", justify="right")
    for header in ("busy", "processed", "up", "heartbeat"):
        fixed(table, header, justify="right")
    for w in stats.workers:
        up = "?" if w.started_ms is None else fmt_duration((stats.now_ms - w.started_ms) / 1000)
        where: list[RenderableType] = [one_line(w.host or "?"), fmt_count(w.pid)] if wide else []
        table.add_row(
            escape(w.id),
            *where,
            f"{fmt_count(w.running)}/{fmt_count(w.concurrency)}",
            fmt_count(w.processed),
            up,
            f"{fmt_duration(w.heartbeat_age)} ago",
        )
    return table


def status_tables(stats: admin.QueueStats, *, wide: bool = False) -> list[Table]:
    """Everything ``drumbeat status`` shows, in order; listings that are empty are left out."""
    tables = [summary_table(stats), priority_table(stats)]
    if len(stats.queues) > 1 or any(q.paused for q in stats.queues):
        tables.append(queues_table(stats))
    if stats.running:
        tables.append(running_table(stats, wide=wide))
    if stats.workers:
        tables.append(workers_table(stats, wide=wide))
    return tables


def schedule_table(stats: admin.ScheduleStats, signal: Signal | None = None) -> Table:
    """Schedules and how late their runs started over the last minute (for ``status``); with
    the autoscale ``signal``, the runs due and not started, and why they wait.

    Percentiles are upper bounds of the histogram bin they fall in (hence the ``≤``).
    """
    table = Table(title="Schedules", title_justify="left", show_header=False)
    table.add_column("what")
    table.add_column("value", justify="right")
    late = stats.lateness
    table.add_row("schedules", str(stats.total))
    table.add_row("shards", str(stats.shards))
    table.add_row("runs, last minute", str(late.runs))
    if late.runs:
        lateness = f"≤{fmt_ms(late.p50_ms)} / ≤{fmt_ms(late.p99_ms)} / {fmt_ms(late.max_ms)}"
    else:
        lateness = "-"
    table.add_row("lateness p50 / p99 / max", lateness)
    if signal is not None:
        table.add_row("runs due, not started", due_runs_text(signal))
    return table


def due_runs_text(signal: Signal) -> str:
    """How many schedule runs are due and not claimed yet, and what holds them."""
    if not signal.due_runs:
        return "0"
    late = fmt_ms(signal.lag_ms)
    if signal.slots == 0:
        why = "no live worker"
    elif signal.waiting_for_slots:
        why = f"every worker slot busy ({signal.busy} of {signal.slots}): waiting for free slots"
    else:
        why = f"{signal.slots - signal.busy} of {signal.slots} worker slots free: catching up"
    return f"~{signal.due_runs:,}, the oldest {late} late; {why}"


def supervisors_table(signal: Signal, *, wide: bool = False) -> Table:
    """Live supervisors (``--processes`` / ``--autoscale``): processes live/desired, their
    bounds, and why and when each last scaled; ``wide`` adds the supervisor's id."""
    table = listing("Supervisors")
    if wide:
        fixed(table, "supervisor")
    flexible(table, "host")
    fixed(table, "pid", justify="right")
    fixed(table, "procs", justify="right")
    fixed(table, "min:max", justify="right")
    fixed(table, "scaled", justify="right")
    flexible(table, "why")
    for sup in signal.supervisors:
        when = (
            "?" if sup.reason_ms is None else fmt_duration((signal.now_ms - sup.reason_ms) / 1000)
        )
        table.add_row(
            *([escape(sup.id)] if wide else []),
            one_line(sup.host or "?"),
            fmt_count(sup.pid),
            f"{sup.live}/{sup.desired}",
            f"{sup.minimum}:{sup.maximum}",
            f"{when} ago" if sup.reason_ms is not None else when,
            one_line(sup.reason or "-"),
        )
    return table
