"""The documents speak of the product only, stay short where they are the way in, and link to what exists.

* README.md is at most :data:`README_MAX_LINES` lines: the guides live in ``docs/``.
* No development-process words (how, when or by whom the code was made, what machine a number came from) in
  README.md, ``docs/*.md``, the sample-data notes or the package's docstrings.
* Every relative link and image between README.md and ``docs/`` points at a file that exists (and, with a
  ``#fragment``, at a heading of it); every ``attnviz.…`` dotted name in backticks is importable.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
DOCUMENTS = [README, *DOCS]
SAMPLE_NOTES = sorted((ROOT / "attnviz" / "sample_data").rglob("*.md"))

README_MAX_LINES = 200

#: words that describe how the project was developed, not what the product does (matched case-insensitively)
PROCESS_WORDS = (
    "issue #",
    "the issue's",
    "against the issue",
    "this session",
    "the lead",
    "helper engineer",
    "ceo",
    "quiet machine",
    "loaded machine",
    "shared machine",
    "load average",
    "other jobs",
    "other agents",
    "the project's",
    "this project",
    "seed-style",
    "the seeds'",
    "we measured on",
    "measured here",
    "was lent",
)
_PROCESS_PATTERN = re.compile("|".join(rf"\b{re.escape(word)}(?!\w)" for word in PROCESS_WORDS), re.IGNORECASE)

_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
_DOTTED = re.compile(r"`(attnviz(?:\.[A-Za-z_][A-Za-z0-9_]*)+)")


def process_words(text: str) -> list[str]:
    return sorted({match.group(0) for match in _PROCESS_PATTERN.finditer(text)})


def docstrings(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            text = ast.get_docstring(node, clean=False)
            if text:
                found.append(text)
    return found


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower()).replace("_", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = _FENCE.sub("", path.read_text(encoding="utf-8"))
    return {slug(line.lstrip("#")) for line in text.splitlines() if re.match(r"#{1,6} ", line)}


def test_readme_is_short():
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines: move detail into docs/ (at most {README_MAX_LINES})"
    )


def test_docs_has_an_index_that_links_every_page():
    index = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    missing = [page.name for page in DOCS if page.name != "index.md" and f"({page.name}" not in index]
    assert missing == [], f"link these pages from docs/index.md: {missing}"


@pytest.mark.parametrize("path", DOCUMENTS + SAMPLE_NOTES, ids=lambda p: str(p.relative_to(ROOT)))
def test_documents_speak_of_the_product_only(path):
    assert process_words(path.read_text(encoding="utf-8")) == []


def test_docstrings_speak_of_the_product_only():
    offenders = {}
    for path in sorted((ROOT / "attnviz").rglob("*.py")):
        words = sorted({word for text in docstrings(path) for word in process_words(text)})
        if words:
            offenders[str(path.relative_to(ROOT))] = words
    assert offenders == {}


def test_the_word_list_finds_what_it_should():
    assert process_words("Measured on a quiet machine, against the issue's targets (the lead said so).") == [
        "against the issue",
        "quiet machine",
        "the lead",
    ]
    assert process_words("The leader head; a CEOs list; misleading") == []


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_and_images_exist(path):
    broken = []
    text = _FENCE.sub("", path.read_text(encoding="utf-8"))
    for target in _LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        file_part, _, fragment = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        if not linked.exists() or fragment and linked.suffix == ".md" and fragment not in anchors(linked):
            broken.append(target)
    assert broken == [], f"{path.name}: broken links {broken}"


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_named_modules_exist(path):
    missing = []
    for dotted in sorted(set(_DOTTED.findall(path.read_text(encoding="utf-8")))):
        if not resolves(dotted):
            missing.append(dotted)
    assert missing == [], f"{path.name} names modules or objects that do not exist: {missing}"


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_documents_use_no_deprecated_top_level_name(path):
    import attnviz

    named = set(re.findall(r"\battnviz\.([A-Za-z_]\w*)", path.read_text(encoding="utf-8")))  # prose and code
    assert sorted(named & set(attnviz._DEPRECATED)) == [], f"{path.name} names old top-level names of attnviz"


def resolves(dotted: str) -> bool:
    """Whether ``a.b.c`` is a module, or an attribute path below the longest importable module prefix."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for name in parts[cut:]:
                target = getattr(target, name)
        except AttributeError:
            return False
        return True
    return False
