"""Every link in the README and docs/ reaches a file of the repository, and every `#anchor` a
heading of it; so does every `docs/<page>.md#<anchor>` that the code cites."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *ROOT.glob("benchmarks/*/*.md")])
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
CITED = re.compile(r"docs/([\w-]+\.md)(?:#([\w-]+))?")


def _prose(text: str) -> str:
    """`text` without its fenced code blocks."""
    return re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)


def slugs(page: Path) -> set[str]:
    """The anchors GitHub gives the headings of `page`: lower case, punctuation dropped, spaces
    to hyphens, a repeated one numbered."""
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6} +(.+?) *$", _prose(page.read_text()), flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        seen[slug] = seen.get(slug, -1) + 1
        if seen[slug]:
            seen[f"{slug}-{seen[slug]}"] = 0
    return set(seen)


def test_slugs_follow_github():
    page = ROOT / "docs" / "strategies.md"
    assert {
        "a-deadlock-of-jaxlib-010-on-few-cpu-devices",
        "auto-keeps-its-own-executables",
        "pymcs-100-host-devices",
        "chunk-target-bytes",
    } <= slugs(page)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_reach_files_and_headings(page):
    broken = []
    for target in LINK.findall(_prose(page.read_text())):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        where = (page.parent / path).resolve() if path else page
        if not where.exists():
            broken.append(f"{target}: no such file")
        elif anchor and where.suffix == ".md" and anchor not in slugs(where):
            broken.append(f"{target}: no such heading")
    assert broken == []


def test_pages_the_code_cites_exist():
    broken = []
    sources = [*ROOT.glob("pymc_chunkpost/**/*.py"), *ROOT.glob("benchmarks/*.py")]
    sources += [*ROOT.glob("tests/*.py"), *ROOT.glob("profiling/*.py")]
    for source in sources:
        for name, anchor in CITED.findall(source.read_text()):
            page = ROOT / "docs" / name
            if not page.exists():
                broken.append(f"{source.relative_to(ROOT)}: docs/{name}")
            elif anchor and anchor not in slugs(page):
                broken.append(f"{source.relative_to(ROOT)}: docs/{name}#{anchor}")
    assert broken == []
