"""Every example of README.md and docs/*.md runs as written.

Each ```bash block (and the README's command table, whose examples run in order in one directory) runs in a new
empty directory through ``bash -e -o pipefail``, offline, with this environment's ``attnviz`` first on PATH. A block
preceded by ``<!-- not-run: reason -->`` is skipped with that reason (only what the CI machine cannot run: a GPU,
several machines, the network, the set-up itself); one preceded by ``<!-- ci-reduced: reason -->`` (too slow for CI
as written) runs in ``test_docs_reduced.py`` on a shorter input or a tiny model standing in. The test asserts exit status 0, that every
file the block names as an output exists, and that every file it wrote is valid for its kind (images load, JSON
parses, SVG and HTML are complete documents, safetensors files open, CSV has a header and rows).

attnviz's own cache is a hard-linked copy of the real one, so ``attnviz cache clear`` in an example frees nothing of
the user's and converted models need no new conversion.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from xml.etree import ElementTree

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: seconds one block may take
BLOCK_TIMEOUT = 600

_NOT_RUN = re.compile(r"<!--\s*not-run:\s*(.+?)\s*-->")
_CI_REDUCED = re.compile(r"<!--\s*ci-reduced:\s*(.+?)\s*-->")
_TABLE_START = "<!-- examples:"
_OUTPUT_OPTIONS = ("--out", "-o", "--json", "--csv", "--plot", "--similarity")
#: sample files copied by ``attnviz samples``: inputs, not outputs of the block
_SAMPLES = "sample_data"


@dataclass
class Example:
    document: Path
    line: int
    script: str
    skip: str | None = None
    reduced: str | None = None  # why CI runs it reduced (test_docs_reduced.py), None: as written

    @property
    def name(self) -> str:
        return f"{self.document.relative_to(ROOT)}:{self.line}"


def examples_of(document: Path) -> list[Example]:
    """The ```bash blocks of ``document`` and, in the README, the examples of its command table."""
    lines = document.read_text(encoding="utf-8").splitlines()
    found, index = [], 0
    while index < len(lines):
        line = lines[index]
        if line.strip() == "```bash":
            start = index
            index += 1
            body = []
            while index < len(lines) and lines[index].strip() != "```":
                body.append(lines[index])
                index += 1
            previous = next((lines[i] for i in range(start - 1, -1, -1) if lines[i].strip()), "")
            marker, reduced = _NOT_RUN.search(previous), _CI_REDUCED.search(previous)
            found.append(
                Example(
                    document,
                    start + 1,
                    "\n".join(body),
                    marker.group(1) if marker else None,
                    reduced.group(1) if reduced else None,
                )
            )
        elif line.startswith(_TABLE_START):
            rows = []
            index += 1
            while index < len(lines) and lines[index].startswith("|"):
                cells = [cell.strip() for cell in lines[index].strip("|").split("|")]
                code = re.fullmatch(r"`([^`]+)`", cells[2]) if len(cells) > 2 else None
                if code is not None:
                    rows.append(code.group(1))
                index += 1
            found.append(Example(document, index, "\n".join(rows)))
        index += 1
    return found


EXAMPLES = [example for document in DOCUMENTS for example in examples_of(document)]


def named_outputs(script: str) -> list[str]:
    """Files a script names as outputs: the values of output options and of ``> file`` redirections."""
    outputs = []
    for line in script.splitlines():
        line = line.split(" #", 1)[0]
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue
        for i, word in enumerate(words[:-1]):
            if word in _OUTPUT_OPTIONS or word == ">":
                outputs.append(words[i + 1])
        outputs.extend(word[1:] for word in words if word.startswith(">") and len(word) > 1 and word[1] != ">")
    return [path for path in outputs if path != "-" and not path.startswith(("&", ">", "<", "|", ";"))]


