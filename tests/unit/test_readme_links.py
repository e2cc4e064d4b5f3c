"""The READMEs' relative links lead to files that exist: the docs site's strict build checks the
links of docs/, and nothing else reads the README's (it links into docs/ and bench/)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.mark.parametrize("readme", ["README.md", "bench/README.md"])
def test_every_relative_link_of_the_readme_exists(readme: str) -> None:
    source = ROOT / readme
    targets = [t.split("#")[0] for t in LINK.findall(source.read_text())]
    relative = [t for t in targets if t and not re.match(r"[a-z]+:", t)]
    assert relative, f"no relative link found in {readme}: has the link form changed?"
    missing = [t for t in relative if not (source.parent / t).exists()]
    assert missing == [], f"{readme} links to files that do not exist: {missing}"


def test_the_readme_keeps_the_commands_ci_runs() -> None:
    """.ci/run says it runs the README's commands; the README names them."""
    text = (ROOT / "README.md").read_text()
    for command in ("make demo", "make test", "make docs"):
        assert command in text, f"README.md no longer mentions `{command}`"
