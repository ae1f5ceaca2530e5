"""The code cites the docs pages (``docs/...md#anchor``), never a document outside the repository: every cited page
exists and every cited anchor is a heading of that page."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CITE = re.compile(r"docs/[\w/.-]+?\.md(?:#[\w-]+)?")


def slug(heading: str) -> str:
    """MkDocs' (Python-Markdown toc) anchor of a heading: lowercase, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\s-]", "", heading.strip().lower())
    return re.sub(r"[\s]+", "-", text)


def anchors(page: Path) -> set[str]:
    out = set()
    for line in page.read_text().splitlines():
        m = re.match(r"#{1,6}\s+(.*?)\s*(\{\s*#([\w-]+)\s*\})?\s*$", line)
        if m:
            out.add(m.group(3) or slug(m.group(1)))
    return out


def citations() -> list[tuple[str, str]]:
    found = []
    for path in sorted((ROOT / "ctrl_rl").rglob("*.py")):
        for cite in CITE.findall(path.read_text()):
            found.append((str(path.relative_to(ROOT)), cite))
    return found


def test_the_code_cites_no_document_outside_the_repository():
    stale = [str(p.relative_to(ROOT)) for p in (ROOT / "ctrl_rl").rglob("*.py") if "ALGORITHMS.md" in p.read_text()]
    assert not stale, f"files citing ALGORITHMS.md (not in the repository): {stale}"


def test_every_cited_page_and_anchor_exists():
    cites = citations()
    assert len(cites) > 20  # the algorithm files cite their pages
    bad = []
    for where, cite in cites:
        page, _, anchor = cite.partition("#")
        target = ROOT / page
        if not target.is_file():
            bad.append(f"{where}: {cite} (no such page)")
        elif anchor and anchor not in anchors(target):
            bad.append(f"{where}: {cite} (no such heading)")
    assert not bad, "stale docs citations: " + "; ".join(bad)


def test_slug_matches_mkdocs():
    assert slug("NeuBay's model") == "neubays-model"
    assert slug("The batch update") == "the-batch-update"