def check_file(path: Path) -> None:
    """Assert that ``path`` is a complete, valid file of its kind."""
    data = path.read_bytes()
    assert data, f"{path} is empty"
    suffix = path.suffix.lower()
    if suffix == ".png":
        from PIL import Image

        with Image.open(path) as image:
            image.load()
            assert min(image.size) >= 16, f"{path}: {image.size} pixels"  # a figure, or a small input image
    elif suffix == ".svg":
        assert ElementTree.fromstring(data).tag.endswith("svg")
    elif suffix == ".pdf":
        assert data.startswith(b"%PDF") and b"%%EOF" in data[-1024:]
    elif suffix == ".json":
        json.loads(data)
    elif suffix == ".jsonl":
        for line in data.decode("utf-8").splitlines():
            json.loads(line)
    elif suffix == ".csv":
        rows = list(csv.reader(data.decode("utf-8").splitlines()))
        assert len(rows) >= 2 and len(rows[0]) >= 2, f"{path}: {len(rows)} rows"
    elif suffix == ".html":
        text = data.decode("utf-8")
        assert "<html" in text.lower() and text.rstrip().lower().endswith("</html>"), f"{path} is not a whole page"
    elif suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(str(path), "pt") as tensors:
            assert list(tensors.keys()), f"{path} holds no tensors"
    elif suffix in (".txt", ".md"):
        data.decode("utf-8")


@pytest.fixture(scope="module")
def attnviz_cache():
    """A hard-linked copy of attnviz's cache (converted GGUF models), removed afterwards."""
    from attnviz.common.cache import cache_root

    real = cache_root()
    real.parent.mkdir(parents=True, exist_ok=True)
    copy = Path(tempfile.mkdtemp(prefix=".attnviz-docs-examples-", dir=real.parent))
    if (real / "gguf").is_dir():
        try:
            shutil.copytree(real / "gguf", copy / "gguf", copy_function=os.link)
        except OSError:  # another file system: the examples convert again
            shutil.rmtree(copy / "gguf", ignore_errors=True)
    yield copy
    shutil.rmtree(copy, ignore_errors=True)


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda example: example.name)
def test_example_runs_as_written(example, tmp_path, attnviz_cache):
    if example.skip is not None:
        pytest.skip(f"not-run: {example.skip}")
    if example.reduced is not None:
        pytest.skip(f"runs reduced in test_docs_reduced.py: {example.reduced}")
    run_example(example.name, example.script, tmp_path, attnviz_cache)


def run_example(
    name: str, script: str, cwd: Path, cache: Path, *, absent: tuple[str, ...] = ()
) -> subprocess.CompletedProcess:
    """Run ``script`` in ``cwd`` as a user would; assert that it succeeds, that it wrote every output it names
    but those in ``absent`` (outputs of commands shown being refused), and that what it wrote is valid."""
    environment = dict(os.environ)
    environment["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{environment.get('PATH', '')}"
    environment.update(HF_HUB_OFFLINE="1", ATTNVIZ_CACHE=str(cache), COLUMNS="120")
    before = set(cwd.rglob("*"))
    result = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", script],
        check=False,
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        timeout=BLOCK_TIMEOUT,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, (
        f"{name} failed ({result.returncode}):\n{script}\n--- stderr:\n{result.stderr[-3000:]}"
    )
    for output in named_outputs(script):
        if output in absent:
            assert not (cwd / output).exists(), f"{name}: {output} was written by a refused command"
        else:
            assert (cwd / output).exists(), f"{name}: {output} was not written"
    written = [
        path
        for path in cwd.rglob("*")
        if path.is_file() and path not in before and _SAMPLES not in path.relative_to(cwd).parts
    ]
    for path in written:
        check_file(path)
    return result


def test_examples_are_found():
    """The collector sees the README's blocks, its command table and the skip markers."""
    readme = [example for example in EXAMPLES if example.document.name == "README.md"]
    assert any("attnviz samples" in example.script.splitlines()[0] for example in readme)  # the command table
    assert any(example.skip for example in readme)  # the set-up commands
    assert all(example.script.strip() for example in EXAMPLES)
    assert named_outputs('attnviz x --out a.png --json - > b.json && attnviz y --plot "c d.svg" # --csv e.csv') == [
        "a.png",
        "b.json",
        "c d.svg",
    ]
    assert named_outputs("attnviz env --json > env.json") == ["env.json"]
