"""The documentation's links resolve, and the README's two commands are the ones CI and the quickstart run."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

# [text](target) outside code; images too. Targets with a scheme are not checked (no network in tests).
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)

MAIN_JOB = ('python -m pip install "torch==2.13.0" -e ".[server,data]" && python -m hermes.deploy.testbed '
            '--clients 4 --profile hl8 --dataset digits --target-accuracy 0.9 --max-seconds 120 --out runs/quickstart')
TEST_INSTALL = 'python -m pip install "torch==2.13.0" -e ".[dev]"'
TEST_COMMAND = f"{TEST_INSTALL} && python -m pytest"


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for heading in HEADING.findall(FENCE.sub("", page.read_text())):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(page: Path) -> list[str]:
    text = INLINE_CODE.sub("", FENCE.sub("", page.read_text()))
    return LINK.findall(text)


def test_there_are_pages_and_links():
    assert (ROOT / "docs").is_dir() and len(PAGES) > 5
    assert sum(len(links(p)) for p in PAGES) > 50


def test_slug_matches_github():
    assert slug("Paper -> file") == "paper---file"
    assert slug("Presets: the other papers' systems on the same engine") == \
        "presets-the-other-papers-systems-on-the-same-engine"
    assert slug("Edge devices over SSH: `hermes-deploy`") == "edge-devices-over-ssh-hermes-deploy"
    assert slug("Batch sizing: compare_batching") == "batch-sizing-compare_batching"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path):
    broken = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading with anchor #{anchor} in {dest.name}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_readme_two_commands_are_what_ci_runs():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert MAIN_JOB in readme
    assert TEST_COMMAND in readme
    assert TEST_INSTALL in ci and "python -m pytest" in ci, ".ci/run must run the README's test command"
    assert MAIN_JOB in (ROOT / "docs" / "quickstart.md").read_text()


def test_readme_stays_a_front_page():
    assert len((ROOT / "README.md").read_text().splitlines()) < 150
