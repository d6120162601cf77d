"""The README stays an entry point and the documentation's links hold, without building the site.

`make docs` builds the site with `mkdocs build --strict`, which checks the pages it renders; these
checks are cheap enough for every test run and also cover README.md, which the site leaves out.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
README_MAX_LINES = 250
"""The README is where a newcomer starts: the core in a screen or two, the rest in docs/."""

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"(`+).+?\1", re.DOTALL)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)
"""A scheme (https:, mailto:): not a file of this checkout."""


def relative_links(markdown: str) -> list[str]:
    """The targets of the Markdown links and images that point into the checkout, anchors cut
    off; code (fenced blocks, inline spans) holds examples, not links."""
    text = INLINE_CODE.sub("", FENCE.sub("", markdown))
    targets = []
    for target in LINK.findall(text):
        if EXTERNAL.match(target) or target.startswith("#"):
            continue
        targets.append(target.split("#", 1)[0])
    return targets


def broken_links(page: Path) -> list[str]:
    return [target for target in relative_links(page.read_text(encoding="utf-8"))
            if not (page.parent / target).exists()]


def pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def test_the_readme_stays_short() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines, at most {README_MAX_LINES}: move detail to docs/")


def test_the_readme_names_the_test_command_ci_runs() -> None:
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "make test" in ci
    assert "make test" in README.read_text(encoding="utf-8")


@pytest.mark.parametrize("page", pages(), ids=lambda page: page.relative_to(ROOT).as_posix())
def test_every_relative_link_points_to_a_file_that_exists(page: Path) -> None:
    assert broken_links(page) == []


def test_the_readme_links_every_docs_page() -> None:
    linked = {(README.parent / target).resolve() for target in relative_links(
        README.read_text(encoding="utf-8"))}
    missing = [p.name for p in sorted(DOCS.glob("*.md"))
               if p.name != "index.md" and p.resolve() not in linked]
    assert missing == []


def test_every_docs_page_is_in_the_site_navigation() -> None:
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8").split("\nnav:", 1)[1]
    listed = set(re.findall(r":\s*([\w./-]+\.md)\s*$", nav, re.MULTILINE))
    assert sorted(p.name for p in DOCS.glob("*.md") if p.name not in listed) == []


def test_links_are_found_outside_code_and_checked(tmp_path: Path) -> None:
    (tmp_path / "there.md").write_text("# there\n")
    page = tmp_path / "page.md"
    page.write_text(
        "See [there](there.md#a-section), [gone](gone.md), ![a plot](images/plot.png),\n"
        "[the web](https://example.org/x.md) and [this page](#top).\n"
        "`[not a link](inline.md)`\n"
        "```\n[not a link either](fenced.md)\n```\n", encoding="utf-8")
    assert relative_links(page.read_text(encoding="utf-8")) == [
        "there.md", "gone.md", "images/plot.png"]
    assert broken_links(page) == ["gone.md", "images/plot.png"]
