"""The documentation's shape: a short README that links out, and no broken relative links.

README.md stays a front page (what skv is, the two commands, a quick tour, the layout, links);
topics live in docs/ (one file each) or in the README of the folder they describe
(benchmarks/README.md). Every relative markdown link in those files must name a file or folder
that exists; anchors (``#...``) are not checked, and links inside code are not links.
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README_MAX_LINES = 300

LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.DOTALL | re.MULTILINE)
INLINE_CODE = re.compile(r"`[^`\n]*`")


def doc_files() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "ARTIFACT.md", ROOT / "benchmarks" / "README.md"]
    return files + sorted((ROOT / "docs").glob("*.md"))


def relative_links(text: str) -> list[str]:
    text = INLINE_CODE.sub("", FENCE.sub("", text))
    out = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE) or target.startswith("#"):
            continue  # http(s):, mailto:, ... and anchors in the same file
        out.append(target)
    return out


def test_relative_links_parsed():
    text = "[a](docs/x.md#sec) `[b](no.md)` [c](https://x.org) [d](#top)\n```\n[e](no.md)\n```\n"
    assert relative_links(text) == ["docs/x.md#sec"]


def test_readme_is_short():
    n = len((ROOT / "README.md").read_text().splitlines())
    assert n <= README_MAX_LINES, (
        f"README.md has {n} lines (at most {README_MAX_LINES}): move long explanations to docs/ "
        "(one file per topic) or to the README of the folder they describe, and link them"
    )


def test_readme_keeps_the_commands():
    text = (ROOT / "README.md").read_text()
    # CI reads the test command from README.md
    assert "./reproduce.sh test" in text
    assert re.search(r"^\./reproduce\.sh\s", text, re.MULTILINE)


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path: Path):
    assert path.is_file(), f"{path.relative_to(ROOT)} is missing"
    broken = []
    for target in relative_links(path.read_text()):
        file_part = target.split("#", 1)[0]
        if file_part and not (path.parent / file_part).exists():
            broken.append(target)
    assert not broken, f"{path.relative_to(ROOT)}: links to missing files: {broken}"


def test_every_doc_is_linked_from_readme():
    links = {
        (ROOT / t.split("#", 1)[0]).resolve()
        for t in relative_links((ROOT / "README.md").read_text())
    }
    orphans = [
        str(p.relative_to(ROOT))
        for p in [*sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks" / "README.md"]
        if p.resolve() not in links
    ]
    assert not orphans, f"not linked from README.md's Further reading: {orphans}"
