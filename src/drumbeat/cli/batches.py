"""``drumbeat batches``: list the batches (open ones and recent ones) and show one."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from drumbeat import admin
from drumbeat.cli import redis_now_ms, shapes
from drumbeat.cli.errors import CliError
from drumbeat.cli.loading import AppArg, opened
from drumbeat.cli.shapes import json_option
from drumbeat.cli.tables import console, fixed, fmt_duration, listing, print_table
from drumbeat.errors import JobNotFound

__all__ = ["batches_cli"]

batches_cli = typer.Typer(
    help="List batches (open and recently ended) and show one: counts, failed members, callbacks.",
    no_args_is_help=True,
)

# The counts a batch shows, in order (a `BatchStatus` is a mapping of them).
_COUNTS = ("total", "pending", "succeeded", "failed", "cancelled")
# Failed ids `show` prints (a batch of 100,000 may have as many): --json gives them all.
_SHOWN_FAILED = 20

BatchIdArg = Annotated[
    str, typer.Argument(metavar="ID", help="The batch's id.", show_default=False)
]


def _ago(ms: int | None, now_ms: int) -> str:
    return "-" if ms is None else f"{fmt_duration(max(0, now_ms - ms) / 1000)} ago"


@batches_cli.command("ls")
def batches_ls(
    app_spec: AppArg,
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, help="Most batches to list.")] = 50,
    as_json: Annotated[
        bool,
        json_option(
            '{"batches": [{"id", "state", "ended", "total", "pending", "succeeded", "failed", '
            '"cancelled", "made_ms", "made_at", "ended_ms", "ended_at", "on_complete", '
            '"on_success"}]}, newest first'
        ),
    ] = False,
) -> None:
    """List batches, newest first: open ones, and ended ones until they are forgotten.

    Each with its state (open: members may be added; closed: members pending; ended;
    cancelled), its counts (total, pending, succeeded, failed, cancelled) and when it was made.
    An ended batch is listed until its record expires (Settings.result_ttl after its end, at
    least 10 minutes).
    """
    with opened(app_spec) as app:
        infos = admin.list_batches(app, limit)
        now_ms = redis_now_ms(app)
    if as_json:
        shapes.emit({"batches": [shapes.batch_json(info, failed=False) for info in infos]})
        return
    if not infos:
        console().print("no batches")
        return
    table = listing("Batches")
    fixed(table, "batch")
    fixed(table, "state")
    for header in _COUNTS:
        fixed(table, header, justify="right")
    fixed(table, "made", justify="right")
    for info in infos:
        counts = [str(info.status[name]) for name in _COUNTS]
        table.add_row(info.id, info.phase, *counts, _ago(info.made_ms, now_ms))
    print_table(table)


@batches_cli.command("show")
def batches_show(
    app_spec: AppArg,
    batch_id: BatchIdArg,
    as_json: Annotated[
        bool,
        json_option(
            '{"id", "state", "ended", "total", "pending", "succeeded", "failed", "cancelled", '
            '"made_ms", "made_at", "ended_ms", "ended_at", "on_complete", "on_success", '
            '"failed_ids"}'
        ),
    ] = False,
) -> None:
    """Show one batch: its state, counts, callbacks and failed members.

    The callbacks with their job status, and the ids of the members that did not succeed
    (dead-lettered or cancelled) in the order they ended: the first 20 (--json gives all).
    """
    with opened(app_spec) as app:
        try:
            info = admin.batch_info(app, batch_id)
        except JobNotFound as exc:
            raise CliError(str(exc)) from None
        callbacks = admin.batch_callbacks(app, info)
        now_ms = redis_now_ms(app)
    if as_json:
        shapes.emit(shapes.batch_json(info, failed=True))
        return
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    table.add_row("batch", info.id)
    table.add_row("state", info.phase)
    for name in _COUNTS:
        table.add_row(name, str(info.status[name]))
    table.add_row("made", _ago(info.made_ms, now_ms))
    if info.ended_ms is not None:
        table.add_row("ended", _ago(info.ended_ms, now_ms))
    for role in ("on_complete", "on_success"):
        job_id, state = callbacks.get(role, ("-", ""))
        table.add_row(role, f"{job_id} ({state})" if state else job_id)
    failed = ", ".join(info.failed_ids[:_SHOWN_FAILED]) or "-"
    more = len(info.failed_ids) - _SHOWN_FAILED
    if more > 0:
        failed += f" and {more} more (--json lists them all)"
    table.add_row("failed ids", escape(failed))
    print_table(table)
