"""The lowest version of each runtime dependency pyproject.toml allows, for `make test-min-deps`.

``python .ci/lower_bounds.py``        prints a pip constraints file: ``name==<lower bound>`` per
                                      dependency (its own dependencies stay free: the newest).
``python .ci/lower_bounds.py check``  fails unless the running interpreter has exactly those
                                      versions installed, and prints them for the CI log.

Every dependency must have a ``>=`` bound that names a released version: ``==`` on it is what pip
installs, so a bound between releases fails loudly here instead of testing something else.
"""

from __future__ import annotations

import re
import sys
import tomllib
from importlib import metadata
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"
# name, optional [extras], ">=" bound, anything else (more specifiers), optional "; marker"
REQUIREMENT = re.compile(
    r"^\s*(?P<name>[A-Za-z0-9._-]+)\s*(?:\[[^\]]*\])?\s*>=\s*(?P<bound>[^\s,;]+)[^;]*(?P<marker>;.*)?$"
)


def lower_bounds() -> list[tuple[str, str, str]]:
    """(name, bound, marker) for every runtime dependency in pyproject.toml."""
    found = []
    for requirement in tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]:
        match = REQUIREMENT.match(requirement)
        if match is None:
            sys.exit(f"{PYPROJECT}: dependency {requirement!r} has no '>=' lower bound to test")
        found.append((match["name"], match["bound"], (match["marker"] or "").strip()))
    return found


def _release(version: str) -> str:
    """``0.26`` and ``0.26.0`` are one version to pip: drop trailing ``.0`` parts to compare."""
    return re.sub(r"(\.0)+$", "", version)


def main() -> None:
    if sys.argv[1:] == []:
        for name, bound, marker in lower_bounds():
            print(f"{name}=={bound}{' ' + marker if marker else ''}")
        return
    if sys.argv[1:] != ["check"]:
        sys.exit(f"usage: {sys.argv[0]} [check]")
    wrong = []
    for name, bound, marker in lower_bounds():
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            installed = "not installed"
            if marker:  # not for this platform
                print(f"  {name} {installed} ({marker})")
                continue
        same = _release(installed) == _release(bound)
        print(f"  {name} {installed}" + ("" if same else f" (lower bound {bound})"))
        if not same:
            wrong.append(name)
    if wrong:
        sys.exit(f"not at their lower bound: {', '.join(wrong)}; expected the versions above")


if __name__ == "__main__":
    main()
