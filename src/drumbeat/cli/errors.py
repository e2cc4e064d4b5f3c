"""How a ``drumbeat`` command fails: what a user can cause or fix (a bad argument, an app that
does not import, Redis out of reach) is one red line on stderr and an exit code, not a traceback.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import redis
import typer
from rich.console import Console
from rich.markup import escape

from drumbeat.cli.tasks import UnknownTaskName
from drumbeat.errors import DrumbeatError, InvalidJob

__all__ = ["USAGE_ERROR", "CliError", "err", "fail", "reported"]

USAGE_ERROR = 2  # what click uses for bad arguments


class CliError(Exception):
    """A failure the CLI reports as one line, exiting with ``code``."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


def err() -> Console:
    """A console on stderr, for errors and notes beside a command's output."""
    return Console(stderr=True, highlight=False)


def fail(message: str, code: int) -> typer.Exit:
    """Prints ``message`` as one red line; the exit to raise, with ``code``."""
    err().print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)
    return typer.Exit(code)


@contextlib.contextmanager
def reported() -> Iterator[None]:
    """Turns the errors a user can cause or fix into one red line and an exit code."""
    try:
        yield
    except CliError as exc:
        raise fail(exc.message, exc.code) from None
    except UnknownTaskName as exc:
        raise fail(str(exc), USAGE_ERROR) from None
    except InvalidJob as exc:  # a bad argument to enqueue: a usage error
        raise fail(str(exc), USAGE_ERROR) from None
    except DrumbeatError as exc:
        raise fail(str(exc), 1) from None
    except redis.ConnectionError as exc:
        raise fail(f"cannot connect to Redis: {exc}", 1) from None
    except redis.RedisError as exc:
        raise fail(f"Redis error: {exc}", 1) from None
    except redis.exceptions.RedisClusterException as exc:  # not a RedisError; says what failed
        raise fail(str(exc), 1) from None
    except ValueError as exc:
        raise fail(str(exc), 1) from None
