"""The package's layering: modules stay short, keep their private names to themselves, and
import each other without cycles (GUIDE.md: one module per concept, readable top to bottom)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = SRC / "drumbeat"
MAX_LINES = 450

# Private names of other owners that a module may reach: (module, name) -> why.
_ALLOWED_PRIVATE = {
    ("drumbeat/cli/worker.py", "_exit"): "os._exit: the worker command leaves without "
    "waiting for threads a task left running",
    ("drumbeat/direct.py", "_parsers"): "redis-py's parser classes live in redis._parsers",
    ("drumbeat/worker/liveness.py", "_current_frames"): "sys._current_frames: the stacks of "
    "a stuck job's threads, for the log",
}


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _name(path: Path) -> str:
    return path.relative_to(SRC).as_posix()


def _dotted(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _source(path: Path, node: ast.ImportFrom) -> str:
    """The module a ``from ... import`` in ``path`` reads, its relative dots resolved."""
    if not node.level:
        return node.module or ""
    package = _dotted(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    base = package[: len(package) - node.level + 1]
    return ".".join([*base, node.module] if node.module else base)


def test_modules_are_short() -> None:
    long = {_name(p): n for p in _modules() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split them by concept): {long}"


def _own_names(tree: ast.AST) -> set[str]:
    """The private names a module defines: functions, classes, assignments (``self._x = ...``
    included) and parameters."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.alias):
            names.add((node.asname or node.name).split(".")[0])
    return {n for n in names if _private(n)}


def _private_uses(path: Path) -> set[tuple[str, str]]:
    """(module, name) for each private name of another module that ``path`` uses: imported
    from a drumbeat module, or read as an attribute of anything but ``self`` / ``cls``."""
    tree = ast.parse(path.read_text(), str(path))
    own = _own_names(tree)
    found: set[tuple[str, str]] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            source = _source(path, node)
            if source.split(".")[0] == "drumbeat":
                found |= {(_name(path), a.name) for a in node.names if _private(a.name)}
            elif any(_private(part) for part in source.split(".")):
                found.add((_name(path), next(p for p in source.split(".") if _private(p))))
        elif isinstance(node, ast.Attribute) and _private(node.attr):
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            if node.attr not in own:
                found.add((_name(path), node.attr))
    return found


def test_no_module_uses_another_modules_private_names() -> None:
    found = set().union(*(_private_uses(p) for p in _modules()))
    unexpected = sorted(found - set(_ALLOWED_PRIVATE))
    assert not unexpected, f"private names used across modules (name them publicly): {unexpected}"
    stale = sorted(set(_ALLOWED_PRIVATE) - found)
    assert not stale, f"allowlisted but no longer used, drop them: {stale}"


def _runtime_imports(path: Path) -> set[str]:
    """The drumbeat modules ``path`` imports when it runs: not under ``if TYPE_CHECKING:``;
    an import inside a function counts (it runs when the function does)."""
    tree = ast.parse(path.read_text(), str(path))
    skipped: set[int] = set()
    for node in ast.walk(tree):
        test = node.test if isinstance(node, ast.If) else None
        if test is not None and "TYPE_CHECKING" in ast.unparse(test):
            skipped |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            source = _source(path, node)
            found.add(source)
            # `from . import x` / `from .pkg import mod` import the submodule too.
            found |= {f"{source}.{a.name}" for a in node.names}
    known = {_dotted(p) for p in _modules()}
    me = _dotted(path)
    # A module's own packages are imported before it (`from . import x` names one).
    ancestors = {".".join(me.split(".")[:i]) for i in range(1, me.count(".") + 1)}
    return {m for m in found if m in known and m != me and m not in ancestors}


def _cycles() -> list[list[str]]:
    """The import cycles among drumbeat's modules (Tarjan's strongly connected components)."""
    graph = {_dotted(p): _runtime_imports(p) for p in _modules()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles() -> None:
    cycles = _cycles()
    if cycles:
        pytest.fail(f"modules that import each other at run time: {cycles}")
