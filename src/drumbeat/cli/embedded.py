"""``drumbeat redis``: the embedded Redis that ``App()`` uses when given no URL, shown, started
or stopped."""

from __future__ import annotations

import os
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from drumbeat import embedded
from drumbeat.cli import cli
from drumbeat.cli.errors import USAGE_ERROR, CliError, reported
from drumbeat.cli.tables import console, fmt_count

__all__ = ["redis_command"]


@cli.command("redis")
def redis_command(
    start: Annotated[bool, typer.Option("--start", help="Start it (or reuse it).")] = False,
    stop: Annotated[bool, typer.Option("--stop", help="Shut it down (AOF is fsynced).")] = False,
) -> None:
    """Show the embedded Redis that App() uses when given no URL; --start or --stop it.

    Its data directory is DRUMBEAT_HOME (default ~/.local/share/drumbeat).
    """
    out = console()
    with reported():
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
