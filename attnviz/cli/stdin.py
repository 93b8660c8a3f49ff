"""``-`` as a text or file argument: read standard input, only when the user asked for it."""

from __future__ import annotations

import sys

#: What the user types for "read standard input".
STDIN = "-"


def read_stdin(what: str) -> str:
    """All of standard input as text; refuses a terminal (nothing piped) and empty input."""
    from attnviz.common.encoding import check_utf8, decode_utf8
    from attnviz.common.errors import InputError

    if sys.stdin is None or sys.stdin.isatty():
        raise InputError(f"'-' reads the {what} from standard input, but nothing is piped in: echo '...' | attnviz ...")
    buffer = getattr(sys.stdin, "buffer", None)
    try:
        # the bytes, decoded like a file's: the locale's decoder would escape or misread what is not UTF-8
        content = decode_utf8(buffer.read(), "standard input") if buffer is not None else sys.stdin.read()
    except UnicodeDecodeError as exc:
        raise InputError(f"standard input is not UTF-8 text ({exc.reason})") from exc
    except OSError as exc:
        raise InputError(f"cannot read standard input: {exc.strerror or exc}") from exc
    content = check_utf8(content, "standard input").replace("\r\n", "\n")
    if not content.strip():
        raise InputError(f"standard input is empty: pipe the {what} in")
    return content


def text_or_stdin(text: str | None, what: str = "text") -> str | None:
    """``text`` itself, or standard input (without its final newline) when ``text`` is ``-``."""
    if text != STDIN:
        return text
    return read_stdin(what).rstrip("\n")


def corpus_from_options(data, text: list[str] | None, text_files: list | None = None) -> list[str] | None:
    """The examples of ``--data``, ``--text`` and ``--text-file`` together (``-`` reads standard input: one example
    per line for ``--data``, one text for ``--text-file``); None without any."""
    from attnviz.common.encoding import read_text
    from attnviz.common.errors import InputError
    from attnviz.common.texts import examples_from_text, load_texts

    if [str(path) for path in (data, *(text_files or ())) if path is not None].count(STDIN) > 1:
        raise InputError("standard input ('-') can be read once: give '-' to one of --data and --text-file")
    whole = []
    for path in text_files or ():
        content = read_stdin("text") if str(path) == STDIN else read_text(path.expanduser(), "text file")
        if not content.strip():
            raise InputError(f"text file {path} is empty: give a file with some text")
        whole.append(content.rstrip("\n"))
    if data is not None and str(data) == STDIN:
        return examples_from_text(read_stdin("data")) + (load_texts(None, text) if text else []) + whole
    if data is None and not text:
        return whole or None
    return load_texts(data, text) + whole
