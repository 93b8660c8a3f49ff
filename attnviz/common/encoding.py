"""The one check that text is UTF-8, wherever it comes from: a file, standard input, or the command line.

Bytes are decoded strictly (never replaced or escaped): text attnviz cannot read exactly is refused
with one message, rather than analysed as something the user did not write.
"""

from __future__ import annotations

import os
from pathlib import Path

from attnviz.common.errors import InputError


def decode_utf8(data: bytes, what: str) -> str:
    """``data`` as text; :class:`InputError` naming ``what`` (``data file x.txt``, ``standard input``) if not UTF-8."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{what} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def check_utf8(text: str, what: str) -> str:
    """``text`` itself, unless it holds characters that no UTF-8 bytes encode.

    Python hands over undecodable bytes (of a command line or of standard input in the C locale) as lone
    surrogates; they are refused here like undecodable bytes are in :func:`decode_utf8`.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InputError(f"{what} is not valid UTF-8 text: check the terminal's or the file's encoding") from None
    return text


def read_text(path: str | os.PathLike, what: str = "file") -> str:
    """A UTF-8 text file's content with universal newlines; OS errors become one :class:`InputError`.

    Only regular files are read: a pipe, a device or a socket could block or never end.
    """
    path = Path(path).expanduser()
    if not path.exists():
        raise InputError(f"{what} {path} does not exist")
    if path.is_dir():
        raise InputError(f"{what} {path} is a directory, not a file")
    if not path.is_file():
        raise InputError(f"{what} {path} is not a regular file: save the text to a file first")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read {what} {path}: {exc.strerror or exc}") from exc
    return decode_utf8(data, f"{what} {path}").replace("\r\n", "\n").replace("\r", "\n")


__all__ = ["check_utf8", "decode_utf8", "read_text"]
