"""Every relative link in README.md and docs/*.md resolves: the file exists and, for a link with
an anchor, the target has a heading with that GitHub-style slug (issue 19, item 5)."""

from __future__ import annotations

import re
import unicodedata
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# [text](target) and ![alt](target), with an optional "title"; not inside code.
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")


def prose(text: str) -> str:
    """`text` without fenced code blocks and inline code, where links are not links."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LNM")
    return kept.replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    """The heading anchors of a markdown file (a repeated heading gets -1, -2, ...)."""
    seen: dict[str, int] = {}
    found = set(re.findall(r"<a\s+(?:name|id)=\"([^\"]+)\"", path.read_text()))
    for line in FENCE.sub("", path.read_text()).splitlines():
        heading = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading:
            base = slug(heading[1])
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return frozenset(found)


def relative_links(path: Path) -> list[str]:
    return [
        target
        for target in LINK.findall(prose(path.read_text()))
        if not re.match(r"[a-zA-Z][a-zA-Z+.-]*:", target)  # http:, https:, mailto:
    ]


def test_the_slugs_are_github_s():
    assert slug("Overload (after the queued-path rewrite)") == (
        "overload-after-the-queued-path-rewrite"
    )
    assert slug("Where the middleware goes: inside `setup_webserver()`") == (
        "where-the-middleware-goes-inside-setup_webserver"
    )
    assert slug("Limits that move (`adaptive.py`)") == "limits-that-move-adaptivepy"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(doc: Path):
    broken = []
    for target in relative_links(doc):
        path, _, anchor = target.partition("#")
        destination = (doc.parent / path).resolve() if path else doc
        if not destination.exists():
            broken.append(f"{target}: no file {destination.relative_to(ROOT)}")
        elif anchor and destination.suffix == ".md" and anchor not in anchors(destination):
            broken.append(f"{target}: no heading #{anchor} in {destination.relative_to(ROOT)}")
    assert not broken, "\n".join(broken)


def test_links_are_found():
    # The check above cannot pass by finding nothing.
    links = [link for doc in DOCS for link in relative_links(doc)]
    assert len(links) > 50
    assert "performance.md#limits-that-move" in links
