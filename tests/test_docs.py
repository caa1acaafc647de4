"""The README is the front page and docs/ holds the rest: every relative link resolves (file and #anchor), the
README stays short, it shows the commands CI runs, and docs/claims.md maps every claim to its experiment."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
README_LIMIT = 8000  # characters: what a newcomer reads first; the rest belongs on a docs/ page

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")  # [text](target) and ![alt](target)
FENCE = re.compile(r"^```.*?^```", re.S | re.M)  # links inside code blocks are not links
CODE = re.compile(r"`[^`\n]*`")


def links(text: str) -> list[str]:
    return LINK.findall(CODE.sub("", FENCE.sub("", text)))


def anchors(page: Path) -> set[str]:
    """GitHub's heading ids: lower case, punctuation dropped, spaces to hyphens, repeats numbered -1, -2, ..."""
    ids: set[str] = set()
    count: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*$", FENCE.sub("", page.read_text()), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        n = count[slug] = count.get(slug, -1) + 1
        ids.add(f"{slug}-{n}" if n else slug)
    return ids


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(page):
    broken = []
    for target in links(page.read_text()):
        if re.match(r"[a-z]+:", target):  # https:, mailto: — not checked offline
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target} (no heading #{anchor} in {dest.name})")
    assert not broken, f"{page.relative_to(REPO)}: " + "; ".join(broken)


def test_readme_is_short_and_links_every_docs_page():
    text = (REPO / "README.md").read_text()
    assert len(text) <= README_LIMIT, f"README.md has {len(text)} characters (limit {README_LIMIT}): move text to docs/"
    linked = {(REPO / t.partition("#")[0]).resolve() for t in links(text)}
    unlinked = [p.name for p in PAGES[1:] if p.resolve() not in linked]
    assert not unlinked, f"docs pages the README does not link: {unlinked}"


def test_readme_shows_the_commands_ci_runs():
    """.ci/run installs and tests "as the README says": the README must keep showing those exact commands."""
    readme = (REPO / "README.md").read_text()
    ci = (REPO / ".ci" / "run").read_text()
    assert 'pip install -e ".[dev]"' in ci and 'pip install -e ".[dev]"' in readme
    assert "python -m pytest -n 2\n" in ci and "\npython -m pytest -n 2 " in readme


def test_claims_page_maps_every_claim_to_its_module_and_config():
    claims = (REPO / "docs" / "claims.md").read_text()
    rows = {m[0]: m[1] for m in re.findall(r"^\| \[(E\d+)\]\(results\.md#e\d+\) \|(.*)$", claims, re.M)}
    modules = sorted((REPO / "experiments" / "claims").glob("e[0-9][0-9]_*.py"))
    assert modules
    for module in modules:
        cid = f"E{int(module.name[1:3])}"
        assert cid in rows and f"`{module.name}`" in rows[cid], f"docs/claims.md has no row naming {module.name}"
        for config in re.findall(r"`(e\d\d_\w+\.yaml)`", rows[cid]):
            assert (REPO / "conf" / "experiment" / config).exists(), f"docs/claims.md names a missing {config}"
    assert len(rows) == len(modules)
    # the claim list itself: every E id appears in the lecture notes' list
    for cid in rows:
        assert f"**{cid}:**" in claims or f"**{cid}.**" in claims, f"{cid} is not in the list of claims"
