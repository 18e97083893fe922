"""Every link to a section of the docs (`operations.md#prometheus-metrics`, `(#below)`) in
the README, docs/, ops/ and the package names a heading that is there, as GitHub makes
its anchors: a renamed section, or a link typed from memory, fails here rather than
leaving a reader at the top of a long page."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted(
    [
        ROOT / "README.md",
        *(ROOT / "docs").glob("*.md"),
        *(ROOT / "ops").iterdir(),
        *(ROOT / "mpbroker").rglob("*.py"),
        *(ROOT / "mpbroker").rglob("static/*"),
    ]
)
# A page and a section ("docs/operations.md#the-dashboard"), or a section of the same
# Markdown page ("](#the-dashboard)").
_LINK = re.compile(r"([\w./-]+\.md)#([\w-]+)")
_SAME_PAGE = re.compile(r"\]\(#([\w-]+)\)")
_HEADING = re.compile(r"#{1,6}\s+(.+?)\s*#*\s*$")


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped (a hyphen and an
    underscore kept), each space a hyphen."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_github_anchors() -> None:
    assert anchor("Prometheus metrics") == "prometheus-metrics"
    assert anchor("The data dir's partitions") == "the-data-dirs-partitions"
    assert anchor("`GET /metrics` and max_memory") == "get-metrics-and-max_memory"


def anchors(page: Path) -> set[str]:
    """The anchors of a Markdown page's headings (outside code blocks); a repeated
    heading's second anchor ends in -1, its third in -2."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    in_code = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            in_code = not in_code
            continue
        match = None if in_code else _HEADING.match(line)
        if match is None:
            continue
        name = anchor(match.group(1))
        repeats = seen.get(name, 0)
        seen[name] = repeats + 1
        found.add(name if repeats == 0 else f"{name}-{repeats}")
    return found


def links(source: Path) -> list[tuple[Path | None, str, str]]:
    """(the page it names, or None when no such page; the section; the link as written)
    for each link to a section in `source`. A page is looked for beside `source`, then
    from the repository's root (the package's texts name `docs/...`)."""
    text = source.read_text(encoding="utf-8")
    found: list[tuple[Path | None, str, str]] = []
    for match in _LINK.finditer(text):
        name, section = match.groups()
        candidates = (source.parent / name, ROOT / name)
        page = next((path for path in candidates if path.is_file()), None)
        found.append((page, section, match.group(0)))
    if source.suffix == ".md":
        found += [(source, section, f"#{section}") for section in _SAME_PAGE.findall(text)]
    return found


def test_every_link_to_a_section_names_one_that_is_there() -> None:
    broken = [
        f"{source.relative_to(ROOT)}: {written}"
        for source in SOURCES
        for page, section, written in links(source)
        if page is None or section not in anchors(page)
    ]
    assert broken == []
