"""The front door and the docs: every relative link and image resolves to a file inside the
repository, README.md stays short and undated (dates live in docs/benchmarks.md and
bench/results/), torch-free."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README_MAX_LINES = 300

FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
CODE_SPAN = re.compile(r"(`+).+?\1", re.S)
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_LINK = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$", re.M)
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
PARENT_PATH = re.compile(r"(?<![\w./])(?:\.\./)+[\w./-]*")

MONTH = (r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?"
         r"|Sep(?:t(?:ember)?)?|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)")
YEAR = r"(?:19|20)\d{2}"
DATES = (
    re.compile(rf"\b{YEAR}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12]\d|3[01])\b"),  # 2026-11-29
    re.compile(rf"\b{YEAR}/(?:0[1-9]|1[0-2])/(?:0[1-9]|[12]\d|3[01])\b"),  # 2026/11/29
    re.compile(rf"\b{YEAR}-(?:0[1-9]|1[0-2])\b(?!-?\d)"),  # 2026-11
    re.compile(rf"\b{YEAR}(?:0[1-9]|1[0-2])(?:0[1-9]|[12]\d|3[01])T\d{{2,6}}Z?\b"),  # 20261129T140523Z
    re.compile(rf"\b{MONTH}\.?\s+(?:\d{{1,2}}(?:st|nd|rd|th)?,?\s+)?{YEAR}\b", re.I),  # November 29, 2026
    re.compile(rf"\b\d{{1,2}}(?:st|nd|rd|th)?\s+{MONTH}\.?,?\s+{YEAR}\b", re.I),  # 29 November 2026
)


def pages() -> list[Path]:
    found = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "bench" / "results" / "README.md"]
    return found + sorted((ROOT / "bench" / "results").glob("*/README.md"))


def link_targets(markdown: str) -> list[str]:
    """The targets of a page's inline links, images and reference definitions, outside code."""
    text = CODE_SPAN.sub("", FENCE.sub("", markdown))
    return INLINE_LINK.findall(text) + REFERENCE_LINK.findall(text)


def broken_links(page: Path, markdown: str) -> list[str]:
    """Relative targets that do not name a file or folder inside the repository."""
    problems = []
    for target in link_targets(markdown):
        if SCHEME.match(target) or target.startswith("#"):
            continue  # a web address or an anchor on the same page
        path = target.split("#", 1)[0].split("?", 1)[0]
        if path.startswith("/"):
            problems.append(f"{target}: an absolute path")
            continue
        resolved = (page.parent / path).resolve()
        if not resolved.is_relative_to(ROOT):
            problems.append(f"{target}: leaves the repository")
        elif not resolved.exists():
            problems.append(f"{target}: no such file")
    return problems


def paths_leaving(page: Path, markdown: str) -> list[str]:
    """`../` paths anywhere in a page, code included, that point outside the repository."""
    return [p for p in PARENT_PATH.findall(markdown) if not (page.parent / p).resolve().is_relative_to(ROOT)]


def dates_in(text: str) -> list[str]:
    return [m.group(0) for pattern in DATES for m in pattern.finditer(text)]


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves_inside_the_repository(page: Path):
    assert broken_links(page, page.read_text()) == []


@pytest.mark.parametrize("page", [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_the_front_door_and_the_docs_name_no_path_outside_the_repository(page: Path):
    # The dated history (bench/results/<day>/README.md) keeps its words as written; these pages may not.
    assert paths_leaving(page, page.read_text()) == []


def test_the_pages_link_the_docs_and_the_screenshot():
    assert len(pages()) >= 10
    readme = link_targets((ROOT / "README.md").read_text())
    assert "docs/screenshots/chat.png" in readme
    for doc in sorted((ROOT / "docs").glob("*.md")):
        assert f"docs/{doc.name}" in readme, doc.name


def test_readme_is_short_and_carries_no_date():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= README_MAX_LINES
    assert dates_in(text) == []


def test_the_checks_catch_what_they_are_for():
    page = ROOT / "README.md"
    assert broken_links(page, "See [design](../shared/DESIGN.md).") == ["../shared/DESIGN.md: leaves the repository"]
    assert broken_links(page, "![shot](docs/screenshots/none.png)") == ["docs/screenshots/none.png: no such file"]
    assert broken_links(page, "[x]: /etc/passwd") == ["/etc/passwd: an absolute path"]
    assert broken_links(page, "`[code](../nowhere.md)` and [web](https://example.org) and [top](#use)") == []
    assert paths_leaving(page, "See `../shared/DESIGN.md`: the layers.") == ["../shared/DESIGN.md"]
    assert paths_leaving(ROOT / "docs" / "x.md", "[results](../bench/results/README.md)") == []
    for dated in ("on 2026-11-29", "2026/11/29", "in 2026-11", "file-20261129T140523Z.json",
                  "November 29, 2026", "Nov 2026", "29 November 2026", "1st Dec. 2026"):
        assert dates_in(dated), dated
    for undated in ("batch 2048-wide", "1,060 tok/s", "Q4_K_M", "may 2 rows", "vLLM 0.11"):
        assert dates_in(undated) == [], undated
