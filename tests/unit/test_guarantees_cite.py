"""Every test `docs/guarantees.md` names as proof exists: a promise whose test was renamed or
removed would otherwise read as proven."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def cited() -> list[tuple[str, str]]:
    """(test file, test name) per citation; `::name` after a file names another test in it."""
    found: list[tuple[str, str]] = []
    path = ""  # the last file named (a citation may go on over a line break)
    for line in (ROOT / "docs" / "guarantees.md").read_text().splitlines():
        for m in re.finditer(r"`((?:tests/[\w/]+|[\w]+)\.py)?::(\w+)`", line):
            if m[1] and m[1].startswith("tests/"):
                path = m[1]
            elif m[1]:  # a bare file name: the tests directory that holds it
                [match] = [str(p.relative_to(ROOT)) for p in ROOT.glob(f"tests/**/{m[1]}")]
                path = match
            assert path, f"{m[0]} names no file before it: {line!r}"
            found.append((path, m[2]))
    return found


def test_every_test_the_guarantees_cite_exists() -> None:
    citations = cited()
    assert len(citations) > 20, "the citations were not found: has their form changed?"
    missing = [
        f"{path}::{name}"
        for path, name in citations
        if not re.search(rf"^(async )?def {name}\(", (ROOT / path).read_text(), re.M)
    ]
    assert missing == [], f"docs/guarantees.md cites tests that do not exist: {missing}"
