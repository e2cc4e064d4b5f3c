"""`bench/results/` keeps what the docs cite, and every cited report says how to reproduce it."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results"
DOCS = [REPO / "README.md", REPO / "bench" / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
CITED = re.compile(r"bench/results/([\w.-]*\w)")
RUN = re.compile(
    r"(?:core|periodic|cluster-periodic|cluster-jobs|schedule-memory|checkpoints|elastic|limits"
    r"|dashboard|workflows-peers)"
    r"-(?:quick-)?\d{8}T\d{6}Z"
)
SOURCE = re.compile(r"\((periodic-\d{8}T\d{6}Z\.json)\)")
"""How a report rebuilt with ``bench.periodic --render`` names each run it was rebuilt from."""


def _cited() -> dict[str, list[str]]:
    """Results file name -> the docs that cite it."""
    found: dict[str, list[str]] = {}
    for doc in DOCS:
        for name in CITED.findall(doc.read_text()):
            found.setdefault(name, []).append(str(doc.relative_to(REPO)))
    return found


def _reports() -> list[Path]:
    return [RESULTS / name for name in _cited() if name.endswith(".md")]


def _sources(report: Path) -> list[str]:
    return SOURCE.findall(report.read_text()) if report.exists() else []


def test_every_results_file_the_docs_cite_exists() -> None:
    cited = _cited()
    assert cited, f"no bench/results/ path found in {[str(d) for d in DOCS]}: did the pattern rot?"
    missing = {name: docs for name, docs in cited.items() if not (RESULTS / name).is_file()}
    assert not missing, f"cited but not in bench/results/ (file: citing docs): {missing}"


def test_every_cited_report_states_the_command_that_reproduces_it() -> None:
    for report in _reports():
        lines = report.read_text().splitlines()
        commands = [x for x in lines if x.startswith("- command: `") and x.endswith("`")]
        assert len(commands) == 1, f"{report.name}: expected one '- command: `...`' line"
        # one command: a list of the commands of several runs does not rebuild a combined report
        assert commands[0].count(" -m bench.") == 1, (
            f"{report.name}: expected the one command that reproduces it, got {commands[0]}"
        )
        if "--render" in commands[0]:
            named = re.findall(r"bench/results/(\S+\.json)", commands[0])
            assert named == _sources(report), (
                f"{report.name}: its --render command names {named}, its header lists "
                f"{_sources(report)} as the runs it was rendered from"
            )


def test_a_rendered_report_keeps_the_runs_it_was_rendered_from() -> None:
    missing = {
        report.name: [s for s in _sources(report) if not (RESULTS / s).is_file()]
        for report in _reports()
    }
    missing = {k: v for k, v in missing.items() if v}
    assert not missing, f"--render needs these result files, which are gone: {missing}"


def _git_ls_results() -> str | None:
    """NUL-separated paths committed under bench/results/, or None outside a git checkout."""
    git = shutil.which("git")
    if git is None:
        return None
    argv = [git, "-C", str(REPO), "ls-files", "-z", "bench/results"]
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)
    return done.stdout if done.returncode == 0 else None


def test_results_keeps_the_cited_runs_and_nothing_else() -> None:
    listed = _git_ls_results()
    if listed is None:
        pytest.skip("not a git checkout: which results files are committed is unknown")
    tracked = {Path(p).name for p in listed.split("\0") if p}
    cited = set(_cited())
    untracked = sorted(cited - tracked)
    assert not untracked, (
        f"cited but not committed (results/ is git-ignored: git add -f): {untracked}"
    )
    runs = {RUN.match(name) for name in cited | {s for r in _reports() for s in _sources(r)}}
    kept = {m.group() for m in runs if m}
    orphans = sorted(
        name
        for name in tracked - {".gitignore", ".gitkeep"}
        if not ((m := RUN.match(name)) and m.group() in kept)
    )
    assert not orphans, f"committed in bench/results/ but cited nowhere: {orphans}"
