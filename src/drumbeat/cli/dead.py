"""``drumbeat dead``: list, retry and purge dead-lettered jobs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

import typer
from rich.console import RenderableType
from rich.markup import escape
from rich.table import Table

from drumbeat import admin
from drumbeat.cli import redis_now_ms, shapes
from drumbeat.cli.errors import USAGE_ERROR, CliError, err, reported
from drumbeat.cli.loading import AppArg, opened
from drumbeat.cli.shapes import json_option
from drumbeat.cli.tables import (
    ERROR_WIDTH,
    WideOpt,
    console,
    fixed,
    flexible,
    fmt_count,
    fmt_duration,
    listing,
    one_line,
    print_table,
    progress_cell,
)

__all__ = ["dead_cli"]

dead_cli = typer.Typer(
    help="Inspect, retry and purge dead-lettered jobs.",
    no_args_is_help=True,
)

IdsArg = Annotated[
    list[str] | None,
    typer.Argument(metavar="IDS", help="Job ids.", show_default=False),
]
AllOpt = Annotated[bool, typer.Option("--all", help="Every dead letter.")]


def _targets(ids: Sequence[str] | None, all_: bool, verb: str) -> list[str] | None:
    if ids and all_:
        raise CliError("give job ids or --all, not both", USAGE_ERROR)
    if not ids and not all_:
        raise CliError(
            f"nothing to {verb}: give the ids of the dead letters, or --all for every one",
            USAGE_ERROR,
        )
    return None if all_ else list(ids or [])


@dead_cli.command("ls")
def dead_ls(
    app_spec: AppArg,
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, help="Most entries to list.")] = 50,
    tracebacks: Annotated[
        bool, typer.Option("--traceback", "-t", help="Also print each failure's traceback.")
    ] = False,
    wide: WideOpt = False,
    as_json: Annotated[
        bool,
        json_option(
            '{"total", "dead_letters": [{"id", "task", "died_ms", "died_at", "attempt", '
            '"error", "traceback", "progress"}]}, newest first; total counts every dead letter'
        ),
    ] = False,
) -> None:
    """List dead letters, newest first: their id, how long ago they died, their task and error.

    --wide adds the time of death (UTC), the attempt and the saved progress; errors show
    their first 60 characters, --traceback and --json all of it.
    """
    with opened(app_spec) as app:
        letters = admin.dead_letters(app, limit)
        total = admin.dead_count(app)
        now_ms = redis_now_ms(app)
    if as_json:
        shapes.emit(shapes.dead_letters_json(letters, total))
        return
    if not letters:
        console().print("no dead letters")
        return
    print_table(_dead_table(letters, total, now_ms, wide=wide), wide=wide)
    if tracebacks:
        out = console()
        for letter in letters:
            if letter.traceback:
                out.rule(f"{letter.id} ({escape(letter.task)})")
                out.print(escape(letter.traceback.rstrip()), soft_wrap=True)


def _dead_table(letters: list[admin.DeadLetter], total: int, now_ms: int, *, wide: bool) -> Table:
    title = "Dead letters" + (
        f" (newest {len(letters)} of {total})" if total > len(letters) else ""
    )
    table = listing(title)
    fixed(table, "job")
    if wide:
        fixed(table, "died (UTC)")
    else:
        fixed(table, "died", justify="right")
    flexible(table, "task")
    if wide:
        fixed(table, "attempt", justify="right")
    flexible(table, "error", max_width=ERROR_WIDTH)
    if wide:
        flexible(table, "progress")
    for letter in letters:
        if wide:
            died = letter.died_at.strftime("%Y-%m-%d %H:%M:%S")
            cells: list[RenderableType] = [died, one_line(letter.task), fmt_count(letter.attempt)]
        else:
            ago = f"{fmt_duration(max(0, now_ms - letter.died_ms) / 1000)} ago"
            cells = [ago, one_line(letter.task)]
        cells.append(one_line(letter.error))
        if wide:
            cells.append(progress_cell(letter.progress))
        table.add_row(letter.id, *cells)
    return table


@dead_cli.command("retry")
def dead_retry(app_spec: AppArg, ids: IdsArg = None, all_: AllOpt = False) -> None:
    """Requeue dead letters with a fresh set of attempts.

    The dependents that a retried job dead-lettered (its dependency failed) come back to wait
    for it, counted apart: they run once it completed. A batch member counts in its batch
    again, unless the batch already ended: it is not reopened, the job runs outside it
    (docs/workflows.md).
    """
    with reported():
        targets = _targets(ids, all_, "retry")
    with opened(app_spec) as app:
        revived = admin.retry_dead(app, targets)
    n, back = revived.jobs, revived.dependents
    said = f"requeued {n} job{'s' if n != 1 else ''}"
    if back:
        said += f" and {back} dependent{'s' if back != 1 else ''} that were dead-lettered with them"
        said += " (back to wait for them)"
    console().print(said)
    if revived.outside_batch:
        err().print(
            f"[yellow]note:[/] {revived.outside_batch} of them were members of a batch that had "
            "already ended (or was cancelled): it is not reopened, they run outside its counts "
            "and callbacks",
            soft_wrap=True,
        )
    if targets is not None and n < len(set(targets)):
        _skipped(len(set(targets)) - n, "requeued")


@dead_cli.command("purge")
def dead_purge(
    app_spec: AppArg,
    ids: IdsArg = None,
    all_: AllOpt = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
) -> None:
    """Delete dead letters for good (asks first unless --yes)."""
    with reported():
        targets = _targets(ids, all_, "purge")
    with opened(app_spec) as app:
        count = admin.dead_count(app) if targets is None else len(set(targets))
        if count == 0:
            console().print("no dead letters")
            return
        if not yes:
            what = f"all {count} dead letters" if targets is None else f"{count} dead letter(s)"
            typer.confirm(f"Delete {what} for good?", abort=True)
        n = admin.purge_dead(app, targets)
    console().print(f"purged {n} job{'s' if n != 1 else ''}")
    if targets is not None and n < len(set(targets)):
        _skipped(len(set(targets)) - n, "purged")


def _skipped(n: int, verb: str) -> None:
    err().print(
        f"[yellow]note:[/] {n} id(s) were not {verb}: not in the dead-letter set"
        + (
            " (or without a job record, or back to wait for a dependency retried with it)"
            if verb == "requeued"
            else ""
        ),
        soft_wrap=True,
    )
