"""Where analysis text comes from: ``--data`` files, ``--text`` options, or the shipped corpus.

A data file is plain text with one example per line (blank lines skipped), or
JSON Lines (``.jsonl``) with a ``text`` field on every line.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from attnviz.common.encoding import check_utf8, read_text
from attnviz.common.errors import InputError, ParameterError

#: Folder of the data shipped inside the package (read with importlib.resources, so it works installed).
SAMPLE_DATA = "sample_data"


def sample_data_path(*parts: str) -> Path:
    """A file or folder shipped in ``attnviz/sample_data`` (the corpus, the toy checkpoints).

    The package is installed as plain files (a wheel or an editable checkout), so the resource is
    a real path that the loaders can open directly.
    """
    return Path(str(resources.files("attnviz").joinpath(SAMPLE_DATA, *parts)))


def default_corpus_path() -> Path:
    """The default corpus: a few hundred varied English sentences (see sample_data/README.md)."""
    path = sample_data_path("corpus.txt")
    if not path.is_file():
        raise InputError(f"the default corpus {path} is missing from the installed package: reinstall attnviz")
    return path


def read_examples(path: str | Path) -> list[str]:
    """Examples of a data file: one per non-blank line, or the ``text`` field of each JSONL line."""
    path = Path(path).expanduser()
    content = read_text(path, "data file")  # the CLI protects --data as an input of the run
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
        for number, record in json_records(lines, lambda number, exc: f"{where}:{number}: not valid JSON ({exc.msg})"):
            if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                raise InputError(f'{where}:{number}: each JSONL line needs a string "text" field')
            # JSON escapes can spell lone surrogates (\ud800), which are no text any tokenizer reads
            check_utf8(record["text"], f"{where}:{number}: the text field")
            if record["text"].strip():
                examples.append(record["text"])
        if not examples:
            raise InputError(f"{what} has only empty texts")
        return examples
    return [line.strip() for _, line in lines]


def json_records(
    numbered_lines: Iterable[tuple[int, str]], not_json: Callable[[int, json.JSONDecodeError], str]
) -> Iterator[tuple[int, Any]]:
    """``(line number, decoded object)`` of each non-blank line of JSON Lines; a line that is not JSON raises
    :class:`InputError` with the message ``not_json(line number, error)``."""
    for number, line in numbered_lines:
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise InputError(not_json(number, error)) from error
        yield number, record


def load_texts(data: str | Path | None = None, texts: Sequence[str] | None = None) -> list[str]:
    """Texts from ``--data`` and ``--text`` together; the default corpus when neither is given."""
    examples: list[str] = []
    if data is not None:
        examples.extend(read_examples(data))
    for text in texts or ():
        if not text.strip():
            raise ParameterError("text", "a {text} value is empty: give at least one word")
        examples.append(check_utf8(text, "a text"))
    if data is None and not texts:
        examples = read_examples(default_corpus_path())
    return examples
