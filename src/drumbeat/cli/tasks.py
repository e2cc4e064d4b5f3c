"""Task names as the CLI takes them: a registered name, or its short name (``build`` for
``tasks.build``) when only one task has it, with a suggestion when the name matches none."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any

from drumbeat.app import App
from drumbeat.errors import UnknownTask
from drumbeat.task import Task

__all__ = ["UnknownTaskName", "matching_tasks", "resolve_task", "suggestions"]

#: How many registered names an error lists when none is close to the one given.
KNOWN_SHOWN = 10


class UnknownTaskName(UnknownTask):
    """The name matches no registered task, or the short names of several."""


def matching_tasks(names: Iterable[str], given: str) -> list[str]:
    """The registered names ``given`` stands for: itself if registered, else those it ends
    (``build`` and ``reports.build`` both stand for ``tasks.reports.build``), sorted."""
    names = list(names)
    if given in names:
        return [given]
    return sorted(name for name in names if name.endswith("." + given))


def resolve_task(app: App, given: str) -> Task[Any, Any]:
    """The task of ``app`` that ``given`` names (see `matching_tasks`).

    Raises:
        UnknownTaskName: if no task matches (with the close names, found by `difflib`), or if
            several do (with all of them).
    """
    found = matching_tasks(app.tasks, given)
    if len(found) == 1:
        return app.tasks[found[0]]
    if found:
        raise UnknownTaskName(
            f"task name {given!r} is ambiguous: it is the short name of {_either(found, 'and')}; "
            "give the full name"
        )
    close = suggestions(app.tasks, given)
    if close:
        hint = f"did you mean {_either(close, 'or')}?"
    elif app.tasks:
        known = sorted(app.tasks)
        more = f", ... ({len(known) - KNOWN_SHOWN} more)" if len(known) > KNOWN_SHOWN else ""
        hint = f"expected one of: {', '.join(known[:KNOWN_SHOWN])}{more}"
    else:
        hint = "the app registers no tasks at all"
    raise UnknownTaskName(f"the app registers no task named {given!r}; {hint}")


def suggestions(names: Iterable[str], given: str, n: int = 3) -> list[str]:
    """Registered names close to ``given``, by their full name or by their short name."""
    names = sorted(names)
    by_short: dict[str, list[str]] = {}
    for name in names:
        by_short.setdefault(name.rpartition(".")[2], []).append(name)
    close = difflib.get_close_matches(given, names, n=n)
    for short in difflib.get_close_matches(given.rpartition(".")[2], list(by_short), n=n):
        close += by_short[short]
    return list(dict.fromkeys(close))[: max(n, 1)]


def _either(names: list[str], conjunction: str) -> str:
    if len(names) == 1:
        return names[0]
    return f"{', '.join(names[:-1])} {conjunction} {names[-1]}"
