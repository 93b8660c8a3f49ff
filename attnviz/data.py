"""Where analysis text comes from: ``--data`` files, ``--text`` options, or the shipped corpus.

A data file is plain text with one example per line (blank lines skipped), or
JSON Lines (``.jsonl``) with a ``text`` field on every line.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from attnviz.errors import InputError
from attnviz.io import read_text_file

#: The default corpus: a few hundred varied English sentences (see sample_data/README.md).
#: Looked up next to the package (a source checkout) and inside it (an installed wheel).
_CORPUS_CANDIDATES = (
    Path(__file__).resolve().parent.parent / "sample_data" / "corpus.txt",
    Path(__file__).resolve().parent / "sample_data" / "corpus.txt",
)


def default_corpus_path() -> Path:
    for path in _CORPUS_CANDIDATES:
        if path.is_file():
            return path
    raise InputError("the default corpus sample_data/corpus.txt is missing: give text with --data FILE or --text")


def read_examples(path: str | Path) -> list[str]:
    """Examples of a data file: one per non-blank line, or the ``text`` field of each JSONL line."""
    path = Path(path).expanduser()
    content = read_text_file(path, "data file")
    return parse_examples(content, f"data file {path}", str(path), jsonl=path.suffix.lower() in (".jsonl", ".ndjson"))


def examples_from_text(content: str, name: str = "standard input") -> list[str]:
    """Examples of text that comes without a file name (standard input): JSON Lines when it starts with ``{``."""
    first = next((line for line in content.splitlines() if line.strip()), "")
    return parse_examples(content, name, name, jsonl=first.lstrip().startswith("{"))


def parse_examples(content: str, what: str, where: str, *, jsonl: bool) -> list[str]:
    """Examples of ``content``; ``what`` names it in messages (``data file x``), ``where`` prefixes line numbers."""
    lines = [(number, line) for number, line in enumerate(content.splitlines(), start=1) if line.strip()]
    if not lines:
        raise InputError(f"{what} is empty: put one example per line")
    if jsonl:
        examples = []
        for number, line in lines:
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InputError(f"{where}:{number}: not valid JSON ({exc.msg})") from exc
            if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                raise InputError(f'{where}:{number}: each JSONL line needs a string "text" field')
            if record["text"].strip():
                examples.append(record["text"])
        if not examples:
            raise InputError(f"{what} has only empty texts")
        return examples
    return [line.strip() for _, line in lines]


def load_texts(data: str | Path | None = None, texts: Sequence[str] | None = None) -> list[str]:
    """Texts from ``--data`` and ``--text`` together; the default corpus when neither is given."""
    examples: list[str] = []
    if data is not None:
        examples.extend(read_examples(data))
    for text in texts or ():
        if not text.strip():
            raise InputError("a --text value is empty: give at least one word")
        examples.append(text)
    if data is None and not texts:
        examples = read_examples(default_corpus_path())
    return examples
