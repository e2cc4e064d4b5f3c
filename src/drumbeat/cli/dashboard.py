"""``drumbeat dashboard``: serve the web dashboard over one app (the optional extra
``drumbeat[dashboard]``)."""

from __future__ import annotations

from typing import Annotated

import typer

from drumbeat.cli import cli
from drumbeat.cli.errors import USAGE_ERROR, CliError, err, reported
from drumbeat.cli.loading import AppArg, load_app

__all__ = ["dashboard_command"]


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
    with reported():
        try:
            from drumbeat import dashboard  # noqa: PLC0415 - an optional extra
        except ImportError as exc:
            raise CliError(
                f"the dashboard needs the dashboard extra ({exc.name or exc} is missing): "
                "pip install 'drumbeat[dashboard]'"
            ) from None
        app = load_app(app_spec)
        try:
            dashboard.serve(app, host, port, read_only=read_only, announce=err().print)
        except dashboard.InsecureBind as exc:
            raise CliError(str(exc), USAGE_ERROR) from None
        finally:
            app.close()
