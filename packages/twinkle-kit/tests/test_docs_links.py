"""Every relative link of the READMEs and of docs/ leads to a file inside the repository.

A user who clones the repository has nothing beside it, so a link that climbs above the
root (the old ``../shared/DESIGN.md``) or names a file that is not there is a dead link.
Links inside code (fenced blocks and inline spans) are examples, not links, and are skipped;
so are URLs with a scheme and links to an anchor of the same page.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
INLINE_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEFINITION = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.M)
HAS_SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)


def markdown_files() -> list[Path]:
    files = [ROOT / "README.md", *sorted(ROOT.glob("packages/*/README.md"))]
    return files + sorted((ROOT / "docs").rglob("*.md"))


def relative_links(text: str) -> list[str]:
    """The relative link targets of a Markdown text, without their #anchors."""
    text = CODE_SPAN.sub("", FENCE.sub("", text))
    targets = INLINE_LINK.findall(text) + REFERENCE_DEFINITION.findall(text)
    paths = [t.split("#", 1)[0] for t in targets if not HAS_SCHEME.match(t)]
    return [p for p in paths if p]


def broken(source: Path, target: str) -> str | None:
    """Why ``target``, linked from ``source``, is not a file inside the repository (None: it is)."""
    if target.startswith("/"):
        return "is absolute; write it relative to the file"
    resolved = (source.parent / target).resolve()
    if not resolved.is_relative_to(ROOT):
        return "leaves the repository"
    if not resolved.exists():
        return "names a file that does not exist"
    return None


def test_the_scanner_finds_links_and_skips_code() -> None:
    text = (
        "See [design](docs/architecture.md#modes), ![plot](img/a.png) and [web](https://x.org).\n"
        "[ref]: ../shared/DESIGN.md\n"
        "Inline `[not](a-link.md)` and a [same page](#top) anchor.\n"
        "```\n[also not](inside-a-fence.md)\n```\n"
    )
    assert relative_links(text) == ["docs/architecture.md", "img/a.png", "../shared/DESIGN.md"]


def test_a_link_above_the_root_or_to_a_missing_file_is_reported() -> None:
    readme = ROOT / "README.md"
    assert broken(readme, "../shared/DESIGN.md") == "leaves the repository"
    assert broken(readme, "docs/no-such-page.md") == "names a file that does not exist"
    assert broken(readme, "/etc/passwd") == "is absolute; write it relative to the file"
    assert broken(readme, "benchmarks/RESULTS.md") is None


def test_the_documents_are_scanned() -> None:
    names = {str(p.relative_to(ROOT)) for p in markdown_files()}
    assert {"README.md", "docs/index.md", "docs/architecture.md"} <= names
    assert "packages/twinkle-mesh/README.md" in names


@pytest.mark.parametrize("source", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves_inside_the_repository(source: Path) -> None:
    problems = [
        f"{target}: {why}"
        for target in relative_links(source.read_text(encoding="utf-8"))
        if (why := broken(source, target)) is not None
    ]
    assert not problems, f"{source.relative_to(ROOT)} has dead links:\n" + "\n".join(problems)


def test_the_readme_links_to_the_docs() -> None:
    links = relative_links((ROOT / "README.md").read_text(encoding="utf-8"))
    assert "docs/architecture.md" in links
    assert not any(link.startswith("../") for link in links)
