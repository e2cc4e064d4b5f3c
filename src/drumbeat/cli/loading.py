"""The app a ``drumbeat`` command works on: the ``MODULE:APP`` argument, imported as uvicorn
imports its app (the current directory first on ``sys.path``), and closed when the command is done.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from collections.abc import Iterator
from typing import Annotated, Any

import typer

from drumbeat.app import App
from drumbeat.cli.errors import USAGE_ERROR, CliError, reported

__all__ = ["AppArg", "load_app", "opened"]

AppArg = Annotated[
    str,
    typer.Argument(
        metavar="MODULE:APP",
        help="Where the drumbeat.App lives, e.g. myproject.jobs:app"
        " (MODULE alone means MODULE:app).",
        show_default=False,
    ),
]


@contextlib.contextmanager
def opened(spec: str) -> Iterator[App]:
    """The app named by ``spec``, with its connections closed afterwards."""
    with reported():
        app = load_app(spec)
        try:
            yield app
        finally:
            app.close()


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
