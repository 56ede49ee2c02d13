"""Every relative link in the repository's Markdown (README, docs/, hub cards, ComfyUI nodes) names a file that exists,
and a heading of it where the link names one."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted(
    {
        ROOT / "README.md",
        ROOT / "comfy_nodes" / "README.md",
        *(ROOT / "docs").rglob("*.md"),
        *(ROOT / "hub_cards").rglob("*.md"),
    }
)
# [text](target) and ![alt](target), with an optional "title"; <img src="target"> in inline HTML
INLINE = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.MULTILINE)
IMG_SRC = re.compile(r"<img[^>]*\ssrc=\"([^\"]+)\"", re.IGNORECASE)
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"`[^`\n]*`")


def relative_targets(text: str) -> list[str]:
    text = CODE_SPAN.sub("", FENCE.sub("", text))
    targets = INLINE.findall(text) + REFERENCE.findall(text) + IMG_SRC.findall(text)
    return [t for t in targets if not re.match(r"^([a-z][a-z0-9+.-]*:|#|/)", t, re.IGNORECASE)]


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    headings = re.findall(r"^#{1,6}\s+(.+?)\s*#*$", FENCE.sub("", page.read_text()), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


def broken(page: Path, target: str) -> bool:
    path, _, anchor = target.split("?")[0].partition("#")
    file = page.parent / path if path else page
    if not file.exists():
        return True
    return bool(anchor) and file.suffix == ".md" and anchor not in anchors(file)


def test_the_link_pattern_finds_links_and_skips_code_and_urls():
    text = "[a](docs/a.md#x) ![b](b.png) [c](https://x.org) [d](#top) `[e](e.md)`\n```\n[f](f.md)\n```\n[g]: g.md\n"
    assert relative_targets(text) == ["docs/a.md#x", "b.png", "g.md"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    missing = [target for target in relative_targets(page.read_text()) if broken(page, target)]
    assert not missing, f"{page.relative_to(ROOT)} links to files or headings that do not exist: {missing}"


def test_no_two_docs_share_a_title():
    """Each doc's H1 says what it is: two pages with one title (as three sweeps once had) cannot be told apart."""
    titles = {}
    for page in sorted((ROOT / "docs").rglob("*.md")):
        title = re.search(r"^# (.+)$", FENCE.sub("", page.read_text()), re.MULTILINE)
        titles.setdefault(title.group(1).strip() if title else None, []).append(str(page.relative_to(ROOT)))
    assert None not in titles, f"docs without a title: {titles.get(None)}"
    assert not {t: p for t, p in titles.items() if len(p) > 1}
