"""``drumbeat queues``: list the queues with their state and counts, pause and resume one."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape

from drumbeat import admin
from drumbeat.cli import shapes
from drumbeat.cli.loading import AppArg, opened
from drumbeat.cli.shapes import json_option
from drumbeat.cli.tables import console, print_table, queues_table

__all__ = ["queues_cli"]

queues_cli = typer.Typer(
    help="List queues (paused or active, and what waits in each); pause and resume one.",
    no_args_is_help=True,
)

QueueArg = Annotated[
    str,
    typer.Argument(
        metavar="QUEUE", help='The queue\'s name ("default" for the default one).',
        show_default=False,
    ),
]  # fmt: skip


@queues_cli.command("ls")
def queues_ls(
    app_spec: AppArg,
    as_json: Annotated[
        bool,
        json_option(
            '{"queues": [{"name", "ready", "ready_by_priority", "delayed", "parked", '
            '"paused"}]}, the default queue first'
        ),
    ] = False,
) -> None:
    """List the queues: paused or active, and what waits in each.

    Every known queue and every paused one, the default one first: its ready jobs per
    priority, delayed and parked ones, as ``drumbeat status`` counts them.
    """
    with opened(app_spec) as app:
        stats = admin.queue_stats(app, running_limit=0)
    if as_json:
        shapes.emit({"queues": shapes.queues_json(stats)})
        return
    print_table(queues_table(stats))


@queues_cli.command("pause")
def queues_pause(app_spec: AppArg, queue: QueueArg) -> None:
    """Pause a queue for every worker, until it is resumed.

    Its jobs wait in order (for "default", schedule runs wait too); jobs running finish, and
    enqueues are still accepted.
    """
    with opened(app_spec) as app:
        changed = app.pause_queue(queue)
    note = "" if changed else " (it was paused already)"
    console().print(f"paused queue {escape(queue)}{note}")


@queues_cli.command("resume")
def queues_resume(app_spec: AppArg, queue: QueueArg) -> None:
    """Resume a paused queue: idle workers that serve it wake at once."""
    with opened(app_spec) as app:
        changed = app.resume_queue(queue)
    note = "" if changed else " (it was not paused)"
    console().print(f"resumed queue {escape(queue)}{note}")
