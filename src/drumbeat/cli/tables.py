"""Rich tables for ``drumbeat status``, one function per table: `status_tables` for the queue,
`schedule_table` for the schedules, and the short formats the other commands share."""

from __future__ import annotations

from rich.console import RenderableType
from rich.markup import escape
from rich.table import Table

from drumbeat import admin
from drumbeat.task import MAX_PRIORITY, MIN_PRIORITY


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


def running_table(stats: admin.QueueStats) -> Table:
    """Jobs under a lease, closest to expiry first."""
    title = "Running"
    if stats.running_total > len(stats.running):
        title += f" (showing {len(stats.running)} of {stats.running_total})"
    table = Table(title=title, title_justify="left")
    table.add_column("job", no_wrap=True, min_width=32)
    table.add_column("worker", overflow="fold")
    table.add_column("lease age", justify="right")
    table.add_column("lease left", justify="right")
    for job in stats.running:
        left = fmt_duration(job.lease_left)
        if job.lease_left < 0:
            left = f"[red]{left} (expired)[/]"
        table.add_row(job.id, escape(job.worker), fmt_duration(job.lease_age), left)
    return table


def workers_table(stats: admin.QueueStats) -> Table:
    """Live workers, from their heartbeats."""
    table = Table(title="Workers", title_justify="left")
    table.add_column("worker", overflow="fold")
    table.add_column("host", overflow="fold")
    table.add_column("pid", justify="right")
    table.add_column("busy", justify="right")
    table.add_column("processed", justify="right")
    table.add_column("up", justify="right")
    table.add_column("heartbeat", justify="right")
    for w in stats.workers:
        up = "?" if w.started_ms is None else fmt_duration((stats.now_ms - w.started_ms) / 1000)
        table.add_row(
            escape(w.id),
            escape(w.host or "?"),
            fmt_count(w.pid),
            f"{fmt_count(w.running)}/{fmt_count(w.concurrency)}",
            fmt_count(w.processed),
            up,
            f"{fmt_duration(w.heartbeat_age)} ago",
        )
    return table


def status_tables(stats: admin.QueueStats) -> list[RenderableType]:
    """Everything ``drumbeat status`` shows, in order; listings that are empty are left out."""
    tables: list[RenderableType] = [summary_table(stats), priority_table(stats)]
    if stats.running:
        tables.append(running_table(stats))
    if stats.workers:
        tables.append(workers_table(stats))
    return tables


def schedule_table(stats: admin.ScheduleStats) -> Table:
    """Schedules and how late their runs started over the last minute (for ``status``).

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
    return table
